//! Slot rings in shared memory: the shared-memory transport between processes of one host and
//! the in-process transport between threads of one process use the same code over different
//! memory (a `/dev/shm` mapping or a heap allocation).
//!
//! A connection's segment holds two rings, one per direction. A ring is `slots` slots of
//! `slot_size` bytes (an 8-byte sequence/length header, then payload) plus two cache-padded
//! counters: `head` (slots posted, written only by the
//! producer) and `tail` (slots released, written only by the consumer). A slot carries the
//! bytes of one `send_some` call, at most `slot_size`. Sleepers wait on the counters with a
//! futex and raise a flag so that the other side only pays for a wake when someone sleeps.

use super::futex;
use super::{Direction, Transport, Wait, whole_elements};
use std::ffi::CString;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

const MAGIC: u32 = 0x5354_5241; // "STRA"
const CACHE_LINE: usize = 64;
const CONTROL_BYTES: usize = 4096;

/// Memory that both endpoints of a ring connection can see.
pub(crate) trait Memory: Send + Sync {
    /// Start of the region (page aligned).
    fn base(&self) -> *mut u8;
    /// Bytes in the region.
    fn len(&self) -> usize;
}

/// Ring geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Slots per direction.
    pub slots: u32,
    /// Bytes per slot (a multiple of 64).
    pub slot_size: usize,
}

impl Geometry {
    fn ring_bytes(&self) -> usize {
        CONTROL_BYTES + self.slots as usize * self.slot_size
    }
    /// Bytes of a segment holding both directions.
    pub fn segment_bytes(&self) -> usize {
        CONTROL_BYTES + 2 * self.ring_bytes()
    }
}

#[repr(C)]
struct SegmentHeader {
    magic: AtomicU32,
    slots: AtomicU32,
    slot_size: AtomicU32,
    /// Set to 1 by the side that opens an existing segment.
    attached: AtomicU32,
}

/// Counters of one direction, each on its own cache line.
#[repr(C, align(64))]
struct Padded(AtomicU32);

#[repr(C)]
struct RingControl {
    head: Padded,
    tail: Padded,
    consumer_sleeping: Padded,
    producer_sleeping: Padded,
    // followed by `slots` AtomicU32 lengths
}

/// One endpoint of a ring connection: it produces into one ring and consumes the other.
pub(crate) struct RingEndpoint {
    /// Keeps the segment mapped for as long as the endpoint lives.
    _mem: Arc<dyn Memory>,
    geo: Geometry,
    tx: usize,
    rx: usize,
    /// Producer-side copy of our own head, and the consumer's tail as last read.
    tx_head: u32,
    tx_tail_seen: u32,
    /// Consumer-side copy of our own tail, and how far into the current slot we have read.
    rx_tail: u32,
    rx_offset: usize,
    /// `tx_head` and `rx_tail` modulo the slot count, kept rather than divided for on
    /// every post and poll.
    tx_slot: u32,
    rx_slot: u32,
    name: &'static str,
    /// Where each ring starts, computed once.
    rings: [*mut u8; 2],
}

// SAFETY: the endpoint only touches the shared memory through atomics and through slots that
// the ring protocol gives it exclusively (producer: slots in [head, tail + slots); consumer:
// slots in [tail, head)). The memory is kept alive by the Arc.
unsafe impl Send for RingEndpoint {}

