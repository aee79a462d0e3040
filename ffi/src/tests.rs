//! The C entry points called in process: fault codes, abort from another thread, groups over
//! several communicators of one thread, init inside a group, shrink, and an argument fuzz.

use super::*;
use std::ptr::{null, null_mut};
use std::time::Instant;

fn lo() {
    // SAFETY: every test of this binary sets the same value before reading it.
    unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
}

/// `n` ranks as communicators of this process (ncclCommInitAll).
pub(super) fn init_all(n: usize) -> Vec<NcclComm> {
    lo();
    let mut comms = vec![null_mut(); n];
    // SAFETY: an array of n handles.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as c_int, null()) };
    assert_eq!(r, NcclResult::Success, "{}", last_error_text());
    comms
}

/// A fresh id from ncclGetUniqueId (its root listens on loopback).
pub(super) fn unique_id() -> NcclUniqueId {
    lo();
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NcclResult::Success);
    id
}

pub(super) fn comm(c: NcclComm) -> Arc<Communicator> {
    CommHandle::lookup(c).unwrap().ready().unwrap()
}

pub(super) fn destroy(comms: &[NcclComm]) {
    for &c in comms {
        // SAFETY: a live handle (or one already gone, which is only an error code).
        unsafe { ncclCommDestroy(c) };
    }
}

pub(super) fn last_error(c: NcclComm) -> String {
    // SAFETY: the returned pointer is a valid C string until this thread's next error.
    unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(c)) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn version_and_error_strings() {
    let mut v = 0;
    // SAFETY: valid pointer / null.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, NcclResult::Success);
    assert_eq!(v, 23007);
    // SAFETY: null is handled.
    assert_eq!(
        unsafe { ncclGetVersion(null_mut()) },
        NcclResult::InvalidArgument
    );
    // SAFETY: the returned pointers are static C strings.
    let s = unsafe { std::ffi::CStr::from_ptr(ncclGetErrorString(6)) };
    assert!(s.to_str().unwrap().contains("remote process"));
    // SAFETY: as above.
    let s = unsafe { std::ffi::CStr::from_ptr(ncclGetErrorString(-5)) };
    assert_eq!(s.to_str().unwrap(), "unknown result code");
}

#[test]
fn strata_comm_set_timeout_sets_one_communicators_deadline_and_refuses_bad_input() {
    let comms = init_all(2);
    assert_eq!(strataCommSetTimeout(comms[0], 2.5), NcclResult::Success);
    assert_eq!(comm(comms[0]).timeout(), Duration::from_secs_f64(2.5));
    assert_ne!(
        comm(comms[1]).timeout(),
        Duration::from_secs_f64(2.5),
        "only that one"
    );
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            strataCommSetTimeout(comms[0], bad),
            NcclResult::InvalidArgument,
            "{bad}"
        );
    }
    assert_eq!(
        strataCommSetTimeout(null_mut(), 1.0),
        NcclResult::InvalidArgument
    );
    assert_eq!(comm(comms[0]).timeout(), Duration::from_secs_f64(2.5));
    destroy(&comms);
}

#[test]
fn strata_comm_get_stragglers_writes_json_and_refuses_a_short_buffer() {
    let comms = init_all(2);
    let mut buf = [0x55 as std::ffi::c_char; 64];
    let mut len = usize::MAX;
    // SAFETY: a 64-byte buffer and a length.
    let ok = unsafe { strataCommGetStragglers(comms[0], buf.as_mut_ptr(), 64, &mut len) };
    assert_eq!(ok, NcclResult::Success);
    // SAFETY: written with its NUL.
    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(text.to_str().unwrap(), "[]", "no one is slow here");
    assert_eq!(len, 2);
    // Too short for the text and its NUL: an error, the length still said, nothing written.
    let mut short = [0x55 as std::ffi::c_char; 2];
    // SAFETY: as above, 2 bytes.
    let r = unsafe { strataCommGetStragglers(comms[0], short.as_mut_ptr(), 2, &mut len) };
    assert_eq!(r, NcclResult::InvalidArgument);
    assert_eq!((len, short), (2, [0x55; 2]));
    // SAFETY: NULL arguments are refused, not followed.
    unsafe {
        assert_eq!(
            strataCommGetStragglers(null_mut(), buf.as_mut_ptr(), 64, &mut len),
            NcclResult::InvalidArgument
        );
        assert_eq!(
            strataCommGetStragglers(comms[0], null_mut(), 64, &mut len),
            NcclResult::InvalidArgument
        );
        assert_eq!(
            strataCommGetStragglers(comms[0], buf.as_mut_ptr(), 64, null_mut()),
            NcclResult::InvalidArgument
        );
    }
    destroy(&comms);
}

