//! Training that heals: four ranks (processes) train a data-parallel model; rank 2 is killed
//! mid-training; the survivors name it, shrink past it and go on; then a spare process joins
//! and the three grow back to four (`Communicator::grow_id`, `Communicator::grow`), the spare
//! taking the model from rank 0. At the end every rank holds the same model.
//!
//! Run: `cargo run --release --example elastic`. It prints, per rank, when it went on after
//! the kill, and how long after the kill the first survivor finished a step.

use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use strata::{Communicator, ReduceOp, UniqueId};

const RANKS: usize = 4;
const VICTIM: usize = 2;
const STEPS: u64 = 120;
const PARAMS: usize = 1 << 16;

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// This rank's gradient at `step`: different on every rank, the same on every run.
fn gradient(rank: usize, step: u64) -> Vec<f32> {
    (0..PARAMS)
        .map(|i| ((rank * 31 + i) as f32 * 0.001 + step as f32 * 0.01).sin())
        .collect()
}

/// Trains from `step` to STEPS on `comm`; on a failure, shrinks past the failed rank and
/// retries the step; `me` seeds this process's gradient. Ten steps after a shrink, rank 0 hands the id of a grown communicator
/// to the spare through `handoff`, and every rank grows. Returns the model.
fn train(
    (mut comm, me): (Communicator, usize),
    mut params: Vec<f32>,
    mut step: u64,
    handoff: &std::path::Path,
) -> strata::Result<Vec<f32>> {
    let mut grow_at = None;
    let mut healing = false;
    while step < STEPS {
        if grow_at == Some(step) {
            // Rank 0 makes the id and hands it to the spare; the others get it from rank 0.
            let id = if comm.rank() == 0 {
                let id = comm.grow_id()?;
                let io = |e: std::io::Error| strata::Error::Transport(e.to_string());
                let tmp = handoff.with_extension("tmp");
                std::fs::write(&tmp, id.to_hex()).map_err(io)?;
                std::fs::rename(&tmp, handoff).map_err(io)?;
                Some(id)
            } else {
                None
            };
            comm = comm.grow(id.as_ref(), RANKS)?;
            // The spare takes the model and the step from rank 0.
            comm.broadcast_in_place(&mut params, 0)?;
            comm.broadcast_in_place(&mut [step], 0)?;
            println!(
                "rank {me}: grew back to {} ranks at step {step}",
                comm.size()
            );
        }
        std::thread::sleep(Duration::from_millis(20)); // the step's compute
        let mut g = gradient(me, step);
        match comm.all_reduce_in_place(&mut g, ReduceOp::Avg) {
            Ok(()) => {
                for (p, g) in params.iter_mut().zip(&g) {
                    *p -= 0.1 * g;
                }
                step += 1;
                if std::mem::take(&mut healing) {
                    println!(
                        "WENT_ON rank {me} at {:.3}: step {step} done on {} ranks",
                        unix_s(),
                        comm.size()
                    );
                }
            }
            Err(e) => {
                let failed = e.failed_ranks();
                if failed.is_empty() {
                    return Err(e);
                }
                println!("rank {me}: step {step} failed ({e}); shrinking past {failed:?}");
                comm = comm.shrink(&failed)?;
                grow_at = Some(step + 10);
                healing = true;
            }
        }
    }
    Ok(params)
}

fn rank_main(rank: usize) -> strata::Result<()> {
    let handoff = std::path::PathBuf::from(var("ELASTIC_HANDOFF").unwrap_or_default());
    let (comm, params, step) = if rank < RANKS {
        let id = UniqueId::from_hex(&var("ELASTIC_ID").unwrap_or_default())?;
        (Communicator::init(&id, RANKS, rank)?, vec![0f32; PARAMS], 0)
    } else {
        // The spare: waits for the id of the grown communicator, joins as the last rank.
        let start = Instant::now();
        let hex = loop {
            if let Ok(h) = std::fs::read_to_string(&handoff) {
                break h;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(strata::Error::Transport(
                    "no grown communicator came".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let comm = Communicator::init(&UniqueId::from_hex(&hex)?, RANKS, RANKS - 1)?;
        let mut params = vec![0f32; PARAMS];
        comm.broadcast_in_place(&mut params, 0)?;
        println!("spare: joined as rank {} of {}", comm.rank(), comm.size());
        let mut at = [0u64];
        comm.broadcast_in_place(&mut at, 0)?;
        (comm, params, at[0])
    };
    // The number this process started as seeds its gradient.
    let params = train((comm, rank), params, step, &handoff)?;
    let sum: f64 = params.iter().map(|&p| f64::from(p)).sum();
    println!("MODEL rank {rank} checksum {sum:.6}");
    Ok(())
}

fn main() {
    if let Some(rank) = var("ELASTIC_RANK").and_then(|r| r.parse::<usize>().ok()) {
        if let Err(e) = rank_main(rank) {
            eprintln!("rank {rank}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let id = UniqueId::new().expect("rendezvous");
    let handoff = std::env::temp_dir().join(format!("strata-elastic-{}", std::process::id()));
    let _ = std::fs::remove_file(&handoff);
    let spawn = |rank: usize| -> Child {
        Command::new(&exe)
            .env("ELASTIC_RANK", rank.to_string())
            .env("ELASTIC_ID", id.to_hex())
            .env("ELASTIC_HANDOFF", &handoff)
            .env("STRATA_SOCKET_IFNAME", "=lo")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawning a rank")
    };
    let mut ranks: Vec<Child> = (0..RANKS).map(spawn).collect();
    let spare = spawn(RANKS);
    std::thread::sleep(Duration::from_millis(600));
    let killed = unix_s();
    ranks[VICTIM].kill().expect("killing rank 2");
    println!("launcher: killed rank {VICTIM} at {killed:.3}");
    let mut ok = true;
    let mut went_on = Vec::new();
    let mut models = Vec::new();
    for (r, c) in ranks.into_iter().chain(std::iter::once(spare)).enumerate() {
        let out = c.wait_with_output().expect("waiting for a rank");
        ok &= r == VICTIM || out.status.success();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("  {line}");
            if let Some(rest) = line.strip_prefix("WENT_ON ") {
                let at = rest.split(" at ").nth(1).and_then(|t| t.split(':').next());
                went_on.extend(at.and_then(|t| t.parse::<f64>().ok()));
            }
            if let Some(sum) = line.split("checksum ").nth(1) {
                models.push(sum.to_string());
            }
        }
    }
    let _ = std::fs::remove_file(&handoff);
    if let Some(first) = went_on.iter().copied().reduce(f64::min) {
        println!(
            "launcher: the survivors finished their first step without rank {VICTIM} {:.2} s after it was killed",
            first - killed
        );
    } else {
        ok = false;
        println!("launcher: no survivor went on");
    }
    let same = models.len() == RANKS && models.iter().all(|m| *m == models[0]);
    println!(
        "launcher: {} ranks ended with {}",
        models.len(),
        if same {
            "the same model"
        } else {
            "different models"
        }
    );
    ok &= same;
    println!("launcher: {}", if ok { "done" } else { "a rank failed" });
    if !ok {
        std::process::exit(1);
    }
}
