//! strata's low-latency kernels (`src/gpu/kernels/ll.cu`), compiled as C for the host by the
//! CUDA stand-in, run against each other by threads on plain memory: the LL protocol (lines
//! whose flags carry the call number, areas by parity, the arrive words that keep a rank from
//! overwriting an area its peer still reads) and the arithmetic, for every collective the
//! kernels serve, every type and operator, in and out of place, at 2 to 5 ranks. The calls
//! follow each other without any other synchronisation, so every area is reused many times
//! while peers are one call behind or ahead. Results are checked as every strata test checks
//! them (`strata::check`). What this proves is the protocol's logic, not GPU speed.

mod common;

use std::ffi::c_void;
use strata::{CallSpec, Collective, DataType, ReduceOp, check};
use strata_cuda_standin as _; // links the host kernels

#[repr(C)]
struct LlEntry {
    name: *const std::ffi::c_char,
    fn_: *const c_void,
    args: i32,
}

unsafe extern "C" {
    static strata_ll_table: [LlEntry; 3];
}

/// `strata_ll_args`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Args {
    input: u64,
    output: u64,
    in_bytes: u64,
    out_bytes: u64,
    count: u64,
    bases: u64,
    abort_word: u64,
    scalar: u64,
    ll_off: u64,
    ll_stride: u64,
    rank: u32,
    nranks: u32,
    root: u32,
    seq: u32,
    wait_for: u32,
    coll: u32,
    op: u32,
    flags: u32,
    call_off: u32,
    arrive_off: u32,
    expect_off: u32,
    es: u32,
    dtype: u32,
    digest: u32,
    sig_off: u32,
    pad: u32,
    header: [u32; 8],
}

type Kernel = unsafe extern "C" fn(*const Args, extern "C" fn(u64, u64) -> *mut c_void);

/// Device addresses are host addresses here.
extern "C" fn identity(addr: u64, _len: u64) -> *mut c_void {
    addr as *mut c_void
}

fn kernel(name: &str) -> Kernel {
    // SAFETY: a static table ending with a NULL name.
    let table = unsafe { &strata_ll_table };
    let e = table
        .iter()
        .take_while(|e| !e.name.is_null())
        // SAFETY: NUL-terminated static strings.
        .find(|e| unsafe { std::ffi::CStr::from_ptr(e.name) }.to_str() == Ok(name))
        .unwrap_or_else(|| panic!("no kernel {name}"));
    assert_eq!(
        e.args as usize,
        std::mem::size_of::<Args>(),
        "strata_ll_args and this test disagree on its size"
    );
    // SAFETY: the low-latency kernels' host versions have this signature.
    unsafe { std::mem::transmute::<*const c_void, Kernel>(e.fn_) }
}

const FLAG_AREA: u64 = 4096;
/// Where the senders' (call number, digest) pairs start in a program buffer.
const SIG_OFF: u32 = 1024;

/// Every rank's program buffer: a flag area, then an area of `stride` bytes per sending rank
/// and parity, zeroed as the runtime zeroes them; addressed through `bases`.
struct Buffers {
    _memory: Vec<Vec<u64>>,
    bases: Vec<u64>,
    stride: u64,
}

impl Buffers {
    fn new(p: usize, stride: u64) -> Self {
        let words = (FLAG_AREA + 2 * p as u64 * stride) as usize / 8;
        let memory: Vec<Vec<u64>> = (0..p).map(|_| vec![0u64; words]).collect();
        let bases = memory.iter().map(|b| b.as_ptr() as u64).collect();
        Self {
            _memory: memory,
            bases,
            stride,
        }
    }

    /// What every call of rank `rank` shares: the layout, call `seq` (after call `seq - 1`),
    /// the abort word at `abort`, and a digest every rank agrees on unless a test says not.
    fn args(&self, rank: usize, seq: u32, abort: u64) -> Args {
        Args {
            bases: self.bases.as_ptr() as u64,
            abort_word: abort,
            ll_off: FLAG_AREA,
            ll_stride: self.stride,
            rank: rank as u32,
            nranks: self.bases.len() as u32,
            seq,
            wait_for: seq - 1,
            arrive_off: 64,
            expect_off: 64 + 4 * 64,
            digest: 1,
            sig_off: SIG_OFF,
            ..Args::default()
        }
    }

    /// A word of rank `r`'s flag area.
    fn word(&self, r: usize, offset: usize) -> u32 {
        // SAFETY: within the buffer; read when no kernel writes it any more.
        unsafe { *(self.bases[r] as *const u32).add(offset / 4) }
    }
}

/// One call of the matrix: what every rank runs.
#[derive(Clone, Copy)]
struct Case {
    spec: CallSpec,
    in_place: bool,
    two_shot: bool,
}

