//! The kernel path: a small or medium collective among the ranks of one host as one launch of
//! a low-latency kernel (`gpu/kernels/ll.cu`) instead of a stream program. Each stream-program
//! step costs the GPU's front end a few microseconds before data moves (a wait, a copy, a
//! write: about 4.5 us on an H200), so below some size one kernel that writes NCCL-style LL
//! lines straight into the peers' buffers and polls its own is faster; above it, the copy
//! engines and the schedule's bandwidth win. Where that crossover lies depends on the machine,
//! so every communicator measures it at bind (all-reduce, one-shot and two-shot kernels
//! against the stream program the tuner would run, a few calls per size) and every rank takes
//! the same answer; `Communicator::explain` shows it.
//!
//! A kernel call enqueues no stream memory operation: the kernel itself writes the call's
//! header and the arrivals it waits for into the flag area, where the monitor's diagnosis
//! reads them, and gives up its waits when the monitor sets the abort word after a fault.

use super::*;
use crate::gpu::kernels::{LL_BLOCK, LlArgs};
use crate::gpu::memory::PinnedBuffer;

/// Kernel call numbers run 1..=CYCLE and wrap (never 0: fresh memory is zeros; an even count,
/// so parity alternates across the wrap).
const CYCLE: u64 = 0xffff_fffe;
/// The most ranks the kernels serve (`LL_MAX_RANKS` in ll.cu).
pub(super) const MAX_RANKS: usize = 64;
/// Payload bytes one area carries by default (`STRATA_GPU_LL_BYTES`).
const DEFAULT_AREA_PAYLOAD: usize = 256 << 10;
/// Where all-reduce switches from one-shot to two-shot when nothing was measured.
const DEFAULT_TWO_SHOT_FROM: usize = 16 << 10;
/// The most blocks a kernel launches (`STRATA_GPU_LL_BLOCKS`): few, so that kernels of ranks
/// sharing one GPU are all resident at once (a polling block waits for the others).
const DEFAULT_MAX_BLOCKS: u32 = 8;

/// Which kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// All-reduce: every rank writes its vector to every peer and reduces all of them.
    OneShot,
    /// All-reduce: each rank reduces a shard and hands it to the others.
    TwoShot,
    /// Reduce-scatter, reduce, all-gather, broadcast: each its one pattern.
    Direct,
}

impl Variant {
    /// As `explain` and collbench's algo column name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::OneShot => "ll_one_shot",
            Variant::TwoShot => "ll_two_shot",
            Variant::Direct => "ll",
        }
    }
}

/// Whether a kernel waits for a rank whose arrive word is `have` when it expects that rank's
/// arrival at call `want` (0: at none): `have` is not there yet on the cycle of call numbers
/// (as `ll_ahead` in ll.cu counts). The monitor's diagnosis asks it of every flag area.
pub(super) fn behind(have: u32, want: u32) -> bool {
    if want == 0 {
        return false;
    }
    if have == 0 {
        return true;
    }
    (u64::from(have) + CYCLE - u64::from(want)) % CYCLE >= CYCLE / 2
}

/// How `STRATA_GPU_KERNEL` (and `NCCL_PROTO`) set the kernel path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Measured at bind (the default).
    Auto,
    /// Never (`off`; or `NCCL_PROTO` without LL).
    Off,
    /// Whenever the call fits the areas (`on`).
    Always,
    /// Up to this many bytes (`STRATA_GPU_KERNEL=64K`).
    UpTo(usize),
}

fn mode_from_env() -> Result<Mode> {
    mode_from(
        std::env::var("NCCL_PROTO").ok().as_deref(),
        std::env::var("STRATA_GPU_KERNEL").ok().as_deref(),
    )
}

/// The mode from `NCCL_PROTO` and `STRATA_GPU_KERNEL`.
fn mode_from(nccl_proto: Option<&str>, setting: Option<&str>) -> Result<Mode> {
    // NCCL_PROTO lists protocols to use (or, after ^, not to use); strata's kernels are LL.
    if let Some(v) = nccl_proto {
        let (exclude, list) = match v.trim().strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v.trim()),
        };
        let has_ll = list.split(',').any(|t| t.trim().eq_ignore_ascii_case("ll"));
        if !list.is_empty() && has_ll == exclude {
            return Ok(Mode::Off);
        }
    }
    match setting.map(str::trim) {
        None | Some("") | Some("auto") => Ok(Mode::Auto),
        Some("off" | "never" | "0") => Ok(Mode::Off),
        Some("on" | "always") => Ok(Mode::Always),
        Some(v) => super::super::queue::parse_bytes(v)
            .map(Mode::UpTo)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "STRATA_GPU_KERNEL={v}: expected auto, on, off or a size in bytes (64K)"
                ))
            }),
    }
}

