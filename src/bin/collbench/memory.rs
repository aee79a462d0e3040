//! `collbench --memory`: how many bytes each rank moves through memory per byte of the
//! message, counted from the schedule it runs, beside this host's memcpy rate, so that the
//! distance from the memory-bandwidth limit is a printed number.
//!
//! Counted for the shared-memory transport, in three parts. The caller's buffers and scratch
//! (as large as the message: at 64 MiB they live in DRAM): a send reads its source, a receive
//! writes its destination, a receive-reduce reads the local operand and writes the result, a
//! copy reads and writes, a local reduction reads two operands and writes one. Cache: a send
//! of at most [`CACHE_RESIDENT_BYTES`] that reads what the rank wrote in the step before (a
//! sliced ring sends on the slice it just reduced) is counted here instead of in the buffers.
//! The ring's slots (1 MiB a direction, so they stay in the last-level cache): a send writes
//! a slot, a receive reads one. The bound is the buffer traffic at the memcpy rate (a memcpy
//! reads and writes 2 bytes per byte copied); for a message that fits in the caches it is not
//! a bound.

use std::time::Instant;
use strata::{Algorithm, Collective, Communicator};
use strata_algorithms::hierarchy::Hierarchy;
use strata_algorithms::schedule::{Op, Region};
use strata_algorithms::{Plan, RankSchedule};

/// The largest send counted as read from cache when the step before wrote its source.
pub(super) const CACHE_RESIDENT_BYTES: usize = 1 << 20;

/// Bytes one rank's schedule moves, by the rules in the module comment.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub(super) struct Traffic {
    /// Read or written in the caller's buffers and scratch.
    pub buffers: f64,
    /// Re-read from cache right after being written.
    pub cache: f64,
    /// Written to or read from the transport's slots.
    pub slots: f64,
}

/// The bytes one rank's schedule moves, by the rules in the module comment.
pub(super) fn schedule_traffic(sched: &RankSchedule, es: usize) -> Traffic {
    let bytes = |len: usize| (len * es) as f64;
    let inside =
        |r: &Region, w: &Region| r.buf == w.buf && w.offset <= r.offset && r.end() <= w.end();
    let mut t = Traffic::default();
    // Regions written by the last step that moved data, and by the local steps after it.
    let (mut before, mut now): (Vec<Region>, Vec<Region>) = (Vec::new(), Vec::new());
    for step in &sched.steps {
        let moves = step.ops.iter().any(|op| op.peer().is_some());
        for op in &step.ops {
            match op {
                Op::Send { src, .. } => {
                    let hot = src.len * es <= CACHE_RESIDENT_BYTES
                        && before.iter().any(|w| inside(src, w));
                    *if hot { &mut t.cache } else { &mut t.buffers } += bytes(src.len);
                    t.slots += bytes(src.len);
                }
                Op::Recv { dst, .. } => {
                    t.buffers += bytes(dst.len);
                    t.slots += bytes(dst.len);
                    now.push(*dst);
                }
                Op::RecvReduce { dst, .. } => {
                    t.buffers += 2.0 * bytes(dst.len);
                    t.slots += bytes(dst.len);
                    now.push(*dst);
                }
                Op::Copy { src, dst } if src == dst => {}
                Op::Copy { src, dst } => {
                    t.buffers += 2.0 * bytes(src.len);
                    now.push(*dst);
                }
                // Two operands read, one result written.
                Op::Reduce { dst, .. } => {
                    t.buffers += 3.0 * bytes(dst.len);
                    now.push(*dst);
                }
                // Sum needs no final pass; avg's division is not counted.
                Op::Finalize { .. } => {}
            }
        }
        if moves {
            before = std::mem::take(&mut now);
        } else {
            before.append(&mut now);
        }
    }
    t
}

/// Traffic per byte of the message for this rank's part of `collective` with `algorithm`
/// (in launcher order, a ring all-reduce sliced as this communicator slices it), or `None`
/// when strata has no such schedule.
pub(super) fn traffic_per_byte(
    comm: &Communicator,
    collective: Collective,
    algorithm: Algorithm,
    count: usize,
    es: usize,
) -> Option<Traffic> {
    let plan = Plan {
        collective,
        algorithm,
        nranks: comm.size(),
        rank: comm.rank(),
        count,
        root: 0,
        chunk_elems: count.max(1),
    };
    let hierarchy = Hierarchy::single_host(comm.size());
    let slice = comm.ring_slice_bytes(count * es) / es;
    let sched = strata_algorithms::plan_to_run_on(&plan, &hierarchy, false, slice).ok()?;
    let message = (count * es).max(1) as f64;
    let t = schedule_traffic(&sched, es);
    Some(Traffic {
        buffers: t.buffers / message,
        cache: t.cache / message,
        slots: t.slots / message,
    })
}

