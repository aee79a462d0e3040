//! A census: who is where with one call, as the diagnosis gathers it up the rank tree.

use serde::{Deserialize, Serialize};

/// Most laggards a census names; the rest are counted.
pub(crate) const MAX_NAMED: usize = 64;

/// Who is where, for one call.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Census {
    /// Ranks in the call (started it, not finished it).
    pub in_call: Vec<usize>,
    /// Ranks not in it, with what each is doing or why it did not answer (at most
    /// [`MAX_NAMED`]).
    pub laggards: Vec<(usize, String)>,
    /// Laggards beyond those named.
    pub unnamed: usize,
    /// Ranks that could not be asked in time (below one that did not answer).
    pub unasked: usize,
}

impl Census {
    /// Adds a subtree's census to this one, naming at most [`MAX_NAMED`] laggards.
    pub(crate) fn merge(&mut self, other: Census) {
        self.in_call.extend(other.in_call);
        self.unnamed += other.unnamed;
        self.unasked += other.unasked;
        for l in other.laggards {
            if self.laggards.len() < MAX_NAMED {
                self.laggards.push(l);
            } else {
                self.unnamed += 1;
            }
        }
    }

    /// A census of one rank that is not in the call, doing `what`.
    pub(crate) fn lagging(rank: usize, what: String) -> Self {
        Self {
            laggards: vec![(rank, what)],
            ..Self::default()
        }
    }

    /// Orders the ranks named.
    pub(crate) fn sort(&mut self) {
        self.in_call.sort_unstable();
        self.laggards.sort_by_key(|l| l.0);
    }
}