impl RingEndpoint {
    /// Lays out a fresh segment in `mem` and returns the creator's endpoint.
    pub fn create(mem: Arc<dyn Memory>, geo: Geometry, name: &'static str) -> io::Result<Self> {
        if mem.len() < geo.segment_bytes()
            || !geo.slot_size.is_multiple_of(CACHE_LINE)
            || geo.slot_size == 0
            || geo.slots == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring segment too small or misshapen",
            ));
        }
        // SAFETY: the region is at least segment_bytes long and page aligned; nobody else has
        // attached yet, so plain initialisation through atomics is race-free.
        let hdr = unsafe { &*(mem.base() as *const SegmentHeader) };
        hdr.slots.store(geo.slots, Ordering::Relaxed);
        hdr.slot_size.store(geo.slot_size as u32, Ordering::Relaxed);
        hdr.magic.store(MAGIC, Ordering::Release);
        Ok(Self::endpoint(mem, geo, 0, 1, name))
    }

    /// Attaches to a segment laid out by [`RingEndpoint::create`] and returns the other endpoint.
    pub fn attach(mem: Arc<dyn Memory>, name: &'static str) -> io::Result<Self> {
        if mem.len() < CONTROL_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ring segment too small",
            ));
        }
        // SAFETY: the region is at least CONTROL_BYTES long and page aligned.
        let hdr = unsafe { &*(mem.base() as *const SegmentHeader) };
        if hdr.magic.load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a strata ring segment",
            ));
        }
        let geo = Geometry {
            slots: hdr.slots.load(Ordering::Relaxed),
            slot_size: hdr.slot_size.load(Ordering::Relaxed) as usize,
        };
        if geo.slots == 0
            || geo.slot_size == 0
            || !geo.slot_size.is_multiple_of(CACHE_LINE)
            || mem.len() < geo.segment_bytes()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ring segment geometry does not fit",
            ));
        }
        hdr.attached.store(1, Ordering::Release);
        Ok(Self::endpoint(mem, geo, 1, 0, name))
    }

    fn endpoint(
        mem: Arc<dyn Memory>,
        geo: Geometry,
        tx: usize,
        rx: usize,
        name: &'static str,
    ) -> Self {
        Self {
            geo,
            tx,
            rx,
            tx_head: 0,
            tx_tail_seen: 0,
            rx_tail: 0,
            rx_offset: 0,
            tx_slot: 0,
            rx_slot: 0,
            name,
            // SAFETY: both rings lie inside segment_bytes, checked at create/attach.
            rings: [0, 1]
                .map(|which| unsafe { mem.base().add(CONTROL_BYTES + which * geo.ring_bytes()) }),
            _mem: mem,
        }
    }

    fn ring_base(&self, which: usize) -> *mut u8 {
        self.rings[which]
    }

    /// The slot after `slot`.
    fn next_slot(&self, slot: u32) -> u32 {
        if slot + 1 == self.geo.slots {
            0
        } else {
            slot + 1
        }
    }

    /// The control block of ring `which`. The reference is not tied to `&self` so that the
    /// endpoint's own cursors can be updated while it is held; it must not outlive `self`.
    fn control<'a>(&self, which: usize) -> &'a RingControl {
        // SAFETY: each ring starts with a 4 KiB control block, page aligned, inside memory that
        // `self.mem` keeps alive; callers only use the reference while `self` is borrowed.
        unsafe { &*(self.ring_base(which) as *const RingControl) }
    }

    /// The sequence word and length at the start of a slot: the consumer polls the line that
    /// also carries the first bytes of data, not a shared counter.
    fn slot_header<'a>(&self, which: usize, slot: u32) -> &'a SlotHeader {
        // SAFETY: every slot starts with a SlotHeader, 64-byte aligned; see `control`.
        unsafe { &*(self.slot_ptr(which, slot) as *const SlotHeader) }
    }

    fn payload_capacity(&self) -> usize {
        self.geo.slot_size - SLOT_HEADER
    }

    fn slot_ptr(&self, which: usize, slot: u32) -> *mut u8 {
        // SAFETY: slot < slots, so the slot lies inside the ring.
        unsafe {
            self.ring_base(which)
                .add(CONTROL_BYTES + slot as usize * self.geo.slot_size)
        }
    }
}

impl RingEndpoint {
    /// Whether the producer has a slot to fill (re-reading the consumer's counter only when
    /// the ring looks full).
    fn slot_free(&mut self) -> bool {
        if self.tx_head.wrapping_sub(self.tx_tail_seen) < self.geo.slots {
            return true;
        }
        self.tx_tail_seen = self.control(self.tx).tail.0.load(Ordering::Acquire);
        self.tx_head.wrapping_sub(self.tx_tail_seen) < self.geo.slots
    }

