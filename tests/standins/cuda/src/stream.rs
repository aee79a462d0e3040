//! Streams that run on their own threads, events, host functions and stream memory operations
//! (one at a time, or in batches).

use crate::memory::device_view;
use crate::{IN_HOST_FN, code, current, put, ready, stats, status};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Op = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    busy: bool,
    destroyed: bool,
}

/// One stream: a queue and the thread that runs it in order.
#[derive(Default)]
struct StreamState {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl StreamState {
    fn start(self: &Arc<Self>) {
        let s = self.clone();
        std::thread::Builder::new()
            .name("cuda-standin-stream".into())
            .spawn(move || {
                loop {
                    let op = {
                        let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
                        loop {
                            if let Some(op) = q.ops.pop_front() {
                                q.busy = true;
                                break op;
                            }
                            q.busy = false;
                            s.cv.notify_all();
                            if q.destroyed {
                                return;
                            }
                            q = s.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                        }
                    };
                    op();
                }
            })
            .expect("stream thread");
    }

    fn wait_idle(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        while q.busy || !q.ops.is_empty() {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

struct Streams {
    by_handle: HashMap<usize, (i32, Arc<StreamState>)>,
    next: usize,
}

fn streams() -> &'static Mutex<Streams> {
    static S: OnceLock<Mutex<Streams>> = OnceLock::new();
    S.get_or_init(|| {
        Mutex::new(Streams {
            by_handle: HashMap::new(),
            next: 0x5757_0000,
        })
    })
}

/// The stream a handle names: NULL, `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2) are
/// the current device's default stream, made on first use.
fn lookup(handle: usize) -> Result<Arc<StreamState>, i32> {
    let mut s = streams().lock().unwrap_or_else(|p| p.into_inner());
    let handle = if handle <= 2 {
        let device = current()?;
        let key = 0x5757_0000 - 16 - device as usize;
        s.by_handle.entry(key).or_insert_with(|| {
            let st = Arc::new(StreamState::default());
            st.start();
            (device, st)
        });
        key
    } else {
        handle
    };
    s.by_handle
        .get(&handle)
        .map(|(_, st)| st.clone())
        .ok_or(code::INVALID_HANDLE)
}

/// Whether `handle` names a stream (or the current device's default stream).
pub(crate) fn check(handle: usize) -> Result<(), i32> {
    lookup(handle).map(|_| ())
}

/// Puts `op` on stream `handle`.
pub(crate) fn enqueue(handle: usize, op: Op) -> Result<(), i32> {
    let st = lookup(handle)?;
    let mut q = st.queue.lock().unwrap_or_else(|p| p.into_inner());
    q.ops.push_back(op);
    st.cv.notify_all();
    Ok(())
}

/// Puts `op` on stream `handle` and waits until the stream has run it (and so everything
/// before it): what the driver does for a copy into pageable host memory.
pub(crate) fn enqueue_and_wait(handle: usize, op: Op) -> Result<(), i32> {
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let signal = done.clone();
    enqueue(
        handle,
        Box::new(move || {
            op();
            *signal.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
            signal.1.notify_all();
        }),
    )?;
    let mut ran = done.0.lock().unwrap_or_else(|p| p.into_inner());
    while !*ran {
        ran = done.1.wait(ran).unwrap_or_else(|p| p.into_inner());
    }
    Ok(())
}

/// Waits until every stream of `device` is idle.
pub(crate) fn synchronize_device(device: i32) {
    let all: Vec<_> = {
        let s = streams().lock().unwrap_or_else(|p| p.into_inner());
        s.by_handle
            .values()
            .filter(|(d, _)| *d == device)
            .map(|(_, st)| st.clone())
            .collect()
    };
    all.iter().for_each(|st| st.wait_idle());
}

/// Waits until every stream is idle.
pub(crate) fn synchronize_all() {
    let all: Vec<_> = {
        let s = streams().lock().unwrap_or_else(|p| p.into_inner());
        s.by_handle.values().map(|(_, st)| st.clone()).collect()
    };
    all.iter().for_each(|st| st.wait_idle());
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut usize, _flags: c_uint) -> i32 {
    status(current().and_then(|device| {
        let mut s = streams().lock().unwrap_or_else(|p| p.into_inner());
        s.next += 16;
        let handle = s.next;
        let st = Arc::new(StreamState::default());
        st.start();
        s.by_handle.insert(handle, (device, st));
        // SAFETY: out-parameter.
        unsafe { put(out, handle) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut usize,
    flags: c_uint,
    _p: i32,
) -> i32 {
    // SAFETY: same contract.
    unsafe { cuStreamCreate(out, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(handle: usize) -> i32 {
    status(ready().and_then(|_| {
        if handle <= 2 {
            return Err(code::INVALID_HANDLE);
        }
        let (_, st) = streams()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_handle
            .remove(&handle)
            .ok_or(code::INVALID_HANDLE)?;
        // As the driver does: queued work still runs, then the stream goes away.
        let mut q = st.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.destroyed = true;
        st.cv.notify_all();
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy(handle: usize) -> i32 {
    cuStreamDestroy_v2(handle)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(handle: usize) -> i32 {
    stats::add(stats::HOST_WAITS, 1);
    status(ready().and_then(|_| {
        lookup(handle)?.wait_idle();
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(handle: usize) -> i32 {
    stats::add(stats::QUERIES, 1);
    status(ready().and_then(|_| {
        let st = lookup(handle)?;
        let q = st.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.busy || !q.ops.is_empty() {
            Err(code::NOT_READY)
        } else {
            Ok(())
        }
    }))
}

/// `void (*CUhostFn)(void* userData)`.
type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc(handle: usize, f: HostFn, data: *mut c_void) -> i32 {
    status(current().and_then(|_| {
        let f = f.ok_or(code::INVALID_VALUE)?;
        let data = data as usize;
        enqueue(
            handle,
            Box::new(move || {
                stats::add(stats::HOST_FUNCTIONS, 1);
                IN_HOST_FN.with(|c| c.set(true));
                // SAFETY: the caller's function with the caller's data, as documented.
                unsafe { f(data as *mut c_void) };
                IN_HOST_FN.with(|c| c.set(false));
            }),
        )
    }))
}

const WAIT_GEQ: c_uint = 0;
const WAIT_EQ: c_uint = 1;
const WAIT_AND: c_uint = 2;
/// `CU_STREAM_WAIT_VALUE_FLUSH`: allowed, and nothing to do on host memory.
const WAIT_FLUSH: c_uint = 1 << 30;
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.
const WRITE_NO_BARRIER: c_uint = 1;

/// The 32-bit word the device knows as `addr`.
fn word(addr: u64) -> Result<&'static AtomicU32, i32> {
    if !addr.is_multiple_of(4) {
        return Err(code::INVALID_VALUE);
    }
    let p = device_view(addr, 4)?;
    // SAFETY: 4 aligned bytes of device-accessible memory that the caller keeps alive while
    // the operation is queued (the driver's contract).
    Ok(unsafe { &*(p as *const AtomicU32) })
}

/// The 64-bit word the device knows as `addr`.
fn word64(addr: u64) -> Result<&'static AtomicU64, i32> {
    if !addr.is_multiple_of(8) {
        return Err(code::INVALID_VALUE);
    }
    let p = device_view(addr, 8)?;
    // SAFETY: as in `word`, 8 aligned bytes.
    Ok(unsafe { &*(p as *const AtomicU64) })
}

/// The test of a wait's `flags` (GEQ, EQ, AND or NOR; the flush bit allowed), on 64 bits;
/// a 32-bit wait compares in 32 bits, so GEQ is modular in the width it waits on.
fn wait_test(flags: c_uint, bits: u32) -> Result<impl Fn(u64, u64) -> bool + Send + 'static, i32> {
    if flags & !(0x3 | WAIT_FLUSH) != 0 {
        return Err(code::INVALID_VALUE);
    }
    let kind = flags & 0x3;
    Ok(move |v: u64, want: u64| match kind {
        WAIT_GEQ if bits == 32 => ((v as u32).wrapping_sub(want as u32) as i32) >= 0,
        WAIT_GEQ => (v.wrapping_sub(want) as i64) >= 0,
        WAIT_EQ => v == want,
        WAIT_AND => v & want != 0,
        // CU_STREAM_WAIT_VALUE_NOR (3)
        _ if bits == 32 => !(v | want) & 0xffff_ffff != 0,
        _ => !(v | want) != 0,
    })
}

/// Holds the stream thread until `ready()`, backing off from 2 µs to 200 µs between looks.
fn hold_until(ready: impl Fn() -> bool) {
    let mut pause = Duration::from_micros(2);
    while !ready() {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(200));
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32_v2(
    handle: usize,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> i32 {
    status(current().and_then(|_| {
        let w = word(addr)?;
        let test = wait_test(flags, 32)?;
        stats::add(stats::MEMORY_OPS, 1);
        enqueue(
            handle,
            Box::new(move || {
                hold_until(|| test(u64::from(w.load(Ordering::Acquire)), u64::from(value)))
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32(handle: usize, addr: u64, value: u32, flags: c_uint) -> i32 {
    cuStreamWaitValue32_v2(handle, addr, value, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWriteValue32_v2(
    handle: usize,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> i32 {
    status(current().and_then(|_| {
        if flags & !WRITE_NO_BARRIER != 0 {
            return Err(code::INVALID_VALUE);
        }
        let w = word(addr)?;
        stats::add(stats::MEMORY_OPS, 1);
        enqueue(handle, Box::new(move || w.store(value, Ordering::Release)))
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWriteValue32(handle: usize, addr: u64, value: u32, flags: c_uint) -> i32 {
    cuStreamWriteValue32_v2(handle, addr, value, flags)
}

/// The most operations one `cuStreamBatchMemOp` takes here (the driver documents a limit
/// without a number; 256 is what its own samples stay under).
const BATCH_MAX: c_uint = 256;

/// One resolved operation of a batch.
enum MemOp {
    Wait32(
        &'static AtomicU32,
        u32,
        Box<dyn Fn(u64, u64) -> bool + Send>,
    ),
    Wait64(
        &'static AtomicU64,
        u64,
        Box<dyn Fn(u64, u64) -> bool + Send>,
    ),
    Write32(&'static AtomicU32, u32),
    Write64(&'static AtomicU64, u64),
    /// A flush of remote writes or a memory barrier: ordering the stream already gives.
    Fence,
}

/// Reads one `CUstreamBatchMemOpParams` (48 bytes: operation at 0, address at 8, value at
/// 16, flags at 24, alias at 32) and resolves it, or says why it is invalid.
///
/// # Safety
/// `p` points to 48 readable bytes.
unsafe fn mem_op(p: *const u8) -> Result<MemOp, i32> {
    // SAFETY: within the 48 bytes the caller vouches for; unaligned reads.
    let (op, addr, value, flags) = unsafe {
        (
            (p as *const u32).read_unaligned(),
            (p.add(8) as *const u64).read_unaligned(),
            (p.add(16) as *const u64).read_unaligned(),
            (p.add(24) as *const u32).read_unaligned(),
        )
    };
    Ok(match op {
        1 => MemOp::Wait32(word(addr)?, value as u32, Box::new(wait_test(flags, 32)?)),
        4 => MemOp::Wait64(word64(addr)?, value, Box::new(wait_test(flags, 64)?)),
        2 | 5 if flags & !WRITE_NO_BARRIER != 0 => return Err(code::INVALID_VALUE),
        2 => MemOp::Write32(word(addr)?, value as u32),
        5 => MemOp::Write64(word64(addr)?, value),
        3 | 6 => MemOp::Fence,
        _ => return Err(code::INVALID_VALUE),
    })
}

/// `cuStreamBatchMemOp`: the operations run in array order on the stream, a wait holding
/// those after it. Every operation is checked before any is enqueued, so an invalid batch
/// enqueues nothing. Counted as one memory operation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp_v2(
    handle: usize,
    count: c_uint,
    params: *const u8,
    flags: c_uint,
) -> i32 {
    status(current().and_then(|_| {
        if count == 0 || count > BATCH_MAX || params.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        let ops = (0..count as usize)
            // SAFETY: the caller passes `count` records of 48 bytes.
            .map(|i| unsafe { mem_op(params.add(48 * i)) })
            .collect::<Result<Vec<_>, _>>()?;
        stats::add(stats::MEMORY_OPS, 1);
        enqueue(
            handle,
            Box::new(move || {
                for op in ops {
                    match op {
                        MemOp::Wait32(w, v, test) => {
                            hold_until(|| test(u64::from(w.load(Ordering::Acquire)), u64::from(v)))
                        }
                        MemOp::Wait64(w, v, test) => {
                            hold_until(|| test(w.load(Ordering::Acquire), v))
                        }
                        MemOp::Write32(w, v) => w.store(v, Ordering::Release),
                        MemOp::Write64(w, v) => w.store(v, Ordering::Release),
                        MemOp::Fence => std::sync::atomic::fence(Ordering::SeqCst),
                    }
                }
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp(
    handle: usize,
    count: c_uint,
    params: *const u8,
    flags: c_uint,
) -> i32 {
    // SAFETY: same contract.
    unsafe { cuStreamBatchMemOp_v2(handle, count, params, flags) }
}

/// An event: how many times it was recorded, how many of those completed, and when.
struct EventState {
    timing: bool,
    state: Mutex<(u64, u64, Option<Instant>)>,
    cv: Condvar,
}

fn events() -> &'static Mutex<HashMap<usize, Arc<EventState>>> {
    static E: OnceLock<Mutex<HashMap<usize, Arc<EventState>>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

fn event(handle: usize) -> Result<Arc<EventState>, i32> {
    events()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&handle)
        .cloned()
        .ok_or(code::INVALID_HANDLE)
}

const EVENT_DISABLE_TIMING: c_uint = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut usize, flags: c_uint) -> i32 {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x5e5e_0000);
    status(current().and_then(|_| {
        let handle = NEXT.fetch_add(16, Ordering::Relaxed);
        let e = Arc::new(EventState {
            timing: flags & EVENT_DISABLE_TIMING == 0,
            state: Mutex::new((0, 0, None)),
            cv: Condvar::new(),
        });
        events()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, e);
        // SAFETY: out-parameter.
        unsafe { put(out, handle) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(handle: usize) -> i32 {
    status(ready().and_then(|_| {
        events()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle)
            .map(|_| ())
            .ok_or(code::INVALID_HANDLE)
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(handle: usize) -> i32 {
    cuEventDestroy_v2(handle)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(handle: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        let e = event(handle)?;
        let generation = {
            let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
            st.0 += 1;
            st.0
        };
        enqueue(
            s,
            Box::new(move || {
                let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
                st.1 = st.1.max(generation);
                st.2 = Some(Instant::now());
                e.cv.notify_all();
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(handle: usize, s: usize, _flags: c_uint) -> i32 {
    cuEventRecord(handle, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(handle: usize) -> i32 {
    stats::add(stats::QUERIES, 1);
    status(ready().and_then(|_| {
        let e = event(handle)?;
        let st = e.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.1 >= st.0 {
            Ok(())
        } else {
            Err(code::NOT_READY)
        }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(handle: usize) -> i32 {
    stats::add(stats::HOST_WAITS, 1);
    status(ready().and_then(|_| {
        let e = event(handle)?;
        let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.1 < st.0 {
            st = e.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(s: usize, handle: usize, _flags: c_uint) -> i32 {
    status(current().and_then(|_| {
        let e = event(handle)?;
        let generation = e.state.lock().unwrap_or_else(|p| p.into_inner()).0;
        enqueue(
            s,
            Box::new(move || {
                let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
                while st.1 < generation {
                    st = e.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: usize, end: usize) -> i32 {
    status(ready().and_then(|_| {
        let (a, b) = (event(start)?, event(end)?);
        if !a.timing || !b.timing {
            return Err(code::INVALID_HANDLE);
        }
        let ta = *a.state.lock().unwrap_or_else(|p| p.into_inner());
        let tb = *b.state.lock().unwrap_or_else(|p| p.into_inner());
        match (ta, tb) {
            ((r0, c0, Some(t0)), (r1, c1, Some(t1))) if c0 >= r0 && c1 >= r1 => {
                let d = t1.saturating_duration_since(t0).as_secs_f32() * 1e3;
                // SAFETY: out-parameter.
                unsafe { put(ms, d) }
            }
            ((r0, c0, _), (r1, c1, _)) if c0 < r0 || c1 < r1 => Err(code::NOT_READY),
            _ => Err(code::INVALID_HANDLE),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: usize, end: usize) -> i32 {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}
