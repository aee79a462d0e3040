//! strata's own declarations of the libfabric ABI it uses (libfabric 1.x, `<rdma/fabric.h>`
//! and friends): the structs as far as strata reads or writes them, the operation tables the
//! header's inline calls go through, and the constants. Sizes and offsets are checked in
//! `layout_matches_libfabric` against figures printed by a C program built with libfabric
//! 1.17's headers.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// `FI_VERSION(1, 10)`: the API version strata asks for (1.10 has everything it uses).
pub const API_VERSION: u32 = (1 << 16) | 10;

pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub const FI_HMEM: u64 = 1 << 47;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;
pub const FI_RX_CQ_DATA: u64 = 1 << 56;

pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
pub const FI_MR_HMEM: c_int = 1 << 10;

pub const FI_EP_RDM: u32 = 3;
pub const FI_CQ_FORMAT_DATA: u32 = 3;
pub const FI_WAIT_NONE: u32 = 0;
pub const FI_WAIT_FD: u32 = 3;
pub const FI_AV_TABLE: u32 = 2;
pub const FI_THREAD_DOMAIN: u32 = 3;
pub const FI_PROGRESS_AUTO: u32 = 1;

/// `fi_control` commands.
pub const FI_GETWAIT: c_int = 5;
pub const FI_ENABLE: c_int = 6;

/// `-FI_EAGAIN`, `-FI_EAVAIL`.
pub const FI_EAGAIN: isize = 11;
pub const FI_EAVAIL: isize = 259;

/// `struct fid`.
#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut fi_ops,
}

/// `struct fi_ops`.
#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: unsafe extern "C" fn(*mut fid) -> c_int,
    pub bind: unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int,
    pub control: unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int,
    pub _rest: [*mut c_void; 3],
}

/// `struct fi_fabric_attr`.
#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut fid_fabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

/// `struct fi_domain_attr`, up to `cq_data_size`.
#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut c_void,
    pub name: *mut c_char,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub resource_mgmt: u32,
    pub av_type: u32,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
}

/// `struct fi_ep_attr`, up to `type`.
#[repr(C)]
pub struct fi_ep_attr {
    pub ep_type: u32,
}

/// `struct fi_info`.
#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut c_void,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    pub nic: *mut c_void,
}

/// `struct fi_tx_attr`.
#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

/// `struct fid_fabric` and its `fi_ops_fabric`.
#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *mut fi_ops_fabric,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: unsafe extern "C" fn(
        *mut fid_fabric,
        *mut fi_info,
        *mut *mut fid_domain,
        *mut c_void,
    ) -> c_int,
    pub passive_ep: *mut c_void,
    pub eq_open: *mut c_void,
    pub wait_open: *mut c_void,
    pub trywait: unsafe extern "C" fn(*mut fid_fabric, *mut *mut fid, c_int) -> c_int,
}

/// `struct fid_domain`, `fi_ops_domain`, `fi_ops_mr`.
#[repr(C)]
pub struct fid_domain {
    pub fid: fid,
    pub ops: *mut fi_ops_domain,
    pub mr: *mut fi_ops_mr,
}

#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_av_attr,
        *mut *mut fid_av,
        *mut c_void,
    ) -> c_int,
    pub cq_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_cq_attr,
        *mut *mut fid_cq,
        *mut c_void,
    ) -> c_int,
    pub endpoint:
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int,
}

#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    #[allow(clippy::type_complexity)]
    pub reg: unsafe extern "C" fn(
        *mut fid,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        u64,
        *mut *mut fid_mr,
        *mut c_void,
    ) -> c_int,
}

/// `struct fid_mr`.
#[repr(C)]
pub struct fid_mr {
    pub fid: fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

/// `struct fid_ep` and the tables strata calls.
#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *mut c_void,
    pub cm: *mut fi_ops_cm,
    pub msg: *mut fi_ops_msg,
    pub rma: *mut fi_ops_rma,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: *mut c_void,
    pub getname: unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int,
}

#[repr(C)]
pub struct fi_ops_msg {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> isize,
}

