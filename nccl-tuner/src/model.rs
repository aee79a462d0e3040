//! What the plugin knows of one NCCL communicator: strata's price of each NCCL algorithm it
//! models, at every power of two of bytes, computed once at `init`; and how a call's cost
//! table is rewritten from them (a lookup and a few multiplications per call).
//!
//! NCCL's algorithms map onto strata's schedules of the same shape: `RING` is strata's ring in
//! topology order (a pipelined chain for broadcast), `TREE` the double binary tree (all-reduce),
//! `PAT` a log-step exchange (Bruck all-gather, recursive-halving reduce-scatter). CollNet and
//! NVLS need switch hardware the model does not describe; their entries keep NCCL's own figures.
//! Within one algorithm NCCL knows its kernels better than strata does, so the ratio between its
//! protocols (LL, LL128, Simple) is kept and only the algorithm's level is replaced by strata's
//! price: NCCL, taking the minimum, then ranks the algorithms as strata's model does.

use strata_algorithms::schedule::Collective;
use strata_algorithms::tuner::{
    CHUNK_BYTES, RUNTIME_PRICING_MAX_RANKS, Tuner, fewer_elements_than_ranks, map_in_order,
};
use strata_algorithms::{Algorithm, Hierarchy};
use strata_topology::Tier;
use strata_topology::fabric::{Fabric, TierCosts};

/// NCCL's algorithm indices in the cost table (`NCCL_ALGO_*`).
pub mod algo {
    /// `NCCL_ALGO_TREE`.
    pub const TREE: usize = 0;
    /// `NCCL_ALGO_RING`.
    pub const RING: usize = 1;
    /// `NCCL_ALGO_COLLNET_DIRECT`.
    pub const COLLNET_DIRECT: usize = 2;
    /// `NCCL_ALGO_COLLNET_CHAIN`.
    pub const COLLNET_CHAIN: usize = 3;
    /// `NCCL_ALGO_NVLS`.
    pub const NVLS: usize = 4;
    /// `NCCL_ALGO_NVLS_TREE`.
    pub const NVLS_TREE: usize = 5;
    /// `NCCL_ALGO_PAT`.
    pub const PAT: usize = 6;
    /// `NCCL_NUM_ALGORITHMS`.
    pub const COUNT: usize = 7;
    /// Names as NCCL prints them.
    pub const NAMES: [&str; COUNT] = [
        "Tree",
        "Ring",
        "CollNetDirect",
        "CollNetChain",
        "NVLS",
        "NVLSTree",
        "PAT",
    ];
}

/// `NCCL_NUM_PROTOCOLS` (LL, LL128, Simple).
pub const PROTOCOLS: usize = 3;

/// NCCL's collective codes (`ncclFunc_t`).
pub mod func {
    /// `ncclFuncBroadcast`.
    pub const BROADCAST: i32 = 0;
    /// `ncclFuncReduce`.
    pub const REDUCE: i32 = 1;
    /// `ncclFuncAllGather`.
    pub const ALL_GATHER: i32 = 2;
    /// `ncclFuncReduceScatter`.
    pub const REDUCE_SCATTER: i32 = 3;
    /// `ncclFuncAllReduce`.
    pub const ALL_REDUCE: i32 = 4;
}

/// Prices are kept for 2^0 .. 2^MAX_LOG2 bytes per rank (256 MiB); larger calls extend the
/// last two powers of two, as every schedule is a pipeline of chunks by then (the full
/// simulation of a tree at 1 GiB costs 40 ms on 8 ranks).
const MAX_LOG2: usize = 28;

/// Above [`DENSE_MAX_RANKS`] ranks only these powers of two are priced, and the others are
/// interpolated between them (log-log).
const SPARSE_GRID: [usize; 11] = [0, 4, 8, 12, 16, 19, 20, 22, 24, 26, 28];

