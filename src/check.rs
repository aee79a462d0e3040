//! Deterministic inputs and their expected results, for collbench's `-c` and for tests.
//!
//! Inputs are small integers chosen so that every partial result of every algorithm is exactly
//! representable in the element type (fp8 included); only `avg` rounds, once, and is compared
//! with a tolerance of a couple of units in the last place of the type. Everything else must
//! match exactly.

use crate::comm::{CallSpec, Communicator};
use crate::dtype::{DataType, ReduceOp, Scalar};
use crate::reduce::{element_as_f64, scalar_from_f64, set_element_from_f64};
use strata_algorithms::Collective;

/// The scalar rank `rank` passes to a pre-multiplied sum in tests: 1, 2 or 3.
pub fn premul_scalar(dtype: DataType, rank: usize) -> Scalar {
    scalar_from_f64(dtype, (1 + rank % 3) as f64)
}

/// The op a rank uses: for `PreMulSum` its own scalar ([`premul_scalar`]), otherwise `op`.
pub fn op_for_rank(op: ReduceOp, dtype: DataType, rank: usize) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) => ReduceOp::PreMulSum(premul_scalar(dtype, rank)),
        other => other,
    }
}

fn is_fp8(d: DataType) -> bool {
    matches!(d, DataType::Float8E4M3 | DataType::Float8E5M2)
}

fn signed(d: DataType) -> bool {
    !matches!(d, DataType::Uint8 | DataType::Uint32 | DataType::Uint64)
}

/// Input element `i` of `rank` for a call of `spec`.
pub fn input_value(spec: &CallSpec, rank: usize, i: usize) -> f64 {
    let d = spec.dtype;
    let (r, i) = (rank as i64, i as i64);
    if !spec.collective.reduces() {
        // Distinct small values that show a misplaced block.
        let v = (r * 31 + i * 7) % 61 - 30;
        return if signed(d) { v as f64 } else { (v + 30) as f64 };
    }
    match spec.op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
            if is_fp8(d) && (r + i) % 4 != 0 {
                return 0.0; // keep fp8 sums within its exact integers
            }
            let v = (r + i) % 3;
            if signed(d) { (v - 1) as f64 } else { v as f64 }
        }
        ReduceOp::Prod => {
            if (r + 2 * i) % 5 == 0 {
                2.0
            } else if signed(d) && (r + i) % 7 == 3 {
                -1.0
            } else {
                1.0
            }
        }
        ReduceOp::Min | ReduceOp::Max => {
            let v = (r * 7 + i * 13) % 17;
            if signed(d) { (v - 8) as f64 } else { v as f64 }
        }
    }
}

/// How often a rank's inputs repeat: [`input_value`] of element `i` is that of `i % period`.
/// Inputs, and so expected outputs, are built and checked one period at a time.
fn period(spec: &CallSpec) -> usize {
    if !spec.collective.reduces() {
        return 61;
    }
    match spec.op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
            if is_fp8(spec.dtype) {
                12
            } else {
                3
            }
        }
        ReduceOp::Prod => 35,
        ReduceOp::Min | ReduceOp::Max => 17,
    }
}

/// Fills `buf` (the rank's input, `dtype` elements) with [`input_value`]: one period
/// converted, the rest copied from it.
pub fn fill_input(spec: &CallSpec, rank: usize, buf: &mut [u8]) {
    let es = spec.dtype.size();
    let end = buf.len() / es * es;
    let first = period(spec).min(end / es);
    for i in 0..first {
        set_element_from_f64(spec.dtype, buf, i, input_value(spec, rank, i));
    }
    // Whole periods double until the buffer is full.
    let mut filled = first * es;
    while filled < end {
        let m = filled.min(end - filled);
        buf.copy_within(0..m, filled);
        filled += m;
    }
}

fn stored(d: DataType, v: f64) -> f64 {
    let s = scalar_from_f64(d, v);
    element_as_f64(d, s.as_bytes(), 0)
}