fn cases(p: usize) -> Vec<Case> {
    let kernels = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce,
        Collective::AllGather,
        Collective::Broadcast,
    ];
    let mut out = Vec::new();
    common::gpu::for_each_matrix_call(p, &[1, 3, 37, 1000], |spec, in_place, _| {
        if !kernels.contains(&spec.collective) {
            return;
        }
        let shots: &[bool] = if spec.collective == Collective::AllReduce {
            &[false, true]
        } else {
            &[false]
        };
        for &two_shot in shots {
            out.push(Case {
                spec,
                in_place,
                two_shot,
            });
        }
    });
    out
}

/// Runs the matrix on `p` threads; returns the failures.
fn run(p: usize) -> Vec<String> {
    // 8 KB of payload per area: 1,000 f64.
    let buffers = Buffers::new(p, 2 * 16 * 1000);
    let abort = [0u32; 1];
    let abort_addr = abort.as_ptr() as u64;
    let reduce = kernel("strata_ll_reduce");
    let copy = kernel("strata_ll_copy");
    let cases = cases(p);
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..p)
            .map(|rank| {
                let (cases, buffers) = (&cases, &buffers);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for (i, case) in cases.iter().enumerate() {
                        let call = i as u64 + 1;
                        let spec = CallSpec {
                            op: check::op_for_rank(case.spec.op, case.spec.dtype, rank),
                            ..case.spec
                        };
                        let es = spec.dtype.size();
                        let (ie, oe) = spec.collective.buffer_elems(spec.count, p, rank, spec.root);
                        let (ib, ob) = (ie * es, oe * es);
                        let (ioff, ooff) = spec.in_place_offsets(rank);
                        let whole = (ioff + ib).max(ooff + ob);
                        let mut mem = vec![0xA5u8; if case.in_place { whole } else { ib + ob }];
                        let (input, output) = if case.in_place { (ioff, ooff) } else { (0, ib) };
                        check::fill_input(&spec, rank, &mut mem[input..input + ib]);
                        let base = mem.as_mut_ptr() as u64;
                        let (coll, k) = match (spec.collective, case.two_shot) {
                            (Collective::AllReduce, false) => (0, reduce),
                            (Collective::AllReduce, true) => (1, reduce),
                            (Collective::ReduceScatter, _) => (2, reduce),
                            (Collective::Reduce, _) => (3, reduce),
                            (Collective::AllGather, _) => (4, copy),
                            _ => (5, copy),
                        };
                        let (op, flags, scalar) = match spec.op {
                            ReduceOp::Avg => (0, 1, 0),
                            ReduceOp::PreMulSum(s) => (0, 2, u64::from_le_bytes(s.bytes)),
                            other => (u32::from(other.code()), 0, 0),
                        };
                        let args = Args {
                            input: base + input as u64,
                            output: base + output as u64,
                            in_bytes: ib as u64,
                            out_bytes: ob as u64,
                            count: spec.count as u64,
                            scalar,
                            root: spec.root as u32,
                            coll,
                            op,
                            flags,
                            es: es as u32,
                            dtype: spec.dtype as u32,
                            digest: 0x5eed_0000 + i as u32,
                            header: [call as u32, 0, 0, 0, 0, 0, 0, 0],
                            ..buffers.args(rank, call as u32, abort_addr)
                        };
                        // SAFETY: every address in `args` is live memory of the lengths given,
                        // and every rank runs the same calls in the same order.
                        unsafe { k(&args, identity) };
                        let what = format!(
                            "{} {} {} {} in_place {} two_shot {}",
                            spec.collective,
                            spec.dtype,
                            case.spec.op,
                            spec.count,
                            case.in_place,
                            case.two_shot
                        );
                        let got = &mem[output..output + ob];
                        let c = check::compare(&spec, p, rank, got);
                        if let Some(first) = c.first {
                            failures.push(format!("rank {rank}: {what}: {first:?}"));
                        }
                    }
                    failures
                })
            })
            .collect();
        ranks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn low_latency_kernels_are_right_for_every_collective_type_and_operator_at_2_to_5_ranks() {
    for p in 2..=5 {
        let failures = run(p);
        assert!(
            failures.is_empty(),
            "{p} ranks: {} failures:\n{}",
            failures.len(),
            failures[..failures.len().min(20)].join("\n")
        );
    }
}