/// Above [`SCALE_RANKS`] ranks, these: by 16 MiB per rank every modelled schedule is a
/// pipeline in its steady state or a sum of per-step messages, so larger sizes extend the last
/// two affinely (the tree all-reduce at 256 MiB on 4,096 ranks: +4% against its full price).
const AT_SCALE_GRID: [usize; 7] = [0, 8, 16, 19, 20, 22, 24];

/// Up to this many ranks every power of two is priced.
const DENSE_MAX_RANKS: usize = 16;

/// Up to [`SCALE_RANKS`] ranks, a price whose work (ranks × pipeline chunks) exceeds this is
/// extrapolated from the smaller sizes instead: it keeps `init` of a 1,024-rank communicator
/// under a second (8 ranks are priced at every size). Above, fast pricing itself times a
/// pipeline only until its steady state, and [`AT_SCALE_GRID`] stops at 16 MiB.
const WORK_BOUND: usize = 1 << 15;

/// Above this many ranks the plugin prices on [`AT_SCALE_GRID`], and a ring all-reduce of
/// fewer elements than ranks (whose empty blocks take the engine, not the closed form, to
/// price: seconds at 4,096 ranks) is given the price of the first size priced, which it does
/// not exceed. strata's own runtime draws the same line ([`RUNTIME_PRICING_MAX_RANKS`]).
pub const SCALE_RANKS: usize = RUNTIME_PRICING_MAX_RANKS;

/// Threads `init` prices on above [`SCALE_RANKS`] ranks (the algorithms at once).
const SCALE_THREADS: usize = 2;

/// The most channels the plugin asks for; above it NCCL's own count stands.
pub const MAX_CHANNELS: usize = 32;

/// Which strata schedule prices NCCL's `algo` for the collective `func`, and the collective.
pub fn strata_algorithm(func: i32, nccl_algo: usize) -> Option<(Collective, Algorithm)> {
    use Algorithm as A;
    match (func, nccl_algo) {
        (func::ALL_REDUCE, algo::RING) => Some((Collective::AllReduce, A::Ring)),
        (func::ALL_REDUCE, algo::TREE) => Some((Collective::AllReduce, A::Tree)),
        (func::ALL_GATHER, algo::RING) => Some((Collective::AllGather, A::Ring)),
        (func::ALL_GATHER, algo::PAT) => Some((Collective::AllGather, A::Bruck)),
        (func::REDUCE_SCATTER, algo::RING) => Some((Collective::ReduceScatter, A::Ring)),
        (func::REDUCE_SCATTER, algo::PAT) => Some((Collective::ReduceScatter, A::RecursiveHalving)),
        (func::BROADCAST, algo::RING) => Some((Collective::Broadcast, A::Chain)),
        _ => None,
    }
}

/// The collectives priced, with NCCL's code.
const FUNCS: [i32; 4] = [
    func::ALL_REDUCE,
    func::ALL_GATHER,
    func::REDUCE_SCATTER,
    func::BROADCAST,
];

/// Strata's bytes per rank for NCCL's `nBytes` of `func` (NCCL passes the larger of the send
/// and receive buffers: the whole gathered or scattered vector for all-gather and
/// reduce-scatter, where strata counts one rank's block).
pub fn bytes_per_rank(func: i32, n_bytes: usize, n_ranks: usize) -> usize {
    match func {
        func::ALL_GATHER | func::REDUCE_SCATTER => n_bytes.div_ceil(n_ranks.max(1)),
        _ => n_bytes,
    }
}

/// Where the communicator's ranks sit: `n_ranks` ranks spread over `hosts` (host indices of
/// `fabric`, one per NCCL node, in node order), a contiguous block of ranks per node.
pub fn hierarchy(fabric: &Fabric, n_ranks: usize, hosts: &[usize]) -> Hierarchy {
    let per_host = fabric.gpus_per_host.max(1);
    let nodes = hosts.len().max(1);
    let devices: Vec<usize> = (0..n_ranks)
        .map(|r| {
            let node = r * nodes / n_ranks.max(1);
            let first = (node * n_ranks).div_ceil(nodes);
            hosts.get(node).copied().unwrap_or(0) * per_host + (r - first) % per_host
        })
        .collect();
    Hierarchy::on_fabric(fabric, &devices)
}

