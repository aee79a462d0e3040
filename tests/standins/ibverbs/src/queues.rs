//! Completion queues and completion channels.

use crate::set_errno;
use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use strata_ibverbs_abi::*;

/// A completion channel: an eventfd in semaphore mode, one count per event.
#[repr(C)]
pub(crate) struct Channel {
    abi: ibv_comp_channel,
    /// CQs with an event not yet taken, in order.
    pending: Mutex<VecDeque<usize>>,
}

struct CqState {
    entries: VecDeque<ibv_wc>,
    armed: bool,
    overrun: bool,
}

/// A completion queue: the ABI struct first.
#[repr(C)]
pub(crate) struct Cq {
    abi: ibv_cq,
    capacity: usize,
    channel: usize,
    state: Mutex<CqState>,
}

/// A handle to a CQ that outlives nothing: CQs are destroyed only after their QPs.
#[derive(Clone, Copy)]
pub(crate) struct CqRef(pub usize);

impl CqRef {
    fn get(&self) -> &Cq {
        // SAFETY: a CQ outlives the QPs that complete into it (ibv_destroy_cq refuses while a
        // QP uses it).
        unsafe { &*(self.0 as *const Cq) }
    }

    /// Adds a completion, and signals the channel if the CQ was armed.
    pub fn push(&self, wc: ibv_wc) {
        let cq = self.get();
        let Ok(mut st) = cq.state.lock() else {
            return;
        };
        if st.entries.len() >= cq.capacity {
            st.overrun = true;
            return;
        }
        st.entries.push_back(wc);
        if std::mem::take(&mut st.armed) && cq.channel != 0 {
            // SAFETY: the channel outlives its CQs (destroying it is refused while used).
            let ch = unsafe { &*(cq.channel as *const Channel) };
            if let Ok(mut p) = ch.pending.lock() {
                p.push_back(self.0);
            }
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe { libc::write(ch.abi.fd, &one as *const u64 as *const c_void, 8) };
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    if crate::context(ctx).is_none() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(Channel {
        abi: ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        pending: Mutex::new(VecDeque::new()),
    })) as *mut ibv_comp_channel
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_comp_channel.
    if unsafe { (*ch).refcnt } > 0 {
        return libc::EBUSY;
    }
    // SAFETY: as above.
    let ch = unsafe { Box::from_raw(ch as *mut Channel) };
    // SAFETY: our descriptor.
    unsafe { libc::close(ch.abi.fd) };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _vector: c_int,
) -> *mut ibv_cq {
    if crate::context(ctx).is_none() || !(1..=1 << 22).contains(&cqe) {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if !channel.is_null() {
        // SAFETY: a channel from ibv_create_comp_channel.
        unsafe { (*channel).refcnt += 1 };
    }
    Box::into_raw(Box::new(Cq {
        abi: ibv_cq {
            context: ctx,
            channel,
            cq_context,
            handle: 0,
            cqe,
            _private: [0; 12],
        },
        capacity: cqe as usize,
        channel: channel as usize,
        state: Mutex::new(CqState {
            entries: VecDeque::new(),
            armed: false,
            overrun: false,
        }),
    })) as *mut ibv_cq
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    if crate::qp::any_on_cq(cq as usize) {
        return libc::EBUSY;
    }
    // SAFETY: made by ibv_create_cq.
    let cq = unsafe { Box::from_raw(cq as *mut Cq) };
    if cq.channel != 0 {
        // SAFETY: the channel outlives its CQs.
        unsafe { (*(cq.channel as *mut ibv_comp_channel)).refcnt -= 1 };
    }
    0
}

/// `ibv_poll_cq` (through the context's ops table).
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if cq.is_null() || n < 0 || (n > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    // SAFETY: made by ibv_create_cq.
    let cq = unsafe { &*(cq as *const Cq) };
    let Ok(mut st) = cq.state.lock() else {
        return -libc::EIO;
    };
    if st.overrun {
        return -libc::EOVERFLOW;
    }
    let k = (n as usize).min(st.entries.len());
    for i in 0..k {
        let e = st.entries.pop_front().unwrap_or_default();
        // SAFETY: the caller's array of n entries.
        unsafe { *wc.add(i) = e };
    }
    k as c_int
}

/// `ibv_req_notify_cq`: the next completion added signals the channel.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_cq.
    let cq = unsafe { &*(cq as *const Cq) };
    if cq.channel == 0 {
        return libc::EINVAL;
    }
    match cq.state.lock() {
        Ok(mut st) => {
            st.armed = true;
            0
        }
        Err(_) => libc::EIO,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq_out.is_null() || ctx_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: made by ibv_create_comp_channel.
    let ch = unsafe { &*(ch as *const Channel) };
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes from our eventfd (blocking unless the caller made it
    // non-blocking, as with the real channel's descriptor).
    let r = unsafe { libc::read(ch.abi.fd, &mut v as *mut u64 as *mut c_void, 8) };
    if r != 8 {
        return -1;
    }
    let cq = ch.pending.lock().ok().and_then(|mut p| p.pop_front());
    let Some(cq) = cq else {
        set_errno(libc::EIO);
        return -1;
    };
    // SAFETY: the caller's out-parameters; the CQ is alive (it has a pending event).
    unsafe {
        *cq_out = cq as *mut ibv_cq;
        *ctx_out = (*(cq as *const Cq)).abi.cq_context;
    }
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(_cq: *mut ibv_cq, _n: c_uint) {}

/// A CQ's handle, checked to be one of ours by the caller.
pub(crate) fn cq_ref(cq: *mut ibv_cq) -> Option<CqRef> {
    (!cq.is_null()).then_some(CqRef(cq as usize))
}
