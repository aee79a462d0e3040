//! Near-tie trials: where the model prices algorithms for a size class within
//! [`NEAR_TIE`](strata_algorithms::tuner::NEAR_TIE) of its choice, it cannot tell which is
//! fastest here, so the first calls of that class on host buffers take turns among them (the
//! choice and up to three rivals, distinct prices first, [`TRIAL_MAX`]). A turn is two calls of
//! one algorithm: the first settles what the call leaves behind (connections, slot rings,
//! caches) as that algorithm's own previous call would in a loop of it, the second is timed on
//! each rank. After a few turns of each (more for small messages, [`rounds`]), the ranks add
//! up their medians with one all-reduce of one number per algorithm, and every rank keeps the
//! same one (the fastest in total, the cheaper priced on a tie). Turns rather than one block
//! per algorithm, so that a drift of the machine's speed falls on every algorithm alike;
//! medians, because a call of a few microseconds on a shared machine is sometimes preempted
//! for a millisecond. Timing calls that followed another algorithm's (as trials once did) kept
//! ring for a 3-rank 2 MiB all-gather on a 2-core VM, where recursive doubling runs 1.1-1.35x
//! faster call after call (benches/trial_order.py). Every rank makes the same calls in the
//! same order, so every rank runs the same algorithm in every call, trial or not.
//! `STRATA_ALGO`, `set_algorithm` and tuning-file rules skip trials; `STRATA_TUNER_TRIALS=0`
//! turns them off.

use super::*;
use strata_algorithms::tuner::{ChoiceAndRivals, TRIAL_MAX, size_class};

/// Turns of each rival (a settling call, then a timed one) for a size class of `class_bytes`:
/// 1 MiB's worth of timed calls, between 4 and 32. The count depends on the class alone, so
/// every rank makes the same.
fn rounds(class_bytes: usize) -> u32 {
    ((1usize << 20) / class_bytes.max(1)).clamp(4, 32) as u32
}

/// Calls of a size class (holding `bytes` per rank) that a near-tie trial of `algorithms`
/// (the choice and its rivals, 2 to [`TRIAL_MAX`]) takes before its winner runs; the ranks
/// agree within the last of them.
pub fn tuner_trial_calls(bytes: usize, algorithms: usize) -> usize {
    let class = strata_algorithms::tuner::class_bytes(size_class(bytes));
    trial_length(algorithms, rounds(class)) as usize
}

/// Calls in a trial of `algorithms` (2 to [`TRIAL_MAX`]) taking `rounds` turns each.
fn trial_length(algorithms: usize, rounds: u32) -> u32 {
    algorithms.clamp(2, TRIAL_MAX) as u32 * CALLS_PER_TURN * rounds
}

/// Calls in a turn: one that settles the algorithm's state, one timed.
const CALLS_PER_TURN: u32 = 2;

/// A size class's trial: the algorithms, the calls made, this rank's times in each.
#[derive(Clone, Debug)]
pub(super) struct Trial {
    /// The model's choice, then its rivals, cheapest first.
    pub rivals: Vec<Algorithm>,
    /// Turns of each (timed calls of each).
    pub rounds: u32,
    /// Calls of the class made so far.
    pub calls: u32,
    /// This rank's seconds in each timed call of each algorithm.
    pub times: Vec<Vec<f64>>,
    /// The algorithm kept, once the ranks agreed.
    pub decided: Option<Algorithm>,
}

/// A trial's key: the collective and the size class of its bytes per rank.
pub(super) type TrialKey = (Collective, u32);

/// The key of a call of `collective` on `bytes` per rank.
pub(super) fn key(collective: Collective, bytes: usize) -> TrialKey {
    (collective, size_class(bytes))
}

impl Trial {
    /// A trial of `choice`'s algorithms for the size class of `key`, no call made yet.
    pub fn new(choice: ChoiceAndRivals, key: TrialKey) -> Self {
        let rivals: Vec<Algorithm> = choice.all().collect();
        Self {
            times: vec![Vec::new(); rivals.len()],
            rivals,
            rounds: rounds(strata_algorithms::tuner::class_bytes(key.1)),
            calls: 0,
            decided: None,
        }
    }

