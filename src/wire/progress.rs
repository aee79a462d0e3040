//! What one rank says about its work when asked (the watchdog's status, the census).

use serde::{Deserialize, Serialize};

/// What one rank last reported about its work.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Sequence number of the last collective started.
    pub started: u64,
    /// Sequence number of the last collective that finished successfully.
    pub finished: u64,
    /// The collective in progress, if any, e.g. `all_reduce #12 (float, sum, 1024 elements)`.
    pub current: Option<String>,
}

impl Progress {
    /// "in all_reduce #12 (...)" or "idle after #11".
    pub fn describe(&self) -> String {
        match &self.current {
            Some(op) => format!("in {op}"),
            None => format!("idle after collective #{}", self.finished),
        }
    }
}
