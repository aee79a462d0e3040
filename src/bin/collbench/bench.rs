//! The benchmark itself: sizes, timing, checking and printing rows.

use super::*;

pub(super) fn list<T>(
    spec: &str,
    all: Vec<T>,
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<Vec<T>, String> {
    if spec.eq_ignore_ascii_case("all") {
        return Ok(all);
    }
    spec.split(',')
        .map(|s| parse(s).ok_or_else(|| format!("unknown {what} '{s}'")))
        .collect()
}

pub(super) use strata::metrics::bus_factor;

/// (count, input bytes, output bytes) for a row of `size` bytes, nccl-tests' convention: size
/// is the larger of the two buffers of a rank.
pub(super) fn shape(
    c: Collective,
    size: usize,
    es: usize,
    n: usize,
    rank: usize,
    root: usize,
) -> (usize, usize, usize) {
    let elems = size / es;
    let count = match c {
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => elems / n,
        _ => elems,
    };
    let (i, o) = c.buffer_elems(count, n, rank, root);
    (count, i * es, o * es)
}

pub(super) fn bench_main(args: &Args, comm: &Communicator) -> ExitCode {
    match run_bench(args, comm) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            if comm.rank() == 0 {
                eprintln!("collbench: {wrong} wrong elements");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("collbench: rank {}: {e}", comm.rank());
            ExitCode::FAILURE
        }
    }
}

