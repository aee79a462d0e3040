//! `collbench --memory`: how many bytes each rank moves through memory per byte of the
//! message, counted from the schedule it runs, beside this host's memcpy rate, so that the
//! distance from the memory-bandwidth limit is a printed number.
//!
//! Counted for the shared-memory transport, in two parts. The caller's buffers and scratch
//! (as large as the message: at 64 MiB they live in DRAM): a send reads its source, a receive
//! writes its destination, a receive-reduce reads the local operand and writes the result, a
//! copy reads and writes. The ring's slots (1 MiB a direction, so they stay in the last-level
//! cache): a send writes a slot, a receive reads one. The bound is the buffer traffic at the
//! memcpy rate (a memcpy reads and writes 2 bytes per byte copied); for a message that fits
//! in the caches it is not a bound.

use std::time::Instant;
use strata::{Algorithm, Collective, Communicator};
use strata_algorithms::schedule::Op;
use strata_algorithms::{Plan, RankSchedule};

/// Bytes one rank's schedule reads and writes: (in the caller's buffers and scratch, in the
/// ring's slots), by the rules in the module comment.
pub(super) fn schedule_traffic(sched: &RankSchedule, es: usize) -> (usize, usize) {
    let bytes = |len: usize| len * es;
    sched
        .steps
        .iter()
        .flat_map(|s| s.ops.iter())
        .map(|op| match op {
            Op::Send { src, .. } => (bytes(src.len), bytes(src.len)),
            Op::Recv { dst, .. } => (bytes(dst.len), bytes(dst.len)),
            Op::RecvReduce { dst, .. } => (2 * bytes(dst.len), bytes(dst.len)),
            Op::Copy { src, dst } if src == dst => (0, 0),
            Op::Copy { src, .. } => (2 * bytes(src.len), 0),
            // Sum needs no final pass; avg's division is not counted.
            Op::Finalize { .. } => (0, 0),
        })
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// Traffic per byte of the message (buffers, slots) for this rank's part of `collective`
/// with `algorithm` (in launcher order), or `None` when strata has no such schedule.
pub(super) fn traffic_per_byte(
    comm: &Communicator,
    collective: Collective,
    algorithm: Algorithm,
    count: usize,
    es: usize,
) -> Option<(f64, f64)> {
    let plan = Plan {
        collective,
        algorithm,
        nranks: comm.size(),
        rank: comm.rank(),
        count,
        root: 0,
        chunk_elems: count.max(1),
    };
    let sched = strata_algorithms::plan(&plan).ok()?;
    let message = (count * es).max(1) as f64;
    let (buffers, slots) = schedule_traffic(&sched, es);
    Some((buffers as f64 / message, slots as f64 / message))
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

/// Prints, for each (size, algorithm, measured µs, (buffer, slot) traffic per byte) row, the
/// traffic, the time the memcpy rate allows for the buffer part, and the ratio.
pub(super) fn print_memory(rows: &[(usize, String, f64, (f64, f64))], memcpy_bytes_per_s: f64) {
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
        "# {:>12} {:>10} {:>9} {:>9} {:>11} {:>13} {:>9}",
        "size(B)", "algorithm", "buffers", "slots", "bound(us)", "measured(us)", "of limit"
    );
    println!(
        "#   (of limit = bound / measured: about 100% is the memory limit for this much traffic; far above it the message lives in the caches)"
    );
    for (size, algorithm, measured_us, (buffers, slots)) in rows {
        let bound_us = *size as f64 * buffers / traffic_rate * 1e6;
        println!(
            "# {size:>12} {algorithm:>10} {buffers:>9.2} {slots:>9.2} {bound_us:>11.1} {measured_us:>13.1} {:>8.0}%",
            100.0 * bound_us / measured_us.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(algorithm: Algorithm, p: usize, rank: usize, n: usize) -> (f64, f64) {
        let plan = Plan {
            collective: Collective::AllReduce,
            algorithm,
            nranks: p,
            rank,
            count: n,
            root: 0,
            chunk_elems: n,
        };
        let sched = strata_algorithms::plan(&plan).unwrap();
        let (b, s) = schedule_traffic(&sched, 4);
        (b as f64 / (4 * n) as f64, s as f64 / (4 * n) as f64)
    }

    #[test]
    fn two_rank_all_reduce_traffic_follows_the_schedule() {
        // Ring at 2 ranks: send half (reads 1/2), receive-reduce half (reads 1/2, writes 1/2),
        // send the reduced half (reads 1/2), receive the other (writes 1/2): 2.5 bytes per
        // byte in the buffers; each half passes a slot twice (written, read): 2 in the slots.
        assert_eq!(traffic(Algorithm::Ring, 2, 0, 1 << 20), (2.5, 2.0));
        // Recursive doubling: send all (1), receive-reduce all into scratch (2), copy the
        // result to the output (2); the whole message passes a slot twice.
        assert_eq!(
            traffic(Algorithm::RecursiveDoubling, 2, 0, 1 << 20),
            (5.0, 2.0)
        );
    }
}
