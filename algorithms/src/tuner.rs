//! The tuner: prices every algorithm that can run a collective on this communicator's fabric
//! and picks the cheapest, once per size class.
//!
//! Prices come from [`crate::cost::price`] on a [`FabricModel`]: α and β of the tier joining
//! each pair, γ for reductions, and the flows of each step that share an oversubscribed
//! uplink. Flat algorithms are priced as they would run (in topology order when the
//! communicator orders its rings, else in launcher order); hierarchical ones only where the
//! hierarchy is regular. A size class is a power of two of bytes per rank; the choice for a
//! class is made at its upper edge, so every rank makes the same choice whatever sizes it saw
//! first. Rules from a tuning file override the prices for the sizes they cover.

use std::collections::HashMap;
use std::sync::Mutex;

use strata_topology::Tier;
use strata_topology::fabric::TierCosts;

use crate::cost::{FabricModel, price};
use crate::hierarchy::Hierarchy;
use crate::schedule::{Buf, Collective, Op, RankSchedule, Region, Step};
use crate::{Algorithm, algorithms_for};
use crate::{scale, sim};

/// Element size the tuner prices with (the size class is in bytes, so this only sets the
/// granularity of blocks).
const PRICE_ELEM_BYTES: usize = 4;

/// The pipeline chunk schedules are priced with (the runtime's default `STRATA_CHUNK_SIZE`).
pub const CHUNK_BYTES: usize = 512 << 10;

/// Up to this many ranks prices come from the full flow-level simulation; above it from fast
/// pricing ([`crate::scale`]), which is checked against it.
pub const FULL_SIMULATION_MAX_RANKS: usize = 64;

/// Above this many ranks, the first call of a size class that no tuning-file rule covers
/// prices only the algorithms that cost O(p lg p) or less to price (rings and hierarchical
/// rings in closed form, recursive doubling step by step), in milliseconds; `collbench explain
/// --write-tuning` prices every algorithm ahead of time.
pub const RUNTIME_PRICING_MAX_RANKS: usize = 1024;

/// A tuning-file rule: use `algorithm` for `collective` when the bytes per rank are in
/// `[min_bytes, max_bytes]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Which collective.
    pub collective: Collective,
    /// Smallest size covered, bytes per rank.
    pub min_bytes: usize,
    /// Largest size covered, bytes per rank.
    pub max_bytes: usize,
    /// What to run.
    pub algorithm: Algorithm,
}

/// One line of an explanation.
#[derive(Clone, Debug, PartialEq)]
pub struct Priced {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Predicted seconds, or why it cannot run here.
    pub seconds: Result<f64, String>,
    /// Steps with messages of the longest rank schedule (full simulation only).
    pub steps: Option<usize>,
    /// Most messages that share one uplink in one step (full simulation only).
    pub max_sharing: Option<u32>,
}

/// Why the tuner chose what it chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    /// The collective.
    pub collective: Collective,
    /// Bytes per rank priced.
    pub bytes: usize,
    /// The communicator, in words.
    pub hierarchy: String,
    /// Every algorithm, cheapest first; those that cannot run last.
    pub ranked: Vec<Priced>,
    /// The choice.
    pub chosen: Algorithm,
    /// The reason, in one sentence.
    pub reason: String,
    /// What the runtime adds that the model does not price (for example where a
    /// communicator's calls on device buffers go to a kernel instead), one line each.
    pub notes: Vec<String>,
}

