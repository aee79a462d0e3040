//! RC queue pairs: the state machine, posting, and the process's table of QPs.

use crate::queues::{CqRef, cq_ref};
use crate::{regions, set_errno};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use strata_ibverbs_abi::*;

/// One RDMA write on its way out.
pub(crate) struct WriteJob {
    pub wr_id: u64,
    pub signaled: bool,
    pub local: usize,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub imm: Option<u32>,
}

/// What the QP's sender thread is told.
pub(crate) enum Job {
    Write(WriteJob),
}

pub(crate) struct QpState {
    pub state: u32,
    pub port: u8,
    pub access: u32,
    pub dest_qpn: u32,
    /// The peer NIC's address (from its GID, or its LID).
    pub dest: std::net::Ipv4Addr,
    pub timeout: u8,
    pub retry_cnt: u8,
    /// Posted receives, in order.
    pub rq: VecDeque<u64>,
    /// Sends posted and not yet completed.
    pub sq_outstanding: u32,
    pub sender: Option<Sender<Job>>,
    /// `ibv_destroy_qp` ran: its CQs may be gone, so nothing completes into them any more.
    pub destroyed: bool,
}

/// A QP's shared part (the sender thread and the responder hold it too).
pub(crate) struct QpInner {
    pub qpn: u32,
    pub pd: usize,
    pub cap: ibv_qp_cap,
    pub send_cq: CqRef,
    pub recv_cq: CqRef,
    pub st: Mutex<QpState>,
    /// Signalled when a receive is posted or the state changes.
    pub cv: Condvar,
}

/// A QP: the ABI struct first.
#[repr(C)]
pub(crate) struct Qp {
    abi: ibv_qp,
    inner: Arc<QpInner>,
}

fn table() -> &'static Mutex<HashMap<u32, Arc<QpInner>>> {
    static T: OnceLock<Mutex<HashMap<u32, Arc<QpInner>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// The QP numbered `qpn` in this process.
pub(crate) fn lookup(qpn: u32) -> Option<Arc<QpInner>> {
    table().lock().ok()?.get(&qpn).cloned()
}

pub(crate) fn any_on_pd(pd: usize) -> bool {
    table()
        .lock()
        .map(|t| t.values().any(|q| q.pd == pd))
        .unwrap_or(true)
}

pub(crate) fn any_on_cq(cq: usize) -> bool {
    table()
        .lock()
        .map(|t| t.values().any(|q| q.send_cq.0 == cq || q.recv_cq.0 == cq))
        .unwrap_or(true)
}

static NEXT_QPN: AtomicU32 = AtomicU32::new(0x100);

/// A completion for `wr_id`.
pub(crate) fn wc(qpn: u32, wr_id: u64, status: u32, opcode: u32) -> ibv_wc {
    ibv_wc {
        wr_id,
        status,
        opcode,
        qp_num: qpn,
        vendor_err: if status == wc_status::SUCCESS {
            0
        } else {
            0x80 + status
        },
        ..Default::default()
    }
}

impl QpInner {
    /// Moves the QP to the error state: every posted receive completes with a flush error.
    pub fn fail(&self, st: &mut QpState) {
        st.state = qp_state::ERR;
        st.sender = None;
        for wr_id in st.rq.drain(..) {
            self.recv_cq.push(wc(
                self.qpn,
                wr_id,
                wc_status::WR_FLUSH_ERR,
                wc_opcode::RECV_RDMA_WITH_IMM,
            ));
        }
        self.cv.notify_all();
    }