/// The prices of one communicator.
#[derive(Clone, Debug)]
pub struct Model {
    n_ranks: usize,
    n_nodes: usize,
    /// `prices[f][k][a]`: strata's seconds for collective `FUNCS[f]` at 2^k bytes per rank on
    /// NCCL algorithm `a`; NaN where strata has no schedule for it.
    prices: Vec<Vec<[f64; algo::COUNT]>>,
    /// Their natural logarithms, for the per-call interpolation.
    ln_prices: Vec<Vec<[f64; algo::COUNT]>>,
    /// Bytes at which one message across the communicator's outermost tier costs as much in
    /// bandwidth as in latency (α/β): below it, a message is latency-bound.
    half_bandwidth_bytes: f64,
    /// The fabric, in words, for the log.
    pub described: String,
    /// Prices of the grid taken from smaller sizes rather than priced (work bound).
    pub extrapolated: usize,
}

impl Model {
    /// Prices every NCCL algorithm strata models for a communicator of `n_ranks` ranks on the
    /// fabric's `hosts` (one per NCCL node).
    pub fn build(fabric: &Fabric, n_ranks: usize, hosts: &[usize]) -> Model {
        let h = hierarchy(fabric, n_ranks, hosts);
        let outer = (0..h.depth())
            .map(|l| h.level_tier(l))
            .max()
            .unwrap_or(Tier::Host)
            .max(h.inner_tier());
        let described = format!("{} ({})", h.describe(), fabric.source);
        let tuner = Tuner::new(h, nccl_tiers(fabric.tiers), true);
        let link = fabric.tiers.link(outer);
        let half_bandwidth_bytes = link.latency_us * 1e-6 * link.effective_gbps() * 1e9;
        let at_scale = n_ranks > SCALE_RANKS;
        let grid: Vec<usize> = if n_ranks <= DENSE_MAX_RANKS {
            (0..=MAX_LOG2).collect()
        } else if at_scale {
            AT_SCALE_GRID.to_vec()
        } else {
            SPARSE_GRID.to_vec()
        };
        // Every (collective, NCCL algorithm) strata models, priced on its own.
        let rows: Vec<(usize, usize, Collective, Algorithm)> = FUNCS
            .iter()
            .enumerate()
            .flat_map(|(f, &func)| {
                (0..algo::COUNT)
                    .filter_map(move |a| strata_algorithm(func, a).map(|(c, alg)| (f, a, c, alg)))
            })
            .collect();
        let priced = map_in_order(
            &rows,
            if at_scale { SCALE_THREADS } else { 1 },
            |&(_, _, c, alg)| {
                grid.iter()
                    .filter(|&&k| at_scale || work(n_ranks, alg, k) <= WORK_BOUND)
                    .filter(|&&k| !(at_scale && sparse_ring(c, alg, k, n_ranks)))
                    .filter_map(|&k| Some((k, tuner.price(c, alg, 1usize << k).seconds.ok()?)))
                    .collect::<Vec<(usize, f64)>>()
            },
        );
        let mut extrapolated = 0;
        let mut prices = vec![vec![[f64::NAN; algo::COUNT]; MAX_LOG2 + 1]; FUNCS.len()];
        for (&(f, a, _, _), points) in rows.iter().zip(priced) {
            if points.len() < 2 {
                continue;
            }
            extrapolated += grid
                .iter()
                .filter(|k| !points.iter().any(|p| p.0 == **k))
                .count();
            for (k, row) in prices[f].iter_mut().enumerate() {
                row[a] = log_log(&points, k as f64);
            }
        }
        let ln_prices = logarithms(&prices);
        Model {
            n_ranks,
            n_nodes: hosts.len(),
            prices,
            ln_prices,
            half_bandwidth_bytes,
            described,
            extrapolated,
        }
    }