    /// Fills the next slot with `a` then `b` and posts it. The caller has checked
    /// [`RingEndpoint::slot_free`] and that both fit one slot's payload.
    fn post(&mut self, a: &[u8], b: &[u8]) {
        let slot = self.tx_slot;
        debug_assert!(a.len() + b.len() <= self.payload_capacity());
        // SAFETY: the slot is free (head - tail < slots), so the consumer does not read it,
        // and a and b together fit its payload.
        unsafe {
            let p = self.slot_ptr(self.tx, slot).add(SLOT_HEADER);
            crate::copy::copy_nonoverlapping(a.as_ptr(), p, a.len());
            crate::copy::copy_nonoverlapping(b.as_ptr(), p.add(a.len()), b.len());
        }
        self.tx_head = self.tx_head.wrapping_add(1);
        self.tx_slot = self.next_slot(slot);
        let hdr = self.slot_header(self.tx, slot);
        hdr.len.store((a.len() + b.len()) as u32, Ordering::Relaxed);
        hdr.seq.store(self.tx_head, Ordering::Release);
        self.control(self.tx)
            .head
            .0
            .store(self.tx_head, Ordering::SeqCst);
    }

    /// Wakes the consumer if it sleeps.
    fn wake_consumer(&self) {
        let ctl = self.control(self.tx);
        if ctl.consumer_sleeping.0.load(Ordering::SeqCst) != 0 {
            futex::wake(&ctl.head.0);
        }
    }
}

/// Bytes at the start of each slot before its payload (keeps the payload 8-byte aligned).
const SLOT_HEADER: usize = 8;

/// `seq` is the producer's head after posting the slot; `len` the payload bytes.
#[repr(C)]
struct SlotHeader {
    seq: AtomicU32,
    len: AtomicU32,
}

impl Transport for RingEndpoint {
    fn name(&self) -> &'static str {
        self.name
    }

    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut sent = 0;
        while sent < data.len() && self.slot_free() {
            let n = self.payload_capacity().min(data.len() - sent);
            self.post(&data[sent..sent + n], &[]);
            sent += n;
        }
        if sent > 0 {
            self.wake_consumer();
        }
        Ok(sent)
    }

    fn send_some_pair(&mut self, head: &[u8], tail: &[u8]) -> io::Result<usize> {
        let n = head.len() + tail.len();
        if n == 0 || n > self.payload_capacity() || !self.slot_free() {
            return super::send_in_turn(self, head, tail);
        }
        self.post(head, tail);
        self.wake_consumer();
        Ok(n)
    }

    fn recv_some(
        &mut self,
        max: usize,
        granule: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let ctl = self.control(self.rx);
        let mut consumed = 0;
        let mut released = false;
        while consumed < max {
            let slot = self.rx_slot;
            let hdr = self.slot_header(self.rx, slot);
            if hdr.seq.load(Ordering::Acquire) != self.rx_tail.wrapping_add(1) {
                break;
            }
            let len = (hdr.len.load(Ordering::Relaxed) as usize).min(self.payload_capacity());
            let take = whole_elements(len - self.rx_offset, max - consumed, granule, consumed)?;
            if take == 0 {
                break;
            }
            // SAFETY: slots in [tail, head) belong to the consumer until tail moves; the range
            // lies inside the slot's posted length.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    self.slot_ptr(self.rx, slot)
                        .add(SLOT_HEADER + self.rx_offset),
                    take,
                )
            };
            f(bytes);
            consumed += take;
            self.rx_offset += take;
            if self.rx_offset == len {
                self.rx_offset = 0;
                self.rx_tail = self.rx_tail.wrapping_add(1);
                self.rx_slot = self.next_slot(slot);
                ctl.tail.0.store(self.rx_tail, Ordering::SeqCst);
                released = true;
            }
        }
        if released && ctl.producer_sleeping.0.load(Ordering::SeqCst) != 0 {
            futex::wake(&ctl.tail.0);
        }
        Ok(consumed)
    }

    fn peek(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let (mut slot, mut seq, mut offset) =
            (self.rx_slot, self.rx_tail.wrapping_add(1), self.rx_offset);
        let mut done = 0;
        while done < dst.len() {
            let hdr = self.slot_header(self.rx, slot);
            if hdr.seq.load(Ordering::Acquire) != seq {
                break;
            }
            let len = (hdr.len.load(Ordering::Relaxed) as usize).min(self.payload_capacity());
            let take = len.saturating_sub(offset).min(dst.len() - done);
            // SAFETY: a posted slot past the tail belongs to the consumer (this side) until the
            // tail moves, which peeking never does; the range lies inside its posted length.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    self.slot_ptr(self.rx, slot).add(SLOT_HEADER + offset),
                    take,
                )
            };
            crate::copy::copy(&mut dst[done..done + take], bytes);
            done += take;
            offset = 0;
            seq = seq.wrapping_add(1);
            slot = self.next_slot(slot);
        }
        Ok(done)
    }

    fn wait_for(&mut self, dir: Direction) -> Wait {
        match dir {
            Direction::Recv => {
                let ctl = self.control(self.rx);
                Wait::Futex {
                    word: &ctl.head.0,
                    expected: self.rx_tail,
                    flag: &ctl.consumer_sleeping.0,
                }
            }
            Direction::Send => {
                let ctl = self.control(self.tx);
                let tail = ctl.tail.0.load(Ordering::Acquire);
                Wait::Futex {
                    word: &ctl.tail.0,
                    expected: tail,
                    flag: &ctl.producer_sleeping.0,
                }
            }
        }
    }
}

