//! Running ranks: spawning them on this host, ending them, and a spawned rank's start.

use super::*;
use std::os::unix::process::CommandExt;

/// The id of the job this launcher starts. With STRATA_ROOT (or MASTER_ADDR) set, its root
/// is there and stays open for `collbench status` while the job runs; else on a free port,
/// closed after init. `None` (said why) when it cannot be served.
fn job_id() -> Option<(UniqueId, Option<strata::bootstrap::JobRoot>)> {
    let served = UniqueId::serve_from_env().and_then(|served| match served {
        Some((id, root)) => Ok((id, Some(root))),
        None => UniqueId::new().map(|id| (id, None)),
    });
    served.map_err(|e| eprintln!("collbench: {e}")).ok()
}

/// Runs `--threads` ranks as threads of this process, each with its own communicator (the
/// in-process transport joins them; on device buffers they share this host's GPUs); fails if
/// any rank fails.
pub(super) fn threads_main(args: &Args) -> ExitCode {
    let Some((id, _job_root)) = job_id() else {
        return ExitCode::FAILURE;
    };
    let n = args.threads;
    let ok = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                s.spawn(move || match Communicator::init(&id, n, rank) {
                    Ok(comm) => rank_main(args, &comm) == ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("collbench: rank {rank}: init failed: {e}");
                        false
                    }
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .fold(true, |a, b| a & b)
    });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Spawns `np` ranks of this program on this host (over loopback unless told otherwise).
pub(super) fn spawn_main(args: &Args) -> ExitCode {
    if std::env::var_os("STRATA_SOCKET_IFNAME").is_none()
        && std::env::var_os("NCCL_SOCKET_IFNAME").is_none()
    {
        // SAFETY: single-threaded at this point; children inherit it.
        unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
    }
    let Some((id, _job_root)) = job_id() else {
        return ExitCode::FAILURE;
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("collbench: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let passthrough: Vec<String> = std::env::args().skip(1).collect();
    // More ranks than cores: still one fixed core each, round robin. Left to the scheduler,
    // four ranks on two cores fell into a slow pairing in about one run in three (8 B
    // all-reduce 11-13 µs against 4-6 µs).
    let cores = (args.bind_to == "core")
        .then(allowed_cores)
        .filter(|cores| !cores.is_empty());
    let mut children: Vec<Child> = Vec::new();
    // SAFETY: getpid has no preconditions.
    let launcher = unsafe { libc::getpid() };
    for rank in 0..args.np {
        let mut command = Command::new(&exe);
        command
            .args(&passthrough)
            .env(ENV_ID, id.to_hex())
            .env(ENV_RANK, rank.to_string())
            .env(ENV_NRANKS, args.np.to_string());
        let core = cores
            .as_ref()
            .map(|cores| cores[core_of_rank(rank, cores.len())]);
        // SAFETY: between fork and exec the child only makes system calls.
        unsafe {
            command.pre_exec(move || {
                // Bound before it runs a line of its own, so that what it measures at init
                // (which CPU it has) is what it runs on; a failure is reported below.
                if let Some(core) = core {
                    let _ = set_affinity(0, core);
                }
                die_with(launcher)
            })
        };
        let child = command.spawn();
        match child {
            Ok(c) => {
                if let Some(core) = core {
                    bind_to_core(&c, core);
                }
                children.push(c)
            }
            Err(e) => {
                eprintln!("collbench: spawning rank {rank}: {e}");
                kill_all(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let deadline = args
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut status: Vec<Option<bool>> = vec![None; children.len()];
    let mut failed_at: Option<Instant> = None;
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none()
                && let Ok(Some(s)) = c.try_wait()
            {
                status[r] = Some(s.success());
                if !s.success() {
                    eprintln!("collbench: rank {r} exited with {s}");
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        // After a failure, give the others a moment to report their own errors (the watchdog
        // tells every survivor within milliseconds), then end whoever is left: a stopped or
        // hung rank never exits by itself.
        let grace_over = failed_at.is_some_and(|t| t.elapsed() > FAILURE_GRACE);
        if grace_over || deadline.is_some_and(|d| Instant::now() > d) {
            eprintln!("collbench: stopping the remaining ranks");
            kill_all(&mut children);
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.iter().all(|s| *s == Some(true)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// In a spawned rank before exec: the kernel kills it when the launcher's thread that spawned
/// it ends (a killed launcher, too), so no rank runs on without a deadline after its launcher
/// is gone; if the launcher is gone already, the rank does not start.
fn die_with(launcher: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: plain system calls with constant arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != launcher {
            return Err(std::io::Error::other("the launcher is gone"));
        }
    }
    Ok(())
}

/// Which of `cores` cores `--np` binds rank `rank` to, by index: round robin, so that core c
/// holds the ranks c, c + cores, ....
pub(super) fn core_of_rank(rank: usize, cores: usize) -> usize {
    rank % cores
}

/// The cores this process may run on.
pub(super) fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the call.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &allowed))
            .collect()
    }
}

/// Under a launcher that left this rank free to run on every core of the machine (srun
/// without a CPU binding, for one), binds it to one as `--np` does, core `local rank mod
/// cores` of those allowed: several ranks per host otherwise stalled the first row of a
/// sweep (69-77 µs instead of 0.3 µs for 8 B under srun in 3 runs of 10). A mask the
/// launcher narrowed is left alone.
pub(super) fn bind_launched_rank(args: &Args, info: &strata::launcher::LaunchInfo) {
    let Some(local_rank) = info.local_rank else {
        return;
    };
    let allowed = allowed_cores();
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    if args.bind_to != "core" || allowed.len() < 2 || allowed.len() < online {
        return;
    }
    let core = allowed[local_rank % allowed.len()];
    if let Err(e) = set_affinity(0, core) {
        eprintln!(
            "collbench: could not bind rank {} to core {core}: {e}",
            info.rank
        );
    }
}

/// Lets process `pid` (0: this one) run on `core` only.
fn set_affinity(pid: libc::pid_t, core: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call only reads it.
    let bound = unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut one);
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &one)
    };
    if bound == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Binds a spawned rank to `core`. Without it, two ranks started on two cores can share one
/// for their first ~20 ms, until the scheduler moves one: the first row of a sweep then ran
/// at ~90 µs instead of 0.5 µs in about one run in five.
fn bind_to_core(child: &Child, core: usize) {
    if let Err(e) = set_affinity(child.id() as libc::pid_t, core) {
        eprintln!(
            "collbench: could not bind pid {} to core {core}: {e}",
            child.id()
        );
    }
}

/// How long the launcher waits for the other ranks after one has failed.
const FAILURE_GRACE: Duration = Duration::from_secs(1);

pub(super) fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub(super) fn child_main(args: &Args, id_hex: &str) -> ExitCode {
    let parsed = UniqueId::from_hex(id_hex);
    let rank = std::env::var(ENV_RANK)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let nranks = std::env::var(ENV_NRANKS)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let (Ok(id), Some(rank), Some(nranks)) = (parsed, rank, nranks) else {
        eprintln!("collbench: malformed {ENV_ID}/{ENV_RANK}/{ENV_NRANKS}");
        return ExitCode::FAILURE;
    };
    match Communicator::init(&id, nranks, rank) {
        Ok(comm) => rank_main(args, &comm),
        Err(e) => {
            eprintln!("collbench: rank {rank}: init failed: {e}");
            ExitCode::FAILURE
        }
    }
}