#[repr(C)]
pub struct fi_ops_rma {
    pub size: usize,
    pub _before: [*mut c_void; 7],
    #[allow(clippy::type_complexity)]
    pub writedata: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
}

/// `struct fid_cq` and `fi_ops_cq`.
#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *mut fi_ops_cq,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize,
    pub readfrom: *mut c_void,
    pub readerr: unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize,
    pub sread: *mut c_void,
    pub sreadfrom: *mut c_void,
    pub signal: *mut c_void,
    pub strerror: unsafe extern "C" fn(
        *mut fid_cq,
        c_int,
        *const c_void,
        *mut c_char,
        usize,
    ) -> *const c_char,
}

/// `struct fid_av` and `fi_ops_av`.
#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *mut fi_ops_av,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        *mut fid_av,
        *const c_void,
        usize,
        *mut u64,
        u64,
        *mut c_void,
    ) -> c_int,
}

/// `struct fi_cq_attr`.
#[repr(C)]
#[derive(Default)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: u32,
    pub wait_obj: u32,
    pub signaling_vector: c_int,
    pub wait_cond: u32,
    pub wait_set: usize,
}

/// `struct fi_av_attr`.
#[repr(C)]
#[derive(Default)]
pub struct fi_av_attr {
    pub av_type: u32,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: usize,
    pub map_addr: usize,
    pub flags: u64,
}

/// `struct fi_cq_data_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct fi_cq_data_entry {
    pub op_context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
}

/// `struct fi_cq_err_entry`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fi_cq_err_entry {
    pub op_context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

/// The exported calls, by type.
pub type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const fi_info,
    *mut *mut fi_info,
) -> c_int;
pub type FreeInfo = unsafe extern "C" fn(*mut fi_info);
pub type DupInfo = unsafe extern "C" fn(*const fi_info) -> *mut fi_info;
pub type Fabric =
    unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;
pub type StrError = unsafe extern "C" fn(c_int) -> *const c_char;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_libfabric() {
        assert_eq!(size_of::<fi_info>(), 120);
        assert_eq!(offset_of!(fi_info, tx_attr), 72);
        assert_eq!(offset_of!(fi_info, domain_attr), 96);
        // fabric.h declares fi_tx_attr's nine 64-bit fields before its u32 tclass.
        assert_eq!(offset_of!(fi_tx_attr, op_flags), 16);
        assert_eq!(size_of::<fi_tx_attr>(), 80);
        assert_eq!(offset_of!(fi_info, fabric_attr), 104);
        assert_eq!(offset_of!(fi_domain_attr, threading), 16);
        assert_eq!(offset_of!(fi_domain_attr, mr_mode), 36);
        assert_eq!(offset_of!(fi_domain_attr, cq_data_size), 48);
        assert_eq!(size_of::<fi_fabric_attr>(), 32);
        assert_eq!(size_of::<fid>(), 24);
        assert_eq!(size_of::<fi_ops>(), 56);
        assert_eq!(offset_of!(fi_ops_fabric, trywait), 40);
        assert_eq!(size_of::<fid_domain>(), 40);
        assert_eq!(size_of::<fid_mr>(), 40);
        assert_eq!(offset_of!(fid_ep, rma), 48);
        assert_eq!(offset_of!(fi_ops_cm, getname), 16);
        assert_eq!(offset_of!(fi_ops_rma, writedata), 64);
        assert_eq!(offset_of!(fi_ops_cq, readerr), 24);
        assert_eq!(offset_of!(fi_ops_cq, strerror), 56);
        assert_eq!(size_of::<fi_cq_attr>(), 40);
        assert_eq!(size_of::<fi_av_attr>(), 48);
        assert_eq!(size_of::<fi_cq_data_entry>(), 40);
        assert_eq!(size_of::<fi_cq_err_entry>(), 80);
        assert_eq!(offset_of!(fi_cq_err_entry, err), 56);
        assert_eq!(offset_of!(fi_cq_err_entry, err_data), 64);
    }
}