impl Explanation {
    /// The ranked table and the reason, as `collbench explain` prints them.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} of {} per rank on {}\n{:<22} {:>14} {:>7} {:>9}\n",
            self.collective,
            human_bytes(self.bytes),
            self.hierarchy,
            "algorithm",
            "predicted",
            "steps",
            "sharing"
        );
        for p in &self.ranked {
            let mark = if p.algorithm == self.chosen { "*" } else { " " };
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            match &p.seconds {
                Ok(s) => out.push_str(&format!(
                    "{mark}{:<21} {:>14} {:>7} {:>9}\n",
                    p.algorithm.name(),
                    human_seconds(*s),
                    or_dash(p.steps.map(|v| v.to_string())),
                    or_dash(p.max_sharing.map(|v| v.to_string()))
                )),
                Err(e) => out.push_str(&format!(" {:<21} {e}\n", p.algorithm.name())),
            }
        }
        out.push_str(&format!("choice: {} — {}\n", self.chosen, self.reason));
        for n in &self.notes {
            out.push_str(n);
            out.push('\n');
        }
        out
    }
}

/// The most algorithms a near-tie trial times: the model's choice and up to three rivals.
pub const TRIAL_MAX: usize = 4;

/// The tuner's choice for a size class, then the rivals priced within [`NEAR_TIE`] of it,
/// cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChoiceAndRivals {
    choice: Algorithm,
    rivals: [Option<Algorithm>; TRIAL_MAX - 1],
}

impl ChoiceAndRivals {
    /// `choice` with no rival.
    fn alone(choice: Algorithm) -> Self {
        Self::new(choice, &[])
    }

    /// `choice` and `rivals`, cheapest first (those past [`TRIAL_MAX`] left out).
    pub fn new(choice: Algorithm, rivals: &[Algorithm]) -> Self {
        let mut slots = [None; TRIAL_MAX - 1];
        for (slot, r) in slots.iter_mut().zip(rivals) {
            *slot = Some(*r);
        }
        Self {
            choice,
            rivals: slots,
        }
    }

    /// The choice.
    pub fn chosen(&self) -> Algorithm {
        self.choice
    }

    /// The choice and its rivals, cheapest first.
    pub fn all(&self) -> impl Iterator<Item = Algorithm> + '_ {
        std::iter::once(self.choice).chain(self.rivals.iter().map_while(|a| *a))
    }

    /// How many: 1 with no rival.
    pub fn len(&self) -> usize {
        self.all().count()
    }

    /// Never: a choice is always set (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Adds `rival` after the others, if there is room.
    fn push(&mut self, rival: Algorithm) {
        if let Some(slot) = self.rivals.iter_mut().find(|s| s.is_none()) {
            *slot = Some(rival);
        }
    }
}

/// Prices and chooses algorithms for one communicator; see the module documentation.
#[derive(Debug)]
pub struct Tuner {
    hierarchy: Hierarchy,
    costs: TierCosts,
    /// Ranks on the fullest host: whose buffers share its caches ([`TierCosts::memory`]).
    host_ranks: usize,
    ordered: bool,
    rules: Vec<Rule>,
    /// (bytes a host's ranks keep in flight, ranks on this host) when the runtime runs the
    /// ring all-reduce slice by slice ([`crate::builders::ring_slice_bytes`]).
    ring_pipeline: Option<(usize, usize)>,
    /// Per size class: the choice, and the rivals priced within [`NEAR_TIE`] of it.
    cache: Mutex<HashMap<(Collective, u32), ChoiceAndRivals>>,
    /// Per rank, the core it shares with other ranks, if it does (empty: none known).
    shared_cores: Vec<Option<u32>>,
}

/// Algorithms [`Tuner::explain`] prices at once above [`RUNTIME_PRICING_MAX_RANKS`] ranks
/// (where pricing every algorithm takes seconds), where the machine has the cores: two, so
/// that memory stays at the largest pricing's plus one other's (a pipelined tree at 24,576
/// ranks holds about 100 MB of transfers; the others about 50 MB each).
pub const EXPLAIN_THREADS: usize = 2;

/// `f` over `items` on up to `threads` threads (no more than the machine's cores), each
/// taking the next item as it finishes one; the results in the items' order.
pub fn map_in_order<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = threads.min(cores).min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return done;
            };
            done.push((i, f(item)));
        }
    };
    let mut out: Vec<Option<R>> = items.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in helpers {
            match h.join() {
                Ok(done) => all.extend(done),
                // A pricing that panicked on a helper panics here, as it would have inline.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (i, r) in all {
            out[i] = Some(r);
        }
    });
    out.into_iter().flatten().collect()
}