fn reduce_expected(spec: &CallSpec, nranks: usize, i: usize) -> f64 {
    let d = spec.dtype;
    let vals = (0..nranks).map(|r| stored(d, input_value(spec, r, i)));
    match spec.op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Avg => {
            let s: f64 = vals.sum();
            if d.is_float() {
                s / nranks as f64
            } else {
                (s / nranks as f64).trunc()
            }
        }
        ReduceOp::PreMulSum(_) => (0..nranks)
            .map(|r| {
                stored(d, input_value(spec, r, i))
                    * element_as_f64(d, premul_scalar(d, r).as_bytes(), 0)
            })
            .sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    }
}

/// A stretch of a rank's output: `len` elements whose expected values are those of input
/// element `start` on, of rank `src` (a copy) or of every rank reduced (`src` unused).
struct Run {
    src: usize,
    start: usize,
    len: usize,
}

/// The stretches of `rank`'s output, in order (none where the rank has no output to check).
fn output_runs(spec: &CallSpec, nranks: usize, rank: usize) -> Vec<Run> {
    let n = spec.count;
    let one = |src, start| vec![Run { src, start, len: n }];
    let each = |start| (0..nranks).map(|src| Run { src, start, len: n }).collect();
    match spec.collective {
        Collective::AllReduce => one(0, 0),
        Collective::Reduce if rank == spec.root => one(0, 0),
        Collective::ReduceScatter => one(0, rank * n),
        Collective::Broadcast => one(spec.root, 0),
        Collective::AllGather => each(0),
        Collective::Gather if rank == spec.root => each(0),
        Collective::AllToAll => each(rank * n),
        Collective::Scatter => one(spec.root, rank * n),
        _ => Vec::new(),
    }
}

/// The expected values of one period of a run from `src` (exact, before storing in the type).
fn period_values(spec: &CallSpec, nranks: usize, src: usize) -> Vec<f64> {
    (0..period(spec))
        .map(|i| {
            if spec.collective.reduces() {
                reduce_expected(spec, nranks, i)
            } else {
                stored(spec.dtype, input_value(spec, src, i))
            }
        })
        .collect()
}

/// Expected output elements of `rank` (empty where the rank has no output to check).
pub fn expected_output(spec: &CallSpec, nranks: usize, rank: usize) -> Vec<f64> {
    let p = period(spec);
    let mut out = Vec::new();
    for run in output_runs(spec, nranks, rank) {
        let values = period_values(spec, nranks, run.src);
        out.extend((run.start..run.start + run.len).map(|i| values[i % p]));
    }
    out
}

/// Allowed distance between an `avg` result and the exact mean.
fn tolerance(d: DataType, expect: f64) -> f64 {
    let eps = match d {
        DataType::Float64 => 1e-12,
        DataType::Float32 => 1e-6,
        DataType::Float16 => 2f64.powi(-10),
        DataType::Bfloat16 => 2f64.powi(-7),
        DataType::Float8E4M3 => 2f64.powi(-3),
        DataType::Float8E5M2 => 2f64.powi(-2),
        _ => 0.0,
    };
    eps * expect.abs().max(1.0)
}

/// Whether `spec`'s results round (a floating-point `avg`), and so are compared within
/// [`tolerance`] rather than exactly.
fn inexact(spec: &CallSpec) -> bool {
    spec.collective.reduces() && spec.op == ReduceOp::Avg && spec.dtype.is_float()
}

fn element_ok(spec: &CallSpec, got: f64, expect: f64) -> bool {
    if inexact(spec) {
        (got - expect).abs() <= tolerance(spec.dtype, expect)
    } else {
        got == stored(spec.dtype, expect)
    }
}

