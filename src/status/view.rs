//! The view a status question gathers: who answered, who did not, who holds the job up,
//! and the text `collbench status` prints.

use super::NAMED_AFTER;
use crate::wire::{RankStatus, SilentRank, StatusPart};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The view of one communicator, as a status question gathered it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct JobStatus {
    /// The communicator's id.
    pub comm: String,
    /// Its ranks.
    pub nranks: usize,
    /// The job's bootstrap root (rendezvous address), where known.
    pub root: Option<String>,
    /// The launcher's job id, as rank 0 (or the first rank that answered) knows it.
    pub job: Option<String>,
    /// How long the question took, seconds.
    pub asked_in_s: f64,
    /// The ranks that answered, by rank.
    pub ranks: Vec<RankStatus>,
    /// The ranks that did not answer, by rank.
    pub silent: Vec<SilentRank>,
    /// Ranks that could not be asked in time (below silent ones).
    pub unasked: usize,
    /// Who holds the job up, from the answers: silent ranks, and ranks that others wait on
    /// while they are not waiting themselves.
    pub holding_up: Vec<Culprit>,
}

/// A rank that holds the job up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    /// The rank.
    pub rank: usize,
    /// Its host, where known.
    pub host: String,
    /// Its process id, where known.
    pub pid: u32,
    /// What it is doing, or why it did not answer.
    pub what: String,
    /// The ranks that wait on it, directly or through others.
    pub waited_on_by: Vec<usize>,
    /// The call they wait in, as the longest waiter describes it.
    pub call: Option<String>,
}

impl JobStatus {
    pub(super) fn from_part(
        comm: String,
        nranks: usize,
        root: Option<String>,
        mut part: StatusPart,
        took: Duration,
    ) -> Self {
        part.ranks.sort_by_key(|r| r.rank);
        part.silent.sort_by_key(|r| r.rank);
        let holding_up = holding_up(&part.ranks, &part.silent);
        Self {
            comm,
            nranks,
            root,
            job: part.ranks.iter().find_map(|r| r.job.clone()),
            asked_in_s: took.as_secs_f64(),
            ranks: part.ranks,
            silent: part.silent,
            unasked: part.unasked,
            holding_up,
        }
    }

    /// The view as text: one line per group of ranks doing the same thing, the silent ones,
    /// and who holds the job up.
    pub fn render_text(&self) -> String {
        let hosts: std::collections::BTreeSet<&str> =
            self.ranks.iter().map(|r| r.host.as_str()).collect();
        let mut out = format!(
            "communicator {}: {} ranks, {} answered ({} hosts), {} silent{} in {:.2} s\n",
            self.comm,
            self.nranks,
            self.ranks.len(),
            hosts.len(),
            self.silent.len(),
            if self.unasked > 0 {
                format!(", {} not asked in time", self.unasked)
            } else {
                String::new()
            },
            self.asked_in_s,
        );
        if let Some(root) = &self.root {
            out += &format!("  root {root}");
            out += &match &self.job {
                Some(job) => format!(", job {job}\n"),
                None => "\n".into(),
            };
        }
        // Ranks by what they do: the call (without its time), whom they wait on.
        let mut groups: BTreeMap<String, Vec<&RankStatus>> = BTreeMap::new();
        for r in &self.ranks {
            let what = match &r.call {
                Some(c) if r.waiting_on.is_empty() => format!("in {}", c.describe),
                Some(c) => format!("in {}, waiting on {}", c.describe, rank_list(&r.waiting_on)),
                None => format!("idle after collective #{}", r.finished),
            };
            groups.entry(what).or_default().push(r);
        }
        for (what, ranks) in &groups {
            let longest = ranks
                .iter()
                .filter_map(|r| r.call.as_ref().map(|c| c.for_s))
                .fold(0.0f64, f64::max);
            let ids: Vec<usize> = ranks.iter().map(|r| r.rank).collect();
            let on: std::collections::BTreeSet<&str> =
                ranks.iter().map(|r| r.host.as_str()).collect();
            let on: Vec<&str> = on.into_iter().collect();
            out += &format!("  {} on {}: {what}", rank_list(&ids), on.join(", "));
            if longest > 0.0 {
                out += &format!(" (up to {longest:.2} s)");
            }
            out += "\n";
        }
        for s in &self.silent {
            out += &format!(
                "  rank {}{}: does not answer: {}\n",
                s.rank,
                host_pid(&s.host, s.pid),
                s.reason
            );
        }
        let mut stragglers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for r in &self.ranks {
            for &s in &r.stragglers {
                stragglers.entry(s).or_default().push(r.rank);
            }
        }
        for (slow, by) in &stragglers {
            out += &format!("  straggler: rank {slow}, named by {}\n", rank_list(by));
        }
        for r in self.ranks.iter().filter(|r| r.fault.is_some()) {
            out += &format!(
                "  fault at rank {}: {}\n",
                r.rank,
                r.fault.as_deref().unwrap_or_default()
            );
        }
        if self.holding_up.is_empty() {
            out += "  nobody holds the job up\n";
        }
        for c in &self.holding_up {
            out += &format!(
                "  holding up the job: rank {}{} {}",
                c.rank,
                host_pid(&c.host, c.pid),
                c.what
            );
            if !c.waited_on_by.is_empty() {
                let verb = if c.waited_on_by.len() == 1 {
                    "waits"
                } else {
                    "wait"
                };
                out += &format!("; {} {verb} on it", rank_list(&c.waited_on_by));
                if let Some(call) = &c.call {
                    out += &format!(" in {call}");
                }
            }
            out += "\n";
        }
        out
    }
}

