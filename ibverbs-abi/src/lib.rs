//! The part of the libibverbs ABI (rdma-core's `<infiniband/verbs.h>`) that strata uses, as
//! strata's own `#[repr(C)]` declarations: no build-time dependency on rdma-core, as NCCL's
//! `ibvwrap` does it. strata's verbs provider loads `libibverbs.so.1` with `dlopen` and calls
//! it through these types; the test-only stand-in (`tests/standins/ibverbs`) implements them.
//!
//! Layouts are those of rdma-core's stable ABI (`IBVERBS_1.1`); the sizes and offsets below are
//! checked against the header in `layout_matches_rdma_core` (figures printed by a C program
//! compiled against rdma-core 44's `verbs.h`). Calls that `verbs.h` makes `static inline`
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) go through the
//! context's [`ContextOps`] table, as the inline versions do.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `enum ibv_qp_state`.
pub mod qp_state {
    /// Freshly created.
    pub const RESET: u32 = 0;
    /// Initialised: receives may be posted.
    pub const INIT: u32 = 1;
    /// Ready to receive.
    pub const RTR: u32 = 2;
    /// Ready to send.
    pub const RTS: u32 = 3;
    /// Send queue error.
    pub const SQE: u32 = 5;
    /// Error: every outstanding and later request completes with a flush error.
    pub const ERR: u32 = 6;
}

/// `enum ibv_qp_attr_mask` bits.
pub mod attr {
    use std::ffi::c_int;
    /// `qp_state`.
    pub const STATE: c_int = 1;
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: c_int = 1 << 3;
    /// `pkey_index`.
    pub const PKEY_INDEX: c_int = 1 << 4;
    /// `port_num`.
    pub const PORT: c_int = 1 << 5;
    /// `ah_attr` (the address vector).
    pub const AV: c_int = 1 << 7;
    /// `path_mtu`.
    pub const PATH_MTU: c_int = 1 << 8;
    /// `timeout`.
    pub const TIMEOUT: c_int = 1 << 9;
    /// `retry_cnt`.
    pub const RETRY_CNT: c_int = 1 << 10;
    /// `rnr_retry`.
    pub const RNR_RETRY: c_int = 1 << 11;
    /// `rq_psn`.
    pub const RQ_PSN: c_int = 1 << 12;
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: c_int = 1 << 15;
    /// `sq_psn`.
    pub const SQ_PSN: c_int = 1 << 16;
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    /// `dest_qp_num`.
    pub const DEST_QPN: c_int = 1 << 20;
    /// What RESET → INIT needs.
    pub const TO_INIT: c_int = STATE | PKEY_INDEX | PORT | ACCESS_FLAGS;
    /// What INIT → RTR needs.
    pub const TO_RTR: c_int =
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    /// What RTR → RTS needs.
    pub const TO_RTS: c_int = STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC;
}

/// `enum ibv_access_flags` bits.
pub mod access {
    use std::ffi::c_int;
    /// The local NIC may write the region.
    pub const LOCAL_WRITE: c_int = 1;
    /// Remote peers may RDMA-write the region.
    pub const REMOTE_WRITE: c_int = 1 << 1;
    /// Remote peers may RDMA-read the region.
    pub const REMOTE_READ: c_int = 1 << 2;
}

/// `enum ibv_wr_opcode`.
pub mod wr_opcode {
    /// RDMA write.
    pub const RDMA_WRITE: u32 = 0;
    /// RDMA write that also consumes a receive at the target and reports 32 bits of data.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// Send.
    pub const SEND: u32 = 2;
}

