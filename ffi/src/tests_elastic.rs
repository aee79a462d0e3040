//! The NCCL 2.29/2.30 entry points called in process: growing a communicator from 2 ranks to 3,
//! suspend and resume, memory statistics, window pointers, and the codes of what strata does
//! not implement.

use super::elastic::*;
use super::tests::{comm, destroy, init_all, last_error};
use super::*;
use std::ptr::{null, null_mut};

/// An all-reduce of `rank + 1` on every rank of `c`, returning the sum this rank got.
fn sum_of_ranks(c: NcclComm) -> f32 {
    let mut x = [comm(c).rank() as f32 + 1.0; 4];
    let p = x.as_mut_ptr().cast::<c_void>();
    // SAFETY: a 4-float buffer in place; blocking communicator.
    let r = unsafe { ncclAllReduce(p, p, 4, 7, 0, c, null_mut()) };
    assert_eq!(r, NcclResult::Success, "{}", last_error(c));
    x[0]
}

#[test]
fn a_communicator_grows_from_two_ranks_to_three() {
    let old = init_all(2);
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: a live handle and a writable id.
    assert_eq!(
        unsafe { ncclCommGetUniqueId(old[0], &mut id) },
        NcclResult::Success
    );
    // An existing rank must pass rank -1; a new rank must pass the id.
    let mut out = null_mut();
    // SAFETY: valid pointers.
    let r = unsafe { ncclCommGrow(old[1], 3, null(), 1, &mut out, null_mut()) };
    assert_eq!(r, NcclResult::InvalidArgument);
    assert!(
        last_error_text().contains("rank -1"),
        "{}",
        last_error_text()
    );
    // SAFETY: valid pointers.
    let r = unsafe { ncclCommGrow(null_mut(), 3, null(), 2, &mut out, null_mut()) };
    assert_eq!(r, NcclResult::InvalidArgument);
    assert!(out.is_null());

    let joiners: Vec<_> = [
        (old[0] as usize, true, -1),
        (old[1] as usize, false, -1),
        (0, true, 2),
    ]
    .into_iter()
    .map(|(c, pass_id, rank)| {
        std::thread::spawn(move || {
            let mut new = null_mut();
            let idp = if pass_id {
                &id as *const NcclUniqueId
            } else {
                null()
            };
            // SAFETY: valid pointers; `c` is a live handle or NULL for the new rank.
            let r = unsafe { ncclCommGrow(c as NcclComm, 3, idp, rank, &mut new, null_mut()) };
            assert_eq!(r, NcclResult::Success, "{}", last_error_text());
            let c = comm(new);
            let (rank, size) = (c.rank(), c.size());
            let sum = sum_of_ranks(new);
            (new as usize, rank, size, sum)
        })
    })
    .collect();
    let grown: Vec<_> = joiners.into_iter().map(|j| j.join().unwrap()).collect();
    // Existing ranks keep their ranks; the new one is rank 2; everyone sums 1 + 2 + 3.
    let ranks: Vec<_> = grown.iter().map(|g| (g.1, g.2, g.3)).collect();
    assert_eq!(ranks, vec![(0, 3, 6.0), (1, 3, 6.0), (2, 3, 6.0)]);
    // The old communicator still works beside the new one.
    let olds: Vec<_> = old
        .iter()
        .map(|&c| {
            let c = c as usize;
            std::thread::spawn(move || sum_of_ranks(c as NcclComm))
        })
        .collect();
    for o in olds {
        assert_eq!(o.join().unwrap(), 3.0);
    }
    destroy(&grown.iter().map(|g| g.0 as NcclComm).collect::<Vec<_>>());
    destroy(&old);
}

#[test]
fn two_ranks_offering_an_id_is_an_error_on_both() {
    let old = init_all(2);
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: a live handle and a writable id.
    assert_eq!(
        unsafe { ncclCommGetUniqueId(old[0], &mut id) },
        NcclResult::Success
    );
    let both: Vec<_> = old
        .iter()
        .map(|&c| {
            let c = c as usize;
            std::thread::spawn(move || {
                let mut new = null_mut();
                // SAFETY: valid pointers.
                let r = unsafe { ncclCommGrow(c as NcclComm, 3, &id, -1, &mut new, null_mut()) };
                (r, new.is_null(), last_error_text())
            })
        })
        .collect();
    for b in both {
        let (r, null_out, text) = b.join().unwrap();
        assert_eq!(r, NcclResult::InvalidArgument, "{text}");
        assert!(null_out);
        assert!(text.contains("exactly one"), "{text}");
    }
    destroy(&old);
}