/// This host's memcpy rate in bytes copied per second: the best of five copies of 64 MiB.
/// Every rank runs it at the same moment (between barriers), so the rate is what one core
/// gets while the others copy too, as they do during a collective.
pub(super) fn memcpy_rate(comm: &Communicator) -> Result<f64, String> {
    const BYTES: usize = 64 << 20;
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    dst.copy_from_slice(&src);
    comm.barrier().map_err(|e| e.to_string())?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    comm.barrier().map_err(|e| e.to_string())?;
    Ok(BYTES as f64 / best)
}

/// Prints, for each (size, algorithm, measured µs, traffic per byte) row, the traffic, the
/// time the memcpy rate allows for the buffer part, and the ratio.
pub(super) fn print_memory(rows: &[(usize, String, f64, Traffic)], memcpy_bytes_per_s: f64) {
    let traffic_rate = 2.0 * memcpy_bytes_per_s;
    println!(
        "# Memory traffic per rank, bytes read and written per byte of the message (shared-memory transport, from the schedule)"
    );
    println!(
        "# memcpy here: {:.2} GB/s copied = {:.2} GB/s read+written, one core, every rank copying at once",
        memcpy_bytes_per_s / 1e9,
        traffic_rate / 1e9
    );
    println!(
        "# {:>12} {:>10} {:>9} {:>9} {:>9} {:>11} {:>13} {:>9}",
        "size(B)",
        "algorithm",
        "buffers",
        "cache",
        "slots",
        "bound(us)",
        "measured(us)",
        "of limit"
    );
    println!(
        "#   (cache = sends of what the step before wrote, at most 1 MiB; of limit = bound / measured: about 100% is the memory limit for the buffer traffic; far above it the message lives in the caches)"
    );
    for (size, algorithm, measured_us, t) in rows {
        let bound_us = *size as f64 * t.buffers / traffic_rate * 1e6;
        println!(
            "# {size:>12} {algorithm:>10} {:>9.2} {:>9.2} {:>9.2} {bound_us:>11.1} {measured_us:>13.1} {:>8.0}%",
            t.buffers,
            t.cache,
            t.slots,
            100.0 * bound_us / measured_us.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (buffers, cache, slots) per byte for rank `rank` of `p` with `n` floats.
    fn traffic(algorithm: Algorithm, p: usize, rank: usize, n: usize, slice: usize) -> [f64; 3] {
        let plan = Plan {
            collective: Collective::AllReduce,
            algorithm,
            nranks: p,
            rank,
            count: n,
            root: 0,
            chunk_elems: n,
        };
        let h = Hierarchy::single_host(p);
        let sched = strata_algorithms::plan_to_run_on(&plan, &h, false, slice).unwrap();
        let t = schedule_traffic(&sched, 4);
        let per = |x: f64| x / (4 * n) as f64;
        [per(t.buffers), per(t.cache), per(t.slots)]
    }

    #[test]
    fn two_rank_all_reduce_traffic_follows_the_schedule() {
        let n = 16 << 20;
        // Ring at 2 ranks, block by block: send half (reads 1/2), receive-reduce half (reads
        // 1/2, writes 1/2), send the reduced half (reads 1/2: 32 MiB written a whole step
        // before), receive the other (writes 1/2): 2.5 bytes per byte in the buffers; each
        // half passes a slot twice (written, read): 2 in the slots.
        assert_eq!(traffic(Algorithm::Ring, 2, 0, n, 0), [2.5, 0.0, 2.0]);
        // Sliced at 1 MiB, each reduced slice is sent on in the next step: read from cache.
        assert_eq!(traffic(Algorithm::Ring, 2, 0, n, 1 << 18), [2.0, 0.5, 2.0]);
        // Recursive doubling: send all (1), receive-reduce all into scratch (2), copy the
        // result to the output (2); the whole message passes a slot twice.
        assert_eq!(
            traffic(Algorithm::RecursiveDoubling, 2, 0, n, 1 << 18),
            [5.0, 0.0, 2.0]
        );
        // One-shot: copy the input to its slot (2), send it (1), receive the peer's (1),
        // reduce the two slots into the output (3).
        assert_eq!(traffic(Algorithm::OneShot, 2, 0, n, 0), [7.0, 0.0, 2.0]);
    }
}