/// `enum ibv_wc_opcode`.
pub mod wc_opcode {
    /// An RDMA write completed at the initiator.
    pub const RDMA_WRITE: u32 = 1;
    /// A receive consumed by an RDMA write with immediate data.
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_status`.
pub mod wc_status {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// Local length error.
    pub const LOC_LEN_ERR: u32 = 1;
    /// Local QP operation error.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// Local protection error (a bad local key).
    pub const LOC_PROT_ERR: u32 = 4;
    /// Flushed: the QP went to the error state first.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// Remote invalid request.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// Remote access error (a bad remote key or range).
    pub const REM_ACCESS_ERR: u32 = 10;
    /// Remote operation error.
    pub const REM_OP_ERR: u32 = 11;
    /// Transport retry counter exceeded (the peer stopped acknowledging).
    pub const RETRY_EXC_ERR: u32 = 12;
    /// Receiver-not-ready retry counter exceeded.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// Fatal error.
    pub const FATAL_ERR: u32 = 19;
    /// General error.
    pub const GENERAL_ERR: u32 = 21;

    /// The enumerator's name, for messages.
    pub fn name(status: u32) -> &'static str {
        match status {
            SUCCESS => "IBV_WC_SUCCESS",
            LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
            LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
            LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
            WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
            REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
            REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
            REM_OP_ERR => "IBV_WC_REM_OP_ERR",
            RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
            RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
            FATAL_ERR => "IBV_WC_FATAL_ERR",
            GENERAL_ERR => "IBV_WC_GENERAL_ERR",
            _ => "IBV_WC_(other)",
        }
    }
}

/// `IBV_SEND_SIGNALED`: the request produces a completion.
pub const SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_WC_WITH_IMM`: the completion carries immediate data.
pub const WC_WITH_IMM: c_uint = 1 << 1;
/// `IBV_QPT_RC`: a reliable connected queue pair.
pub const QPT_RC: u32 = 2;
/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET` (RoCE).
pub const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_MTU_4096`.
pub const MTU_4096: u32 = 5;

/// `struct ibv_device` (opaque here: strata reads it through `ibv_get_device_name`).
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_context_ops`: the calls `verbs.h` inlines go through this table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ContextOps {
    /// Compatibility entries before `poll_cq`.
    pub _compat_head: [*mut c_void; 11],
    /// `poll_cq`.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// `req_notify_cq`.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Compatibility entries before `post_send`.
    pub _compat_mid: [*mut c_void; 12],
    /// `post_send`.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// `post_recv`.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Compatibility entries after `post_recv`.
    pub _compat_tail: [*mut c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    /// The device.
    pub device: *mut ibv_device,
    /// The inline calls' table.
    pub ops: ContextOps,
    /// Command descriptor.
    pub cmd_fd: c_int,
    /// Asynchronous event descriptor.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// `pthread_mutex_t` (40 bytes on x86-64 glibc) and `abi_compat`.
    pub _private: [u64; 6],
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Its context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// Start of the region.
    pub addr: *mut c_void,
    /// Bytes.
    pub length: usize,
    /// Kernel handle.
    pub handle: u32,
    /// Key for local access (scatter/gather entries).
    pub lkey: u32,
    /// Key remote peers name in RDMA requests.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Its context.
    pub context: *mut ibv_context,
    /// Readable when a completion event is pending.
    pub fd: c_int,
    /// Users.
    pub refcnt: c_int,
}

/// `struct ibv_cq` (the fields after `cqe` are the library's own).
#[repr(C)]
pub struct ibv_cq {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its completion channel, if any.
    pub channel: *mut ibv_comp_channel,
    /// The creator's pointer.
    pub cq_context: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Entries.
    pub cqe: c_int,
    /// mutex, cond and event counters.
    pub _private: [u64; 12],
}

/// `struct ibv_qp` (the fields after `qp_type` are the library's own).
#[repr(C)]
pub struct ibv_qp {
    /// Its context.
    pub context: *mut ibv_context,
    /// The creator's pointer.
    pub qp_context: *mut c_void,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// Send completion queue.
    pub send_cq: *mut ibv_cq,
    /// Receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue.
    pub srq: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Queue pair number.
    pub qp_num: u32,
    /// Current state.
    pub state: u32,
    /// Type.
    pub qp_type: u32,
    /// mutex, cond and event counter.
    pub _private: [u64; 12],
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    /// The creator's pointer.
    pub qp_context: *mut c_void,
    /// Send completion queue.
    pub send_cq: *mut ibv_cq,
    /// Receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue.
    pub srq: *mut c_void,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// Type.
    pub qp_type: u32,
    /// Whether every send is signalled.
    pub sq_sig_all: c_int,
}

/// `union ibv_gid`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_gid {
    /// The 16 bytes (subnet prefix, then interface id, big-endian).
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_ah_attr {
    /// Global route header (required on RoCE).
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether `grh` is used.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_attr {
    /// Target state.
    pub qp_state: u32,
    /// Current state.
    pub cur_qp_state: u32,
    /// Path MTU.
    pub path_mtu: u32,
    /// Migration state.
    pub path_mig_state: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// Access flags.
    pub qp_access_flags: c_uint,
    /// Capabilities.
    pub cap: ibv_qp_cap,
    /// Address vector.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQ drained event.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Outstanding RDMA reads as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads as target.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit.
    pub rate_limit: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_port_attr {
    /// `IBV_PORT_*`.
    pub state: u32,
    /// Largest MTU.
    pub max_mtu: u32,
    /// Active MTU.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID.
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// VLs.
    pub max_vl_num: u8,
    /// SM service level.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active width.
    pub active_width: u8,
    /// Active speed.
    pub active_speed: u8,
    /// Physical state.
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// More capability flags.
    pub port_cap_flags2: u16,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_sge {
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the region holding it.
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr`'s `wr` union.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct RdmaTarget {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_send_wr` (the unions strata does not use are padding).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// Next request in a chain.
    pub next: *mut ibv_send_wr,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
    /// `wr_opcode`.
    pub opcode: u32,
    /// `IBV_SEND_*`.
    pub send_flags: c_uint,
    /// Immediate data (network byte order).
    pub imm_data: u32,
    /// The RDMA target (the `wr` union's `rdma` member).
    pub rdma: RdmaTarget,
    /// The rest of the `wr` union, `qp_type` and the `bind_mw` / `tso` union.
    pub _rest: [u64; 9],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            rdma: RdmaTarget::default(),
            _rest: [0; 9],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// Next request in a chain.
    pub next: *mut ibv_recv_wr,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length (0: the receive only takes immediate data).
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    /// The request's id.
    pub wr_id: u64,
    /// `wc_status`.
    pub status: u32,
    /// `wc_opcode`.
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes written (for a receive consumed by a write with immediate).
    pub byte_len: u32,
    /// Immediate data (network byte order).
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP number.
    pub src_qp: u32,
    /// `IBV_WC_*` flags.
    pub wc_flags: c_uint,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Path bits.
    pub dlid_path_bits: u8,
}