/// Bytes of one area (16-byte lines for `STRATA_GPU_LL_BYTES` payload bytes, default 256 KiB);
/// 0 where no kernel can serve the communicator (one rank, or more than [`MAX_RANKS`]). It
/// depends on nothing else a rank could see differently from another: `STRATA_GPU_KERNEL=off`
/// only sets the crossover to 0, so every rank still takes part in agreeing on it.
pub(super) fn area_bytes(p: usize) -> Result<usize> {
    if !(2..=MAX_RANKS).contains(&p) {
        return Ok(0);
    }
    let payload = match std::env::var("STRATA_GPU_LL_BYTES") {
        Err(_) => DEFAULT_AREA_PAYLOAD,
        Ok(v) => super::super::queue::parse_bytes(&v)
            .filter(|&b| (64..=64 << 20).contains(&b))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("STRATA_GPU_LL_BYTES={v}: want 64 to 64M"))
            })?,
    };
    Ok(payload.next_multiple_of(8) * 2)
}

/// One size the crossover measurement timed (microseconds per call, every rank's slowest).
#[derive(Clone, Debug)]
pub struct KernelTiming {
    /// Bytes per rank (all-reduce of f32).
    pub bytes: usize,
    /// The one-shot kernel, where it fits.
    pub one_shot_us: Option<f64>,
    /// The two-shot kernel, where it fits.
    pub two_shot_us: Option<f64>,
    /// The stream program of the tuner's algorithm.
    pub program_us: f64,
    /// That algorithm.
    pub program: Algorithm,
}

/// When calls on device buffers go to the kernels, as every rank of the communicator agreed.
#[derive(Clone, Debug)]
pub struct KernelChoice {
    /// Calls of at most this many bytes (count × element size) that fit the areas run as one
    /// kernel; 0: none.
    pub up_to: usize,
    /// All-reduce runs two-shot from this many bytes, one-shot below.
    pub two_shot_from: usize,
    /// How the limit was set.
    pub how: String,
    /// What was measured at bind (empty when the limit was set).
    pub measured: Vec<KernelTiming>,
}

impl KernelChoice {
    /// One line for `explain`: the limit, how it was set, and the measured points.
    pub fn describe(&self) -> String {
        use strata_algorithms::tuner::human_bytes;
        let mut s = if self.up_to == 0 {
            format!("device buffers: no kernel path ({})", self.how)
        } else {
            let limit = if self.up_to == usize::MAX {
                "whenever the call fits its areas".to_string()
            } else {
                format!("up to {}", human_bytes(self.up_to))
            };
            let two_shot = if self.two_shot_from == usize::MAX {
                "all-reduce one-shot throughout".to_string()
            } else {
                format!(
                    "all-reduce two-shot from {}",
                    human_bytes(self.two_shot_from)
                )
            };
            format!(
                "device buffers: one low-latency kernel per call {limit} ({two_shot}), {}",
                self.how
            )
        };
        if !self.measured.is_empty() {
            s.push_str("; all-reduce us per call, one-shot / two-shot / stream program:");
            for t in &self.measured {
                let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
                s.push_str(&format!(
                    " {} {} / {} / {:.1} ({})",
                    human_bytes(t.bytes),
                    f(t.one_shot_us),
                    f(t.two_shot_us),
                    t.program_us,
                    t.program.name()
                ));
            }
        }
        s
    }
}

