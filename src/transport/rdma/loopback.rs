//! A test-only provider inside one process: a write copies its bytes straight to the
//! destination address and queues the completions a real provider would (sent at the writer,
//! arrived at the peer, which must have a receive posted), so the RDMA protocol's own rules —
//! grants, slots, sequence numbers, failures — can be tested without a device. Faults are
//! injected per link: an error after the next poll's completions, or receives that can no
//! longer be posted.

use super::protocol::RdmaTransport;
use super::{Armed, Completion, Fabric, Link, ProviderKind, Region, Write};
use crate::transport::Transport;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};

/// One link's side as its peer and the test see it.
#[derive(Default)]
struct Side {
    completions: VecDeque<Completion>,
    receives_posted: usize,
    /// The next poll returns its completions, then this error.
    fail_next_poll: Option<String>,
    /// Posting a receive fails with this error.
    refuse_receives: Option<String>,
}

type Shared = Arc<Mutex<Side>>;

/// The provider: every link it makes, by address.
#[derive(Default)]
struct LoopFabric {
    links: Arc<Mutex<Vec<Shared>>>,
}

impl Fabric for LoopFabric {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Verbs
    }
    fn device(&self) -> &str {
        "loopback"
    }
    fn register(&self, ptr: *mut u8, len: usize) -> io::Result<Region> {
        Ok(Region {
            addr: ptr as u64,
            len,
            local: 0,
            rkey: 7,
            remote_base: ptr as u64,
        })
    }
    fn deregister(&self, _region: &Region) {}
    fn link(&self, _lanes: usize, _depth: usize) -> io::Result<Box<dyn Link>> {
        let mut links = self.links.lock().unwrap();
        let me: Shared = Arc::default();
        links.push(me.clone());
        Ok(Box::new(LoopLink {
            address: links.len() - 1,
            me,
            peer: None,
            all: self.links.clone(),
        }))
    }
}

struct LoopLink {
    address: usize,
    me: Shared,
    peer: Option<Shared>,
    all: Arc<Mutex<Vec<Shared>>>,
}

impl Link for LoopLink {
    fn address(&self) -> Vec<u8> {
        self.address.to_le_bytes().to_vec()
    }
    fn connect(&mut self, remote: &[u8]) -> io::Result<()> {
        let at = usize::from_le_bytes(remote.try_into().map_err(io::Error::other)?);
        let all = self.all.lock().unwrap();
        let peer = all
            .get(at)
            .ok_or_else(|| io::Error::other("no such link"))?;
        self.peer = Some(peer.clone());
        Ok(())
    }
    fn write(&mut self, w: &Write) -> io::Result<bool> {
        let peer = self
            .peer
            .as_ref()
            .ok_or_else(|| io::Error::other("not connected"))?;
        let mut p = peer.lock().unwrap();
        if p.receives_posted == 0 {
            return Err(io::Error::other(
                "a write with immediate data found no receive",
            ));
        }
        p.receives_posted -= 1;
        // SAFETY: both addresses lie in regions the two transports of this process registered
        // and keep for the life of the test; the protocol grants before it writes.
        unsafe { std::ptr::copy(w.src as *const u8, w.dst as *mut u8, w.len) };
        p.completions.push_back(Completion::Arrived { imm: w.imm });
        drop(p);
        self.me
            .lock()
            .unwrap()
            .completions
            .push_back(Completion::Sent { wr_id: w.wr_id });
        Ok(true)
    }
    fn post_recv(&mut self, _lane: usize) -> io::Result<()> {
        let mut me = self.me.lock().unwrap();
        if let Some(e) = &me.refuse_receives {
            return Err(io::Error::other(e.clone()));
        }
        me.receives_posted += 1;
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        let mut me = self.me.lock().unwrap();
        out.extend(me.completions.drain(..));
        match me.fail_next_poll.take() {
            Some(e) => Err(io::Error::other(e)),
            None => Ok(()),
        }
    }
    fn arm(&mut self) -> io::Result<Armed> {
        Ok(Armed::Poll)
    }
}

/// Two connected transports (one lane, 4 slots of 4 KiB) and the receiving side's state.
fn pair() -> (RdmaTransport, RdmaTransport, Shared) {
    let fabric = Arc::new(LoopFabric::default());
    let mut a = RdmaTransport::new(fabric.clone(), 1, 4, 4096).unwrap();
    let mut b = RdmaTransport::new(fabric.clone(), 1, 4, 4096).unwrap();
    let (sa, sb) = (a.setup(), b.setup());
    b.connect(&sa, false).unwrap();
    a.connect(&sb, true).unwrap();
    let b_side = fabric.links.lock().unwrap()[1].clone();
    (a, b, b_side)
}

/// Sends `data` from `a` to `b`, letting `b` grant as it goes, without reading any data at
/// `b` (its receives take 0 bytes).
fn send_all(a: &mut RdmaTransport, b: &mut RdmaTransport, data: &[u8]) {
    let mut sent = 0;
    for _ in 0..100 {
        sent += a.send_some(&data[sent..]).unwrap();
        if sent == data.len() {
            return;
        }
        b.recv_some(0, 1, &mut |_| {}).unwrap();
    }
    panic!("only {sent} of {} bytes went out", data.len());
}

fn receive_until_error(b: &mut RdmaTransport) -> (Vec<u8>, io::Error) {
    let mut got = Vec::new();
    for _ in 0..100 {
        match b.recv_some(usize::MAX, 1, &mut |x| got.extend_from_slice(x)) {
            Ok(_) => {}
            Err(e) => return (got, e),
        }
    }
    panic!("no error after {} bytes", got.len());
}

#[test]
fn bytes_that_landed_before_a_failure_are_delivered_before_it() {
    let data: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
    // The peer's last writes and its failure come back from the same poll.
    let (mut a, mut b, b_side) = pair();
    send_all(&mut a, &mut b, &data);
    b_side.lock().unwrap().fail_next_poll = Some("peer closed".into());
    let (got, e) = receive_until_error(&mut b);
    assert_eq!(got, data);
    assert!(e.to_string().contains("peer closed"), "{e}");
    // The failure comes on a later poll than the data.
    let (mut a, mut b, b_side) = pair();
    send_all(&mut a, &mut b, &data);
    b.recv_some(0, 1, &mut |_| {}).unwrap();
    b_side.lock().unwrap().fail_next_poll = Some("peer closed".into());
    let (got, _) = receive_until_error(&mut b);
    assert_eq!(got, data);
    // The receive behind the data cannot be posted again.
    let (mut a, mut b, b_side) = pair();
    send_all(&mut a, &mut b, &data[..3000]);
    b_side.lock().unwrap().refuse_receives = Some("queue pair in error".into());
    let (got, e) = receive_until_error(&mut b);
    assert_eq!(got, data[..3000]);
    assert!(e.to_string().contains("queue pair in error"), "{e}");
}

#[test]
fn a_failed_connection_with_nothing_left_to_deliver_fails_at_once() {
    let (_a, mut b, b_side) = pair();
    b_side.lock().unwrap().fail_next_poll = Some("peer closed".into());
    let mut got = 0;
    let e = b
        .recv_some(usize::MAX, 1, &mut |x| got += x.len())
        .unwrap_err();
    assert_eq!(got, 0);
    assert!(e.to_string().contains("peer closed"), "{e}");
    // And stays failed.
    assert!(b.recv_some(usize::MAX, 1, &mut |_| {}).is_err());
    assert!(b.send_some(b"x").is_err());
}
