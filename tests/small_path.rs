//! The small all-reduce paths (recursive doubling and one-shot, up to 4 KiB per rank), with
//! ranks as threads of one process: which calls take them, their results bit for bit, the
//! flight record, mismatches, and repeated calls.

mod in_process;

use in_process::*;
use std::time::Duration;
use strata::{Algorithm, Collective, DataType, Error, ReduceOp, TransportPolicy, check};

/// The small all-reduce path (recursive doubling at a power-of-two rank count, up to 4 KiB
/// per rank) gives the checked result for every type and operator, in place and out of
/// place, and those are the calls that take it: premulsum, a larger message and a rank whose
/// part is not a plain exchange per step (a folded rank, at 3 ranks) take the general path.
#[test]
fn small_all_reduce_path_is_taken_and_exact() {
    const SMALL_MAX_BYTES: usize = 4096;
    use strata::Algorithm::{OneShot, RecursiveDoubling};
    for transport in [TransportPolicy::Auto, TransportPolicy::Tcp] {
        for (algorithm, n) in [
            (RecursiveDoubling, 2),
            (RecursiveDoubling, 3),
            (RecursiveDoubling, 4),
            (OneShot, 3),
            (OneShot, 5),
        ] {
            let comms = init_threads(n, transport);
            for c in &comms {
                // The tuner's choice at these sizes differs with the rank count.
                c.set_algorithm(Collective::AllReduce, Some(algorithm))
                    .unwrap();
            }
            let before: Vec<u64> = comms.iter().map(|c| c.small_path_calls()).collect();
            let results = on_all(&comms, |c| {
                // At 3 ranks recursive doubling folds ranks 0 and 1 into one; rank 2's part
                // is a plain exchange, which the small path runs. One-shot runs on it
                // everywhere.
                let runs_small = algorithm == OneShot || n != 3 || c.rank() == 2;
                let mut expected = 0;
                for dtype in DataType::ALL {
                    let es = dtype.size();
                    let mut ops = ReduceOp::BASIC.to_vec();
                    ops.push(ReduceOp::PreMulSum(check::premul_scalar(dtype, 0)));
                    for op in ops {
                        for count in [1, 7, SMALL_MAX_BYTES / es, SMALL_MAX_BYTES / es + 1] {
                            let what = format!("{transport:?} {algorithm}");
                            all_reduce_both_ways(c, dtype, count, op, &what)?;
                            let small = count * es <= SMALL_MAX_BYTES
                                && !matches!(op, ReduceOp::PreMulSum(_));
                            // Two calls: out of place and in place.
                            expected += 2 * u64::from(small && runs_small);
                        }
                    }
                }
                Ok::<u64, String>(expected)
            });
            for (c, (r, b)) in comms.iter().zip(results.into_iter().zip(before)) {
                let expected = r.unwrap();
                assert_eq!(
                    c.small_path_calls() - b,
                    expected,
                    "{transport:?}, {algorithm}, {n} ranks, rank {}",
                    c.rank()
                );
            }
        }
    }
}

/// One-shot folds the ranks' vectors in rank order on every rank, on the small path and the
/// general one: float sums whose value depends on the order come out exactly as summed in
/// rank order, with the same bits on every rank, in and out of place.
#[test]
fn one_shot_sums_in_rank_order_on_every_rank() {
    // Large and small terms that cancel: any other order rounds differently somewhere.
    let term = |r: usize, i: usize| -> f32 {
        let big = 1.0e8 * (1.0 + (i % 7) as f32);
        match (r + i) % 4 {
            0 => big,
            1 => 1.0 + (i % 3) as f32,
            2 => -big,
            _ => 0.75,
        }
    };
    for n in [3, 4, 8] {
        let comms = init_threads(n, TransportPolicy::Auto);
        for c in &comms {
            c.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::OneShot))
                .unwrap();
        }
        // 512 floats take the small path, 513 and more the general one.
        for count in [1, 5, 512, 513, 3000] {
            let want: Vec<f32> = (0..count)
                .map(|i| (1..n).fold(term(0, i), |acc, r| acc + term(r, i)))
                .collect();
            for in_place in [false, true] {
                let got = on_all(&comms, |c| {
                    let input: Vec<f32> = (0..count).map(|i| term(c.rank(), i)).collect();
                    if in_place {
                        let mut buf = input;
                        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).map(|_| buf)
                    } else {
                        let mut out = vec![0f32; count];
                        c.all_reduce(&input, &mut out, ReduceOp::Sum).map(|_| out)
                    }
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g: Vec<u32> = g.unwrap().iter().map(|x| x.to_bits()).collect();
                    let w: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(
                        g, w,
                        "{n} ranks, {count} floats, in place {in_place}, rank {r}"
                    );
                }
            }
        }
    }
}