/// What every rank's kernel must agree on, hashed (FNV-1a; never 0): the collective and the
/// kernel's pattern, the type, the count, the operator and the root. A rank whose peer's
/// digest differs takes none of its lines.
fn digest(spec: &CallSpec, code: u32) -> u32 {
    let op = if spec.collective.reduces() {
        spec.op.code()
    } else {
        0
    };
    let fields = [
        u64::from(spec.collective.code()),
        u64::from(code),
        spec.dtype as u64,
        spec.count as u64,
        u64::from(op),
        spec.root as u64,
    ];
    let mut h: u32 = 0x811c_9dc5;
    for b in fields.iter().flat_map(|f| f.to_le_bytes()) {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h.max(1)
}

/// The collectives the kernels run, with their code in ll.cu.
fn coll_code(collective: Collective, variant: Variant) -> Option<u32> {
    Some(match (collective, variant) {
        (Collective::AllReduce, Variant::OneShot) => 0,
        (Collective::AllReduce, Variant::TwoShot) => 1,
        (Collective::ReduceScatter, _) => 2,
        (Collective::Reduce, _) => 3,
        (Collective::AllGather, _) => 4,
        (Collective::Broadcast, _) => 5,
        _ => return None,
    })
}

/// The kernel side of a communicator's stream programs, made at bind.
pub(super) struct Ll {
    /// Every rank's program buffer as this rank addresses it (u64 each), for the kernels.
    table: DeviceBuffer,
    /// Set by the monitor after a fault: every kernel's waits give up.
    abort: PinnedBuffer,
    abort_dev: u64,
    max_blocks: u32,
    /// The agreed crossover, once measured (no kernel runs before).
    pub(super) choice: std::sync::OnceLock<KernelChoice>,
}

impl Ll {
    /// Sets the kernel side up for a rank whose peers' buffers are at `bases`; `None` when the
    /// layout has no areas. A context must be current.
    pub(super) fn new(
        layout: &Layout,
        bases: &[u64],
        device: i32,
        kernels: &Kernels,
    ) -> Result<Option<Self>> {
        if layout.ll_stride == 0 {
            return Ok(None);
        }
        // A driver that cannot load them leaves this rank without kernels (the ranks then
        // agree on none, in choose_kernels).
        for name in ["strata_ll_reduce", "strata_ll_copy"] {
            if let Err(e) = kernels.function(name) {
                tracing::info!("no low-latency kernels: {e}");
                return Ok(None);
            }
        }
        let table = DeviceBuffer::alloc(device, 8 * bases.len())?;
        let bytes: Vec<u8> = bases.iter().flat_map(|b| b.to_le_bytes()).collect();
        let stream = Stream::new(device)?;
        table.upload(&bytes, &stream)?;
        let abort = PinnedBuffer::new(64)?;
        // SAFETY: a fresh pinned allocation of at least 4 aligned bytes.
        unsafe { (abort.as_ptr() as *mut u32).write_volatile(0) };
        let abort_dev = abort.device_ptr()?;
        let max_blocks = match std::env::var("STRATA_GPU_LL_BLOCKS") {
            Err(_) => DEFAULT_MAX_BLOCKS,
            Ok(v) => v
                .trim()
                .parse()
                .ok()
                .filter(|b| (1..=64).contains(b))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("STRATA_GPU_LL_BLOCKS={v}: want 1 to 64"))
                })?,
        };
        Ok(Some(Self {
            table,
            abort,
            abort_dev,
            max_blocks,
            choice: std::sync::OnceLock::new(),
        }))
    }

    /// The word the monitor sets to end every kernel's waits (host address).
    pub(super) fn abort_word(&self) -> usize {
        self.abort.as_ptr() as usize
    }
}

impl Programs {
    /// The kernel for `spec` on this communicator, if the call goes to one: the crossover is
    /// known, the call is no larger than it and fits the areas, its algorithm is the tuner's to
    /// choose, every rank is on this host and in place all-to-all has no pattern here.
    pub(super) fn kernel_for(&self, comm: &Communicator, spec: &CallSpec) -> Option<Variant> {
        let ll = self.ll.as_ref()?;
        let choice = ll.choice.get()?;
        let (p, es) = (comm.size(), spec.dtype.size());
        let bytes = spec.count * es;
        if bytes == 0 || bytes > choice.up_to || self.net.is_some() {
            return None;
        }
        let room = self.layout.ll_stride / 2; // payload bytes of one area
        let variant = match spec.collective {
            Collective::AllReduce if bytes >= choice.two_shot_from || bytes > room => {
                Variant::TwoShot
            }
            Collective::AllReduce => Variant::OneShot,
            Collective::ReduceScatter
            | Collective::Reduce
            | Collective::AllGather
            | Collective::Broadcast => Variant::Direct,
            _ => return None,
        };
        let fits = match variant {
            // Each phase's area holds a shard of ceil(lines / p) lines.
            Variant::TwoShot => bytes.div_ceil(8).div_ceil(p) * 8 <= room / 2,
            _ => bytes <= room,
        };
        (fits && !comm.algorithm_is_set(spec.collective)).then_some(variant)
    }