/// Ranks of the fullest host of `h`: the largest group of the outermost level whose ranks
/// are all joined inside a host (the whole communicator when every pair is).
fn fullest_host(h: &Hierarchy) -> usize {
    if h.inner_tier() > Tier::Host {
        return 1;
    }
    let mut size = 1;
    for level in 0..h.depth() {
        // A group of this level holds ranks joined by the tiers up to the one below it.
        let inside = match level {
            0 => h.inner_tier(),
            l => h.level_tier(l - 1),
        };
        if inside > Tier::Host {
            return size;
        }
        size = h.group_sizes(level).iter().max().map_or(1, |&n| n as usize);
    }
    match h.depth() {
        0 => h.len(),
        d if h.level_tier(d - 1) <= Tier::Host => h.len(),
        _ => size,
    }
}

/// How close two predicted times are for the model not to tell them apart: the accuracy its
/// predictions are held to (±25% of measured times). The runtime times such algorithms (up to
/// [`TRIAL_MAX`]) in the first calls of the size class and keeps the fastest, every rank
/// agreeing.
pub const NEAR_TIE: f64 = 0.25;

/// How close two predicted times are for a trial to take only the cheaper of the two
/// ([`Tuner::choose_with_rivals`]): 0.1%, far inside the model's accuracy.
pub const PRICED_ALIKE: f64 = 1e-3;

/// How far above the cheapest predicted time a ring all-reduce that runs sliced may be priced
/// and still be chosen: the model prices links, not the memory traffic slicing saves.
const SLICED_RING_TOLERANCE: f64 = 0.01;

impl Tuner {
    /// A tuner for ranks laid out as `hierarchy` on tiers that cost `costs`; `ordered` says
    /// whether flat schedules run in topology order.
    pub fn new(hierarchy: Hierarchy, costs: TierCosts, ordered: bool) -> Self {
        let host_ranks = fullest_host(&hierarchy);
        Self {
            host_ranks,
            hierarchy,
            costs,
            ordered,
            rules: Vec::new(),
            ring_pipeline: None,
            cache: Mutex::new(HashMap::new()),
            shared_cores: Vec::new(),
        }
    }

    /// Prices with rank `r` sharing core `cores[r]` with the other ranks on it, where that is
    /// `Some` ([`crate::cost::Network::shared_core`]).
    pub fn with_shared_cores(mut self, cores: Vec<Option<u32>>) -> Self {
        self.shared_cores = cores;
        self
    }

    /// Whether it knows of ranks that share a core ([`Tuner::with_shared_cores`]).
    pub fn shares_cores(&self) -> bool {
        self.shared_cores.iter().any(Option::is_some)
    }

    /// Says that the runtime runs a ring all-reduce slice by slice with `pipeline_bytes` in
    /// flight per host of `local_ranks` ranks. Where that ring is sliced and priced within 1%
    /// of the cheapest, it is chosen: slicing sends what a rank reduced on from cache, which
    /// measured 1.3-1.5x faster at 16-64 MiB on a 2-core host and which the model, pricing
    /// links alone, does not see.
    pub fn with_ring_pipeline(mut self, pipeline_bytes: usize, local_ranks: usize) -> Self {
        self.ring_pipeline = (pipeline_bytes > 0).then_some((pipeline_bytes, local_ranks));
        self
    }

    /// Adds tuning-file rules; the first rule that covers a call wins.
    pub fn with_rules(mut self, rules: Vec<Rule>) -> Self {
        self.rules = rules;
        self
    }

    /// A tuner for the same communicator with `rules` instead of this one's (and an empty
    /// cache).
    pub fn clone_with_rules(&self, rules: Vec<Rule>) -> Self {
        let mut t = Self::new(self.hierarchy.clone(), self.costs, self.ordered).with_rules(rules);
        t.ring_pipeline = self.ring_pipeline;
        t.shared_cores = self.shared_cores.clone();
        t
    }

