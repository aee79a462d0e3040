//! A live view of a running job (`collbench status`): what each rank says about itself when
//! asked, and the part of the view a subtree of the rank tree sends up.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// The call a rank is in, as its status reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallStatus {
    /// The collective, e.g. `all_reduce` (`send`/`recv` for point-to-point).
    pub collective: String,
    /// Its sequence number on the communicator (0 for point-to-point).
    pub seq: u64,
    /// Elements per rank, as the call was made.
    pub count: u64,
    /// The element type, e.g. `float`.
    pub dtype: String,
    /// The whole call in words, e.g. `all_reduce #12 (float, sum, 1024 elements; ring)`.
    pub describe: String,
    /// How long the rank has been in it, seconds.
    pub for_s: f64,
}

/// What one rank says about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    /// Its rank in the communicator.
    pub rank: usize,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The last collective it started.
    pub started: u64,
    /// The last collective it finished.
    pub finished: u64,
    /// The call it is in, if any.
    pub call: Option<CallStatus>,
    /// The peers its call is blocked on now (empty: not blocked, or still spinning).
    pub waiting_on: Vec<usize>,
    /// How long it has been blocked on them, seconds.
    pub waiting_for_s: f64,
    /// The peers it names as stragglers.
    pub stragglers: Vec<usize>,
    /// Its own stall share over the straggler window, 0 to 1.
    pub stall_share: f64,
    /// The fault that broke its communicator, if any.
    pub fault: Option<String>,
    /// The launcher's job id where it knows one (`slurm 1234`, `torchelastic <run id>`).
    pub job: Option<String>,
}

/// A rank that did not answer a status question.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SilentRank {
    /// Its rank.
    pub rank: usize,
    /// Its host name, where the asker knows it.
    pub host: String,
    /// Its process id, where the asker knows it.
    pub pid: u32,
    /// Why it gave no answer, as a phrase.
    pub reason: String,
}

/// What a subtree of the rank tree says: the ranks that answered, those that did not, and how
/// many below a silent one could not be asked in time.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusPart {
    /// Ranks that answered.
    pub ranks: Vec<RankStatus>,
    /// Ranks that did not.
    pub silent: Vec<SilentRank>,
    /// Ranks not asked in time.
    pub unasked: usize,
}

impl StatusPart {
    /// Adds another subtree's part.
    pub fn merge(&mut self, other: StatusPart) {
        self.ranks.extend(other.ranks);
        self.silent.extend(other.silent);
        self.unasked += other.unasked;
    }
}

/// Where a rank listens and who it is, as the bootstrap root registered it: what a status
/// client needs to ask a rank directly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Located {
    /// The rank.
    pub rank: usize,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its listener.
    pub listen: SocketAddr,
}
