//! The 32-byte header every connection an operation uses carries before its data, in each
//! direction: what the sender is doing, checked by the receiver against its own call. Two of
//! its bytes are not the call's but the sender's: how much of its recent collective time it
//! spent stalled on peers ([`STALL_BYTES`]), which lets a receiver that waits on it tell a
//! slow rank from one that only passes a slow rank's delay along
//! ([`crate::watchdog::stragglers`]).

use crate::dtype::{DataType, ReduceOp};
use strata_algorithms::{Algorithm, Collective};

/// Bytes of an operation header (with a small message, it fits one cache line of a slot).
pub(crate) const HEADER_BYTES: usize = 32;
const HEADER_MAGIC: u16 = 0x4853; // "SH"
/// Where the sender's stall share (per mille, little-endian u16) travels: outside the call's
/// identity, so two headers of one call may differ there and nowhere else.
pub(crate) const STALL_BYTES: std::ops::Range<usize> = 2..4;

/// Whether `got`, bytes of a header starting at offset `at`, equal `expected`'s bytes at the
/// same offsets, the sender's stall share aside: the byte-level form of comparing calls.
pub(crate) fn same_call_bytes(got: &[u8], expected: &[u8; HEADER_BYTES], at: usize) -> bool {
    got.iter()
        .zip(&expected[at.min(HEADER_BYTES)..])
        .enumerate()
        .all(|(i, (g, e))| g == e || STALL_BYTES.contains(&(at + i)))
}

/// The sender's stall share carried by a whole header, per mille.
pub(crate) fn stall_share_of(b: &[u8; HEADER_BYTES]) -> u16 {
    u16::from_le_bytes([b[STALL_BYTES.start], b[STALL_BYTES.start + 1]])
}

/// Writes this rank's stall share (per mille) into an encoded header.
pub(crate) fn set_stall_share(b: &mut [u8; HEADER_BYTES], per_mille: u16) {
    b[STALL_BYTES].copy_from_slice(&per_mille.to_le_bytes());
}

/// What a rank says about the operation it is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub collective: Collective,
    pub seq: u64,
    pub dtype: DataType,
    pub count: u64,
    pub op: u8,
    /// The root of a rooted collective, the peer of a send or receive, and the slice in
    /// elements of a ring all-reduce (0: block by block), so that ranks that would cut the
    /// ring differently fail with a mismatch instead of exchanging misaligned slices.
    pub param: u64,
    pub algorithm: Algorithm,
}

impl Header {
    /// Where the encoding keeps the sequence number: a repeated call patches only these.
    pub const SEQ_BYTES: std::ops::Range<usize> = 8..16;

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..2].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4] = self.collective.code();
        b[5] = self.dtype as u8;
        b[6] = self.op;
        b[7] = self.algorithm.code();
        b[Self::SEQ_BYTES].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.param.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Self> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if b.len() < HEADER_BYTES || u16::from_le_bytes(b[0..2].try_into().ok()?) != HEADER_MAGIC {
            return None;
        }
        Some(Self {
            collective: Collective::from_code(b[4])?,
            dtype: DataType::from_code(b[5])?,
            op: b[6],
            algorithm: Algorithm::from_code(b[7])?,
            seq: u64_at(Self::SEQ_BYTES.start),
            count: u64_at(16),
            param: u64_at(24),
        })
    }

    /// The call's sequence number on its communicator as faults and progress report it: the
    /// collective's, or 0 for a point-to-point transfer (numbered per peer instead).
    pub fn call_seq(&self) -> u64 {
        match self.collective {
            Collective::Send | Collective::Recv => 0,
            _ => self.seq,
        }
    }

    /// `all_reduce #3 (float, sum, 1024 elements)`.
    pub fn describe(&self) -> String {
        let c = self.collective;
        let mut s = format!("{c} #{} ({}", self.seq, self.dtype);
        if c.reduces() {
            s += &format!(", {}", ReduceOp::name_of_code(self.op));
        }
        s += &format!(", {} elements", self.count);
        match c {
            _ if c.rooted() => s += &format!(", root {}", self.param),
            Collective::Send => s += &format!(", to rank {}", self.param),
            Collective::Recv => s += &format!(", from rank {}", self.param),
            _ if self.param > 0 => s += &format!(", slices of {}", self.param),
            _ => {}
        }
        s + &format!("; {})", self.algorithm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_describe() {
        let h = Header {
            collective: Collective::AllReduce,
            seq: 7,
            dtype: DataType::Float32,
            count: 1024,
            op: 0,
            param: 0,
            algorithm: Algorithm::Ring,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert_eq!(
            h.describe(),
            "all_reduce #7 (float, sum, 1024 elements; ring)"
        );
        let sliced = Header { param: 4096, ..h };
        assert_eq!(Header::decode(&sliced.encode()), Some(sliced));
        assert_eq!(
            sliced.describe(),
            "all_reduce #7 (float, sum, 1024 elements, slices of 4096; ring)"
        );
        assert!(Header::decode(&[0u8; 64]).is_none());
    }

    /// The small all-reduce compares headers as bytes: that is the same as comparing decoded
    /// headers only if every header has one encoding, so every code byte that decodes must
    /// encode back to itself (the stall share aside, which decoding ignores).
    #[test]
    fn the_encoding_is_canonical() {
        let h = Header {
            collective: Collective::AllReduce,
            seq: 0x0102_0304_0506_0708,
            dtype: DataType::Float32,
            count: u64::MAX - 3,
            op: 0,
            param: 77,
            algorithm: Algorithm::RecursiveDoubling,
        };
        let base = h.encode();
        let mut decoded = 0;
        for at in 4..8 {
            for v in 0..=u8::MAX {
                let mut b = base;
                b[at] = v;
                if let Some(d) = Header::decode(&b) {
                    assert_eq!(d.encode(), b, "byte {at} = {v} decodes to {d:?}");
                    decoded += 1;
                }
            }
        }
        // Every collective, type, operator byte and algorithm was tried.
        assert!(decoded > 256 + 2 * 9, "{decoded}");
    }

    #[test]
    fn the_stall_share_travels_outside_the_calls_identity() {
        let h = Header {
            collective: Collective::AllGather,
            seq: 9,
            dtype: DataType::Int32,
            count: 10,
            op: 0,
            param: 0,
            algorithm: Algorithm::Ring,
        };
        let plain = h.encode();
        let mut shared = plain;
        set_stall_share(&mut shared, 731);
        assert_eq!(stall_share_of(&shared), 731);
        assert_eq!(stall_share_of(&plain), 0);
        assert_eq!(Header::decode(&shared), Some(h));
        // Equal as calls, from any offset; a changed call byte is still a difference.
        for at in 0..HEADER_BYTES {
            assert!(same_call_bytes(&shared[at..], &plain, at), "offset {at}");
        }
        let mut other = shared;
        other[Header::SEQ_BYTES.start] ^= 1;
        assert!(!same_call_bytes(&other, &plain, 0));
        assert!(!same_call_bytes(&other[8..], &plain, 8));
        let mut magic = shared;
        magic[1] ^= 1;
        assert!(!same_call_bytes(&magic, &plain, 0));
        assert!(Header::decode(&magic).is_none());
    }
}