/// The exported calls strata resolves with `dlsym`, by name and type.
pub mod calls {
    use super::*;
    /// `ibv_get_device_list`.
    pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
    /// `ibv_free_device_list`.
    pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
    /// `ibv_get_device_name`.
    pub type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
    /// `ibv_open_device`.
    pub type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
    /// `ibv_close_device`.
    pub type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
    /// `ibv_query_port` (the exported, compatibility-layout entry).
    pub type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    /// `ibv_query_gid`.
    pub type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    /// `ibv_alloc_pd`.
    pub type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
    /// `ibv_dealloc_pd`.
    pub type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
    /// `ibv_reg_mr`.
    pub type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    /// `ibv_reg_dmabuf_mr` (rdma-core 34+).
    pub type RegDmabufMr =
        unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
    /// `ibv_dereg_mr`.
    pub type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
    /// `ibv_create_comp_channel`.
    pub type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
    /// `ibv_destroy_comp_channel`.
    pub type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
    /// `ibv_create_cq`.
    pub type CreateCq = unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq;
    /// `ibv_destroy_cq`.
    pub type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
    /// `ibv_get_cq_event`.
    pub type GetCqEvent =
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    /// `ibv_ack_cq_events`.
    pub type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, c_uint);
    /// `ibv_create_qp`.
    pub type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    /// `ibv_modify_qp`.
    pub type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    /// `ibv_destroy_qp`.
    pub type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
    /// `ibv_wc_status_str`.
    pub type WcStatusStr = unsafe extern "C" fn(u32) -> *const c_char;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets printed by a C program built against rdma-core 44's `verbs.h`.
    #[test]
    fn layout_matches_rdma_core() {
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, rdma), 40);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, cap), 36);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(size_of::<ibv_cq>(), 128);
        assert_eq!(size_of::<ibv_qp>(), 160);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_qp, state), 56);
        assert_eq!(size_of::<ibv_comp_channel>(), 16);
        assert_eq!(size_of::<ibv_pd>(), 16);
        assert_eq!(size_of::<ibv_context>(), 328);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
        assert_eq!(size_of::<ContextOps>(), 256);
        assert_eq!(offset_of!(ContextOps, poll_cq), 88);
        assert_eq!(offset_of!(ContextOps, req_notify_cq), 96);
        assert_eq!(offset_of!(ContextOps, post_send), 200);
        assert_eq!(offset_of!(ContextOps, post_recv), 208);
    }
}