/// ` (host h, pid 12)`, or nothing where unknown.
fn host_pid(host: &str, pid: u32) -> String {
    if host.is_empty() {
        String::new()
    } else {
        format!(" (host {host}, pid {pid})")
    }
}

/// `rank 3` or `ranks 0-2,5`.
fn rank_list(ranks: &[usize]) -> String {
    format!("{}", crate::error::RankList(ranks))
}

/// Who holds the job up: the ranks that waiting ranks wait on, followed through the waits
/// to a rank that is not waiting (silent, idle, in another call, or still computing), and
/// every silent rank. Each is named with the ranks that wait on it.
fn holding_up(ranks: &[RankStatus], silent: &[SilentRank]) -> Vec<Culprit> {
    let by_rank: HashMap<usize, &RankStatus> = ranks.iter().map(|r| (r.rank, r)).collect();
    let silent_by: HashMap<usize, &SilentRank> = silent.iter().map(|s| (s.rank, s)).collect();
    // The ends each waiting rank's waits lead to.
    let mut waited: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let long = NAMED_AFTER.as_secs_f64();
    for r in ranks
        .iter()
        .filter(|r| !r.waiting_on.is_empty() && r.waiting_for_s >= long)
    {
        let mut seen = vec![r.rank];
        let mut frontier = r.waiting_on.clone();
        let mut ends = Vec::new();
        while let Some(q) = frontier.pop() {
            if seen.contains(&q) {
                continue;
            }
            seen.push(q);
            match by_rank.get(&q) {
                Some(s) if !s.waiting_on.is_empty() => frontier.extend(&s.waiting_on),
                _ => ends.push(q),
            }
        }
        for e in ends {
            waited.entry(e).or_default().push(r.rank);
        }
    }
    for s in silent {
        waited.entry(s.rank).or_default();
    }
    let call_of = |waiters: &[usize]| {
        waiters
            .iter()
            .filter_map(|w| by_rank.get(w)?.call.as_ref())
            .max_by(|a, b| a.for_s.total_cmp(&b.for_s))
            .map(|c| c.describe.clone())
    };
    waited
        .into_iter()
        .map(|(rank, mut by)| {
            by.sort_unstable();
            by.dedup();
            let (host, pid, what) = match (silent_by.get(&rank), by_rank.get(&rank)) {
                (Some(s), _) => (
                    s.host.clone(),
                    s.pid,
                    format!("does not answer: {}", s.reason),
                ),
                (None, Some(r)) => (
                    r.host.clone(),
                    r.pid,
                    match &r.call {
                        Some(c) => format!(
                            "is in {} for {:.2} s, not waiting on anyone",
                            c.describe, c.for_s
                        ),
                        None => format!("is not in a call (idle after collective #{})", r.finished),
                    },
                ),
                (None, None) => (String::new(), 0, "was not asked".into()),
            };
            Culprit {
                rank,
                host,
                pid,
                what,
                call: call_of(&by),
                waited_on_by: by,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CallStatus;

    fn rank(r: usize, waiting_on: &[usize], call: Option<(&str, f64)>) -> RankStatus {
        RankStatus {
            rank: r,
            host: format!("h{}", r / 2),
            pid: 100 + r as u32,
            call: call.map(|(d, s)| CallStatus {
                collective: "all_reduce".into(),
                seq: 7,
                count: 16,
                dtype: "float".into(),
                describe: d.into(),
                for_s: s,
            }),
            waiting_on: waiting_on.to_vec(),
            waiting_for_s: if waiting_on.is_empty() { 0.0 } else { 1.0 },
            ..RankStatus::default()
        }
    }

    #[test]
    fn waits_are_followed_to_the_rank_that_holds_the_ring_up() {
        // A ring stopped at rank 2: 3 waits on 2, 0 on 3, 1 on 0; rank 2 is silent.
        let ar = Some(("all_reduce #7", 1.5));
        let ranks = vec![rank(0, &[3], ar), rank(1, &[0], ar), rank(3, &[2], ar)];
        let silent = vec![SilentRank {
            rank: 2,
            host: "h1".into(),
            pid: 102,
            reason: "does not answer (timed out)".into(),
        }];
        let c = holding_up(&ranks, &silent);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].rank, 2);
        assert_eq!(c[0].waited_on_by, vec![0, 1, 3]);
        assert_eq!(c[0].call.as_deref(), Some("all_reduce #7"));
        assert!(c[0].what.contains("does not answer"));
    }

    #[test]
    fn a_rank_still_computing_is_named_and_a_healthy_job_names_no_one() {
        let ranks = vec![
            rank(0, &[1], Some(("all_reduce #7", 0.4))),
            rank(1, &[], None),
            rank(2, &[0, 1], Some(("all_reduce #7", 0.4))),
        ];
        let c = holding_up(&ranks, &[]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].rank, c[0].waited_on_by.clone()), (1, vec![0, 2]));
        assert!(c[0].what.contains("not in a call"), "{}", c[0].what);
        let busy = vec![rank(0, &[], Some(("x", 0.0))), rank(1, &[], None)];
        assert!(holding_up(&busy, &[]).is_empty());
        // A wait shorter than NAMED_AFTER is a healthy job's.
        let mut brief = rank(0, &[1], Some(("x", 0.001)));
        brief.waiting_for_s = 0.001;
        assert!(holding_up(&[brief, rank(1, &[], None)], &[]).is_empty());
    }

    #[test]
    fn the_text_groups_ranks_and_names_the_culprit() {
        let ar = Some(("all_reduce #7 (float, sum, 16 elements; ring)", 1.5));
        let part = StatusPart {
            ranks: vec![rank(3, &[2], ar), rank(0, &[2], ar), rank(1, &[2], ar)],
            silent: vec![SilentRank {
                rank: 2,
                host: "h1".into(),
                pid: 102,
                reason: "does not answer (timed out)".into(),
            }],
            unasked: 0,
        };
        let s = JobStatus::from_part(
            "c".into(),
            4,
            Some("1.2.3.4:5".into()),
            part,
            Duration::ZERO,
        );
        let text = s.render_text();
        assert!(
            text.contains("ranks 0-1,3 on h0, h1: in all_reduce #7"),
            "{text}"
        );
        assert!(
            text.contains("holding up the job: rank 2 (host h1, pid 102)"),
            "{text}"
        );
        assert!(
            text.contains("ranks 0-1,3 wait on it in all_reduce #7"),
            "{text}"
        );
        let json = serde_json::to_string(&s).unwrap();
        let back: JobStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back.holding_up, s.holding_up);
    }
}