    /// Enqueues `spec` as one launch of `variant` on `stream`, after the communicator's
    /// previous call, and hands it to the monitor.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue_kernel(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        variant: Variant,
        record: Option<(u64, [u8; HEADER_BYTES])>,
        (send, recv): (u64, u64),
        (in_bytes, out_bytes): (usize, usize),
        stream: &Stream,
    ) -> Result<()> {
        let ll = self
            .ll
            .as_ref()
            .ok_or_else(|| Error::Transport("internal: no kernel path".into()))?;
        let code = coll_code(spec.collective, variant).ok_or_else(|| {
            Error::Transport(format!("internal: no kernel runs {}", spec.collective))
        })?;
        let (p, es) = (comm.size(), spec.dtype.size());
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let start = self.begin(st, stream)?;
        st.kernel_calls += 1;
        let c = st.kernel_calls;
        let seq = ((c - 1) % CYCLE + 1) as u32;
        let wait_for = if c >= 2 {
            ((c - 2) % CYCLE + 1) as u32
        } else {
            0
        };
        let (op, flags, scalar) = match spec.op {
            _ if !spec.collective.reduces() => (0, 0, 0),
            ReduceOp::Avg => (0, 1, 0),
            ReduceOp::PreMulSum(s) => (0, 2, u64::from_le_bytes(s.bytes)),
            other => (u32::from(other.code()), 0, 0),
        };
        let words = header_words(&record.map_or([0; HEADER_BYTES], |r| r.1));
        let layout = self.layout;
        let args = LlArgs {
            input: send,
            output: recv,
            in_bytes: in_bytes as u64,
            out_bytes: out_bytes as u64,
            count: spec.count as u64,
            bases: ll.table.ptr(),
            abort_word: ll.abort_dev,
            scalar,
            ll_off: layout.ll(),
            ll_stride: layout.ll_stride as u64,
            rank: self.rank as u32,
            nranks: p as u32,
            root: spec.root as u32,
            seq,
            wait_for,
            coll: code,
            op,
            flags,
            call_off: layout.call() as u32,
            arrive_off: layout.arrive(0) as u32,
            expect_off: layout.expect_arrival(0) as u32,
            es: es as u32,
            dtype: spec.dtype as u32,
            digest: digest(&spec, code),
            sig_off: layout.sig(0, 0) as u32,
            pad: 0,
            header: words,
        };
        // Lines each thread works through: the vector, a shard, or a rank's block.
        let lines = match variant {
            Variant::TwoShot => (spec.count * es).div_ceil(8).div_ceil(p),
            _ => (spec.count * es).div_ceil(8),
        };
        let blocks = lines
            .div_ceil(LL_BLOCK as usize)
            .clamp(1, ll.max_blocks as usize) as u32;
        let name = if spec.collective.reduces() {
            "strata_ll_reduce"
        } else {
            "strata_ll_copy"
        };
        self.kernels.launch_ll(name, &args, blocks, stream.raw())?;
        let end = self.watch.event()?;
        end.record(stream)?;
        st.last.record(stream)?;
        let call = InFlight {
            start,
            end,
            started: None,
            timeout: comm.timeout(),
            what: CallName::Kernel(spec, variant),
            record: record.map(|r| r.0),
        };
        self.watch.track(call, &st.sent, &st.received);
        Ok(())
    }

    /// Measures where the kernels stop paying and agrees on it with every rank (collective: at
    /// bind, before any call), or takes the limit `STRATA_GPU_KERNEL` sets.
    pub(super) fn choose_kernels(&self, comm: &Communicator) -> Result<()> {
        let stride = self.layout.ll_stride as u64;
        if stride == 0 {
            return Ok(()); // alike on every rank: one rank, too many, or other hosts
        }
        // Every rank has the kernels and areas of the same size (STRATA_GPU_LL_BYTES), or none
        // uses them: agreed before anything is measured, so no rank leaves a collective out.
        let mut words = [u64::from(self.ll.is_some()), stride, !stride];
        let min = CallSpec {
            op: ReduceOp::Min,
            ..CallSpec::new(Collective::AllReduce, DataType::Uint64, 3)
        };
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        comm.call_bytes(min, None, &mut bytes)?;
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
        }
        let Some(ll) = self.ll.as_ref().filter(|_| words == [1, stride, !stride]) else {
            let why = if words[0] == 0 {
                "a rank could not load the kernels"
            } else {
                "the ranks' STRATA_GPU_LL_BYTES differ"
            };
            if comm.rank() == 0 {
                tracing::warn!("device buffers: no kernel path: {why}");
            }
            if let Some(ll) = &self.ll {
                let _ = ll.choice.set(KernelChoice {
                    up_to: 0,
                    two_shot_from: usize::MAX,
                    how: why.into(),
                    measured: Vec::new(),
                });
            }
            return Ok(());
        };
        let room = self.layout.ll_stride / 2;
        let mode = mode_from_env()?;
        let (mut up_to, mut two_shot_from, mut measured) = (0, DEFAULT_TWO_SHOT_FROM, Vec::new());
        let mut how = match mode {
            Mode::Off => "STRATA_GPU_KERNEL=off".to_string(),
            Mode::Always => {
                up_to = usize::MAX;
                "STRATA_GPU_KERNEL=on".to_string()
            }
            Mode::UpTo(b) => {
                up_to = b;
                format!(
                    "set by STRATA_GPU_KERNEL ({})",
                    strata_algorithms::tuner::human_bytes(b)
                )
            }
            Mode::Auto => String::new(),
        };
        if mode == Mode::Auto {
            measured = self.measure(comm, room)?;
            up_to = crossover(&measured);
            two_shot_from = measured
                .iter()
                .find(|t| match (t.one_shot_us, t.two_shot_us) {
                    (Some(one), Some(two)) => two < one,
                    (None, Some(_)) => true,
                    _ => false,
                })
                .map_or(usize::MAX, |t| t.bytes);
            how = "measured at bind".into();
        }
        // Every rank takes the smallest limit and the largest switch to two-shot, so that they
        // agree even if their settings differ.
        let mut words = [up_to as u64, !(two_shot_from as u64)];
        let min = CallSpec {
            op: ReduceOp::Min,
            ..CallSpec::new(Collective::AllReduce, DataType::Uint64, 2)
        };
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        comm.call_bytes(min, None, &mut bytes)?;
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
        }
        let agreed = KernelChoice {
            up_to: words[0] as usize,
            two_shot_from: !words[1] as usize,
            how,
            measured,
        };
        if comm.rank() == 0 {
            tracing::info!("{}", agreed.describe());
        }
        let _ = ll.choice.set(agreed);
        Ok(())
    }

    /// Times all-reduce of f32 on the kernels and on the tuner's stream program at sizes from
    /// 8 bytes by factors of 4 up to what an area holds, every rank's slowest (the same numbers
    /// on every rank). Stops once the program won twice in a row.
    fn measure(&self, comm: &Communicator, room: usize) -> Result<Vec<KernelTiming>> {
        const REPS: usize = 3;
        let p = comm.size();
        let largest = room.max(8);
        let device = self.device;
        let stream = Stream::new(device)?;
        let send = DeviceBuffer::alloc(device, largest)?;
        let recv = DeviceBuffer::alloc(device, largest)?;
        let (t0, t1) = (Event::new(true)?, Event::new(true)?);
        // Every rank allocated before any rank's call waits on it (an allocation waits for
        // the device, and ranks may share one).
        comm.barrier()?;
        let mut out = Vec::new();
        let mut program_won = 0;
        let mut bytes = 8usize;
        while bytes <= largest && program_won < 2 {
            let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, bytes / 4);
            let one_fits = bytes <= room;
            let two_fits = bytes.div_ceil(8).div_ceil(p) * 8 <= room / 2;
            let stream = &stream;
            let time = |run: &dyn Fn() -> Result<()>| -> Result<f64> {
                run()?;
                t0.record(stream)?;
                for _ in 0..REPS {
                    run()?;
                }
                t1.record(stream)?;
                t1.synchronize()?;
                Ok(f64::from(t1.elapsed_ms_since(&t0)?) * 1e3 / REPS as f64)
            };
            let io = (send.ptr(), recv.ptr());
            let kernel =
                |v| move || self.enqueue_kernel(comm, spec, v, None, io, (bytes, bytes), stream);
            let one = if one_fits {
                time(&kernel(Variant::OneShot))?
            } else {
                -1.0
            };
            let two = if two_fits {
                time(&kernel(Variant::TwoShot))?
            } else {
                -1.0
            };
            let (algorithm, plan) = comm.plan_device_call(spec)?;
            let program = time(&|| {
                self.enqueue_planned(comm, spec, algorithm, &plan, None, io, bytes, stream)
                    .map(|_| ())
            })?;
            // Every rank's slowest, so that every rank decides alike.
            let mut t: Vec<u8> = [one, two, program]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let max = CallSpec {
                op: ReduceOp::Max,
                ..CallSpec::new(Collective::AllReduce, DataType::Float64, 3)
            };
            comm.call_bytes(max, None, &mut t)?;
            let v: Vec<f64> = t
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            let timing = KernelTiming {
                bytes,
                one_shot_us: (v[0] >= 0.0).then_some(v[0]),
                two_shot_us: (v[1] >= 0.0).then_some(v[1]),
                program_us: v[2],
                program: algorithm,
            };
            program_won = if kernel_wins(&timing) {
                0
            } else {
                program_won + 1
            };
            out.push(timing);
            bytes *= 4;
        }
        stream.synchronize()?;
        Ok(out)
    }
}