/// Compares `out` (the rank's output bytes) with [`expected_output`] in one pass; missing
/// elements count as wrong. Exact results are compared a run of whole periods at a time as
/// bytes, and element by element (as numbers, so `-0` equals `0`) only where the bytes differ.
pub fn compare(spec: &CallSpec, nranks: usize, rank: usize, out: &[u8]) -> Checked {
    let d = spec.dtype;
    let es = d.size();
    let p = period(spec);
    // Elements per byte comparison: whole periods, about 256 elements.
    let stretch = p * 256usize.div_ceil(p);
    let runs = output_runs(spec, nranks, rank);
    let have = out.len() / es;
    let mut checked = Checked {
        wrong: runs
            .iter()
            .map(|r| r.len)
            .sum::<usize>()
            .saturating_sub(have),
        first: None,
    };
    let mut at = 0;
    for run in runs {
        let len = run.len.min(have.saturating_sub(at));
        let values = period_values(spec, nranks, run.src);
        let mut check_one = |k: usize, want: f64| {
            let got = element_as_f64(d, out, k);
            if !element_ok(spec, got, want) {
                checked.wrong += 1;
                checked.first.get_or_insert((k, got, want));
            }
        };
        if inexact(spec) {
            for j in 0..len {
                check_one(at + j, values[(run.start + j) % p]);
            }
        } else {
            // Two stretches of expected bytes, so that one can start at any phase.
            let mut pattern = vec![0u8; 2 * stretch * es];
            for e in 0..2 * stretch {
                set_element_from_f64(d, &mut pattern, e, values[e % p]);
            }
            let mut j = 0;
            while j < len {
                let phase = (run.start + j) % p;
                let m = stretch.min(len - j);
                let k = at + j;
                if out[k * es..(k + m) * es] != pattern[phase * es..(phase + m) * es] {
                    for e in 0..m {
                        check_one(k + e, values[(phase + e) % p]);
                    }
                }
                j += m;
            }
        }
        at += run.len;
    }
    checked
}

/// What one checked call found.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// Wrong output elements.
    pub wrong: usize,
    /// The first wrong element: (index, got, expected).
    pub first: Option<(usize, f64, f64)>,
}

/// Runs `spec` once on `comm` with this rank's checked inputs — out of place, or in place at
/// NCCL's in-place position — and compares the output with [`expected_output`]. A
/// `PreMulSum` takes this rank's own scalar ([`premul_scalar`]).
pub fn run_and_check(
    comm: &Communicator,
    spec: CallSpec,
    in_place: bool,
) -> crate::Result<Checked> {
    let (n, rank) = (comm.size(), comm.rank());
    let spec = CallSpec {
        op: op_for_rank(spec.op, spec.dtype, rank),
        ..spec
    };
    let es = spec.dtype.size();
    let (ilen, olen) = spec.collective.buffer_elems(spec.count, n, rank, spec.root);
    let (ib, ob) = (ilen * es, olen * es);
    // Outputs start as a pattern no correct result leaves behind by chance everywhere.
    let out = if in_place {
        let (ioff, ooff) = spec.in_place_offsets(rank);
        let mut buf = vec![0xA5u8; (ioff + ib).max(ooff + ob)];
        fill_input(&spec, rank, &mut buf[ioff..ioff + ib]);
        comm.call_bytes(spec, None, &mut buf)?;
        buf.drain(ooff..ooff + ob).collect::<Vec<u8>>()
    } else {
        let mut send = vec![0u8; ib];
        fill_input(&spec, rank, &mut send);
        let mut recv = vec![0xA5u8; ob];
        comm.call_bytes(spec, Some(&send), &mut recv)?;
        recv
    };
    Ok(compare(&spec, n, rank, &out))
}

/// Runs `spec` on device buffers of `device` (allocated here), enqueued on `stream`, with
/// every rank's input filled as [`fill_input`] fills it, and checks this rank's output.
pub fn run_and_check_device(
    comm: &Communicator,
    spec: CallSpec,
    in_place: bool,
    stream: &crate::gpu::Stream,
    device: i32,
) -> crate::Result<Checked> {
    use crate::gpu::DeviceBuffer;
    let (ib, ob) = device_bytes(comm, &spec);
    let whole = ib + ob + spec.count * spec.dtype.size() * comm.size();
    let send = DeviceBuffer::alloc(device, whole.max(1))?;
    let recv = DeviceBuffer::alloc(device, whole.max(1))?;
    run_and_check_device_in(comm, spec, in_place, stream, &send, &recv)
}