    /// Strata's price in seconds of NCCL algorithm `a` for `n_bytes` of `func` as NCCL counts
    /// them, or `None` where strata does not model it.
    pub fn seconds(&self, func: i32, a: usize, n_bytes: usize) -> Option<f64> {
        let f = FUNCS.iter().position(|&x| x == func)?;
        self.at(f, a, self.log2_bytes(func, n_bytes))
    }

    /// log2 of strata's bytes per rank for NCCL's `n_bytes` of `func`.
    fn log2_bytes(&self, func: i32, n_bytes: usize) -> f64 {
        (bytes_per_rank(func, n_bytes, self.n_ranks).max(1) as f64).log2()
    }

    /// The price of NCCL algorithm `a` for `FUNCS[f]` at 2^x bytes per rank: a power law
    /// between the powers of two around it (one `exp` of the stored logarithms), affine in
    /// bytes above 2^MAX_LOG2.
    fn at(&self, f: usize, a: usize, x: f64) -> Option<f64> {
        let lo = (x.floor() as usize).min(MAX_LOG2 - 1);
        let (t0, t1) = (self.prices[f][lo][a], self.prices[f][lo + 1][a]);
        if !(t0.is_finite() && t1.is_finite()) {
            return None;
        }
        let (l0, l1) = (self.ln_prices[f][lo][a], self.ln_prices[f][lo + 1][a]);
        if x > MAX_LOG2 as f64 || !(l0.is_finite() && l1.is_finite()) {
            return Some(log_log(&[(lo, t0), (lo + 1, t1)], x));
        }
        Some((l0 + (l1 - l0) * (x - lo as f64)).exp())
    }

    /// Rewrites NCCL's cost table (`table[a * protocols + p]`, µs, negative = not allowed) for
    /// a call, and returns the channel count to ask for (0: NCCL's own).
    pub fn fill(&self, func: i32, n_bytes: usize, table: &mut [f32], protocols: usize) -> i32 {
        let algos = table.len() / protocols.max(1);
        let Some(f) = FUNCS.iter().position(|&x| x == func) else {
            return self.channels(func, n_bytes);
        };
        let x = self.log2_bytes(func, n_bytes);
        for a in 0..algos.min(algo::COUNT) {
            if strata_algorithm(func, a).is_none() {
                continue;
            }
            let Some(seconds) = self.at(f, a, x) else {
                continue;
            };
            let row = &mut table[a * protocols..(a + 1) * protocols];
            let best = row
                .iter()
                .copied()
                .filter(|&c| c >= 0.0)
                .fold(f32::INFINITY, f32::min);
            if !(best.is_finite() && best > 0.0) {
                continue; // NCCL does not allow this algorithm here
            }
            let scale = (seconds * 1e6) as f32 / best;
            for c in row.iter_mut().filter(|c| **c >= 0.0) {
                *c *= scale;
            }
        }
        self.channels(func, n_bytes)
    }

    /// Channels for a call: across nodes, as many as keep each channel's share of one step's
    /// message at or above the half-bandwidth size of the outermost tier, since a channel
    /// below it adds a latency and no bandwidth. 0 (NCCL's own count) within one node, where
    /// channels are bounded by SMs the model does not price, and where that many channels
    /// reach [`MAX_CHANNELS`].
    pub fn channels(&self, func: i32, n_bytes: usize) -> i32 {
        if self.n_nodes <= 1 || self.half_bandwidth_bytes <= 0.0 {
            return 0;
        }
        // One step of a ring carries a rank's block; a broadcast or reduce pipeline carries
        // the whole message through every link.
        let step = match func {
            func::BROADCAST | func::REDUCE => n_bytes,
            _ => n_bytes / self.n_ranks.max(1),
        };
        let c = (step as f64 / self.half_bandwidth_bytes).floor() as usize;
        if c >= MAX_CHANNELS {
            0
        } else {
            c.max(1) as i32
        }
    }