    /// A tuner for the same communicator priced with `costs` instead (same rules and ring
    /// slicing, an empty cache): what a cost profile would choose and predict.
    pub fn with_costs(&self, costs: TierCosts) -> Self {
        let mut t =
            Self::new(self.hierarchy.clone(), costs, self.ordered).with_rules(self.rules.clone());
        t.ring_pipeline = self.ring_pipeline;
        t.shared_cores = self.shared_cores.clone();
        t
    }

    /// The tier costs it prices with.
    pub fn costs(&self) -> TierCosts {
        self.costs
    }

    /// The hierarchy it prices on.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// Whether flat schedules run in topology order.
    pub fn ordered(&self) -> bool {
        self.ordered
    }

    /// The algorithm for `collective` at `bytes` per rank: a rule's, else the cheapest of its
    /// size class (cached).
    pub fn choose(&self, collective: Collective, bytes: usize) -> Algorithm {
        self.choose_with_rivals(collective, bytes).chosen()
    }

    /// [`Tuner::choose`], and the runners-up the model cannot tell from it: up to
    /// [`TRIAL_MAX`]` - 1` of them, the cheapest first, each priced within [`NEAR_TIE`] of the
    /// choice. A rule's choice, a sliced ring's and a lone candidate have none.
    pub fn choose_with_rivals(&self, collective: Collective, bytes: usize) -> ChoiceAndRivals {
        if let Some(r) = self.rule_for(collective, bytes) {
            return ChoiceAndRivals::alone(r.algorithm);
        }
        let choices = algorithms_for(collective);
        if choices.len() == 1 || self.hierarchy.len() <= 1 {
            return ChoiceAndRivals::alone(choices[0]);
        }
        let class = size_class(bytes);
        let key = (collective, class);
        if let Some(a) = self.cache.lock().ok().and_then(|c| c.get(&key).copied()) {
            return a;
        }
        let e = self.decide(collective, class_bytes(class), false);
        let mut chosen = ChoiceAndRivals::alone(e.chosen);
        if let Some(Ok(t)) = e
            .ranked
            .first()
            .filter(|best| best.algorithm == e.chosen)
            .map(|best| &best.seconds)
        {
            // An algorithm priced within PRICED_ALIKE of one already taken most likely moves
            // the same messages on this fabric (tree and hier_tree on one host; ring,
            // ring+bruck and pairwise+ring at 3 ranks, 3e-7 apart), so each distinct price
            // takes a place first and those priced alike fill what is left (rd and one-shot
            // at 8 B on 2 ranks: one exchange, two code paths). At 3 ranks on 2 cores, 2 MiB,
            // the four places had gone to tree, hier_tree, pairwise+ring and pairwise+bruck
            // (two prices) while rhd, priced 19% above tree, ran 0.80-0.88x of tree's time.
            let within: Vec<(Algorithm, f64)> = e.ranked[1..]
                .iter()
                .map_while(|r| match r.seconds {
                    Ok(u) if u <= *t * (1.0 + NEAR_TIE) => Some((r.algorithm, u)),
                    _ => None,
                })
                .collect();
            let mut taken: Vec<(Algorithm, f64)> = vec![(e.chosen, *t)];
            for &(a, u) in &within {
                if taken.len() < TRIAL_MAX
                    && taken.iter().all(|&(_, v)| (u - v).abs() > PRICED_ALIKE * v)
                {
                    taken.push((a, u));
                }
            }
            for &(a, u) in &within {
                if taken.len() < TRIAL_MAX && taken.iter().all(|&(b, _)| b != a) {
                    taken.push((a, u));
                }
            }
            // In price order, the choice first (stable: it is the cheapest).
            taken.sort_by(|x, y| x.1.total_cmp(&y.1));
            for &(a, _) in &taken[1..] {
                chosen.push(a);
            }
        }
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, chosen);
        }
        chosen
    }

    /// Why the ring is chosen over a cheaper-priced algorithm of `ranked`, if it is: an
    /// all-reduce the runtime runs sliced at `bytes`, priced within [`SLICED_RING_TOLERANCE`].
    fn sliced_ring_preference(
        &self,
        collective: Collective,
        bytes: usize,
        ranked: &[Priced],
    ) -> Option<String> {
        let (budget, local) = self.ring_pipeline?;
        let p = self.hierarchy.len();
        if collective != Collective::AllReduce
            || crate::builders::ring_slice_bytes(budget, p, local, bytes) == 0
        {
            return None;
        }
        let best = ranked.first()?;
        let best_t = *best.seconds.as_ref().ok()?;
        let ring = ranked.iter().find(|x| x.algorithm == Algorithm::Ring)?;
        let ring_t = *ring.seconds.as_ref().ok()?;
        (best.algorithm != Algorithm::Ring && ring_t <= best_t * (1.0 + SLICED_RING_TOLERANCE))
            .then(|| {
                format!(
                    "within {:.2}% of {} and run slice by slice here, which sends what a rank \
                     reduced on from cache (the model prices links, not memory traffic)",
                    100.0 * (ring_t / best_t.max(f64::MIN_POSITIVE) - 1.0),
                    best.algorithm
                )
            })
    }

    /// The fast-pricing question for `algorithm` at `bytes` per rank.
    fn query(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        bytes: usize,
    ) -> scale::Query<'_> {
        scale::Query {
            hierarchy: &self.hierarchy,
            costs: self.costs_for(collective, bytes),
            ordered: self.ordered,
            collective,
            algorithm,
            count: bytes.div_ceil(PRICE_ELEM_BYTES),
            elem_bytes: PRICE_ELEM_BYTES,
            root: 0,
            chunk_elems: CHUNK_BYTES / PRICE_ELEM_BYTES,
        }
    }

    /// The costs of a call of `collective` at `bytes` per rank: its buffers on the fullest
    /// host (inputs and outputs of every rank there) against where the host's caches end
    /// ([`TierCosts::at_working_set`]).
    fn costs_for(&self, collective: Collective, bytes: usize) -> TierCosts {
        self.costs_with_scratch(collective, bytes, 0)
    }

    /// The costs of a call of `bytes` per rank whose schedule also uses `scratch_bytes` of
    /// scratch per rank ([`RankSchedule::scratch_elems`]): its fullest host's inputs, outputs
    /// and scratch are what the caches must hold ([`TierCosts::at_working_set`]).
    fn costs_with_scratch(
        &self,
        collective: Collective,
        bytes: usize,
        scratch_bytes: usize,
    ) -> TierCosts {
        if self.costs.memory.is_none() {
            return self.costs;
        }
        let p = self.hierarchy.len();
        let (input, output) = collective.buffer_elems(bytes, p, 0, 0);
        let host_bytes = (input + output + scratch_bytes) as f64 * self.host_ranks as f64;
        self.costs.at_working_set(host_bytes)
    }

    fn rule_for(&self, collective: Collective, bytes: usize) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.collective == collective && (r.min_bytes..=r.max_bytes).contains(&bytes))
    }

    /// A time below which fast pricing ([`scale::price`], what [`Tuner::price`] uses above
    /// [`FULL_SIMULATION_MAX_RANKS`]) cannot come, where it knows one in O(lg p)
    /// ([`scale::lower_bound`]).
    fn lower_bound(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        bytes: usize,
    ) -> Option<f64> {
        scale::lower_bound(&self.query(collective, algorithm, bytes))
    }

    /// Prices `algorithm` for `collective` at `bytes` per rank on this fabric: by the full
    /// simulation up to [`FULL_SIMULATION_MAX_RANKS`], else by fast pricing; the tiers'
    /// `call_us` is added to every price, and their `schedule_us` to that of every call the
    /// runtime walks step by step ([`Algorithm::takes_small_path`]). A call of no elements
    /// moves only headers: every rank sends its header to each peer of its schedule and to
    /// both ring neighbours at once and waits for theirs, and no step waits on another's
    /// data, so it is priced as that one exchange ([`headers_only`]); above the full
    /// simulation, as a call of one.
    pub fn price(&self, collective: Collective, algorithm: Algorithm, bytes: usize) -> Priced {
        let mut priced = if bytes == 0 && self.hierarchy.len() <= FULL_SIMULATION_MAX_RANKS {
            self.price_headers(collective, algorithm)
        } else {
            self.price_messages(collective, algorithm, bytes.max(1))
        };
        let walked = !algorithm.takes_small_path(collective, self.hierarchy.len(), bytes);
        if let Ok(s) = priced.seconds.as_mut() {
            *s += (self.costs.call_us + if walked { self.costs.schedule_us } else { 0.0 }) * 1e-6;
        }
        priced
    }

    /// [`Tuner::price`] without the cost of the call itself.
    fn price_messages(&self, collective: Collective, algorithm: Algorithm, bytes: usize) -> Priced {
        let p = self.hierarchy.len();
        let count = bytes.div_ceil(PRICE_ELEM_BYTES);
        let chunk = CHUNK_BYTES / PRICE_ELEM_BYTES;
        if p > FULL_SIMULATION_MAX_RANKS {
            let seconds = scale::price(&self.query(collective, algorithm, bytes));
            return Priced {
                algorithm,
                seconds,
                steps: None,
                max_sharing: None,
            };
        }
        let priced = sim::schedules_on(
            collective,
            algorithm,
            &self.hierarchy,
            self.ordered,
            count,
            0,
            chunk,
        )
        .and_then(|s| {
            // One-shot's p slots of scratch take cache as its buffers do.
            let scratch = s.iter().map(|x| x.scratch_elems).max().unwrap_or(0);
            let net = FabricModel {
                hierarchy: &self.hierarchy,
                costs: self.costs_with_scratch(collective, bytes, scratch * PRICE_ELEM_BYTES),
                shared_cores: &self.shared_cores,
            };
            let est = price(&s, PRICE_ELEM_BYTES, &net)?;
            let sharing = sim::max_sharing(&s, &net);
            Ok((est.seconds, s, sharing))
        });
        match priced {
            Ok((seconds, s, sharing)) => Priced {
                algorithm,
                seconds: Ok(seconds),
                steps: Some(s.iter().map(|x| x.message_steps()).max().unwrap_or(0)),
                max_sharing: Some(sharing),
            },
            Err(e) => Priced {
                algorithm,
                seconds: Err(e),
                steps: None,
                max_sharing: None,
            },
        }
    }

    /// [`Tuner::price`] of a call of no elements, without the cost of the call itself.
    fn price_headers(&self, collective: Collective, algorithm: Algorithm) -> Priced {
        let net = FabricModel {
            hierarchy: &self.hierarchy,
            costs: self.costs_for(collective, 0),
            shared_cores: &self.shared_cores,
        };
        let chunk = CHUNK_BYTES / PRICE_ELEM_BYTES;
        let priced = sim::schedules_on(
            collective,
            algorithm,
            &self.hierarchy,
            self.ordered,
            0,
            0,
            chunk,
        )
        .and_then(|s| price(&headers_only(&s), PRICE_ELEM_BYTES, &net).map(|e| e.seconds));
        Priced {
            algorithm,
            seconds: priced,
            steps: Some(1),
            max_sharing: None,
        }
    }

    /// Prices every algorithm for `collective` at `bytes` per rank and says which it would
    /// choose and why.
    pub fn explain(&self, collective: Collective, bytes: usize) -> Explanation {
        self.decide(collective, bytes, true)
    }

    /// [`Tuner::explain`]; unless `thorough`, a communicator above
    /// [`RUNTIME_PRICING_MAX_RANKS`] prices only what costs O(p) to price, so that no call
    /// stalls on pricing.
    fn decide(&self, collective: Collective, bytes: usize, thorough: bool) -> Explanation {
        let quick = !thorough && self.hierarchy.len() > RUNTIME_PRICING_MAX_RANKS;
        let unpriced = |algorithm, why: String| Priced {
            algorithm,
            seconds: Err(why),
            steps: None,
            max_sharing: None,
        };
        let candidates = algorithms_for(collective);
        // What has a lower bound is priced last, so that the others can rule it out.
        let mut bounded: Vec<(Algorithm, f64)> = Vec::new();
        let mut rest: Vec<Algorithm> = Vec::new();
        for &a in candidates {
            match quick
                .then(|| self.lower_bound(collective, a, bytes))
                .flatten()
            {
                Some(bound) => bounded.push((a, bound)),
                None => rest.push(a),
            }
        }
        let mut ranked: Vec<Priced> = Vec::with_capacity(candidates.len());
        let p = self.hierarchy.len();
        let price_one = |&a: &Algorithm| {
            if let Err(too_many) = a.check_ranks(p) {
                unpriced(a, too_many.to_string())
            } else if quick && !cheap_to_price(collective, a, bytes, p) {
                unpriced(
                    a,
                    format!(
                        "not priced at run time above {RUNTIME_PRICING_MAX_RANKS} ranks \
                             (write a tuning file with collbench explain --write-tuning)"
                    ),
                )
            } else {
                self.price(collective, a, bytes)
            }
        };
        // Ahead of time, on a communicator whose pricing takes seconds, two at once.
        let threads = if thorough && p > RUNTIME_PRICING_MAX_RANKS {
            EXPLAIN_THREADS
        } else {
            1
        };
        if threads > 1 {
            // The dearest first, so that the cheaper ones share the other threads meanwhile
            // rather than leave it to run alone at the end.
            rest.sort_by_key(|&a| !scale::is_pipelined(collective, a));
        }
        ranked.extend(map_in_order(&rest, threads, price_one));
        for (a, bound) in bounded {
            let best = ranked
                .iter()
                .filter_map(|p| Some((p.seconds.as_ref().ok()?, p.algorithm)))
                .min_by(|x, y| x.0.total_cmp(y.0));
            ranked.push(match best {
                Some((t, b)) if bound > *t => unpriced(
                    a,
                    format!(
                        "not priced at run time: its own messages alone take {}, more than \
                         {b}'s {}",
                        human_seconds(bound),
                        human_seconds(*t)
                    ),
                ),
                _ => self.price(collective, a, bytes),
            });
        }
        // Back in the default order, which breaks ties below.
        ranked.sort_by_key(|p| candidates.iter().position(|&a| a == p.algorithm));
        // Cheapest first; ties keep the default order; unpriced last.
        ranked.sort_by(|x, y| match (&x.seconds, &y.seconds) {
            (Ok(a), Ok(b)) => a.total_cmp(b),
            (Ok(_), Err(_)) => std::cmp::Ordering::Less,
            (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
            (Err(_), Err(_)) => std::cmp::Ordering::Equal,
        });
        let hierarchy = format!(
            "{}, {}",
            self.hierarchy.describe(),
            if self.ordered || self.hierarchy.is_launcher_order() {
                "rings in topology order"
            } else {
                "rings in launcher order"
            }
        );
        if let Some(rule) = self.rule_for(collective, bytes) {
            return Explanation {
                notes: Vec::new(),
                collective,
                bytes,
                hierarchy,
                chosen: rule.algorithm,
                reason: format!(
                    "the tuning file sets {} for {}..={} bytes",
                    rule.algorithm, rule.min_bytes, rule.max_bytes
                ),
                ranked,
            };
        }
        if let Some(reason) = self.sliced_ring_preference(collective, bytes, &ranked) {
            return Explanation {
                notes: Vec::new(),
                collective,
                bytes,
                hierarchy,
                ranked,
                chosen: Algorithm::Ring,
                reason,
            };
        }
        let (chosen, reason) = match (ranked.first(), ranked.get(1)) {
            (Some(best), next) if best.seconds.is_ok() => {
                let t = *best.seconds.as_ref().unwrap_or(&0.0);
                let reason = match next.map(|n| (&n.seconds, n.algorithm)) {
                    Some((Ok(u), a)) => format!(
                        "cheapest predicted time, {} ahead of {a} ({:.2}×)",
                        human_seconds(u - t),
                        u / t.max(f64::MIN_POSITIVE)
                    ),
                    _ => "the only algorithm that can run here".into(),
                };
                (best.algorithm, reason)
            }
            _ => (
                algorithms_for(collective)[0],
                "nothing could be priced; the default".into(),
            ),
        };
        Explanation {
            notes: Vec::new(),
            collective,
            bytes,
            hierarchy,
            ranked,
            chosen,
            reason,
        }
    }
}