/// Bytes this rank's input and output of `spec` take.
fn device_bytes(comm: &Communicator, spec: &CallSpec) -> (usize, usize) {
    let es = spec.dtype.size();
    let (ilen, olen) =
        spec.collective
            .buffer_elems(spec.count, comm.size(), comm.rank(), spec.root);
    (ilen * es, olen * es)
}

/// [`run_and_check_device`] in buffers the caller made (`recv` alone when in place), each at
/// least as large as the call needs: what ranks that share a process use, since allocating
/// device memory synchronises with the device, and a rank that allocates while a peer's call
/// waits on it would wait for ever (NCCL documents the same for its threads).
pub fn run_and_check_device_in(
    comm: &Communicator,
    spec: CallSpec,
    in_place: bool,
    stream: &crate::gpu::Stream,
    send: &crate::gpu::DeviceBuffer,
    recv: &crate::gpu::DeviceBuffer,
) -> crate::Result<Checked> {
    use crate::gpu::DeviceBuffer;
    let (n, rank) = (comm.size(), comm.rank());
    let spec = CallSpec {
        op: op_for_rank(spec.op, spec.dtype, rank),
        ..spec
    };
    let (ib, ob) = device_bytes(comm, &spec);
    let out = if in_place {
        let (ioff, ooff) = spec.in_place_offsets(rank);
        let mut host = vec![0xA5u8; (ioff + ib).max(ooff + ob)];
        fill_input(&spec, rank, &mut host[ioff..ioff + ib]);
        if recv.len() < host.len() {
            return Err(crate::Error::InvalidArgument(format!(
                "the in-place buffer holds {} bytes; the call needs {}",
                recv.len(),
                host.len()
            )));
        }
        // SAFETY: the start of `recv`, which is at least this long (checked above).
        let buf = unsafe { DeviceBuffer::borrowed(recv.ptr(), host.len(), recv.device()) };
        buf.upload(&host, stream)?;
        comm.call_device(spec, None, &buf, stream)?;
        buf.download(&mut host, stream)?;
        host.drain(ooff..ooff + ob).collect::<Vec<u8>>()
    } else {
        let mut send_host = vec![0u8; ib];
        fill_input(&spec, rank, &mut send_host);
        // SAFETY: the starts of the caller's buffers, at least this long (checked below).
        let (s, r) = unsafe {
            (
                DeviceBuffer::borrowed(send.ptr(), ib.min(send.len()), send.device()),
                DeviceBuffer::borrowed(recv.ptr(), ob.min(recv.len()), recv.device()),
            )
        };
        s.upload(&send_host, stream)?;
        let mut recv_host = vec![0xA5u8; ob];
        r.upload(&recv_host, stream)?;
        comm.call_device(spec, Some(&s), &r, stream)?;
        r.download(&mut recv_host, stream)?;
        recv_host
    };
    if let Some(e) = comm.async_error() {
        return Err(e);
    }
    Ok(compare(&spec, n, rank, &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_values_are_exact_in_every_type() {
        // The expected sum of 8 ranks must be representable exactly, so that "exact" checks
        // are fair to every algorithm.
        for d in DataType::ALL {
            for op in [
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::PreMulSum(premul_scalar(d, 0)),
            ] {
                let spec = CallSpec {
                    op,
                    ..CallSpec::new(Collective::AllReduce, d, 64)
                };
                for e in expected_output(&spec, 8, 0) {
                    assert_eq!(stored(d, e), e, "{d} {op}: {e} is not exact");
                }
            }
        }
    }

    #[test]
    fn inputs_repeat_with_their_period_and_fill_writes_them() {
        for c in [Collective::AllReduce, Collective::AllGather] {
            for d in DataType::ALL {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Prod, ReduceOp::Max] {
                    let spec = CallSpec {
                        op,
                        ..CallSpec::new(c, d, 0)
                    };
                    let p = period(&spec);
                    for rank in 0..9 {
                        for i in 0..4 * p + 5 {
                            let (a, b) =
                                (input_value(&spec, rank, i), input_value(&spec, rank, i % p));
                            assert_eq!(a, b, "{c} {d} {op} rank {rank} element {i}");
                        }
                        // Not a whole number of periods, and a part of an element after it.
                        let count = 3 * p + 2;
                        let mut buf = vec![0x5Au8; (count + 1) * d.size() - 1];
                        fill_input(&spec, rank, &mut buf);
                        for i in 0..count {
                            assert_eq!(
                                element_as_f64(d, &buf, i),
                                stored(d, input_value(&spec, rank, i))
                            );
                        }
                        assert!(
                            buf[count * d.size()..].iter().all(|&b| b == 0x5A),
                            "a byte past the last element"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn compare_finds_each_wrong_element_wherever_it_lies() {
        // Runs from every source, at phases that are not multiples of the period, longer than
        // one byte-compared stretch.
        for (c, d) in [
            (Collective::AllGather, DataType::Float16),
            (Collective::AllToAll, DataType::Int8),
            (Collective::ReduceScatter, DataType::Float32),
            (Collective::Scatter, DataType::Uint64),
        ] {
            let spec = CallSpec {
                root: 2,
                ..CallSpec::new(c, d, 700)
            };
            let (nranks, rank) = (5, 3);
            let want = expected_output(&spec, nranks, rank);
            let mut out = vec![0u8; want.len() * d.size()];
            for (i, e) in want.iter().enumerate() {
                set_element_from_f64(d, &mut out, i, *e);
            }
            assert_eq!(compare(&spec, nranks, rank, &out).wrong, 0, "{c} {d}");
            let bad: std::collections::BTreeSet<usize> =
                [0, 699, 700, want.len() / 2, want.len() - 1]
                    .into_iter()
                    .filter(|&i| i < want.len())
                    .collect();
            let mut wrong = out.clone();
            for &i in &bad {
                set_element_from_f64(d, &mut wrong, i, 77.0);
            }
            let got = compare(&spec, nranks, rank, &wrong);
            let bad_here = bad.iter().filter(|&&i| want[i] != 77.0).count();
            assert_eq!(
                (got.wrong, got.first.map(|w| w.0)),
                (bad_here, Some(0)),
                "{c} {d}"
            );
        }
        // A zero of the other sign is the same number.
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 9);
        let want = expected_output(&spec, 2, 0);
        let mut out = vec![0u8; 36];
        for (i, e) in want.iter().enumerate() {
            set_element_from_f64(
                DataType::Float32,
                &mut out,
                i,
                if *e == 0.0 { -0.0 } else { *e },
            );
        }
        assert!(want.contains(&0.0));
        assert_eq!(compare(&spec, 2, 0, &out).wrong, 0);
    }

    #[test]
    fn a_wrong_element_is_counted() {
        let spec = CallSpec::new(Collective::AllReduce, DataType::Int32, 4);
        let mut out = vec![0u8; 16];
        for (i, e) in expected_output(&spec, 3, 0).iter().enumerate() {
            set_element_from_f64(DataType::Int32, &mut out, i, *e);
        }
        assert_eq!(
            compare(&spec, 3, 0, &out),
            Checked {
                wrong: 0,
                first: None
            }
        );
        set_element_from_f64(DataType::Int32, &mut out, 2, 99.0);
        set_element_from_f64(DataType::Int32, &mut out, 3, 98.0);
        let c = compare(&spec, 3, 0, &out);
        assert_eq!((c.wrong, c.first.map(|w| w.0)), (2, Some(2)));
        // Elements 0 and 1 are present and right; 2 and 3 are missing.
        assert_eq!(
            compare(&spec, 3, 0, &out[..8]).wrong,
            2,
            "missing elements are wrong"
        );
    }
}