    /// Completes a send: a success only if it was signalled; an error always.
    pub fn complete_send(&self, wr_id: u64, signaled: bool, status: u32) {
        let Ok(mut st) = self.st.lock() else {
            return;
        };
        if st.destroyed {
            return;
        }
        st.sq_outstanding = st.sq_outstanding.saturating_sub(1);
        if signaled || status != wc_status::SUCCESS {
            self.send_cq
                .push(wc(self.qpn, wr_id, status, wc_opcode::RDMA_WRITE));
        }
        // The error comes first; the flushes it causes follow.
        if status != wc_status::SUCCESS && st.state != qp_state::ERR {
            self.fail(&mut st);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if pd.is_null() || init.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init };
    let (Some(send_cq), Some(recv_cq)) = (cq_ref(a.send_cq), cq_ref(a.recv_cq)) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    if a.qp_type != QPT_RC
        || !a.srq.is_null()
        || a.cap.max_send_wr == 0
        || a.cap.max_send_wr > 16384
        || a.cap.max_recv_wr > 16384
        || a.cap.max_send_sge > 30
        || a.cap.max_recv_sge > 30
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: a PD from ibv_alloc_pd, whose context is one of ours.
    let ctx = unsafe { (*pd).context };
    let Some(_) = crate::context(ctx) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let qpn = NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
    let inner = Arc::new(QpInner {
        qpn,
        pd: pd as usize,
        cap: a.cap,
        send_cq,
        recv_cq,
        st: Mutex::new(QpState {
            state: qp_state::RESET,
            port: 0,
            access: 0,
            dest_qpn: 0,
            dest: std::net::Ipv4Addr::UNSPECIFIED,
            timeout: 0,
            retry_cnt: 0,
            rq: VecDeque::new(),
            sq_outstanding: 0,
            sender: None,
            destroyed: false,
        }),
        cv: Condvar::new(),
    });
    if let Ok(mut t) = table().lock() {
        t.insert(qpn, inner.clone());
    }
    let qp = Box::new(Qp {
        abi: ibv_qp {
            context: ctx,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: std::ptr::null_mut(),
            handle: qpn,
            qp_num: qpn,
            state: qp_state::RESET,
            qp_type: QPT_RC,
            _private: [0; 12],
        },
        inner,
    });
    Box::into_raw(qp) as *mut ibv_qp
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_qp.
    let qp = unsafe { Box::from_raw(qp as *mut Qp) };
    if let Ok(mut st) = qp.inner.st.lock() {
        st.state = qp_state::ERR;
        st.destroyed = true;
        st.sender = None;
        st.rq.clear();
        qp.inner.cv.notify_all();
    }
    if let Ok(mut t) = table().lock() {
        t.remove(&qp.inner.qpn);
    }
    0
}

/// Whether `mask` has every bit of `need`.
fn has(mask: c_int, need: c_int) -> bool {
    mask & need == need
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() || mask & attr::STATE == 0 {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_qp; the caller's attributes.
    let (q, a) = unsafe { (&mut *(qp as *mut Qp), &*attr) };
    let Some(ctx) = crate::context(q.abi.context) else {
        return libc::EINVAL;
    };
    let inner = q.inner.clone();
    let Ok(mut st) = inner.st.lock() else {
        return libc::EIO;
    };
    let (from, to) = (st.state, a.qp_state);
    match (from, to) {
        (_, qp_state::RESET) => {
            st.rq.clear();
            st.sender = None;
            st.sq_outstanding = 0;
        }
        (_, qp_state::ERR) => inner.fail(&mut st),
        (qp_state::RESET, qp_state::INIT) | (qp_state::INIT, qp_state::INIT) => {
            if from == qp_state::RESET && !has(mask, attr::TO_INIT) {
                return libc::EINVAL;
            }
            if has(mask, attr::PORT) {
                if a.port_num != 1 {
                    return libc::EINVAL;
                }
                st.port = a.port_num;
            }
            if has(mask, attr::ACCESS_FLAGS) {
                st.access = a.qp_access_flags;
            }
        }
        (qp_state::INIT, qp_state::RTR) => {
            if !has(mask, attr::TO_RTR) || a.dest_qp_num == 0 || a.path_mtu == 0 {
                return libc::EINVAL;
            }
            let ah = &a.ah_attr;
            // RoCE carries every packet in a global route header; IB needs a LID.
            let dest = if ctx.roce {
                if ah.is_global == 0 || ah.grh.sgid_index > 1 {
                    return libc::EINVAL;
                }
                crate::address_of_gid(&ah.grh.dgid)
            } else if ah.is_global != 0 {
                crate::address_of_gid(&ah.grh.dgid)
            } else {
                (ah.dlid != 0).then(|| crate::wire::lid_address(ah.dlid))
            };
            let Some(dest) = dest else {
                return libc::EINVAL;
            };
            st.dest_qpn = a.dest_qp_num;
            st.dest = dest;
        }
        (qp_state::RTR, qp_state::RTS) | (qp_state::RTS, qp_state::RTS) => {
            if from == qp_state::RTR {
                if !has(mask, attr::TO_RTS) || a.timeout > 31 || a.retry_cnt > 7 {
                    return libc::EINVAL;
                }
                st.timeout = a.timeout;
                st.retry_cnt = a.retry_cnt;
                st.sender = Some(crate::wire::start_sender(
                    inner.clone(),
                    st.dest,
                    st.dest_qpn,
                    st.timeout,
                    st.retry_cnt,
                ));
            }
        }
        _ => return libc::EINVAL,
    }
    st.state = to;
    q.abi.state = to;
    inner.cv.notify_all();
    0
}

/// A work request of a chain.
trait Chained {
    fn next(&self) -> *mut Self;
}

impl Chained for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl Chained for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Posts each request of the chain `wr` on `qp` with `one`; the first refused one is named in
/// `bad` and its error returned, as the verbs calls do.
unsafe fn post_chain<W: Chained>(
    qp: *mut ibv_qp,
    wr: *mut W,
    bad: *mut *mut W,
    one: impl Fn(&Arc<QpInner>, &W) -> Result<(), c_int>,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_qp.
    let inner = unsafe { &(*(qp as *const Qp)).inner };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's chain.
        let w = unsafe { &*cur };
        if let Err(e) = one(inner, w) {
            if !bad.is_null() {
                // SAFETY: the caller's out-parameter.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next();
    }
    0
}

/// `ibv_post_send` (through the context's ops table): RDMA writes only.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { post_chain(qp, wr, bad, post_one_send) }
}

fn post_one_send(inner: &Arc<QpInner>, w: &ibv_send_wr) -> Result<(), c_int> {
    let Ok(mut st) = inner.st.lock() else {
        return Err(libc::EIO);
    };
    let signaled = w.send_flags & SEND_SIGNALED != 0;
    if st.state == qp_state::ERR {
        drop(st);
        inner.send_cq.push(wc(
            inner.qpn,
            w.wr_id,
            wc_status::WR_FLUSH_ERR,
            wc_opcode::RDMA_WRITE,
        ));
        return Ok(());
    }
    if st.state != qp_state::RTS {
        return Err(libc::EINVAL);
    }
    if w.opcode != wr_opcode::RDMA_WRITE && w.opcode != wr_opcode::RDMA_WRITE_WITH_IMM {
        return Err(libc::EINVAL);
    }
    if w.num_sge < 0 || w.num_sge as u32 > inner.cap.max_send_sge.max(1) || w.num_sge > 1 {
        return Err(libc::EINVAL);
    }
    if st.sq_outstanding >= inner.cap.max_send_wr {
        return Err(libc::ENOMEM);
    }
    let (local, len) = if w.num_sge == 1 {
        // SAFETY: one entry, as num_sge says.
        let sge = unsafe { *w.sg_list };
        let region = regions()
            .lock()
            .ok()
            .and_then(|m| m.get(&sge.lkey).copied());
        let host = region
            .filter(|r| r.pd == inner.pd)
            .and_then(|r| r.host_range(sge.addr, sge.length as u64));
        match host {
            Some(h) => (h, sge.length),
            None => {
                // A bad local key completes with a protection error.
                st.sq_outstanding += 1;
                drop(st);
                inner.complete_send(w.wr_id, signaled, wc_status::LOC_PROT_ERR);
                return Ok(());
            }
        }
    } else {
        (0, 0)
    };
    let job = Job::Write(WriteJob {
        wr_id: w.wr_id,
        signaled,
        local,
        len,
        remote_addr: w.rdma.remote_addr,
        rkey: w.rdma.rkey,
        imm: (w.opcode == wr_opcode::RDMA_WRITE_WITH_IMM).then(|| u32::from_be(w.imm_data)),
    });
    let Some(tx) = st.sender.clone() else {
        return Err(libc::EINVAL);
    };
    st.sq_outstanding += 1;
    drop(st);
    if tx.send(job).is_err() {
        inner.complete_send(w.wr_id, signaled, wc_status::WR_FLUSH_ERR);
    }
    Ok(())
}

/// `ibv_post_recv` (through the context's ops table).
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { post_chain(qp, wr, bad, post_one_recv) }
}

fn post_one_recv(inner: &Arc<QpInner>, w: &ibv_recv_wr) -> Result<(), c_int> {
    let mut st = inner.st.lock().map_err(|_| libc::EIO)?;
    match st.state {
        qp_state::RESET => return Err(libc::EINVAL),
        qp_state::ERR => {
            drop(st);
            inner.recv_cq.push(wc(
                inner.qpn,
                w.wr_id,
                wc_status::WR_FLUSH_ERR,
                wc_opcode::RECV_RDMA_WITH_IMM,
            ));
        }
        _ => {
            if w.num_sge < 0 || w.num_sge as u32 > inner.cap.max_recv_sge {
                return Err(libc::EINVAL);
            }
            if st.rq.len() as u32 >= inner.cap.max_recv_wr {
                return Err(libc::ENOMEM);
            }
            st.rq.push_back(w.wr_id);
            inner.cv.notify_all();
        }
    }
    Ok(())
}
