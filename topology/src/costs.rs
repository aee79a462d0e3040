//! What each tier of the machine costs: per-endpoint latency and bandwidth of every tier,
//! the reduction, copy and call figures, and where a host's caches end. The topology file's
//! `[tiers]` table and a cost profile hold these.

use crate::Tier;
use serde::{Deserialize, Serialize};

/// What one tier offers each endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierLink {
    /// Bandwidth per endpoint, GB/s, before oversubscription.
    pub bandwidth_gbps: f64,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// Downlink : uplink ratio at this tier (7 for 1:7); 1 for full bisection.
    #[serde(default = "one")]
    pub oversubscription: f64,
    /// The fraction of an oversubscribed uplink's rate its flows get together when two or
    /// more share it (1: perfect sharing). TCP flows in one switch queue lose some of it to
    /// queueing and unfairness; the emulated fat tree measures about 0.8.
    #[serde(default = "one")]
    pub shared_efficiency: f64,
    /// CPU time each end of a message over this tier spends on it, µs: system calls, the
    /// transport's stack, polling (LogP's o, beside `latency_us`'s L). A rank's messages pay
    /// it one after another, and so do those of ranks that share a core, so a rank that
    /// sends to seven peers at once pays it seven times. 0 unless a cost profile or the file
    /// says otherwise; priced by the flow-level engine (full simulations, up to 64 ranks).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_us: f64,
}

fn one() -> f64 {
    1.0
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl TierLink {
    /// Bandwidth per endpoint when every endpoint below sends across this tier at once.
    pub fn effective_gbps(&self) -> f64 {
        self.bandwidth_gbps / self.oversubscription.max(1.0)
    }
}

/// The cost of every tier.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierCosts {
    /// GPUs of one NVLink domain (absent: no NVLink).
    #[serde(default)]
    pub nvlink: Option<TierLink>,
    /// Within a host over PCIe or shared memory.
    #[serde(default = "default_host")]
    pub host: TierLink,
    /// Between hosts under one leaf switch.
    #[serde(default = "default_net")]
    pub leaf: TierLink,
    /// Between leaves of one pod.
    #[serde(default = "default_net")]
    pub pod: TierLink,
    /// Between pods, across the aggregation layer.
    #[serde(default = "default_net")]
    pub aggregation: TierLink,
    /// How fast one rank applies a reduction, GB/s of input combined (the cost model's γ).
    #[serde(default = "default_reduce")]
    pub reduce_gbps: f64,
    /// What every call costs besides its messages, µs: entering and leaving the library
    /// (0 unless a cost profile or the file says otherwise). It moves every algorithm's price
    /// alike, so it changes predictions, never a choice.
    #[serde(default)]
    pub call_us: f64,
    /// What a call that walks its schedule step by step costs on top of `call_us`, µs: the
    /// per-peer state, header checks and step bookkeeping that the small all-reduce path
    /// skips (`Algorithm::takes_small_path` in strata-algorithms; 0 unless a cost profile or
    /// the file says otherwise).
    #[serde(default)]
    pub schedule_us: f64,
    /// How fast one rank copies inside its own memory, GB/s: what a schedule's local copies
    /// (staging, gathering into place) cost. Absent: they are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_gbps: Option<f64>,
    /// Where a host's caches end (absent: every byte moves at the rates above, whatever the
    /// size). Applied per call by [`TierCosts::at_working_set`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTier>,
    /// What a message inside a host pays before its copies overlap (absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_fill: Option<SlotFill>,
    /// What a message pays, µs, while a rank at either end shares its core with a rank that
    /// has messages of its own in flight: the turn the core gives that rank first (0 unless a
    /// cost profile says otherwise; priced where the model knows which ranks share a core).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub core_wait_us: f64,
    /// Whether the ranks reduce on GPUs, where the units that move a byte also reduce it, so
    /// a receive's reduction follows its data instead of running beside it (set by what
    /// prices GPU collectives, such as the tuner plugin for NCCL; a fabric with an NVLink tier
    /// implies it). Never in a file.
    #[serde(skip)]
    pub device_reductions: bool,
}