    /// Ranks and nodes priced.
    pub fn shape(&self) -> (usize, usize) {
        (self.n_ranks, self.n_nodes)
    }

    /// The model as a table file ([`crate::cache`]): a first line naming the format and
    /// `key`, the shape, then one line of prices per collective and power of two (`{:?}`, which
    /// reads back to the same bits; NaN where unmodelled).
    pub fn to_table(&self, key: u64) -> String {
        let mut out = format!(
            "{TABLE_MAGIC} {key:016x}\nranks {} nodes {} half_bandwidth_bytes {:?} extrapolated {}\n\
             described {}\n",
            self.n_ranks,
            self.n_nodes,
            self.half_bandwidth_bytes,
            self.extrapolated,
            self.described.replace('\n', " ")
        );
        for (f, rows) in self.prices.iter().enumerate() {
            for (k, row) in rows.iter().enumerate() {
                out.push_str(&format!("{f} {k}"));
                for p in row {
                    out.push_str(&format!(" {p:?}"));
                }
                out.push('\n');
            }
        }
        out
    }

    /// Reads [`Model::to_table`]'s text back, refusing one written for another `key`, of
    /// another shape, or cut short.
    pub fn from_table(text: &str, key: u64) -> Result<Model, String> {
        let mut lines = text.lines();
        let head = lines.next().unwrap_or_default();
        if head != format!("{TABLE_MAGIC} {key:016x}") {
            return Err(format!(
                "its first line is {head:?}, not this communicator's key"
            ));
        }
        let shape: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
        let [_, ranks, _, nodes, _, half, _, extrapolated] = shape[..] else {
            return Err("its shape line is malformed".into());
        };
        let num = |s: &str| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
        let (n_ranks, n_nodes, extrapolated) = (num(ranks)?, num(nodes)?, num(extrapolated)?);
        let half_bandwidth_bytes: f64 = half.parse().map_err(|e| format!("{half:?}: {e}"))?;
        let described = lines
            .next()
            .and_then(|l| l.strip_prefix("described "))
            .ok_or("its described line is missing")?
            .to_string();
        let mut prices = vec![vec![[f64::NAN; algo::COUNT]; MAX_LOG2 + 1]; FUNCS.len()];
        let mut seen = 0;
        for line in lines {
            let v: Vec<&str> = line.split(' ').collect();
            let (f, k) = match v[..] {
                [f, k, ..] if v.len() == 2 + algo::COUNT => (num(f)?, num(k)?),
                _ => return Err(format!("price line {line:?} is malformed")),
            };
            let row = prices
                .get_mut(f)
                .and_then(|r| r.get_mut(k))
                .ok_or(format!("price line {line:?} is out of range"))?;
            for (slot, p) in row.iter_mut().zip(&v[2..]) {
                *slot = p.parse().map_err(|e| format!("{p:?}: {e}"))?;
            }
            seen += 1;
        }
        if seen != FUNCS.len() * (MAX_LOG2 + 1) {
            return Err(format!(
                "it holds {seen} price lines, not {}",
                FUNCS.len() * (MAX_LOG2 + 1)
            ));
        }
        let ln_prices = logarithms(&prices);
        Ok(Model {
            n_ranks,
            n_nodes,
            prices,
            ln_prices,
            half_bandwidth_bytes,
            described,
            extrapolated,
        })
    }
}

/// The tier costs NCCL's schedules are priced with: the file's, without the figures that
/// describe strata's own copies through host memory (where a host's caches end, a message's
/// first shared-memory slot) and its own step executor, which NCCL's kernels and its
/// transports do not have, nor the turns ranks sharing a CPU core take; its ranks reduce on
/// GPUs ([`TierCosts::device_reductions`]).
pub fn nccl_tiers(t: TierCosts) -> TierCosts {
    TierCosts {
        memory: None,
        slot_fill: None,
        schedule_us: 0.0,
        core_wait_us: 0.0,
        device_reductions: true,
        ..t
    }
}

