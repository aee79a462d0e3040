//! A verbs connection: reliable-connected queue pairs (one per lane) on one completion queue,
//! with a completion channel to sleep on.

use super::{Api, VerbsFabric};
use crate::transport::rdma::{Armed, Completion, Link, RdmaConfig, Write};
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, c_int, c_void};
use std::io;
use strata_ibverbs_abi::*;

/// One lane's address, as the peer needs it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LaneAddress {
    qpn: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    mtu: u32,
}

/// A connection: queue pairs on one completion queue with a completion channel.
pub(super) struct VerbsLink {
    api: &'static Api,
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qps: Vec<*mut ibv_qp>,
    psns: Vec<u32>,
    local: Vec<LaneAddress>,
    port: u8,
    roce: bool,
    gid_index: u8,
    cfg: RdmaConfig,
    armed: bool,
    events: u32,
    /// Completions taken while arming, handed out by the next poll.
    stash: Vec<ibv_wc>,
}

// SAFETY: verbs objects may be used from any thread; the link is used by one at a time.
unsafe impl Send for VerbsLink {}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl VerbsLink {
    pub(super) fn new(f: &VerbsFabric, lanes: usize, depth: usize) -> io::Result<Self> {
        let api = f.api;
        let ctx = f.ctx as *mut ibv_context;
        // SAFETY: an open context.
        let channel = unsafe { (api.create_comp_channel)(ctx) };
        if channel.is_null() {
            return Err(os_err("ibv_create_comp_channel"));
        }
        // SAFETY: the channel's descriptor; made non-blocking so polling it never waits.
        unsafe {
            let fd = (*channel).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        let mut link = Self {
            api,
            ctx,
            channel,
            cq: std::ptr::null_mut(),
            qps: Vec::new(),
            psns: Vec::new(),
            local: Vec::new(),
            port: f.port,
            roce: f.roce,
            gid_index: f.gid_index,
            cfg: f.cfg.clone(),
            armed: false,
            events: 0,
            stash: Vec::new(),
        };
        let cqe = (2 * depth * lanes) as c_int;
        // SAFETY: an open context and our channel.
        link.cq = unsafe { (api.create_cq)(ctx, cqe, std::ptr::null_mut(), channel, 0) };
        if link.cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        for _ in 0..lanes {
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: link.cq,
                recv_cq: link.cq,
                srq: std::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: depth as u32,
                    max_recv_wr: depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: our PD and attributes.
            let qp = unsafe { (api.create_qp)(f.pd as *mut ibv_pd, &mut init) };
            if qp.is_null() {
                return Err(os_err("ibv_create_qp"));
            }
            link.qps.push(qp);
            let mut a = ibv_qp_attr {
                qp_state: qp_state::INIT,
                pkey_index: 0,
                port_num: f.port,
                qp_access_flags: (access::LOCAL_WRITE | access::REMOTE_WRITE) as u32,
                ..Default::default()
            };
            link.modify(qp, &mut a, attr::TO_INIT, "INIT")?;
            let mut psn = [0u8; 4];
            let _ = getrandom::fill(&mut psn);
            let psn = u32::from_le_bytes(psn) & 0xff_ffff;
            link.psns.push(psn);
            link.local.push(LaneAddress {
                // SAFETY: a QP the library returned.
                qpn: unsafe { (*qp).qp_num },
                psn,
                lid: f.lid,
                gid: f.gid.raw,
                mtu: f.mtu,
            });
        }
        Ok(link)
    }

    fn modify(
        &self,
        qp: *mut ibv_qp,
        a: &mut ibv_qp_attr,
        mask: c_int,
        to: &str,
    ) -> io::Result<()> {
        // SAFETY: our QP and a complete attribute block.
        let r = unsafe { (self.api.modify_qp)(qp, a, mask) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_modify_qp to {to}: {}",
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(())
    }

    fn ops(&self) -> &ContextOps {
        // SAFETY: an open context.
        unsafe { &(*self.ctx).ops }
    }

    fn lane_of_qpn(&self, qpn: u32) -> usize {
        self.local.iter().position(|l| l.qpn == qpn).unwrap_or(0)
    }

    fn status_text(&self, status: u32) -> String {
        // SAFETY: returns a static string.
        let s = unsafe { (self.api.wc_status_str)(status) };
        if s.is_null() {
            return "unknown status".into();
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    fn error_of(&self, wc: &ibv_wc) -> io::Error {
        let what = if wc.opcode == wc_opcode::RECV_RDMA_WITH_IMM {
            "receive"
        } else {
            "RDMA write"
        };
        let kind = match wc.status {
            wc_status::RETRY_EXC_ERR | wc_status::RNR_RETRY_EXC_ERR => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(
            kind,
            format!(
                "{what} on lane {} failed: {} ({}, vendor error {:#x})",
                self.lane_of_qpn(wc.qp_num),
                self.status_text(wc.status),
                wc_status::name(wc.status),
                wc.vendor_err
            ),
        )
    }

    fn take_event(&mut self) {
        if !self.armed {
            return;
        }
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: our channel (non-blocking) and out-parameters.
        if unsafe { (self.api.get_cq_event)(self.channel, &mut cq, &mut ctx) } == 0 {
            self.events += 1;
            self.armed = false;
        }
    }

    fn poll_raw(&mut self, buf: &mut [ibv_wc]) -> io::Result<usize> {
        let poll = self
            .ops()
            .poll_cq
            .ok_or_else(|| io::Error::other("no poll_cq"))?;
        // SAFETY: our CQ and an array of buf.len() entries.
        let n = unsafe { poll(self.cq, buf.len() as c_int, buf.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!(
                "polling the completion queue failed ({})",
                io::Error::from_raw_os_error(-n)
            )));
        }
        Ok(n as usize)
    }
}

impl Link for VerbsLink {
    fn address(&self) -> Vec<u8> {
        serde_json::to_vec(&self.local).unwrap_or_default()
    }

    fn connect(&mut self, remote: &[u8]) -> io::Result<()> {
        let peers: Vec<LaneAddress> = serde_json::from_slice(remote).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("peer address: {e}"))
        })?;
        if peers.len() != self.qps.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the peer has {} lanes, this side {}",
                    peers.len(),
                    self.qps.len()
                ),
            ));
        }
        for (lane, p) in peers.iter().enumerate() {
            let qp = self.qps[lane];
            let global = self.roce || p.lid == 0;
            let mut a = ibv_qp_attr {
                qp_state: qp_state::RTR,
                path_mtu: p.mtu.min(self.local[lane].mtu),
                dest_qp_num: p.qpn,
                rq_psn: p.psn,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: ibv_gid { raw: p.gid },
                        flow_label: 0,
                        sgid_index: self.gid_index,
                        hop_limit: 255,
                        traffic_class: self.cfg.traffic_class,
                    },
                    dlid: p.lid,
                    sl: self.cfg.service_level,
                    src_path_bits: 0,
                    static_rate: 0,
                    is_global: u8::from(global),
                    port_num: self.port,
                },
                ..Default::default()
            };
            self.modify(qp, &mut a, attr::TO_RTR, "RTR")?;
            let mut a = ibv_qp_attr {
                qp_state: qp_state::RTS,
                timeout: self.cfg.timeout,
                retry_cnt: self.cfg.retry_cnt,
                rnr_retry: 7,
                sq_psn: self.psns[lane],
                max_rd_atomic: 1,
                ..Default::default()
            };
            self.modify(qp, &mut a, attr::TO_RTS, "RTS")?;
        }
        Ok(())
    }

    fn write(&mut self, w: &Write) -> io::Result<bool> {
        let mut sge = ibv_sge {
            addr: w.src,
            length: w.len as u32,
            lkey: w.region.local as u32,
        };
        let mut wr = ibv_send_wr {
            wr_id: w.wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: wr_opcode::RDMA_WRITE_WITH_IMM,
            send_flags: SEND_SIGNALED,
            imm_data: w.imm.to_be(),
            rdma: RdmaTarget {
                remote_addr: w.dst,
                rkey: w.rkey as u32,
            },
            ..Default::default()
        };
        let post = self
            .ops()
            .post_send
            .ok_or_else(|| io::Error::other("no post_send"))?;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: our QP; the request and its list live across the call.
        let r = unsafe { post(self.qps[w.lane], &mut wr, &mut bad) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_post_send on lane {}: {}",
                w.lane,
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(true)
    }

    fn post_recv(&mut self, lane: usize) -> io::Result<()> {
        let mut wr = ibv_recv_wr {
            wr_id: lane as u64,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let post = self
            .ops()
            .post_recv
            .ok_or_else(|| io::Error::other("no post_recv"))?;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: our QP and a request without buffers (writes with immediate data need none).
        let r = unsafe { post(self.qps[lane], &mut wr, &mut bad) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_post_recv on lane {lane}: {}",
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        self.take_event();
        let mut batch = std::mem::take(&mut self.stash);
        let mut buf = [ibv_wc::default(); 32];
        loop {
            let n = self.poll_raw(&mut buf)?;
            batch.extend_from_slice(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        // The first error that is not a flush is the cause; flushes only follow it.
        let failed = batch
            .iter()
            .filter(|w| w.status != wc_status::SUCCESS)
            .min_by_key(|w| w.status == wc_status::WR_FLUSH_ERR);
        if let Some(w) = failed {
            return Err(self.error_of(w));
        }
        out.extend(batch.iter().map(|w| {
            if w.opcode == wc_opcode::RECV_RDMA_WITH_IMM {
                Completion::Arrived {
                    imm: u32::from_be(w.imm_data),
                }
            } else {
                Completion::Sent { wr_id: w.wr_id }
            }
        }));
        Ok(())
    }

    fn arm(&mut self) -> io::Result<Armed> {
        if !self.stash.is_empty() {
            return Ok(Armed::Busy);
        }
        if !self.armed {
            let notify = self
                .ops()
                .req_notify_cq
                .ok_or_else(|| io::Error::other("no req_notify_cq"))?;
            // SAFETY: our CQ, which has a channel.
            let r = unsafe { notify(self.cq, 0) };
            if r != 0 {
                return Err(io::Error::other(format!(
                    "ibv_req_notify_cq: {}",
                    io::Error::from_raw_os_error(r)
                )));
            }
            self.armed = true;
        }
        // A completion that came before the request would not signal: look once more.
        let mut one = [ibv_wc::default(); 1];
        if self.poll_raw(&mut one)? == 1 {
            self.stash.push(one[0]);
            return Ok(Armed::Busy);
        }
        // SAFETY: our channel.
        Ok(Armed::Sleep(unsafe { (*self.channel).fd }))
    }
}

impl Drop for VerbsLink {
    fn drop(&mut self) {
        self.take_event();
        // SAFETY: our objects, destroyed children first; events acknowledged before the CQ goes.
        unsafe {
            for &qp in &self.qps {
                (self.api.destroy_qp)(qp);
            }
            if !self.cq.is_null() {
                (self.api.ack_cq_events)(self.cq, self.events);
                (self.api.destroy_cq)(self.cq);
            }
            (self.api.destroy_comp_channel)(self.channel);
        }
    }
}
