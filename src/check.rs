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

/// Fills `buf` (the rank's input, `dtype` elements) with [`input_value`].
pub fn fill_input(spec: &CallSpec, rank: usize, buf: &mut [u8]) {
    for i in 0..buf.len() / spec.dtype.size() {
        set_element_from_f64(spec.dtype, buf, i, input_value(spec, rank, i));
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

/// Expected output elements of `rank` (empty where the rank has no output to check).
pub fn expected_output(spec: &CallSpec, nranks: usize, rank: usize) -> Vec<f64> {
    let n = spec.count;
    let d = spec.dtype;
    let copy = |src_rank: usize, idx: usize| stored(d, input_value(spec, src_rank, idx));
    match spec.collective {
        Collective::AllReduce => (0..n).map(|i| reduce_expected(spec, nranks, i)).collect(),
        Collective::Reduce if rank == spec.root => {
            (0..n).map(|i| reduce_expected(spec, nranks, i)).collect()
        }
        Collective::ReduceScatter => (0..n)
            .map(|i| reduce_expected(spec, nranks, rank * n + i))
            .collect(),
        Collective::Broadcast => (0..n).map(|i| copy(spec.root, i)).collect(),
        Collective::AllGather => (0..nranks * n).map(|k| copy(k / n, k % n)).collect(),
        Collective::Gather if rank == spec.root => {
            (0..nranks * n).map(|k| copy(k / n, k % n)).collect()
        }
        Collective::AllToAll => (0..nranks * n)
            .map(|k| copy(k / n, rank * n + k % n))
            .collect(),
        Collective::Scatter => (0..n).map(|i| copy(spec.root, rank * n + i)).collect(),
        _ => Vec::new(),
    }
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

fn element_ok(spec: &CallSpec, got: f64, expect: f64) -> bool {
    let inexact = spec.collective.reduces() && spec.op == ReduceOp::Avg && spec.dtype.is_float();
    if inexact {
        (got - expect).abs() <= tolerance(spec.dtype, expect)
    } else {
        got == stored(spec.dtype, expect)
    }
}

/// Compares `out` (the rank's output bytes) with [`expected_output`] in one pass; missing
/// elements count as wrong.
pub fn compare(spec: &CallSpec, nranks: usize, rank: usize, out: &[u8]) -> Checked {
    let expect = expected_output(spec, nranks, rank);
    let have = out.len() / spec.dtype.size();
    let mut checked = Checked {
        wrong: expect.len().saturating_sub(have),
        first: None,
    };
    for (i, e) in expect.iter().take(have).enumerate() {
        let got = element_as_f64(spec.dtype, out, i);
        if !element_ok(spec, got, *e) {
            checked.wrong += 1;
            checked.first.get_or_insert((i, got, *e));
        }
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