/// Small all-reduces are in the flight record like every call, although once its
/// connections are open a small call records itself only after its first send: each call
/// has its record, in order, ended no earlier than it started, and a call that waits for a
/// late peer shows as the rank's current operation while it waits.
#[test]
fn small_all_reduces_are_recorded_and_shown_while_they_wait() {
    let comms = init_threads(2, TransportPolicy::Auto);
    for c in &comms {
        c.set_algorithm(
            Collective::AllReduce,
            Some(strata::Algorithm::RecursiveDoubling),
        )
        .unwrap();
    }
    let calls = 5u64;
    let late_call = calls + 1;
    let seen_waiting = std::sync::atomic::AtomicBool::new(false);
    let results = on_all(&comms, |c| {
        let mut buf = vec![c.rank() as f32 + 1.0; 4];
        for _ in 0..calls {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
        if c.rank() == 1 {
            // Rank 0's next call waits for this rank: look at it from here meanwhile.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let want = format!("all_reduce #{late_call}");
            while std::time::Instant::now() < deadline {
                let p = comms[0].progress();
                if p.current.as_deref().is_some_and(|s| s.starts_with(&want)) {
                    seen_waiting.store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        Ok::<Vec<f32>, Error>(buf)
    });
    for (c, r) in comms.iter().zip(results) {
        // (1 + 2) doubled by each of the five calls after the first.
        assert_eq!(r.unwrap(), vec![3.0 * 32.0; 4], "rank {}", c.rank());
        assert_eq!(c.small_path_calls(), late_call, "rank {}", c.rank());
        let records = c.flight_records();
        let ours = &records[records.len() - late_call as usize..];
        for (i, rec) in ours.iter().enumerate() {
            let seq = records.len() - late_call as usize + i + 1;
            assert!(
                rec.op
                    .starts_with(&format!("all_reduce #{seq} (float, sum, 4 elements")),
                "rank {}: {rec:?}",
                c.rank()
            );
            assert_eq!(rec.seq, seq as u64);
            assert!(rec.error.is_none(), "{rec:?}");
            assert!(rec.end_us.is_some_and(|e| e >= rec.start_us), "{rec:?}");
        }
        let p = c.progress();
        assert_eq!((p.started, p.finished), (late_call, late_call));
        assert_eq!(p.current, None);
    }
    assert!(
        seen_waiting.load(std::sync::atomic::Ordering::Relaxed),
        "rank 0's waiting small call never showed as its current operation"
    );
}

/// A rank whose small all-reduce has another count than its peers' fails with a mismatch
/// that names both calls, and so does every peer that compares headers with it (at 4 ranks
/// with recursive doubling: both of its partners and rank 0, which only exchanges headers
/// with it; with one-shot, every rank), and no rank's buffer changes.
#[test]
fn small_all_reduce_mismatch_is_named() {
    for algorithm in [
        strata::Algorithm::RecursiveDoubling,
        strata::Algorithm::OneShot,
    ] {
        let comms = init_threads(4, TransportPolicy::Auto);
        for c in &comms {
            c.set_algorithm(Collective::AllReduce, Some(algorithm))
                .unwrap();
        }
        let results = on_all(&comms, |c| {
            let count = if c.rank() == 3 { 8 } else { 4 };
            let mut buf = vec![1f32; count];
            let r = c.all_reduce_in_place(&mut buf, ReduceOp::Sum);
            (r, buf)
        });
        for (r, (result, buf)) in results.into_iter().enumerate() {
            match result {
                Err(Error::Mismatch(m)) => {
                    assert!(
                        m.contains("4 elements") && m.contains("8 elements"),
                        "{algorithm}, rank {r}: {m}"
                    )
                }
                Err(e) if r != 3 => assert!(
                    matches!(e, Error::PeerFailed { .. } | Error::Aborted(_)),
                    "{algorithm}, rank {r}: {e}"
                ),
                other => panic!("{algorithm}, rank {r}: expected a mismatch, got {other:?}"),
            }
            if algorithm == strata::Algorithm::OneShot {
                assert!(buf.iter().all(|&x| x == 1.0), "rank {r}: {buf:?}");
            }
        }
    }
}

/// A repeated call reuses what the same call derived last time (algorithm, schedule, encoded
/// header), but not across a new explicit choice: the same all-reduce after `set_algorithm`
/// runs the algorithm just chosen, and after `set_algorithm(None)` the tuner's again. Each
/// call is checked, the flight record names each call's algorithm, and the calls that take a
/// small path are those of the algorithms that have one.
#[test]
fn a_repeated_call_follows_a_new_algorithm_choice() {
    use Algorithm::{OneShot, RecursiveDoubling, Ring};
    const REPEATS: usize = 3;
    let (n, count) = (4, 100);
    // Without near-tie trials: the choice under test is the explicit one and the model's.
    let comms = init_threads_configured(loopback_id(), n, |_| {
        let mut c = cfg(TransportPolicy::Auto);
        c.tuner_trials = false;
        c
    });
    let tuned = comms[0].algorithm_for(Collective::AllReduce, count * 4);
    let choices = [
        None,
        Some(Ring),
        Some(RecursiveDoubling),
        Some(OneShot),
        None,
    ];
    let results = on_all(&comms, |c| {
        let mut small = Vec::new();
        for choice in choices {
            c.set_algorithm(Collective::AllReduce, choice).unwrap();
            let before = c.small_path_calls();
            for _ in 0..REPEATS {
                let what = format!("{choice:?}");
                all_reduce_both_ways(c, DataType::Float32, count, ReduceOp::Sum, &what)?;
            }
            small.push(c.small_path_calls() - before);
        }
        Ok::<Vec<u64>, String>(small)
    });
    // Each repeat is two calls: out of place and in place.
    let per_choice = 2 * REPEATS;
    for (c, small) in comms.iter().zip(results) {
        let small = small.unwrap();
        let records = c.flight_records();
        let last = &records[records.len() - choices.len() * per_choice..];
        for (i, choice) in choices.iter().enumerate() {
            let algorithm = choice.unwrap_or(tuned);
            for r in &last[i * per_choice..(i + 1) * per_choice] {
                assert!(
                    r.op.ends_with(&format!("; {algorithm})")),
                    "rank {}, choice {choice:?}: {}",
                    c.rank(),
                    r.op
                );
            }
            let has_small_path = matches!(algorithm, RecursiveDoubling | OneShot);
            assert_eq!(
                small[i],
                if has_small_path { per_choice as u64 } else { 0 },
                "rank {}, {algorithm}",
                c.rank()
            );
        }
    }
}