/// Whether fast pricing prices `algorithm` for `collective` at `bytes` per rank on `p` ranks
/// in O(p lg p) or less, whatever the step count: ring phases in closed form, alone or along
/// the hierarchy's rails, and recursive doubling step by step. A ring all-reduce, flat or
/// hierarchical, of fewer elements than ranks is not: its empty blocks make it build and
/// time its rings on the engine (0.1–0.2 s at 24,576 ranks and 8 bytes), and at that size
/// recursive doubling is priced far below both.
fn cheap_to_price(collective: Collective, algorithm: Algorithm, bytes: usize, p: usize) -> bool {
    let sparse = fewer_elements_than_ranks(bytes, p);
    match (collective, algorithm.normalized()) {
        // Step by step above scale::STEPWISE_DOUBLING_ABOVE: the latency-bound choice.
        (Collective::AllReduce, Algorithm::RecursiveDoubling) => true,
        (
            Collective::AllReduce,
            Algorithm::Ring | Algorithm::Hierarchical(crate::HierPart::Ring),
        ) => !sparse,
        (Collective::AllGather | Collective::ReduceScatter, a) => a == Algorithm::Ring,
        _ => false,
    }
}

/// Whether `bytes` per rank price as fewer elements than `p` ranks: a ring all-reduce of that
/// size has empty blocks, so it is timed on the engine rather than in closed form.
pub fn fewer_elements_than_ranks(bytes: usize, p: usize) -> bool {
    bytes.div_ceil(PRICE_ELEM_BYTES) < p
}