pub(super) fn run_bench(args: &Args, comm: &Communicator) -> Result<u64, String> {
    let collective = if args
        .collective
        .replace(['-', '_'], "")
        .eq_ignore_ascii_case("sendrecv")
    {
        Collective::Send
    } else {
        Collective::parse(&args.collective)
            .filter(|c| !matches!(c, Collective::Recv | Collective::Barrier | Collective::Send))
            .ok_or_else(|| format!("unknown collective '{}'", args.collective))?
    };
    let dtypes = list(
        &args.dtype,
        DataType::ALL.to_vec(),
        DataType::parse,
        "data type",
    )?;
    let (n, rank) = (comm.size(), comm.rank());
    let algos = parse_algos(&args.algo, collective, n)?;
    if args.root >= n {
        return Err(format!("root {} is out of range for {n} ranks", args.root));
    }
    if args.min_bytes > args.max_bytes {
        return Err("-b must not exceed -e".into());
    }
    let mut sizes = Vec::new();
    let mut s = args.min_bytes;
    while s <= args.max_bytes {
        sizes.push(s);
        let next = if args.step_factor > 1 {
            s.saturating_mul(args.step_factor)
        } else {
            s.saturating_add(args.step_bytes.max(1))
        };
        if next == s {
            break;
        }
        s = next;
    }
    let transport = std::env::var("STRATA_TRANSPORT").unwrap_or_else(|_| "auto".into());
    let on_gpu = args.device == "cuda";
    if on_gpu {
        // Collective: every rank binds its GPU before the first timed call.
        let device = super::device::local_device(comm)?;
        comm.bind_device(device).map_err(|e| e.to_string())?;
    }
    if rank == 0 {
        println!(
            "# collbench (strata {}): {collective}, {n} ranks, transport {transport}, buffers on {}",
            env!("CARGO_PKG_VERSION"),
            if on_gpu {
                let path = if comm.uses_gpu_ipc() {
                    "stream programs and kernels: peers' memory in a host (CUDA IPC, or directly \
                     within a process), GPUDirect RDMA between hosts"
                } else {
                    "host-staged"
                };
                format!("the GPU ({path}; timed with CUDA events)")
            } else {
                "the host".to_string()
            }
        );
        if let Some(k) = comm.kernel_choice().filter(|_| on_gpu) {
            println!("# {}", k.describe());
        }
        println!(
            "# nccl-tests columns; algbw = size/time, busbw = algbw x {:.3}; GB = 1e9 B",
            bus_factor(collective, n)
        );
        for p in comm.peers() {
            // The CPU a launcher bound it to, where it did: ranks on one CPU share it.
            let cpu = match p.probe.bound_cpu {
                0 => String::new(),
                c => format!(" cpu {}", c - 1),
            };
            println!(
                "#  Rank {:3} Pid {:7} on {}{cpu}",
                p.rank, p.pid, p.host.hostname
            );
        }
    }
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    // The operators of one type's rows (`-o all`: six for a reducing collective).
    let ops_for = |dtype: DataType| -> Result<Vec<ReduceOp>, String> {
        if !collective.reduces() {
            return Ok(vec![ReduceOp::Sum]);
        }
        let all = ["sum", "prod", "min", "max", "avg", "premulsum"]
            .map(|s| ReduceOp::parse(s, dtype).unwrap_or(ReduceOp::Sum));
        list(
            &args.redop,
            all.to_vec(),
            |s| ReduceOp::parse(s, dtype),
            "reduction",
        )
    };
    let total_rows = sizes.len() * algos.len() * ops_for(dtypes[0])?.len() * dtypes.len();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    for &algo in &algos {
        comm.set_algorithm(collective, algo)
            .map_err(|e| e.to_string())?;
        if rank == 0 {
            print_columns(algo);
        }
        // As nccl-tests does: warm up at the largest and the smallest size, untimed, so that
        // the first row does not pay for first calls (connections, schedules, caches).
        if args.warmup > 0 {
            let warm = Args {
                iters: 0,
                check: 0,
                ..args.clone()
            };
            for size in [sizes[sizes.len() - 1], sizes[0]] {
                bench_row(&warm, comm, collective, dtypes[0], ReduceOp::Sum, size)?;
            }
        }
        let first_row = rows.len();
        for &dtype in &dtypes {
            for op in ops_for(dtype)? {
                for &size in &sizes {
                    let mut row = bench_row(args, comm, collective, dtype, op, size)?;
                    row.tuned = algo.is_none();
                    total_wrong += row.out_of_place.wrong + row.in_place.map_or(0, |m| m.wrong);
                    if rank == 0 {
                        print_row(&row);
                        if last_progress.elapsed() > Duration::from_secs(2) {
                            eprintln!(
                                "# collbench: {} of {} rows done, {:.0} s",
                                rows.len() + 1,
                                total_rows,
                                started.elapsed().as_secs_f64()
                            );
                            last_progress = Instant::now();
                        }
                    }
                    rows.push(row);
                }
            }
        }
        if rank == 0 && algos.len() > 1 {
            println!(
                "# Avg bus bandwidth ({}): {:.4}",
                algo.map_or("auto".into(), |a| a.name()),
                avg_busbw(&rows[first_row..])
            );
        }
    }
    // Later collectives of this process (none today) get strata's own choice again.
    comm.set_algorithm(collective, None)
        .map_err(|e| e.to_string())?;
    let avg = avg_busbw(&rows);
    if args.memory && args.device == "host" {
        let rate = super::memory::memcpy_rate(comm)?;
        if rank == 0 {
            let traffic: Vec<(usize, String, f64, super::memory::Traffic)> = rows
                .iter()
                .filter_map(|r| {
                    let t = r.memory_traffic_per_byte?;
                    Some((r.size_bytes, r.algorithm.clone(), r.out_of_place.time_us, t))
                })
                .collect();
            super::memory::print_memory(&traffic, rate);
        }
    }
    let stragglers = gather_stragglers(comm)?;
    if rank == 0 {
        super::device::print_standin(&rows);
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!("# Avg bus bandwidth    : {avg:.4}");
        let mut used: Vec<String> = (1..n)
            .filter_map(|p| comm.transport_to(p).map(|t| format!("rank {p} {t}")))
            .collect();
        used.truncate(8);
        if !used.is_empty() {
            println!("# Connections of rank 0: {}", used.join(", "));
        }
        if on_gpu {
            let mut paths: Vec<String> = (1..n)
                .filter_map(|p| comm.device_path_to(p).map(|t| format!("rank {p} {t}")))
                .collect();
            paths.truncate(8);
            if !paths.is_empty() {
                println!("# Device paths of rank 0: {}", paths.join(", "));
            }
        }
        println!("# Stragglers: {stragglers}");
        println!("#");
        if let Some(path) = &args.json {
            let report = Report {
                nranks: n,
                transport,
                rows,
                avg_busbw_gbs: avg,
                wrong: total_wrong,
            };
            let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    Ok(total_wrong)
}

/// Every rank's straggler view (each names the peers it stalls on that hardly stall
/// themselves), put together: `rank 2 (stalled on in 3% of calls, 41% of the time, a median
/// 101.2 ms each; it stalls 4% itself; seen by rank 3)`, or `none`.
fn gather_stragglers(comm: &Communicator) -> Result<String, String> {
    const MAX: usize = 8;
    const WORDS: usize = 5;
    let mut mine = [-1f32; MAX * WORDS];
    for (slot, s) in mine.chunks_mut(WORDS).zip(comm.stragglers()) {
        slot.copy_from_slice(&[
            s.rank as f32,
            s.late_share as f32,
            s.stall_share as f32,
            s.median_late_ms as f32,
            s.own_stall_share as f32,
        ]);
    }
    let mut all = vec![0f32; MAX * WORDS * comm.size()];
    comm.all_gather(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    // Per named rank: the view of the observer that stalls on it most, and every observer.
    let mut seen: std::collections::BTreeMap<usize, ([f32; WORDS], Vec<usize>)> =
        std::collections::BTreeMap::new();
    for (observer, view) in all.chunks(MAX * WORDS).enumerate() {
        for s in view.chunks(WORDS).filter(|s| s[0] >= 0.0) {
            let mut words = [0f32; WORDS];
            words.copy_from_slice(s);
            let e = seen.entry(s[0] as usize).or_insert((words, Vec::new()));
            if s[2] > e.0[2] {
                e.0 = words;
            }
            e.1.push(observer);
        }
    }
    if seen.is_empty() {
        return Ok("none".into());
    }
    Ok(seen
        .iter()
        .map(|(r, ([_, calls, time, median, own], by))| {
            let by: Vec<String> = by.iter().map(|o| o.to_string()).collect();
            format!(
                "rank {r} (stalled on in {:.0}% of calls, {:.0}% of the time, a median \
                 {median:.1} ms each; it stalls {:.0}% itself; seen by rank {})",
                100.0 * calls,
                100.0 * time,
                100.0 * own,
                by.join(",")
            )
        })
        .collect::<Vec<_>>()
        .join("; "))
}

pub(super) fn avg_busbw(rows: &[Row]) -> f64 {
    let busbws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [Some(r.out_of_place), r.in_place])
        .flatten()
        .map(|m| m.busbw_gbs)
        .collect();
    if busbws.is_empty() {
        0.0
    } else {
        busbws.iter().sum::<f64>() / busbws.len() as f64
    }
}

/// The algorithms `--algo` names for `collective` on `nranks` ranks (`None`: strata's
/// choice), in the order named: a comma-separated list of names, `auto` and `all` (every
/// algorithm that runs on that many ranks), each once; `all,auto` times every fixed algorithm
/// and then strata's choice, side by side in one run.
pub(super) fn parse_algos(
    spec: &str,
    collective: Collective,
    nranks: usize,
) -> Result<Vec<Option<Algorithm>>, String> {
    let mut out: Vec<Option<Algorithm>> = Vec::new();
    for name in spec.split(',') {
        let named = if name.eq_ignore_ascii_case("auto") {
            vec![None]
        } else if name.eq_ignore_ascii_case("all") {
            strata::algorithms::algorithms_for(collective)
                .iter()
                .copied()
                .filter(|a| a.runs_on(nranks))
                .map(Some)
                .collect()
        } else {
            vec![Some(Algorithm::parse_for(collective, name).ok_or_else(
                || {
                    format!(
                        "algorithm '{name}' cannot run {collective}; valid: auto, all, {}",
                        strata::algorithms::valid_names(collective)
                    )
                },
            )?)]
        };
        for a in named {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

/// The column headers of one table.
pub(super) fn print_columns(algo: Option<Algorithm>) {
    println!("#");
    println!(
        "# algorithm: {}",
        algo.map_or(
            "auto (strata's choice per size; see the algo column)".into(),
            |a| a.name()
        )
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "", "", "", "", "", "out-of-", "place", "", "", "in-", "place", "", ""
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}  {:>10}  algo",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "predicted"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}  {:>10}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)"
    );
}

pub(super) fn print_row(r: &Row) {
    let m = |x: &Measure| {
        format!(
            "{:>9.2} {:>7.3} {:>7.3} {:>6}",
            x.time_us, x.algbw_gbs, x.busbw_gbs, x.wrong
        )
    };
    println!(
        "  {:>10} {:>12} {:>8} {:>9} {:>5}   {}   {}  {:>10}  {}",
        r.size_bytes,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        m(&r.out_of_place),
        r.in_place
            .as_ref()
            .map_or(format!("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-"), m),
        r.predicted_us
            .map_or("-".to_string(), |p| format!("{p:.2}")),
        r.algorithm
    );
}

/// Fills a timed buffer with the checker's input values, repeated every 64 KiB, as
/// nccl-tests fills its buffers. A buffer left as allocated is read from the kernel's one
/// shared zero page, which stays in cache however large the buffer: a 2-rank ring
/// all-reduce of 4 MiB timed 361-370 µs so, and 407-450 µs with filled buffers (an
/// application's), interleaved.
fn fill_with_data(spec: &CallSpec, rank: usize, buf: &mut [u8]) {
    const PERIOD: usize = 64 << 10; // a multiple of every element size
    let first = buf.len().min(PERIOD);
    let (head, rest) = buf.split_at_mut(first);
    check::fill_input(spec, rank, head);
    for chunk in rest.chunks_mut(PERIOD) {
        chunk.copy_from_slice(&head[..chunk.len()]);
    }
}

/// One table row: out of place, then in place, then the results checked and agreed on.
pub(super) fn bench_row(
    args: &Args,
    comm: &Communicator,
    collective: Collective,
    dtype: DataType,
    op: ReduceOp,
    size: usize,
) -> Result<Row, String> {
    let (n, rank) = (comm.size(), comm.rank());
    let es = dtype.size();
    let root = args.root;
    let (count, in_bytes, out_bytes) = shape(collective, size, es, n, rank, root);
    let spec = CallSpec {
        collective,
        dtype,
        count,
        op: check::op_for_rank(op, dtype, rank),
        root,
    };
    let mut send = vec![0u8; in_bytes.max(count * es)];
    let mut recv = vec![0u8; out_bytes.max(in_bytes).max(count * es)];
    fill_with_data(&spec, rank, &mut send);
    fill_with_data(&spec, rank, &mut recv);
    // On device buffers a small call may run as one kernel instead of the algorithm's program.
    let kernel = (args.device == "cuda")
        .then(|| comm.device_kernel_for(&spec))
        .flatten();
    let mut results = [Measure::default(); 2];
    let mut standin_per_call = None;
    let modes: &[bool] = if args.no_in_place {
        &[false]
    } else {
        &[false, true]
    };
    for (k, &in_place) in modes.iter().enumerate() {
        if args.device == "cuda" {
            let (us, wrong, per_call) =
                super::device::time_on_device(args, comm, spec, in_place, in_bytes, out_bytes)?;
            if !in_place && rank == 0 {
                standin_per_call = per_call;
            }
            results[k] = aggregate(comm, collective, size, us, wrong)?;
            continue;
        }
        let once = |send: &mut [u8], recv: &mut [u8]| -> strata::Result<()> {
            if collective == Collective::Send {
                return send_recv(comm, dtype, count, send, recv);
            }
            if in_place {
                comm.call_bytes(spec, None, recv)
            } else {
                comm.call_bytes(spec, Some(&send[..in_bytes]), &mut recv[..out_bytes])
            }
        };
        // Past a near-tie trial of the size class too, so that the timed calls run its
        // winner, and past the first lap of every slot ring, so that they see the rings'
        // steady state (as a training loop does) rather than their first lap.
        let warmup = if args.warmup == 0 {
            0
        } else {
            args.warmup
                .max(comm.tuner_trial_calls(spec.collective, count * es))
                .max(comm.config().calls_to_lap_rings(n, size))
        };
        for _ in 0..warmup {
            once(&mut send, &mut recv).map_err(|e| e.to_string())?;
        }
        comm.barrier().map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        for _ in 0..args.iters {
            once(&mut send, &mut recv).map_err(|e| e.to_string())?;
        }
        let local_us = t0.elapsed().as_secs_f64() * 1e6 / args.iters.max(1) as f64;
        let mut wrong = 0u64;
        if args.check != 0 && collective != Collective::Send {
            wrong = check::run_and_check(comm, spec, in_place)
                .map_err(|e| e.to_string())?
                .wrong as u64;
        }
        results[k] = aggregate(comm, collective, size, local_us, wrong)?;
    }
    // What ran, once any near-tie trial of the size class settled.
    let algorithm = if collective == Collective::Send {
        Algorithm::Direct
    } else {
        comm.algorithm_for(collective, count * es)
    };
    Ok(Row {
        collective: collective.to_string(),
        dtype: dtype.name().into(),
        redop: if collective.reduces() {
            op.name().into()
        } else {
            "none".into()
        },
        root: if collective.rooted() { root as i64 } else { -1 },
        algorithm: kernel.map_or_else(|| algorithm.name(), str::to_string),
        tuned: false,
        predicted_us: (rank == 0 && collective != Collective::Send && kernel.is_none())
            .then(|| comm.predict(collective, algorithm, count * es).ok())
            .flatten()
            .map(|s| s * 1e6),
        size_bytes: size,
        count,
        out_of_place: results[0],
        in_place: (!args.no_in_place).then_some(results[1]),
        memory_traffic_per_byte: (args.memory && collective != Collective::Send)
            .then(|| super::memory::traffic_per_byte(comm, collective, algorithm, count, es))
            .flatten(),
        standin_per_call,
    })
}

/// The row's figures from every rank's time (the slowest counts) and wrong elements (summed).
fn aggregate(
    comm: &Communicator,
    collective: Collective,
    size: usize,
    local_us: f64,
    wrong: u64,
) -> Result<Measure, String> {
    let mut agg = [local_us, wrong as f64];
    let mut maxed = [0f64; 2];
    comm.all_reduce(&agg, &mut maxed, ReduceOp::Max)
        .map_err(|e| e.to_string())?;
    agg[1] = wrong as f64;
    let mut summed = [0f64; 2];
    comm.all_reduce(&agg, &mut summed, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let time_us = maxed[0];
    let algbw = if time_us > 0.0 {
        size as f64 / (time_us * 1e-6) / 1e9
    } else {
        0.0
    };
    Ok(Measure {
        time_us,
        algbw_gbs: algbw,
        busbw_gbs: algbw * bus_factor(collective, comm.size()),
        wrong: summed[1] as u64,
    })
}

/// The send/recv benchmark: ranks pair up (0↔1, 2↔3, ...), an odd last rank sits out.
pub(super) fn send_recv(
    comm: &Communicator,
    dtype: DataType,
    count: usize,
    send: &[u8],
    recv: &mut [u8],
) -> strata::Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    let peer = rank ^ 1;
    if peer >= n {
        return Ok(());
    }
    let bytes = count * dtype.size();
    // Lower rank sends first; the pair never both block on a send.
    let (s, r) = (&send[..bytes], &mut recv[..bytes]);
    if rank < peer {
        comm.send(s, peer)?;
        comm.recv(r, peer)
    } else {
        comm.recv(r, peer)?;
        comm.send(s, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page of a timed buffer holds the checker's inputs, not zeros: the first 64 KiB
    /// as `fill_input` writes them, and the rest repeating them.
    #[test]
    fn timed_buffers_hold_the_inputs_on_every_page() {
        let spec = CallSpec {
            collective: Collective::AllReduce,
            dtype: DataType::Float32,
            count: 50_000,
            op: ReduceOp::Sum,
            root: 0,
        };
        let mut buf = vec![0u8; 200_000];
        fill_with_data(&spec, 1, &mut buf);
        let mut head = vec![0u8; 64 << 10];
        check::fill_input(&spec, 1, &mut head);
        assert_eq!(&buf[..head.len()], &head[..]);
        for (k, chunk) in buf.chunks(head.len()).enumerate() {
            assert_eq!(chunk, &head[..chunk.len()], "chunk {k}");
        }
        assert!(
            buf.chunks(4096).all(|page| page.iter().any(|&b| b != 0)),
            "a page left zero"
        );
    }
}