/// A heap allocation shared by threads of one process.
pub(crate) struct HeapMemory {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the allocation is only accessed through the ring protocol (atomics plus exclusive
// slots), so sharing it between threads is sound.
unsafe impl Send for HeapMemory {}
// SAFETY: as above.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    /// Allocates `len` zeroed bytes, page aligned.
    pub fn new(len: usize) -> io::Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(CONTROL_BYTES), 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "ring allocation failed",
            ));
        }
        // Touch every page now rather than during the ring's first lap.
        for off in (0..layout.size()).step_by(4096) {
            // SAFETY: off < size of the allocation we own.
            unsafe { std::ptr::write_volatile(ptr.add(off), 0) };
        }
        Ok(Self { ptr, layout })
    }
}

impl Memory for HeapMemory {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A `/dev/shm` mapping shared by processes of one host.
pub(crate) struct ShmMemory {
    ptr: *mut u8,
    len: usize,
    name: String,
    owner: std::sync::atomic::AtomicBool,
}

// SAFETY: see HeapMemory; the mapping is process-wide.
unsafe impl Send for ShmMemory {}
// SAFETY: see HeapMemory.
unsafe impl Sync for ShmMemory {}

/// Free bytes of the file system at `path` (0 if unknown).
fn free_bytes(path: &str) -> u64 {
    let Ok(c) = CString::new(path) else { return 0 };
    // SAFETY: statvfs fills a plain struct for a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

impl ShmMemory {
    /// Creates and maps a new segment named `name` (must start with '/').
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        Self::open_inner(name, len, true)
    }

    /// Maps an existing segment.
    pub fn open(name: &str) -> io::Result<Self> {
        Self::open_inner(name, 0, false)
    }

    fn open_inner(name: &str, len: usize, create: bool) -> io::Result<Self> {
        let cname =
            CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let flags = if create {
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR
        } else {
            libc::O_RDWR
        };
        // SAFETY: cname is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let result = (|| {
            let len = if create {
                // SAFETY: fd is a valid descriptor we own.
                if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Reserve the pages now: a size alone is a promise tmpfs may not keep, and
                // the first write past a full /dev/shm would kill the process with SIGBUS.
                // SAFETY: as above.
                let r = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
                if r == libc::ENOSPC {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!(
                            "no space in /dev/shm for a {len}-byte shared-memory segment ({} \
                             bytes free there): remove stale /dev/shm/strata-* files of dead \
                             jobs, or enlarge /dev/shm",
                            free_bytes("/dev/shm")
                        ),
                    ));
                }
                // Other failures (a file system without fallocate) leave the size as it was.
                len
            } else {
                // SAFETY: stat is plain data and fd is valid.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                if unsafe { libc::fstat(fd, &mut st) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                st.st_size as usize
            };
            if len == 0 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "empty segment"));
            }
            // SAFETY: mapping a regular shm file we opened read-write.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            populate(ptr as *mut u8, len);
            Ok((ptr as *mut u8, len))
        })();
        // SAFETY: fd is ours; the mapping stays valid after close.
        unsafe { libc::close(fd) };
        match result {
            Ok((ptr, len)) => Ok(Self {
                ptr,
                len,
                name: name.to_string(),
                owner: create.into(),
            }),
            Err(e) => {
                if create {
                    // SAFETY: removing the name we just created.
                    unsafe { libc::shm_unlink(cname.as_ptr()) };
                }
                Err(e)
            }
        }
    }

    /// Removes the name; the mapping lives on until both sides unmap.
    pub fn unlink(&self) {
        if self.owner.swap(false, Ordering::AcqRel)
            && let Ok(c) = CString::new(self.name.as_str())
        {
            // SAFETY: valid C string; failure (already gone) is harmless.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

/// Maps every page of a fresh shared mapping into this process now, at connection setup.
/// Left to fault in as the ring reaches them, the first lap of a ring's slots costs a page
/// fault per slot on each side (about 1.2 µs each on a KVM guest): a 2-rank reduce-scatter
/// of 128 B took 3.3 µs per call for its first 128 calls and 0.3 µs after, so a benchmark's
/// first rows, and the near-tie trials that run in a size class's first calls, timed page
/// faults instead of the algorithms. It costs a new connection about 0.5 ms per side at
/// the default 2 MiB segment (both sides at once), once.
fn populate(ptr: *mut u8, len: usize) {
    /// `MADV_POPULATE_WRITE` (Linux 5.14); the libc crate does not name it on every target.
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: [ptr, ptr + len) is the mapping just made; populating writes nothing.
    if unsafe { libc::madvise(ptr.cast(), len, MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    map_by_reading(ptr, len);
}

/// Maps the pages of `[ptr, ptr + len)` by reading a byte of each: a read fault maps a
/// shared tmpfs page writable. A read changes nothing the peer may already be writing.
fn map_by_reading(ptr: *mut u8, len: usize) {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    for off in (0..len).step_by(page) {
        // SAFETY: off < len, inside the mapping.
        unsafe { std::ptr::read_volatile(ptr.add(off)) };
    }
}

impl Memory for ShmMemory {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ShmMemory {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: ptr/len come from a successful mmap.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(geo: Geometry) -> (RingEndpoint, RingEndpoint) {
        let mem: Arc<dyn Memory> = Arc::new(HeapMemory::new(geo.segment_bytes()).unwrap());
        let a = RingEndpoint::create(mem.clone(), geo, "inproc").unwrap();
        let b = RingEndpoint::attach(mem, "inproc").unwrap();
        (a, b)
    }

    #[test]
    fn bytes_arrive_in_order_across_slot_wraps() {
        let (mut a, mut b) = pair(Geometry {
            slots: 3,
            slot_size: 64,
        });
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut got = Vec::new();
        let mut sent = 0;
        while got.len() < data.len() {
            sent += a.send_some(&data[sent..]).unwrap();
            b.recv_some(usize::MAX, 1, &mut |x| got.extend_from_slice(x))
                .unwrap();
        }
        assert_eq!(got, data);
        // And the other direction.
        assert_eq!(b.send_some(b"hello").unwrap(), 5);
        let mut buf = [0u8; 5];
        assert_eq!(a.recv_into(&mut buf).unwrap(), 5);
        assert_eq!(&buf, b"hello");
    }

    #[test]
    fn a_pair_that_fits_goes_in_one_slot_and_one_that_does_not_still_arrives_whole() {
        let (mut a, mut b) = pair(Geometry {
            slots: 2,
            slot_size: 64,
        });
        let chunks = |b: &mut RingEndpoint| {
            let mut got = Vec::new();
            b.recv_some(usize::MAX, 1, &mut |x| got.push(x.to_vec()))
                .unwrap();
            got
        };
        // 32 + 24 bytes: one 56-byte payload, so one slot.
        assert_eq!(a.send_some_pair(&[1; 32], &[2; 24]).unwrap(), 56);
        let got = chunks(&mut b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0], [[1u8; 32].as_slice(), &[2; 24]].concat());
        // 32 + 40 bytes does not fit a slot: head and tail in turn, as far as the ring takes
        // them (two slots of 56), and the rest later, in order.
        let tail: Vec<u8> = (0..40).collect();
        let n = a.send_some_pair(&[9; 32], &tail).unwrap();
        assert_eq!(n, 72);
        let got: Vec<u8> = chunks(&mut b).concat();
        assert_eq!(got, [[9u8; 32].as_slice(), &tail].concat());
        // A full ring takes nothing.
        assert_eq!(a.send_some(&[0; 112]).unwrap(), 112);
        assert_eq!(a.send_some_pair(&[1; 8], &[1; 8]).unwrap(), 0);
    }

    /// Minor page faults this thread has taken.
    fn minor_faults() -> i64 {
        // SAFETY: rusage is plain data, filled by the call.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }

    /// Both sides' mappings are populated when made, so the first lap of small messages
    /// through a ring of the default shape takes no page fault per slot (it took two: one
    /// where the sender writes, one where the receiver reads).
    #[test]
    fn a_new_segment_takes_no_page_fault_per_slot_on_its_first_lap() {
        let name = format!("/strata-test-lap-{}", std::process::id());
        let geo = Geometry {
            slots: 128,
            slot_size: 8 << 10,
        };
        let mem: Arc<dyn Memory> = Arc::new(ShmMemory::create(&name, geo.segment_bytes()).unwrap());
        let mut a = RingEndpoint::create(mem, geo, "shm").unwrap();
        let other = ShmMemory::open(&name).unwrap();
        other.unlink();
        let mut b = RingEndpoint::attach(Arc::new(other), "shm").unwrap();
        let (msg, mut got) = ([7u8; 128], [0u8; 128]);
        let before = minor_faults();
        for _ in 0..2 * geo.slots {
            assert_eq!(a.send_some(&msg).unwrap(), msg.len());
            assert_eq!(b.recv_into(&mut got).unwrap(), msg.len());
            assert_eq!(b.send_some(&msg).unwrap(), msg.len());
            assert_eq!(a.recv_into(&mut got).unwrap(), msg.len());
        }
        let taken = minor_faults() - before;
        assert!(
            taken < 32,
            "{taken} page faults in two laps of both rings (each side's unpopulated mapping \
             takes one per slot: 512)"
        );
    }

    /// The populating fallback of kernels before 5.14 relies on a read mapping a shared
    /// tmpfs page for writing too: after it, writing every page faults no more.
    #[test]
    fn reading_a_shared_page_maps_it_for_writing() {
        let name = format!("/strata-test-read-{}", std::process::id());
        let len = 1 << 20;
        let mem = ShmMemory::create(&name, len).unwrap();
        mem.unlink();
        // Unmap the populated pages from this process (tmpfs keeps them).
        // SAFETY: the mapping is ours and holds nothing yet.
        assert_eq!(
            unsafe { libc::madvise(mem.ptr.cast(), len, libc::MADV_DONTNEED) },
            0
        );
        let before = minor_faults();
        map_by_reading(mem.ptr, len);
        let read = minor_faults() - before;
        for off in (0..len).step_by(4096) {
            // SAFETY: inside the mapping.
            unsafe { mem.ptr.add(off).write_volatile(1) };
        }
        let written = minor_faults() - before - read;
        assert!(
            read > 0,
            "reading unmapped pages took no fault: they were mapped"
        );
        assert!(
            written < 8,
            "writing pages a read had mapped took {written} faults"
        );
    }

    #[test]
    fn shm_segment_maps_twice() {
        let name = format!("/strata-test-{}", std::process::id());
        let geo = Geometry {
            slots: 2,
            slot_size: 128,
        };
        let mem: Arc<dyn Memory> = Arc::new(ShmMemory::create(&name, geo.segment_bytes()).unwrap());
        let mut a = RingEndpoint::create(mem, geo, "shm").unwrap();
        let other = ShmMemory::open(&name).unwrap();
        other.unlink();
        let mut b = RingEndpoint::attach(Arc::new(other), "shm").unwrap();
        a.send_some(&[1, 2, 3]).unwrap();
        let mut buf = [0u8; 3];
        assert_eq!(b.recv_into(&mut buf).unwrap(), 3);
        assert_eq!(buf, [1, 2, 3]);
    }
}