/// Whether a kernel beat the stream program at this size.
fn kernel_wins(t: &KernelTiming) -> bool {
    let best = [t.one_shot_us, t.two_shot_us]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
    best <= t.program_us
}

/// The largest measured size up to which a kernel won at every size measured (0 if it lost at
/// the smallest).
fn crossover(measured: &[KernelTiming]) -> usize {
    measured
        .iter()
        .take_while(|t| kernel_wins(t))
        .last()
        .map_or(0, |t| t.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(bytes: usize, one: f64, two: f64, program: f64) -> KernelTiming {
        KernelTiming {
            bytes,
            one_shot_us: Some(one),
            two_shot_us: Some(two),
            program_us: program,
            program: Algorithm::Ring,
        }
    }

    #[test]
    fn the_crossover_is_the_last_size_of_the_first_run_of_kernel_wins() {
        let m = [
            t(8, 3.0, 4.0, 20.0),
            t(32, 3.0, 4.0, 20.0),
            t(128, 9.0, 8.0, 21.0),
            t(512, 30.0, 25.0, 22.0),
            t(2048, 3.0, 3.0, 22.0), // a win after a loss: noise, not counted
        ];
        assert_eq!(crossover(&m), 128);
        assert_eq!(crossover(&m[3..4]), 0);
        assert_eq!(crossover(&[]), 0);
    }

    #[test]
    fn a_rank_is_behind_until_it_arrives_also_across_the_wrap() {
        assert!(!behind(0, 0), "nothing expected");
        assert!(behind(0, 1), "never arrived");
        assert!(behind(4, 5) && !behind(5, 5) && !behind(6, 5));
        // The call after 0xfffffffe is 1: a rank at 1 has passed 0xfffffffe.
        assert!(!behind(1, 0xffff_fffe) && behind(0xffff_fffe, 1));
    }

    #[test]
    fn nccl_proto_without_ll_turns_the_kernels_off() {
        for (proto, off) in [
            (Some("Simple"), true),
            (Some("LL,Simple"), false),
            (Some("^LL"), true),
            (Some("^LL128"), false),
            (Some("LL128"), true),
            (None, false),
        ] {
            let mode = mode_from(proto, None).unwrap();
            assert_eq!(mode == Mode::Off, off, "NCCL_PROTO={proto:?}");
        }
        assert_eq!(mode_from(None, Some("64K")).unwrap(), Mode::UpTo(64 << 10));
        assert_eq!(mode_from(None, Some("on")).unwrap(), Mode::Always);
        assert!(mode_from(None, Some("sometimes")).is_err());
    }
}