    /// The algorithm of call `i` of the trial: they take turns of [`CALLS_PER_TURN`] calls.
    fn of_call(&self, i: u32) -> usize {
        (i / CALLS_PER_TURN) as usize % self.rivals.len()
    }

    /// What the next call of the class runs.
    pub fn current(&self) -> Algorithm {
        self.decided
            .unwrap_or(self.rivals[self.of_call(self.calls)])
    }

    /// Counts a call that took `seconds` on this rank; true once every call of the trial is
    /// made and the ranks must agree.
    pub fn record(&mut self, seconds: f64) -> bool {
        if self.decided.is_some() {
            return false;
        }
        if self.calls % CALLS_PER_TURN == CALLS_PER_TURN - 1 {
            let i = self.of_call(self.calls);
            self.times[i].push(seconds);
        }
        self.calls += 1;
        self.calls == trial_length(self.rivals.len(), self.rounds)
    }

    /// This rank's median time of each algorithm.
    pub fn medians(&self) -> Vec<f64> {
        self.times
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.sort_by(f64::total_cmp);
                match t.len() {
                    0 => 0.0,
                    n if n % 2 == 1 => t[n / 2],
                    n => (t[n / 2 - 1] + t[n / 2]) / 2.0,
                }
            })
            .collect()
    }

    /// The algorithm kept from the times summed over every rank: the fastest, the first
    /// (cheapest priced) of those tied.
    pub fn winner(&self, summed: &[f64]) -> Algorithm {
        let mut best = 0;
        for (i, t) in summed.iter().enumerate() {
            if *t < summed[best] {
                best = i;
            }
        }
        self.rivals[best]
    }
}

impl Communicator {
    /// Ends the trial of `key`: every rank adds its times up with the others' (one all-reduce
    /// of two numbers, run by recursive doubling outside any trial) and keeps the winner.
    pub(super) fn agree_on_trial(&self, key: TrialKey) -> Result<()> {
        let mut summed = {
            let mut st = self.lock_state()?;
            st.agreeing = true;
            match st.trials.get(&key) {
                Some(t) => t.medians(),
                None => return Ok(()),
            }
        };
        let n = summed.len();
        let spec = CallSpec {
            collective: Collective::AllReduce,
            dtype: DataType::Float64,
            count: n,
            op: ReduceOp::Sum,
            root: 0,
        };
        let ptr = summed.as_mut_ptr().cast::<u8>();
        // SAFETY: `summed` is `n` f64s, read and written in place for the whole call.
        let r = unsafe { self.run(spec, ptr, 8 * n, ptr, 8 * n) };
        let mut st = self.lock_state()?;
        st.agreeing = false;
        r?;
        let Some(t) = st.trials.get_mut(&key) else {
            return Ok(());
        };
        let winner = t.winner(&summed);
        t.decided = Some(winner);
        if self.inner.rank == 0 {
            let timed: Vec<String> = t
                .rivals
                .iter()
                .zip(&summed)
                .map(|(a, s)| format!("{a} {:.2} us", s * 1e6))
                .collect();
            tracing::info!(
                "{} of the {} B size class: {} algorithms priced alike by the model; timed over \
                 {} calls of each, their medians summed over the ranks are {}; keeping {winner}",
                key.0,
                strata_algorithms::tuner::class_bytes(key.1),
                t.rivals.len(),
                t.rounds,
                timed.join(", ")
            );
        }
        Ok(())
    }