/// The natural logarithm of every price, for the per-call interpolation.
fn logarithms(prices: &[Vec<[f64; algo::COUNT]>]) -> Vec<Vec<[f64; algo::COUNT]>> {
    prices
        .iter()
        .map(|rows| rows.iter().map(|row| row.map(f64::ln)).collect())
        .collect()
}

/// The first word of a table file, with its format's version.
const TABLE_MAGIC: &str = "strata-nccl-tuner-table-v1";

/// Work of pricing `alg` at 2^k bytes per rank: ranks × chunks for the pipelines the
/// simulation walks chunk by chunk, ranks for the others.
fn work(n_ranks: usize, alg: Algorithm, k: usize) -> usize {
    let chunks = match alg {
        Algorithm::Tree | Algorithm::Chain => ((1usize << k) / CHUNK_BYTES).max(1),
        _ => 1,
    };
    n_ranks.saturating_mul(chunks)
}

/// Whether `alg` for `c` at 2^k bytes per rank is a ring all-reduce of fewer elements than
/// ranks, as the tuner prices them.
fn sparse_ring(c: Collective, alg: Algorithm, k: usize, n_ranks: usize) -> bool {
    c == Collective::AllReduce
        && alg == Algorithm::Ring
        && fewer_elements_than_ranks(1 << k, n_ranks)
}

