//! The one error type of strata.

use std::fmt;

/// Everything a strata call can fail with. Variants are the ones a caller can act on.
#[derive(Clone, Debug, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    /// A bad argument, caught before any traffic.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Ranks called different operations (or the same one with different arguments).
    #[error("mismatched calls: {0}")]
    Mismatch(String),
    /// A peer died, closed its connection or reported a failure.
    #[error("rank {rank} (host {host}, pid {pid}) failed: {reason}")]
    PeerFailed {
        /// The failed rank.
        rank: usize,
        /// Its host name.
        host: String,
        /// Its process id.
        pid: u32,
        /// What was seen.
        reason: String,
    },
    /// An operation overran its deadline.
    #[error(
        "{op} timed out after {after_s:.1} s{}",
        timeout_detail(waiting_on, diagnosis)
    )]
    Timeout {
        /// The operation, e.g. `all_reduce #12 (f32, 1024 elements)` or `init`.
        op: String,
        /// Its sequence number on this communicator (0 for init and point-to-point calls).
        seq: u64,
        /// The ranks this one waited on, or after a diagnosis the ones holding everyone up.
        waiting_on: Vec<usize>,
        /// Seconds waited.
        after_s: f64,
        /// What the survivors found out by asking every rank what it was doing, e.g.
        /// `rank 5 (host h3, pid 4242) is still in all_reduce #1233; ranks 0-4,6-7 wait on it`.
        diagnosis: Option<String>,
    },
    /// The communicator was aborted (by `abort()` or an earlier fault).
    #[error("communicator aborted{}", .0.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Aborted(Option<String>),
    /// An I/O or protocol failure of a transport.
    #[error("transport error: {0}")]
    Transport(String),
    /// Not supported by this build or host.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

fn timeout_detail(waiting_on: &[usize], diagnosis: &Option<String>) -> String {
    match diagnosis {
        Some(d) => format!(": {d}"),
        None => format!(" waiting on {}", RankList(waiting_on)),
    }
}

/// `Result` with strata's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The ranks this error blames: the failed rank of [`Error::PeerFailed`], the ranks a
    /// [`Error::Timeout`] waited on, none otherwise. What a survivor passes to
    /// [`crate::Communicator::shrink`].
    pub fn failed_ranks(&self) -> Vec<usize> {
        match self {
            Error::PeerFailed { rank, .. } => vec![*rank],
            Error::Timeout { waiting_on, .. } => waiting_on.clone(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn io(context: impl fmt::Display, e: std::io::Error) -> Self {
        Error::Transport(format!("{context}: {e}"))
    }
}

/// Formats rank lists compactly: `0-4,6-7`.
pub struct RankList<'a>(pub &'a [usize]);

impl fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut v = self.0.to_vec();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            return f.write_str("no rank");
        }
        f.write_str(if v.len() == 1 { "rank " } else { "ranks " })?;
        let mut i = 0;
        let mut first = true;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j == i {
                write!(f, "{}", v[i])?;
            } else {
                write!(f, "{}-{}", v[i], v[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_are_compact() {
        assert_eq!(
            RankList(&[0, 1, 2, 3, 4, 6, 7]).to_string(),
            "ranks 0-4,6-7"
        );
        assert_eq!(RankList(&[5]).to_string(), "rank 5");
        assert_eq!(RankList(&[]).to_string(), "no rank");
        let e = Error::Timeout {
            op: "init".into(),
            seq: 0,
            waiting_on: vec![3, 1],
            after_s: 2.0,
            diagnosis: None,
        };
        assert_eq!(
            e.to_string(),
            "init timed out after 2.0 s waiting on ranks 1,3"
        );
        let e = Error::Timeout {
            op: "all_reduce #9".into(),
            seq: 9,
            waiting_on: vec![2],
            after_s: 3.0,
            diagnosis: Some("rank 2 is idle after collective #8; ranks 0-1,3 wait on it".into()),
        };
        assert_eq!(
            e.to_string(),
            "all_reduce #9 timed out after 3.0 s: rank 2 is idle after collective #8; ranks \
             0-1,3 wait on it"
        );
    }
}