/// A message through shared memory is copied into a slot by its sender and out by its
/// receiver; past the first slot the two copies overlap, slot by slot, but the first slot's
/// bytes are copied in and then out, one after the other. So each of a message's first
/// `slot_kib` KiB takes `1 / gbps` longer: small messages pay it on every byte, large ones
/// once. Priced by the full simulation (up to 64 ranks), as local copies are.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotFill {
    /// The slot, KiB (`STRATA_SHM_SLOT_SIZE`).
    pub slot_kib: f64,
    /// The extra cost of each byte in it, as a rate in GB/s.
    pub gbps: f64,
}

impl SlotFill {
    /// Seconds a message of `bytes` inside a host pays before its copies overlap.
    pub fn seconds(&self, bytes: f64) -> f64 {
        bytes.min(self.slot_kib * 1024.0) / (self.gbps * 1e9)
    }
}

/// What bytes cost once a call's buffers outgrow a host's caches: the share of them beyond
/// `cache_mib` comes from memory, and each such byte takes `1 / miss_gbps` longer in every
/// transfer inside a host, reduction and local copy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryTier {
    /// Bytes of buffers one host keeps in its caches, MiB (2^20 bytes).
    pub cache_mib: f64,
    /// The extra cost of a byte that misses them, as a rate in GB/s.
    pub miss_gbps: f64,
}

impl MemoryTier {
    /// The share of `host_bytes` bytes of buffers (every rank of the fullest host: inputs
    /// and outputs) that is not in cache: `1 - cache / bytes`, at least 0.
    pub fn miss_share(&self, host_bytes: f64) -> f64 {
        let cache = self.cache_mib * (1u64 << 20) as f64;
        if host_bytes <= cache {
            0.0
        } else {
            1.0 - cache / host_bytes
        }
    }
}

fn default_reduce() -> f64 {
    8.0
}

fn default_host() -> TierLink {
    TierLink {
        bandwidth_gbps: 20.0,
        latency_us: 0.5,
        oversubscription: 1.0,
        shared_efficiency: 1.0,
        cpu_us: 0.0,
    }
}

fn default_net() -> TierLink {
    TierLink {
        bandwidth_gbps: 12.5,
        latency_us: 5.0,
        oversubscription: 1.0,
        shared_efficiency: 1.0,
        cpu_us: 0.0,
    }
}

impl Default for TierCosts {
    fn default() -> Self {
        Self {
            nvlink: None,
            host: default_host(),
            leaf: default_net(),
            pod: default_net(),
            aggregation: default_net(),
            reduce_gbps: default_reduce(),
            call_us: 0.0,
            schedule_us: 0.0,
            copy_gbps: None,
            memory: None,
            slot_fill: None,
            core_wait_us: 0.0,
            device_reductions: false,
        }
    }
}

impl TierLink {
    /// Why this link's figures cannot be used, naming it `tiers.<name>`, if they cannot.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let ok = self.bandwidth_gbps.is_finite()
            && self.bandwidth_gbps > 0.0
            && self.latency_us.is_finite()
            && self.latency_us >= 0.0
            && self.oversubscription.is_finite()
            && self.oversubscription >= 1.0
            && self.shared_efficiency > 0.0
            && self.shared_efficiency <= 1.0
            && self.cpu_us.is_finite()
            && self.cpu_us >= 0.0;
        if ok {
            Ok(())
        } else {
            Err(format!(
                "tiers.{name}: expected bandwidth_gbps > 0, latency_us ≥ 0, oversubscription ≥ 1, \
                 0 < shared_efficiency ≤ 1 and cpu_us ≥ 0"
            ))
        }
    }
}