#[test]
fn strata_comm_get_status_writes_every_rank_and_refuses_bad_input() {
    let comms = init_all(3);
    let mut buf = vec![0 as std::ffi::c_char; 1 << 16];
    let mut len = 0usize;
    // SAFETY: a 64 KiB buffer and a length.
    let ok = unsafe { strataCommGetStatus(comms[1], 2.0, buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(ok, NcclResult::Success);
    // SAFETY: written with its NUL.
    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    let view: serde_json::Value = serde_json::from_str(text.to_str().unwrap()).unwrap();
    assert_eq!(view["nranks"], 3);
    let ranks: Vec<u64> = view["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, vec![0, 1, 2], "{view}");
    assert_eq!(
        view["holding_up"],
        serde_json::json!([]),
        "idle ranks hold no one up"
    );
    let mut short = [0x55 as std::ffi::c_char; 8];
    // SAFETY: as above, 8 bytes.
    let r = unsafe { strataCommGetStatus(comms[0], 2.0, short.as_mut_ptr(), 8, &mut len) };
    assert_eq!(r, NcclResult::InvalidArgument);
    assert!(len > 8);
    assert_eq!(short, [0x55; 8]);
    for bad in [0.0, -1.0, f64::NAN, 31.0] {
        // SAFETY: as above.
        let r =
            unsafe { strataCommGetStatus(comms[0], bad, buf.as_mut_ptr(), buf.len(), &mut len) };
        assert_eq!(r, NcclResult::InvalidArgument, "{bad}");
    }
    // SAFETY: NULL arguments are refused, not followed.
    unsafe {
        assert_eq!(
            strataCommGetStatus(null_mut(), 1.0, buf.as_mut_ptr(), buf.len(), &mut len),
            NcclResult::InvalidArgument
        );
        assert_eq!(
            strataCommGetStatus(comms[0], 1.0, null_mut(), 64, &mut len),
            NcclResult::InvalidArgument
        );
    }
    destroy(&comms);
}

#[test]
fn strata_recv_any_names_each_sender_and_refuses_a_group_and_null_pointers() {
    let comms = init_all(3);
    let (c1, c2) = (comms[1] as usize, comms[2] as usize);
    let senders: Vec<_> = [(c1, 1i32), (c2, 2)]
        .into_iter()
        .map(|(c, r)| {
            std::thread::spawn(move || {
                let data = [r * 10; 5];
                // SAFETY: a valid buffer of 5 int32 (ncclInt32 = 2).
                unsafe { ncclSend(data.as_ptr().cast(), 5, 2, 0, c as NcclComm, null_mut()) }
            })
        })
        .collect();
    let mut got = Vec::new();
    for _ in 0..2 {
        let (mut buf, mut source) = ([0i32; 5], -1);
        // SAFETY: a valid buffer of 5 int32 and an out-pointer.
        let r = unsafe { strataRecvAny(buf.as_mut_ptr().cast(), 5, 2, &mut source, comms[0]) };
        assert_eq!(r, NcclResult::Success, "{}", last_error(comms[0]));
        assert_eq!(buf, [source * 10; 5], "the data is the sender's");
        got.push(source);
    }
    for s in senders {
        assert_eq!(s.join().unwrap(), NcclResult::Success);
    }
    got.sort_unstable();
    assert_eq!(got, [1, 2]);
    let mut buf = [0i32; 5];
    // SAFETY: NULL pointers and a group are refused before anything is received.
    unsafe {
        assert_eq!(
            strataRecvAny(buf.as_mut_ptr().cast(), 5, 2, null_mut(), comms[0]),
            NcclResult::InvalidArgument
        );
        let mut source = 0;
        assert_eq!(
            strataRecvAny(null_mut(), 5, 2, &mut source, comms[0]),
            NcclResult::InvalidArgument
        );
        assert_eq!(ncclGroupStart(), NcclResult::Success);
        assert_eq!(
            strataRecvAny(buf.as_mut_ptr().cast(), 5, 2, &mut source, comms[0]),
            NcclResult::InvalidUsage
        );
        // A group with a failed call runs nothing and reports the failure at its end.
        assert_eq!(ncclGroupEnd(), NcclResult::InvalidUsage);
    }
    destroy(&comms);
}

#[test]
fn strata_comm_subgroup_is_made_by_its_members_alone_and_refuses_bad_lists() {
    let comms = init_all(3);
    // Ranks 2 and 0, in that order; rank 1 takes no part.
    let made: Vec<_> = [(comms[2] as usize, 0i32), (comms[0] as usize, 1)]
        .into_iter()
        .map(|(c, expect)| {
            std::thread::spawn(move || {
                let members = [2, 0];
                let mut sub: NcclComm = null_mut();
                // SAFETY: a list of 2 ranks, a NUL-terminated tag and an out-pointer.
                let r = unsafe {
                    strataCommSubgroup(
                        c as NcclComm,
                        2,
                        members.as_ptr(),
                        c"pair".as_ptr(),
                        &mut sub,
                    )
                };
                assert_eq!(r, NcclResult::Success, "{}", last_error(c as NcclComm));
                let (mut rank, mut x) = (-1, [f32::from(expect as u8) + 1.0; 3]);
                // SAFETY: a live communicator, valid buffers (ncclFloat32 = 7, ncclSum = 0).
                unsafe {
                    assert_eq!(ncclCommUserRank(sub, &mut rank), NcclResult::Success);
                    let p = x.as_mut_ptr().cast();
                    assert_eq!(
                        ncclAllReduce(p, p, 3, 7, 0, sub, null_mut()),
                        NcclResult::Success
                    );
                }
                assert_eq!((rank, x), (expect, [3.0; 3]));
                sub as usize
            })
        })
        .collect();
    let subs: Vec<NcclComm> = made
        .into_iter()
        .map(|t| t.join().unwrap() as NcclComm)
        .collect();
    let mut sub: NcclComm = null_mut();
    // SAFETY: bad arguments are refused before anything is made.
    unsafe {
        let not_member = [0, 2];
        assert_eq!(
            strataCommSubgroup(comms[1], 2, not_member.as_ptr(), c"x".as_ptr(), &mut sub),
            NcclResult::InvalidArgument
        );
        assert!(sub.is_null());
        let twice = [1, 1];
        assert_eq!(
            strataCommSubgroup(comms[1], 2, twice.as_ptr(), c"x".as_ptr(), &mut sub),
            NcclResult::InvalidArgument
        );
        assert_eq!(
            strataCommSubgroup(comms[1], 1, [1].as_ptr(), std::ptr::null(), &mut sub),
            NcclResult::InvalidArgument
        );
        assert_eq!(
            strataCommSubgroup(comms[1], 0, [1].as_ptr(), c"x".as_ptr(), &mut sub),
            NcclResult::InvalidArgument
        );
    }
    destroy(&subs);
    destroy(&comms);
}

#[test]
fn a_config_is_read_by_its_size_and_a_bad_magic_is_rejected() {
    let mut full = NcclConfig {
        blocking: 0,
        ..NcclConfig::initializer()
    };
    // SAFETY: a whole config.
    assert!(!unsafe { settings_of(&full, true) }.unwrap().blocking);
    // A caller whose struct ends before `blocking` gets the default.
    full.size = 16;
    // SAFETY: the first 16 bytes are read.
    assert!(unsafe { settings_of(&full, true) }.unwrap().blocking);
    full.size = std::mem::size_of::<NcclConfig>();
    full.blocking = 7;
    // SAFETY: a whole config.
    assert!(unsafe { settings_of(&full, true) }.is_err());
    full.magic = 0;
    // SAFETY: a whole config.
    assert_eq!(
        unsafe { settings_of(&full, true) }.err(),
        Some(NcclResult::InvalidArgument)
    );
    assert!(last_error_text().contains("NCCL_CONFIG_INITIALIZER"));
}

#[test]
fn abort_from_another_thread_unblocks_a_hung_receive() {
    let comms = init_all(2);
    let c0 = comms[0] as usize;
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let mut buf = [0f32; 16];
        // SAFETY: a valid buffer of 16 floats; rank 1 never sends.
        unsafe {
            ncclRecv(
                buf.as_mut_ptr().cast(),
                16,
                7,
                1,
                c0 as NcclComm,
                null_mut(),
            )
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommAbort(comms[0]) }, NcclResult::Success);
    let code = waiter.join().unwrap();
    assert_ne!(code, NcclResult::Success);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The aborted handle is dead; rank 1's is not.
    let mut n = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { ncclCommCount(comms[0], &mut n) },
        NcclResult::InvalidArgument
    );
    destroy(&comms[1..]);
}

#[test]
fn a_timeout_is_nccl_timeout_and_a_departed_peer_is_nccl_remote_error() {
    let comms = init_all(2);
    comm(comms[0])
        .set_timeout(Duration::from_millis(1500))
        .unwrap();
    let mut x = [1f32; 4];
    // SAFETY: a valid buffer; rank 1 never joins, so the call times out.
    let code = unsafe {
        ncclAllReduce(
            x.as_ptr().cast(),
            x.as_mut_ptr().cast(),
            4,
            7,
            0,
            comms[0],
            null_mut(),
        )
    };
    assert_eq!(code, NcclResult::Timeout, "{}", last_error_text());
    let text = last_error(comms[0]);
    assert!(
        text.contains("all_reduce") && text.contains("rank 1"),
        "{text}"
    );
    let mut state = NcclResult::Success;
    // SAFETY: valid out-pointer.
    unsafe { ncclCommGetAsyncError(comms[0], &mut state) };
    assert_eq!(state, NcclResult::Timeout);
    destroy(&comms);

    // Rank 1 leaves while rank 0 waits for its message.
    let comms = init_all(2);
    let c0 = comms[0] as usize;
    let waiter = std::thread::spawn(move || {
        let mut buf = [0f32; 16];
        // SAFETY: a valid buffer of 16 floats.
        let code = unsafe {
            ncclRecv(
                buf.as_mut_ptr().cast(),
                16,
                7,
                1,
                c0 as NcclComm,
                null_mut(),
            )
        };
        (code, last_error_text())
    });
    // Connect first, so rank 0 waits on an open connection.
    std::thread::sleep(Duration::from_millis(300));
    destroy(&comms[1..]);
    let (code, text) = waiter.join().unwrap();
    assert_eq!(code, NcclResult::RemoteError, "{text}");
    assert!(
        text.contains("rank 1") && text.contains("destroyed its communicator"),
        "{text}"
    );
    destroy(&comms[..1]);
}

#[test]
fn one_thread_drives_two_ranks_through_a_group() {
    let comms = init_all(2);
    let mut bufs = [[1f32, 2.0, 3.0], [10f32, 20.0, 30.0]];
    let mut got = [[0f32; 3]; 2];
    assert_eq!(group::start(), NcclResult::Success);
    for r in 0..2 {
        let (b, g) = (bufs[r].as_mut_ptr(), got[r].as_mut_ptr());
        // SAFETY: valid buffers of 3 floats that outlive the group.
        unsafe {
            assert_eq!(
                ncclAllReduce(b.cast(), b.cast(), 3, 7, 0, comms[r], null_mut()),
                NcclResult::Success
            );
            assert_eq!(
                ncclSend(b.cast(), 3, 7, 1 - r as c_int, comms[r], null_mut()),
                NcclResult::Success
            );
            assert_eq!(
                ncclRecv(g.cast(), 3, 7, 1 - r as c_int, comms[r], null_mut()),
                NcclResult::Success
            );
        }
    }
    // SAFETY: no arguments.
    assert_eq!(
        unsafe { ncclGroupEnd() },
        NcclResult::Success,
        "{}",
        last_error_text()
    );
    assert_eq!(bufs, [[11.0, 22.0, 33.0]; 2]);
    assert_eq!(got, [[11.0, 22.0, 33.0]; 2]);
    destroy(&comms);
}

#[test]
fn a_group_with_a_failed_call_runs_nothing() {
    let comms = init_all(2);
    let mut x = [1f32; 4];
    let started = Instant::now();
    // SAFETY: valid buffers; rank 1's call has an unknown type, so rank 0's all_reduce must not
    // run either (it would wait for rank 1 until the deadline).
    unsafe {
        assert_eq!(ncclGroupStart(), NcclResult::Success);
        let p = x.as_mut_ptr().cast();
        assert_eq!(
            ncclAllReduce(p, p, 4, 7, 0, comms[0], null_mut()),
            NcclResult::Success
        );
        assert_eq!(
            ncclAllReduce(p, p, 4, 99, 0, comms[1], null_mut()),
            NcclResult::InvalidArgument
        );
        assert_eq!(ncclGroupEnd(), NcclResult::InvalidArgument);
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(last_error_text().contains("datatype 99"));
    assert_eq!(x, [1.0; 4], "a call of the failed group ran");
    destroy(&comms);
}

#[test]
fn communicators_initialised_inside_a_group_are_built_at_its_end() {
    let id = unique_id();
    let mut comms = [null_mut(); 3];
    // SAFETY: valid out-pointers; a 3-rank communicator from one thread.
    unsafe {
        assert_eq!(ncclGroupStart(), NcclResult::Success);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(ncclCommInitRank(c, 3, id, r as c_int), NcclResult::Success);
        }
        assert_eq!(ncclGroupEnd(), NcclResult::Success, "{}", last_error_text());
    }
    for (r, &c) in comms.iter().enumerate() {
        assert_eq!(comm(c).rank(), r);
        assert_eq!(comm(c).size(), 3);
    }
    // Shrink without rank 2, called by the survivors only.
    let mut shrunk = [null_mut(); 2];
    std::thread::scope(|s| {
        for (r, out) in shrunk.iter_mut().enumerate() {
            let c = comms[r] as usize;
            let out = out as *mut NcclComm as usize;
            s.spawn(move || {
                let mut exclude = [2 as c_int];
                // SAFETY: valid pointers that outlive the call.
                let code = unsafe {
                    ncclCommShrink(
                        c as NcclComm,
                        exclude.as_mut_ptr(),
                        1,
                        out as *mut NcclComm,
                        null_mut(),
                        0,
                    )
                };
                assert_eq!(code, NcclResult::Success, "{}", last_error_text());
            });
        }
    });
    assert_eq!(comm(shrunk[0]).size(), 2);
    assert_eq!(comm(shrunk[1]).rank(), 1);
    destroy(&shrunk);
    destroy(&comms);
}

#[test]
fn non_blocking_inits_in_a_group_return_in_progress_then_succeed() {
    let id = unique_id();
    let mut cfg = NcclConfig {
        blocking: 0,
        ..NcclConfig::initializer()
    };
    let mut comms = [null_mut(); 2];
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(ncclGroupStart(), NcclResult::Success);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRankConfig(c, 2, id, r as c_int, &mut cfg),
                NcclResult::Success
            );
        }
        assert_eq!(ncclGroupEnd(), NcclResult::InProgress);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for &c in &comms {
        let mut state = NcclResult::InProgress;
        while state == NcclResult::InProgress && Instant::now() < deadline {
            // SAFETY: valid out-pointer.
            assert_eq!(
                unsafe { ncclCommGetAsyncError(c, &mut state) },
                NcclResult::Success
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(state, NcclResult::Success, "{}", last_error(c));
    }
    destroy(&comms);
}

/// A small deterministic generator for the fuzz.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

#[test]
fn an_argument_fuzz_of_every_entry_point_gets_codes_never_crashes() {
    let world = init_all(1);
    let mut live = world[0];
    let mut destroyed = init_all(1)[0];
    destroy(&[destroyed]);
    let mut rng = Rng(0x5eed_cafe_f00d_1234);
    const CAP: usize = 1 << 20;
    let mut buf = vec![0u64; CAP / 8];
    let b = buf.as_mut_ptr() as *mut c_void;
    let ints: Vec<c_int> = (-3..16).chain([c_int::MIN, c_int::MAX, 1000]).collect();
    // Counts that fit the buffer at any element size, or overflow outright.
    let counts = [0, 1, 7, 1000, CAP / 8, usize::MAX, isize::MAX as usize + 1];
    let mut codes = [0usize; 9];
    for i in 0..4000 {
        let comm = match rng.next() % 6 {
            0 => null_mut(),
            1 => destroyed,
            2 => rng.next() as usize as NcclComm,
            _ => live,
        };
        let ptr = if rng.next().is_multiple_of(4) {
            null_mut()
        } else {
            b
        };
        let (count, dt, op, root) = (
            rng.pick(&counts),
            rng.pick(&ints),
            rng.pick(&ints),
            rng.pick(&ints),
        );
        let stream = rng.next() as usize as *mut c_void;
        let mut out_int: c_int = 0;
        let mut out_ptr: *mut c_void = null_mut();
        let mut out_comm: NcclComm = null_mut();
        let mut state = NcclResult::Success;
        let which = rng.next() % 32;
        // SAFETY: every pointer is NULL or points into `buf` (1 MiB) or a local, and every
        // count either fits `buf` for any element size or overflows, which must be caught.
        let code = unsafe {
            match which {
                0 => ncclAllReduce(ptr, ptr, count, dt, op, comm, stream),
                1 => ncclBroadcast(ptr, b, count, dt, root, comm, stream),
                2 => ncclBcast(ptr, count, dt, root, comm, stream),
                3 => ncclReduce(b, ptr, count, dt, op, root, comm, stream),
                4 => ncclAllGather(ptr, b, count, dt, comm, stream),
                5 => ncclReduceScatter(b, ptr, count, dt, op, comm, stream),
                6 => ncclAlltoAll(ptr, b, count, dt, comm, stream),
                7 => ncclGather(b, ptr, count, dt, root, comm, stream),
                8 => ncclScatter(ptr, b, count, dt, root, comm, stream),
                9 => ncclSend(ptr, count, dt, root, comm, stream),
                10 => ncclRecv(ptr, count, dt, root, comm, stream),
                11 => ncclGroupStart(),
                12 => ncclGroupEnd(),
                13 => ncclCommCount(
                    comm,
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_int
                    },
                ),
                14 => ncclCommUserRank(
                    comm,
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_int
                    },
                ),
                15 => ncclCommGetAsyncError(
                    comm,
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut state
                    },
                ),
                16 => ncclCommRegister(comm, ptr, count.min(CAP), &mut out_ptr),
                17 => ncclCommDeregister(comm, rng.pick(&[out_ptr, ptr, stream])),
                18 => ncclCommWindowRegister(comm, ptr, count.min(CAP), &mut out_ptr, op),
                19 => ncclCommWindowDeregister(comm, rng.pick(&[out_ptr, stream])),
                20 => ncclMemAlloc(
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_ptr
                    },
                    count.min(CAP),
                ),
                21 => ncclMemFree(rng.pick(&[ptr, stream])),
                22 => ncclRedOpCreatePreMulSum(&mut out_int, ptr, dt, op, comm),
                23 => ncclRedOpDestroy(op, comm),
                24 => {
                    let mut id = NcclUniqueId { internal: [0; 128] };
                    id.internal[..8].copy_from_slice(&rng.next().to_le_bytes());
                    ncclCommInitRank(&mut out_comm, root, id, op)
                }
                25 => ncclCommSplit(
                    comm,
                    rng.pick(&[-2, -1, 0, 1, c_int::MAX]),
                    op,
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_comm
                    },
                    null_mut(),
                ),
                26 => ncclCommRevoke(rng.pick(&[null_mut(), destroyed, stream]), op),
                27 => ncclCommFinalize(rng.pick(&[null_mut(), destroyed, stream])),
                28 => {
                    let mut sim = NcclSimInfo {
                        size: 24,
                        magic: rng.pick(&[0, SIM_INFO_MAGIC]),
                        version: 0,
                        estimated_time: 0.0,
                    };
                    ncclGroupSimulateEnd(if ptr.is_null() { null_mut() } else { &mut sim })
                }
                29 => strataRecvAny(
                    ptr,
                    count,
                    dt,
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_int
                    },
                    comm,
                ),
                30 => strataCommSubgroup(
                    comm,
                    rng.pick(&ints),
                    ptr.cast(),
                    if rng.next().is_multiple_of(3) {
                        std::ptr::null()
                    } else {
                        c"fuzz".as_ptr()
                    },
                    if ptr.is_null() {
                        null_mut()
                    } else {
                        &mut out_comm
                    },
                ),
                _ => {
                    // Destroy or abort the live communicator, then make a new one.
                    let code = if rng.next().is_multiple_of(2) {
                        ncclCommDestroy(live)
                    } else {
                        ncclCommAbort(live)
                    };
                    destroyed = live;
                    live = init_all(1)[0];
                    code
                }
            }
        };
        assert!(
            !matches!(code, NcclResult::InternalError),
            "call {which} (iteration {i}) hit an internal error: {}",
            last_error_text()
        );
        codes[code as usize] += 1;
        // Clean up what succeeded so the fuzz does not accumulate state.
        // SAFETY: handles the library just returned, or NULL.
        unsafe {
            if which == 20 && code == NcclResult::Success {
                assert_eq!(ncclMemFree(out_ptr), NcclResult::Success);
            }
            if (which == 25 || which == 30) && !out_comm.is_null() {
                ncclCommDestroy(out_comm);
            }
            if which == 22 && code == NcclResult::Success {
                assert_eq!(ncclRedOpDestroy(out_int, live), NcclResult::Success);
            }
        }
        // SAFETY: any handle value is accepted.
        let _ = unsafe { ncclGetLastError(comm) };
    }
    // Leave no group open on this thread.
    // SAFETY: no arguments.
    while unsafe { ncclGroupEnd() } != NcclResult::InvalidUsage {}
    assert!(codes[0] > 100 && codes[4] > 100, "codes seen: {codes:?}");
    // The live communicator still works after all that.
    let mut x = [3f32; 8];
    // SAFETY: valid buffer.
    let code = unsafe {
        ncclAllReduce(
            x.as_ptr().cast(),
            x.as_mut_ptr().cast(),
            8,
            7,
            0,
            live,
            null_mut(),
        )
    };
    assert_eq!(code, NcclResult::Success, "{}", last_error_text());
    assert_eq!(x, [3.0; 8]);
    destroy(&[live]);
}