/// The price at log2 bytes `x` from priced points `(log2 bytes, seconds)` sorted by size: a
/// power law between the two around `x`; below the first, the first (no price falls as bytes
/// grow, so this does not underprice); above the last, affine in bytes through the last two
/// (pipelines of chunks grow linearly).
fn log_log(points: &[(usize, f64)], x: f64) -> f64 {
    let n = points.len();
    if x < points[0].0 as f64 {
        return points[0].1;
    }
    let ((k0, t0), (k1, t1)) = (points[n - 2], points[n - 1]);
    if x > k1 as f64 {
        let (b0, b1) = (2f64.powi(k0 as i32), 2f64.powi(k1 as i32));
        return t1 + (t1 - t0) / (b1 - b0) * (2f64.powf(x) - b1);
    }
    let i = points
        .iter()
        .position(|p| p.0 as f64 >= x)
        .unwrap_or(n)
        .clamp(1, n - 1);
    let ((k0, t0), (k1, t1)) = (points[i - 1], points[i]);
    if t0 <= 0.0 || t1 <= 0.0 {
        return t0 + (t1 - t0) * (x - k0 as f64) / (k1 as f64 - k0 as f64);
    }
    let slope = (t1.ln() - t0.ln()) / (k1 as f64 - k0 as f64);
    (t0.ln() + slope * (x - k0 as f64)).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_topology::fabric::parse_file;

    fn emulated() -> Fabric {
        let text = include_str!("../../examples/topology/emulated-fat-tree.toml");
        parse_file(text, "emulated-fat-tree.toml").unwrap()
    }

    #[test]
    fn nodes_get_contiguous_blocks_of_ranks() {
        let fab = parse_file(
            "gpus_per_host = 4\n[fat_tree]\nhosts_per_leaf = 2\nleaves_per_pod = 2\npods = 1\n",
            "t.toml",
        )
        .unwrap();
        let h = hierarchy(&fab, 8, &[0, 2]);
        // Ranks 0-3 on host 0 and 4-7 on host 2 (another leaf): 0-1 share a host, 3-4 cross
        // the pod tier.
        assert_eq!(h.tier(0, 1), Tier::Host);
        assert_eq!(h.tier(3, 4), Tier::Pod);
        assert_eq!(h.tier(4, 7), Tier::Host);
    }

    /// A file's figures for strata's own host copies (a cache edge, a slot fill) leave
    /// NCCL's prices as they were.
    #[test]
    fn strata_host_copy_figures_do_not_price_nccl() {
        let plain = emulated();
        let mut with = plain.clone();
        with.tiers.memory = Some(strata_topology::MemoryTier {
            cache_mib: 1.0,
            miss_gbps: 0.1,
        });
        with.tiers.slot_fill = Some(strata_topology::SlotFill {
            slot_kib: 8.0,
            gbps: 0.1,
        });
        let hosts: Vec<usize> = (0..8).collect();
        let (a, b) = (
            Model::build(&plain, 8, &hosts),
            Model::build(&with, 8, &hosts),
        );
        for k in [3usize, 16, 24] {
            assert_eq!(
                a.seconds(func::ALL_REDUCE, algo::RING, 1 << k),
                b.seconds(func::ALL_REDUCE, algo::RING, 1 << k)
            );
        }
    }

    #[test]
    fn prices_follow_strata_and_keep_protocol_ratios() {
        let fab = emulated();
        let m = Model::build(&fab, 8, &(0..8).collect::<Vec<_>>());
        // strata's model of the same GPUs: reductions after their data.
        let tuner = Tuner::new(
            hierarchy(&fab, 8, &(0..8).collect::<Vec<_>>()),
            nccl_tiers(fab.tiers),
            true,
        );
        for k in [3usize, 12, 20, 26] {
            let bytes = 1usize << k;
            let ring = tuner
                .price(Collective::AllReduce, Algorithm::Ring, bytes)
                .seconds
                .unwrap();
            let tree = tuner
                .price(Collective::AllReduce, Algorithm::Tree, bytes)
                .seconds
                .unwrap();
            // NCCL's table: tree and ring allowed with all protocols, NVLS not.
            let mut table = vec![-1.0f32; algo::COUNT * PROTOCOLS];
            table[..3].copy_from_slice(&[10.0, 20.0, 40.0]);
            table[3..6].copy_from_slice(&[5.0, 6.0, 7.0]);
            m.fill(func::ALL_REDUCE, bytes, &mut table, PROTOCOLS);
            let us = |s: f64| (s * 1e6) as f32;
            assert!((table[0] - us(tree)).abs() <= us(tree) * 1e-5, "{table:?}");
            assert!((table[2] / table[0] - 4.0).abs() < 1e-4);
            assert!((table[3] - us(ring)).abs() <= us(ring) * 1e-5);
            assert!((table[5] / table[3] - 1.4).abs() < 1e-4);
            assert!(
                table[6..].iter().all(|&c| c == -1.0),
                "not allowed stays so"
            );
        }
    }

    #[test]
    fn bytes_between_powers_of_two_are_interpolated() {
        let fab = emulated();
        let m = Model::build(&fab, 8, &(0..8).collect::<Vec<_>>());
        let a = m.seconds(func::ALL_REDUCE, algo::RING, 1 << 20).unwrap();
        let b = m.seconds(func::ALL_REDUCE, algo::RING, 1 << 21).unwrap();
        let mid = m.seconds(func::ALL_REDUCE, algo::RING, 3 << 19).unwrap();
        assert!(a < mid && mid < b, "{a} {mid} {b}");
        // A power law between the two: the geometric mean at 2^20.5.
        let geo = m.seconds(
            func::ALL_REDUCE,
            algo::RING,
            (1u64 << 20) as usize * 1414 / 1000,
        );
        assert!((geo.unwrap() / (a * b).sqrt() - 1.0).abs() < 1e-3);
        // All-gather: NCCL's n_bytes is the whole output, strata's is one rank's block.
        let ag = m.seconds(func::ALL_GATHER, algo::RING, 8 << 20).unwrap();
        let ag_block = m.prices[1][20][algo::RING];
        assert_eq!(ag, ag_block);
        assert!(m.seconds(func::REDUCE, algo::RING, 1 << 20).is_none());
        assert!(m.seconds(func::ALL_REDUCE, algo::NVLS, 1 << 20).is_none());
    }

    #[test]
    fn channels_grow_with_size_across_nodes_only() {
        let fab = emulated();
        let m = Model::build(&fab, 8, &(0..8).collect::<Vec<_>>());
        assert_eq!(m.channels(func::ALL_REDUCE, 8), 1);
        let mut last = 1;
        for k in 10..40 {
            let c = m.channels(func::ALL_REDUCE, 1 << k);
            if c == 0 {
                break; // NCCL's own count from here on
            }
            assert!(c >= last, "{c} channels at 2^{k} after {last}");
            last = c;
        }
        assert_eq!(m.channels(func::ALL_REDUCE, 1 << 39), 0);
        let one = Model::build(&fab, 1, &[0]);
        assert_eq!(one.channels(func::ALL_REDUCE, 1 << 20), 0);
    }

    /// Above [`SCALE_RANKS`] ranks every modelled row is priced (the plugin once wrote
    /// nothing there): at the grid's sizes the rows are strata's prices; a ring all-reduce of
    /// fewer elements than ranks holds the price of its first size priced, which its own price
    /// does not exceed; past 16 MiB the tree is extended within 10% of its price.
    #[test]
    fn a_communicator_at_scale_is_priced() {
        let fab = parse_file(
            include_str!("../../examples/topology/meta-24k-h100.toml"),
            "meta-24k-h100.toml",
        )
        .unwrap();
        let (ranks, hosts) = (2048, (0..256).collect::<Vec<_>>());
        assert!(ranks > SCALE_RANKS);
        let m = Model::build(&fab, ranks, &hosts);
        let tuner = Tuner::new(hierarchy(&fab, ranks, &hosts), fab.tiers, true);
        let price = |c, alg, bytes| tuner.price(c, alg, bytes).seconds.unwrap();
        let rows = [
            (func::ALL_REDUCE, algo::TREE),
            (func::ALL_REDUCE, algo::RING),
            (func::ALL_GATHER, algo::RING),
            (func::ALL_GATHER, algo::PAT),
            (func::REDUCE_SCATTER, algo::RING),
            (func::REDUCE_SCATTER, algo::PAT),
            (func::BROADCAST, algo::RING),
        ];
        for (f, a) in rows {
            let (c, alg) = strata_algorithm(f, a).unwrap();
            for k in [16usize, 20, 24] {
                let per_rank = 1usize << k;
                let n_bytes = match f {
                    func::ALL_GATHER | func::REDUCE_SCATTER => per_rank * ranks,
                    _ => per_rank,
                };
                let got = m.seconds(f, a, n_bytes).unwrap();
                let want = price(c, alg, per_rank);
                assert!(
                    (got / want - 1.0).abs() < 1e-9,
                    "{c} {alg} 2^{k}: {got} vs {want}"
                );
            }
        }
        // 256 B is 64 elements on 2,048 ranks: the ring's first priced size is 64 KiB.
        let flat = m.seconds(func::ALL_REDUCE, algo::RING, 256).unwrap();
        assert_eq!(
            flat,
            m.seconds(func::ALL_REDUCE, algo::RING, 1 << 16).unwrap()
        );
        let sparse = price(Collective::AllReduce, Algorithm::Ring, 256);
        assert!(sparse <= flat, "{sparse} above {flat}");
        // At 8 B NCCL's tree is far cheaper than the ring at scale, as strata prices it.
        assert!(m.seconds(func::ALL_REDUCE, algo::TREE, 8).unwrap() < sparse);
        let tree = m.seconds(func::ALL_REDUCE, algo::TREE, 1 << 26).unwrap();
        let full = price(Collective::AllReduce, Algorithm::Tree, 1 << 26);
        assert!((tree / full - 1.0).abs() < 0.10, "{tree} vs {full}");
    }
}
