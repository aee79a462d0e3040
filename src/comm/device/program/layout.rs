//! Where things live in a rank's program buffer: the flag area (the words peers write, the
//! expectations this rank's stream publishes, the header of the call it is in, and the
//! low-latency kernels' arrive and expect words), then a ring of receive slots per rank, then
//! the kernels' line areas, per sending rank and parity of the call number.

use super::Slots;

/// Words of a call's header in the flag area.
pub(super) const CALL_WORDS: usize = 8;

/// Offsets in a rank's program buffer.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    pub p: usize,
    pub slots: Slots,
    /// Bytes of one low-latency area (one sender, one parity): 16-byte lines carrying 8
    /// payload bytes each; 0 when the communicator has no kernel path.
    pub ll_stride: usize,
}

impl Layout {
    /// Where rank `q`'s *filled* word lives in a rank's buffer (written by `q`).
    pub fn filled(&self, q: usize) -> u64 {
        4 * q as u64
    }
    /// Where rank `q`'s *credit* word lives in a rank's buffer (written by `q`).
    pub fn credit(&self, q: usize) -> u64 {
        4 * (self.p + q) as u64
    }
    /// Where a rank's stream writes, as a call starts, the *filled* value its last wait for
    /// rank `q`'s data in that call wants (so that any rank of the host can tell, after a
    /// timeout, who waits on whom).
    pub fn expect_filled(&self, q: usize) -> u64 {
        4 * (2 * self.p + q) as u64
    }
    /// Likewise, the *credit* value its last wait for a free slot at rank `q` wants.
    pub fn expect_credit(&self, q: usize) -> u64 {
        4 * (3 * self.p + q) as u64
    }
    /// Where a rank's stream writes, as a call starts, the call's encoded header (eight
    /// words; zeros for a batch of transfers), so a timeout can tell mismatched calls from
    /// slow ones. The kernels write it there too.
    pub fn call(&self) -> u64 {
        4 * (4 * self.p) as u64
    }
    /// Where rank `q`'s kernel writes, as each kernel call starts, that call's number.
    pub fn arrive(&self, q: usize) -> u64 {
        4 * (4 * self.p + CALL_WORDS + q) as u64
    }
    /// Where a rank's kernel writes, as a call starts, the arrival of rank `q` it waits for.
    pub fn expect_arrival(&self, q: usize) -> u64 {
        4 * (5 * self.p + CALL_WORDS + q) as u64
    }
    /// Where rank `q`'s kernel writes, for calls of parity `par`, the pair (call number,
    /// digest of the call's arguments) a receiver checks before it takes `q`'s lines.
    pub fn sig(&self, par: usize, q: usize) -> u64 {
        4 * (6 * self.p + CALL_WORDS + 2 * (par * self.p + q)) as u64
    }
    /// 32-bit words of the flag area: filled, credit, expect_filled, expect_credit, the
    /// call's header, arrive, expect_arrival, and the kernels' pairs.
    pub fn flag_words(&self) -> usize {
        10 * self.p + CALL_WORDS
    }
    pub fn rings(&self) -> u64 {
        (4 * self.flag_words() as u64).next_multiple_of(4096)
    }
    /// Slot `i` of the ring that receives from rank `q`.
    pub fn slot(&self, q: usize, i: usize) -> u64 {
        self.rings() + ((q * self.slots.count + i) * self.slots.bytes) as u64
    }
    /// Where the low-latency areas start: the area of sender `q` for parity `par` is at
    /// `ll() + (2 q + par) ll_stride`.
    pub fn ll(&self) -> u64 {
        (self.rings() + (self.p * self.slots.count * self.slots.bytes) as u64)
            .next_multiple_of(4096)
    }
    pub fn bytes(&self) -> usize {
        self.ll() as usize + 2 * self.p * self.ll_stride
    }
}