/// A rank that waits for a peer that never comes gives up when the abort word is set, as the
/// monitor sets it after a fault.
#[test]
fn a_kernel_waiting_on_a_peer_returns_when_the_abort_word_is_set() {
    let buffers = Buffers::new(2, 2 * 16 * 64);
    let abort = std::sync::atomic::AtomicU32::new(0);
    let mut data = vec![1u8; 64];
    let args = Args {
        input: data.as_mut_ptr() as u64,
        output: data.as_mut_ptr() as u64,
        in_bytes: 64,
        out_bytes: 64,
        count: 16,
        es: 4,
        dtype: DataType::Float32 as u32,
        ..buffers.args(0, 1, abort.as_ptr() as u64)
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: live memory of the lengths given; rank 1 never runs.
            unsafe { kernel("strata_ll_reduce")(&args, identity) };
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !done.load(std::sync::atomic::Ordering::Acquire),
            "returned without its peer's data"
        );
        abort.store(1, std::sync::atomic::Ordering::Release);
        let t = std::time::Instant::now();
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            assert!(t.elapsed().as_secs() < 5, "did not see the abort word");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    // The kernel announced its call: what it waits for, its arrival at rank 1.
    assert_eq!(
        buffers.word(0, 64 + 4 * 64 + 4),
        1,
        "rank 0 expects rank 1 at call 1"
    );
    assert_eq!(
        buffers.word(1, 64),
        1,
        "rank 0 arrived at call 1 in rank 1's words"
    );
}

/// A broadcast root has nothing to receive, so nothing but the arrive words keeps it from
/// running calls ahead of a slow rank: it must wait before it writes an area the slow rank has
/// not read yet. Rank 1 sleeps before each of 12 calls; every call must deliver its own data.
#[test]
fn a_root_that_runs_ahead_never_overwrites_lines_a_slow_rank_has_not_read() {
    let (p, count) = (2usize, 32usize);
    let buffers = Buffers::new(p, 2 * 16 * 64);
    let abort = std::sync::atomic::AtomicU32::new(0);
    let copy = kernel("strata_ll_copy");
    let calls = 12u32;
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..p)
            .map(|rank| {
                let (buffers, abort) = (&buffers, &abort);
                s.spawn(move || {
                    let mut got = Vec::new();
                    for call in 1..=calls {
                        let mut data = vec![if rank == 0 { call as u8 } else { 0 }; count];
                        if rank == 1 {
                            std::thread::sleep(std::time::Duration::from_millis(15));
                        }
                        let args = Args {
                            input: data.as_mut_ptr() as u64,
                            output: data.as_mut_ptr() as u64,
                            in_bytes: if rank == 0 { count as u64 } else { 0 },
                            out_bytes: count as u64,
                            count: count as u64,
                            coll: 5,
                            es: 1,
                            ..buffers.args(rank, call, abort.as_ptr() as u64)
                        };
                        // SAFETY: live memory of the lengths given.
                        unsafe { copy(&args, identity) };
                        got.push(data[0]);
                    }
                    got
                })
            })
            .collect();
        // A rank stuck on lines that were overwritten would wait for ever: give up after 10 s.
        let t = std::time::Instant::now();
        while ranks.iter().any(|h| !h.is_finished()) && t.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        abort.store(1, std::sync::atomic::Ordering::Release);
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let want: Vec<u8> = (1..=calls as u8).collect();
    assert_eq!(results[1], want, "rank 1 missed or mixed up calls");
}

/// Two ranks whose calls differ (here: in their digest, as when one asks for twice the
/// elements) take none of each other's lines: both wait, until the abort word, instead of
/// finishing with the other's data.
#[test]
fn ranks_whose_calls_differ_take_none_of_each_others_lines() {
    let p = 2;
    let buffers = Buffers::new(p, 2 * 16 * 64);
    let abort = std::sync::atomic::AtomicU32::new(0);
    let reduce = kernel("strata_ll_reduce");
    let outs = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..p)
            .map(|rank| {
                let (buffers, abort) = (&buffers, &abort);
                s.spawn(move || {
                    let mut data = vec![(rank + 1) as u8; 16];
                    let args = Args {
                        input: data.as_mut_ptr() as u64,
                        output: data.as_mut_ptr() as u64,
                        in_bytes: 16,
                        out_bytes: 16,
                        count: 16,
                        es: 1,
                        dtype: DataType::Uint8 as u32,
                        digest: 100 + rank as u32,
                        ..buffers.args(rank, 1, abort.as_ptr() as u64)
                    };
                    // SAFETY: live memory of the lengths given.
                    unsafe { reduce(&args, identity) };
                    data
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            ranks.iter().all(|h| !h.is_finished()),
            "a rank finished a call its peer did not make"
        );
        abort.store(1, std::sync::atomic::Ordering::Release);
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    // Neither took the other's lines: each buffer still holds its own input.
    assert_eq!(outs[0], vec![1u8; 16]);
    assert_eq!(outs[1], vec![2u8; 16]);
}