    /// The algorithm a trial settled on for `collective` at `bytes`, if one did.
    pub(super) fn trial_decision(&self, collective: Collective, bytes: usize) -> Option<Algorithm> {
        let st = self.inner.state.lock().ok()?;
        st.trials.get(&key(collective, bytes))?.decided
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each turn times the second of two calls of one algorithm, so an algorithm is timed in
    /// the state its own previous call left, as in a loop of it: here `a` is the faster call
    /// after call, but slower right after `b`, and a trial that timed calls straight after
    /// the other algorithm's would keep `b`.
    #[test]
    fn a_trial_times_each_algorithm_after_its_own_call_and_keeps_the_faster_median() {
        let (a, b) = (Algorithm::RecursiveDoubling, Algorithm::OneShot);
        let key = (Collective::AllReduce, size_class(1 << 20));
        let mut t = Trial::new(ChoiceAndRivals::new(a, &[b]), key);
        assert_eq!(t.rounds, 4);
        assert_eq!(
            tuner_trial_calls(1 << 20, 2),
            16,
            "4 turns of 2 calls of each"
        );
        assert_eq!(tuner_trial_calls(8, 2), 128, "8 B: 32 timed calls of each");
        let mut ran = Vec::new();
        let mut done = false;
        while !done {
            let now = t.current();
            // Settling calls are slow (the first opens connections); `a` takes 2 ms after
            // itself and 4 ms after `b`, `b` 3 ms either way, and `b`'s first timed call
            // (call 3) is preempted for 50 ms, which the median ignores.
            let secs = match (t.calls, ran.last()) {
                (c, _) if c.is_multiple_of(2) => 1.0,
                (3, _) => 0.050,
                (_, Some(&prev)) if now == a && prev == b => 0.004,
                _ if now == a => 0.002,
                _ => 0.003,
            };
            ran.push(now);
            done = t.record(secs);
        }
        assert_eq!(ran.len(), 16);
        assert!(ran.chunks(4).all(|c| c == [a, a, b, b]), "{ran:?}");
        let m = t.medians();
        assert!(
            (m[0] - 0.002).abs() < 1e-12 && (m[1] - 0.003).abs() < 1e-12,
            "{m:?}"
        );
        assert_eq!(t.winner(&m), a);
        assert_eq!(t.winner(&[0.006, 0.004]), b);
        assert_eq!(
            t.winner(&[0.004, 0.004]),
            a,
            "a tie keeps the model's choice"
        );
        t.decided = Some(b);
        assert_eq!(t.current(), b);
        assert!(!t.record(1.0), "a decided trial counts no more calls");
    }

    /// Four algorithms take turns, each timed as often as two would be, and the fastest wins
    /// wherever it stands in the model's order; a tie goes to the cheaper priced.
    #[test]
    fn a_trial_of_four_takes_turns_and_keeps_the_fastest() {
        use Algorithm::*;
        let order = [Ring, Tree, RecursiveDoubling, OneShot];
        let key = (Collective::AllReduce, size_class(1 << 20));
        let choice = ChoiceAndRivals::new(order[0], &order[1..]);
        assert_eq!(choice.len(), 4);
        let mut t = Trial::new(choice, key);
        let mut ran = Vec::new();
        let mut done = false;
        while !done {
            ran.push(t.current());
            // The third priced runs fastest; the first turn's settling calls are slow.
            let secs = match t.current() {
                _ if t.calls < 8 && t.calls.is_multiple_of(2) => 1.0,
                RecursiveDoubling => 0.001,
                _ => 0.002,
            };
            done = t.record(secs);
        }
        assert_eq!(ran.len(), tuner_trial_calls(1 << 20, 4));
        assert_eq!(ran.len(), 4 * 4 * 2, "four turns of two calls of each");
        let turns: Vec<Algorithm> = ran.chunks(2).map(|c| c[0]).collect();
        assert!(ran.chunks(2).all(|c| c[0] == c[1]), "{ran:?}");
        assert!(turns.chunks(4).all(|c| c == order), "{ran:?}");
        let m = t.medians();
        assert_eq!(m, vec![0.002, 0.002, 0.001, 0.002]);
        assert_eq!(t.winner(&m), RecursiveDoubling);
        assert_eq!(t.winner(&[0.003, 0.002, 0.004, 0.002]), Tree);
        // More rivals than a trial takes are left out; fewer than two calls count as two.
        let five = ChoiceAndRivals::new(Ring, &[Tree, RecursiveDoubling, OneShot, Bruck]);
        assert_eq!(five.all().collect::<Vec<_>>(), order);
        assert_eq!(tuner_trial_calls(1 << 20, 9), tuner_trial_calls(1 << 20, 4));
    }
}