#[test]
fn suspend_resume_and_memory_statistics() {
    let c = init_all(1)[0];
    let mut v = 7u64;
    // SAFETY: valid pointers throughout.
    unsafe {
        assert_eq!(
            ncclCommMemStats(c, mem_stat::GPU_MEM_SUSPENDED, &mut v),
            NcclResult::Success
        );
        assert_eq!(v, 0);
        assert_eq!(ncclCommSuspend(c, 4), NcclResult::InvalidArgument);
        assert_eq!(ncclCommSuspend(c, SUSPEND_MEM), NcclResult::Success);
        assert_eq!(
            ncclCommMemStats(c, mem_stat::GPU_MEM_SUSPENDED, &mut v),
            NcclResult::Success
        );
        assert_eq!(v, 1);
        assert_eq!(
            ncclCommMemStats(c, mem_stat::GPU_MEM_TOTAL, &mut v),
            NcclResult::Success
        );
        assert_eq!(v, 0, "strata holds no GPU memory");
        assert_eq!(ncclCommMemStats(c, 9, &mut v), NcclResult::InvalidArgument);
        let mut x = [1.0f32; 4];
        let p = x.as_mut_ptr().cast::<c_void>();
        assert_eq!(
            ncclAllReduce(p, p, 4, 7, 0, c, null_mut()),
            NcclResult::InvalidUsage
        );
        assert!(last_error(c).contains("suspended"), "{}", last_error(c));
        assert_eq!(ncclCommResume(c), NcclResult::Success);
        assert_eq!(ncclCommResume(c), NcclResult::InvalidUsage);
    }
    assert_eq!(sum_of_ranks(c), 1.0);
    destroy(&[c]);
}

#[test]
fn window_pointers_and_the_unimplemented_apis_say_why() {
    let c = init_all(1)[0];
    let mut buf = vec![0u8; 8192];
    let mut win = null_mut();
    let mut user = null_mut();
    let mut dev = [0u8; 64];
    // SAFETY: valid pointers throughout.
    unsafe {
        let b = buf.as_mut_ptr().cast::<c_void>();
        assert_eq!(
            ncclCommWindowRegister(c, b, buf.len(), &mut win, 0),
            NcclResult::Success
        );
        assert_eq!(ncclWinGetUserPtr(c, win, &mut user), NcclResult::Success);
        assert_eq!(user, b);
        assert_eq!(
            ncclWinGetUserPtr(c, 0x10 as *mut c_void, &mut user),
            NcclResult::InvalidArgument
        );
        let d = dev.as_mut_ptr().cast::<c_void>();
        assert_eq!(ncclDevCommCreate(c, d, d), NcclResult::InvalidUsage);
        assert!(
            last_error_text().contains("device-side API"),
            "{}",
            last_error_text()
        );
        user = b;
        assert_eq!(
            ncclGetPeerDevicePointer(win, 0, 0, &mut user),
            NcclResult::InvalidUsage
        );
        assert!(user.is_null());
        assert_eq!(
            ncclSignal(0, 0, 0, 0, c, null_mut()),
            NcclResult::InvalidUsage
        );
        assert!(
            last_error_text().contains("one-sided signals"),
            "{}",
            last_error_text()
        );
        assert_eq!(
            ncclWaitSignal(0, d, c, null_mut()),
            NcclResult::InvalidUsage
        );
        assert_eq!(
            ncclPutSignal(b, 1, 1, 0, win, 0, 0, 0, 0, c, null_mut()),
            NcclResult::InvalidUsage
        );
        // A dead handle is still ncclInvalidArgument, as everywhere.
        assert_eq!(
            ncclSignal(0, 0, 0, 0, 0x99 as NcclComm, null_mut()),
            NcclResult::InvalidArgument
        );
        assert_eq!(ncclCommWindowDeregister(c, win), NcclResult::Success);
    }
    destroy(&[c]);
}