impl TierCosts {
    /// Why these figures cannot be used (the first bad one), if they cannot.
    pub fn check(&self) -> Result<(), String> {
        for (name, t) in [
            ("host", self.host),
            ("leaf", self.leaf),
            ("pod", self.pod),
            ("aggregation", self.aggregation),
        ]
        .into_iter()
        .chain(self.nvlink.map(|t| ("nvlink", t)))
        {
            t.check(name)?;
        }
        if !(self.reduce_gbps.is_finite() && self.reduce_gbps > 0.0) {
            return Err(format!(
                "tiers.reduce_gbps is {}; expected a positive number",
                self.reduce_gbps
            ));
        }
        if let Some(c) = self.copy_gbps
            && !(c.is_finite() && c > 0.0)
        {
            return Err(format!(
                "tiers.copy_gbps is {c}; expected a positive number"
            ));
        }
        for (name, v) in [
            ("call_us", self.call_us),
            ("schedule_us", self.schedule_us),
            ("core_wait_us", self.core_wait_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("tiers.{name} is {v}; expected a number ≥ 0"));
            }
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if let Some(f) = self.slot_fill
            && !(positive(f.slot_kib) && positive(f.gbps))
        {
            return Err(format!(
                "tiers.slot_fill has slot_kib {} and gbps {}; expected positive numbers",
                f.slot_kib, f.gbps
            ));
        }
        if let Some(m) = self.memory
            && !(positive(m.cache_mib) && positive(m.miss_gbps))
        {
            return Err(format!(
                "tiers.memory has cache_mib {} and miss_gbps {}; expected positive numbers",
                m.cache_mib, m.miss_gbps
            ));
        }
        Ok(())
    }

    /// The costs of a call whose buffers take `host_bytes` on its fullest host: with
    /// [`TierCosts::memory`], transfers inside a host, reductions and copies each take
    /// `miss_share / miss_gbps` longer per byte. The result has no `memory` (it is applied).
    pub fn at_working_set(&self, host_bytes: f64) -> TierCosts {
        let mut c = *self;
        let Some(m) = c.memory.take() else {
            return c;
        };
        let miss = m.miss_share(host_bytes);
        if miss > 0.0 {
            // In ns per byte: 1/GB/s.
            let slower = |gbps: f64| 1.0 / (1.0 / gbps + miss / m.miss_gbps);
            c.host.bandwidth_gbps = slower(c.host.bandwidth_gbps);
            c.reduce_gbps = slower(c.reduce_gbps);
            c.copy_gbps = c.copy_gbps.map(slower);
        }
        c
    }

    /// The link of `tier` (`SameDevice` and a missing NVLink tier read as the host tier).
    pub fn link(&self, tier: Tier) -> TierLink {
        match tier {
            Tier::SameDevice | Tier::Host => self.host,
            Tier::NvLink => self.nvlink.unwrap_or(self.host),
            Tier::Leaf => self.leaf,
            Tier::Pod => self.pod,
            Tier::Aggregation => self.aggregation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers that fit change nothing; beyond the cache, the share that misses pays its
    /// rate on top of every in-host rate, and the result has nothing left to apply.
    #[test]
    fn a_working_set_beyond_the_cache_slows_host_rates_by_its_missing_share() {
        let c = TierCosts {
            copy_gbps: Some(10.0),
            memory: Some(MemoryTier {
                cache_mib: 4.0,
                miss_gbps: 2.0,
            }),
            ..TierCosts::default()
        };
        let fits = c.at_working_set((4u64 << 20) as f64);
        assert_eq!(fits.host, c.host);
        assert_eq!(
            (fits.reduce_gbps, fits.copy_gbps),
            (c.reduce_gbps, c.copy_gbps)
        );
        assert!(fits.memory.is_none());
        // 16 MiB: three quarters miss, 0.375 ns more per byte.
        let big = c.at_working_set((16u64 << 20) as f64);
        let ns = |gbps: f64| 1.0 / gbps;
        assert!((ns(big.host.bandwidth_gbps) - ns(c.host.bandwidth_gbps) - 0.375).abs() < 1e-12);
        assert!((ns(big.reduce_gbps) - ns(c.reduce_gbps) - 0.375).abs() < 1e-12);
        assert!((ns(big.copy_gbps.unwrap()) - 0.1 - 0.375).abs() < 1e-12);
        assert_eq!(big.leaf, c.leaf, "the network's rates are its own");
        assert_eq!(big.at_working_set(1e12), big, "applied once");
        let none = TierCosts::default();
        assert_eq!(none.at_working_set(1e12), none);
    }
}