/// What the runtime does for a call of no elements under `schedules` (one per rank): one
/// step in which every rank sends an empty message to, and receives one from, each of its
/// [`RankSchedule::header_peers`] (the headers of the call).
pub fn headers_only(schedules: &[RankSchedule]) -> Vec<RankSchedule> {
    let p = schedules.len();
    let empty = |buf| Region {
        buf,
        offset: 0,
        len: 0,
    };
    schedules
        .iter()
        .enumerate()
        .map(|(rank, s)| {
            let peers = s.header_peers(rank, p);
            let mut ops: Vec<Op> = peers
                .iter()
                .map(|&peer| Op::Send {
                    peer,
                    src: empty(Buf::Input),
                })
                .collect();
            ops.extend(peers.iter().map(|&peer| Op::Recv {
                peer,
                dst: empty(Buf::Output),
            }));
            RankSchedule {
                steps: vec![Step { ops }],
                scratch_elems: 0,
            }
        })
        .collect()
}

/// The size class of `bytes`: ⌈lg bytes⌉ (0 for 0 and 1).
pub fn size_class(bytes: usize) -> u32 {
    bytes.max(1).next_power_of_two().trailing_zeros()
}

/// The bytes a size class is priced at: its upper edge.
pub fn class_bytes(class: u32) -> usize {
    1usize << class
}

/// `64 MiB`, `8 B`.
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `12.3 µs`, `4.56 ms`, `1.23 s`.
pub fn human_seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

#[cfg(test)]
pub(crate) mod tests;
