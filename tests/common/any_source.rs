//! The receive-from-any-source exchange, shared by the in-process tests and the RDMA ones.

use strata::Communicator;

/// Every rank but 0 sends rank 0 three messages of 1,000 `u32` (rank × 100 + i); rank 0
/// receives them from any source and checks that none is torn, that each arrives once with
/// its sender, and that each sender's come in order. After a barrier, rank 2 sends one
/// message of `big_bytes` (many transport slots or reads), which rank 0 must get whole from
/// rank 2: a message of another length while small ones were awaited would be a mismatch.
/// Needs at least 3 ranks; panics on anything wrong.
pub fn every_message_once_with_its_sender(c: &Communicator, big_bytes: usize) {
    let (r, p) = (c.rank(), c.size());
    let pattern = |i: usize| (i % 251) as u8;
    if r == 0 {
        let mut seen = Vec::new();
        for _ in 0..3 * (p - 1) {
            let mut buf = vec![0u32; 1000];
            let src = c.recv_any(&mut buf).unwrap();
            assert!(
                buf.iter().all(|&x| x == buf[0]),
                "a torn message from {src}"
            );
            seen.push((src, buf[0]));
        }
        for sender in 1..p {
            let from: Vec<u32> = seen.iter().filter(|m| m.0 == sender).map(|m| m.1).collect();
            let want: Vec<u32> = (0..3).map(|i| sender as u32 * 100 + i).collect();
            assert_eq!(from, want, "messages from rank {sender} in {seen:?}");
        }
        c.barrier().unwrap();
        let mut big = vec![0u8; big_bytes];
        assert_eq!(c.recv_any(&mut big).unwrap(), 2);
        assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)));
    } else {
        for i in 0..3u32 {
            c.send(&vec![r as u32 * 100 + i; 1000], 0).unwrap();
        }
        c.barrier().unwrap();
        if r == 2 {
            let big: Vec<u8> = (0..big_bytes).map(pattern).collect();
            c.send(&big, 0).unwrap();
        }
    }
}
