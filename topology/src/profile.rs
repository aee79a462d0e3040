//! The cost profile (`STRATA_COST_PROFILE`): the tier figures `collbench calibrate` measured on
//! this machine, which the tuner prices with instead of the topology file's or the defaults.
//!
//! ```toml
//! [tiers]                    # the topology file's [tiers] keys; absent ones stay as they were
//! reduce_gbps = 4.1
//! copy_gbps = 7.5
//! call_us = 0.35
//! [tiers.host]
//! bandwidth_gbps = 6.2
//! latency_us = 0.28
//! cpu_us = 0.05              # CPU time each end spends on a message, one after another
//! [tiers.memory]             # buffers beyond 24 MiB on a host: each byte past it 1/9 ns more
//! cache_mib = 24.0
//! miss_gbps = 9.0
//! [tiers.slot_fill]          # a message's first 8 KiB inside a host: 1/20 ns more per byte
//! slot_kib = 8.0
//! gbps = 20.0
//! [measured]                 # how: for the reader, never priced
//! ranks = 2
//! hosts = 1
//! cores = 2
//! [shared_core]              # the same, measured with more ranks than cores on a host
//! ranks_per_core = 2.0
//! [shared_core.tiers]        # a message waits 0.6 µs for its turn on a busy shared core
//! core_wait_us = 0.6
//! [shared_core.tiers.host]
//! bandwidth_gbps = 3.0
//! latency_us = 4.5
//! ```
//!
//! With `r` ranks per core (`r > 1`, the fullest host's ranks over its cores), every figure of
//! `shared_core` is interpolated linearly between the one-per-core figure (at `r = 1`) and the
//! shared one (at its `ranks_per_core`), as seconds per message, per byte and per reduced byte,
//! and extrapolated past it up to four times its distance.

use crate::error::TopoError;
use crate::fabric::{MemoryTier, SlotFill, TierCosts, TierLink};
use serde::{Deserialize, Serialize};

/// Tier figures that replace some of a [`TierCosts`]; absent ones stay as they were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierPatch {
    /// The NVLink tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<TierLink>,
    /// The tier inside a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<TierLink>,
    /// Between hosts under one leaf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf: Option<TierLink>,
    /// Between leaves of one pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<TierLink>,
    /// Between pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregation: Option<TierLink>,
    /// Reduction rate, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_gbps: Option<f64>,
    /// Cost of a call besides its messages, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_us: Option<f64>,
    /// Cost of a call walked step by step, besides `call_us`, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_us: Option<f64>,
    /// Local copy rate, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_gbps: Option<f64>,
    /// Where the host's caches end, and what a byte beyond them costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTier>,
    /// What a message inside a host pays before its copies overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_fill: Option<SlotFill>,
    /// What a message pays while its core's other rank has messages in flight, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_wait_us: Option<f64>,
}

impl TierPatch {
    /// `base` with this patch's figures in place of its own.
    pub fn apply(&self, base: TierCosts) -> TierCosts {
        let mut c = base;
        if self.nvlink.is_some() {
            c.nvlink = self.nvlink;
        }
        let links = [
            (&mut c.host, self.host),
            (&mut c.leaf, self.leaf),
            (&mut c.pod, self.pod),
            (&mut c.aggregation, self.aggregation),
        ];
        for (slot, new) in links {
            if let Some(l) = new {
                *slot = l;
            }
        }
        c.reduce_gbps = self.reduce_gbps.unwrap_or(c.reduce_gbps);
        c.call_us = self.call_us.unwrap_or(c.call_us);
        c.schedule_us = self.schedule_us.unwrap_or(c.schedule_us);
        c.copy_gbps = self.copy_gbps.or(c.copy_gbps);
        c.memory = self.memory.or(c.memory);
        c.slot_fill = self.slot_fill.or(c.slot_fill);
        c.core_wait_us = self.core_wait_us.unwrap_or(c.core_wait_us);
        c
    }

    /// Whether it replaces nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How a part of the profile was measured: for the reader and for `collbench calibrate`'s
/// merge, never priced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// Ranks of the calibrating job.
    #[serde(default)]
    pub ranks: usize,
    /// Hosts it spanned.
    #[serde(default)]
    pub hosts: usize,
    /// Cores of its fullest host.
    #[serde(default)]
    pub cores: usize,
    /// Timed points the figures were fitted to.
    #[serde(default)]
    pub points: usize,
    /// The fraction of those points the fitted model predicts within ±25%.
    #[serde(default)]
    pub within_25_percent: f64,
    /// The median of |predicted / measured - 1| over those points.
    #[serde(default)]
    pub median_error: f64,
}

/// The figures measured with more ranks than cores on a host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedCore {
    /// Ranks per core when they were measured (> 1).
    pub ranks_per_core: f64,
    /// What they measured.
    #[serde(default)]
    pub tiers: TierPatch,
    /// How.
    #[serde(default)]
    pub measured: Measured,
}

/// A cost profile; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostProfile {
    /// The figures with at most one rank per core.
    #[serde(default, skip_serializing_if = "TierPatch::is_empty")]
    pub tiers: TierPatch,
    /// How they were measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
    /// The figures with ranks sharing cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_core: Option<SharedCore>,
}

/// How far past its measured point the shared-core figures are extrapolated, in multiples of
/// its distance from one rank per core.
const MAX_EXTRAPOLATION: f64 = 4.0;

impl CostProfile {
    /// Whether it has figures for `ranks_per_core`: one per core or fewer needs `tiers`, more
    /// needs `shared_core`.
    pub fn covers(&self, ranks_per_core: f64) -> bool {
        if ranks_per_core > 1.0 {
            self.shared_core.is_some()
        } else {
            !self.tiers.is_empty()
        }
    }

    /// The costs to price with at `ranks_per_core` (the fullest host's ranks over its cores),
    /// starting from `base` (the topology file's or the defaults). Applying it to its own
    /// result gives the same result.
    pub fn apply(&self, base: TierCosts, ranks_per_core: f64) -> TierCosts {
        let mut one = self.tiers.apply(base);
        // With a core per rank no message waits for a turn on one, whatever `base` says.
        one.core_wait_us = self.tiers.core_wait_us.unwrap_or(0.0);
        let Some(shared) = self.shared_core.as_ref() else {
            return one;
        };
        if ranks_per_core <= 1.0 {
            return one;
        }
        let far = shared.tiers.apply(one);
        let w = ((ranks_per_core - 1.0) / (shared.ranks_per_core - 1.0)).min(MAX_EXTRAPOLATION);
        // Linear in seconds per message, per byte and per reduced byte.
        let mix = |a: f64, b: f64| a + (b - a) * w;
        let inv = |a: f64, b: f64| 1.0 / mix(1.0 / a, 1.0 / b);
        let link = |a: TierLink, b: TierLink| TierLink {
            bandwidth_gbps: inv(a.bandwidth_gbps, b.bandwidth_gbps),
            latency_us: mix(a.latency_us, b.latency_us).max(0.0),
            cpu_us: mix(a.cpu_us, b.cpu_us).max(0.0),
            ..b
        };
        TierCosts {
            nvlink: match (one.nvlink, far.nvlink) {
                (Some(a), Some(b)) => Some(link(a, b)),
                (_, b) => b,
            },
            host: link(one.host, far.host),
            leaf: link(one.leaf, far.leaf),
            pod: link(one.pod, far.pod),
            aggregation: link(one.aggregation, far.aggregation),
            reduce_gbps: inv(one.reduce_gbps, far.reduce_gbps),
            call_us: mix(one.call_us, far.call_us).max(0.0),
            schedule_us: mix(one.schedule_us, far.schedule_us).max(0.0),
            copy_gbps: match (one.copy_gbps, far.copy_gbps) {
                (Some(a), Some(b)) => Some(inv(a, b)),
                (_, b) => b,
            },
            memory: match (one.memory, far.memory) {
                (Some(a), Some(b)) => Some(MemoryTier {
                    cache_mib: mix(a.cache_mib, b.cache_mib).max(a.cache_mib.min(b.cache_mib)),
                    miss_gbps: inv(a.miss_gbps, b.miss_gbps),
                }),
                (_, b) => b,
            },
            slot_fill: match (one.slot_fill, far.slot_fill) {
                (Some(a), Some(b)) => Some(SlotFill {
                    slot_kib: b.slot_kib,
                    gbps: inv(a.gbps, b.gbps),
                }),
                (_, b) => b,
            },
            core_wait_us: mix(one.core_wait_us, far.core_wait_us).max(0.0),
            device_reductions: far.device_reductions,
        }
    }

    /// The profile as the file holds it (TOML), with a comment line first.
    pub fn to_toml(&self, comment: &str) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        let mut out = String::new();
        for line in comment.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&body);
        out
    }

    /// Checks that every figure can be priced with.
    fn check(&self) -> Result<(), String> {
        let base = TierCosts::default();
        self.tiers.apply(base).check()?;
        if let Some(s) = &self.shared_core {
            if !(s.ranks_per_core.is_finite() && s.ranks_per_core > 1.0) {
                return Err(format!(
                    "shared_core.ranks_per_core is {}; expected a number above 1",
                    s.ranks_per_core
                ));
            }
            s.tiers
                .apply(base)
                .check()
                .map_err(|e| format!("shared_core.{e}"))?;
        }
        Ok(())
    }
}

/// Parses a cost profile (TOML, or JSON when it starts with `{`); errors name `file` and the
/// line.
pub fn parse_profile(text: &str, file: &str) -> Result<CostProfile, TopoError> {
    let p: CostProfile = crate::fabric::parse_toml_or_json(text, file)?;
    p.check().map_err(|m| TopoError::at(file, 0, m))?;
    Ok(p)
}

/// Reads and checks the cost profile at `path`.
pub fn load_profile(path: &std::path::Path) -> Result<CostProfile, TopoError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| TopoError::at(&file, 0, e.to_string()))?;
    parse_profile(&text, &file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bandwidth_gbps: f64, latency_us: f64) -> TierLink {
        TierLink {
            bandwidth_gbps,
            latency_us,
            oversubscription: 1.0,
            shared_efficiency: 1.0,
            cpu_us: 0.0,
        }
    }

    fn profile() -> CostProfile {
        CostProfile {
            tiers: TierPatch {
                host: Some(link(8.0, 0.25)),
                reduce_gbps: Some(4.0),
                call_us: Some(0.5),
                schedule_us: Some(0.25),
                copy_gbps: Some(10.0),
                memory: Some(MemoryTier {
                    cache_mib: 16.0,
                    miss_gbps: 8.0,
                }),
                slot_fill: Some(SlotFill {
                    slot_kib: 8.0,
                    gbps: 16.0,
                }),
                ..TierPatch::default()
            },
            measured: Some(Measured {
                ranks: 2,
                hosts: 1,
                cores: 2,
                points: 100,
                within_25_percent: 0.9,
                median_error: 0.08,
            }),
            shared_core: Some(SharedCore {
                ranks_per_core: 2.0,
                tiers: TierPatch {
                    host: Some(TierLink {
                        cpu_us: 1.0,
                        ..link(2.0, 4.25)
                    }),
                    reduce_gbps: Some(1.0),
                    call_us: Some(2.5),
                    schedule_us: Some(0.75),
                    copy_gbps: Some(2.5),
                    memory: Some(MemoryTier {
                        cache_mib: 8.0,
                        miss_gbps: 2.0,
                    }),
                    core_wait_us: Some(0.6),
                    ..TierPatch::default()
                },
                measured: Measured::default(),
            }),
        }
    }

    #[test]
    fn patches_what_it_measured_and_keeps_the_rest() {
        let base = TierCosts::default();
        let c = profile().apply(base, 1.0);
        assert_eq!(c.host, link(8.0, 0.25));
        assert_eq!(c.reduce_gbps, 4.0);
        assert_eq!(c.call_us, 0.5);
        assert_eq!(c.schedule_us, 0.25);
        assert_eq!(c.leaf, base.leaf, "an unmeasured tier keeps its figures");
        assert_eq!(profile().apply(c, 1.0), c, "idempotent");
    }

    #[test]
    fn shared_cores_interpolate_in_seconds() {
        let base = TierCosts::default();
        let p = profile();
        let full = p.apply(base, 2.0).host;
        assert_eq!(
            (full.bandwidth_gbps, full.latency_us, full.cpu_us),
            (2.0, 4.25, 1.0)
        );
        let half = p.apply(base, 1.5);
        // Halfway in seconds per byte: (1/8 + 1/2) / 2 ns per byte.
        assert!((1.0 / half.host.bandwidth_gbps - 0.3125).abs() < 1e-12);
        assert!((half.host.latency_us - 2.25).abs() < 1e-12);
        // A message's CPU time too: none measured with a core per rank, 1 µs at two a core.
        assert!((half.host.cpu_us - 0.5).abs() < 1e-12);
        assert!((half.call_us - 1.5).abs() < 1e-12);
        assert!((half.schedule_us - 0.5).abs() < 1e-12);
        // No rank waits for a core's turn at one rank per core.
        assert_eq!(p.apply(base, 1.0).core_wait_us, 0.0);
        assert!((half.core_wait_us - 0.3).abs() < 1e-12);
        assert!((1.0 / half.reduce_gbps - 0.625).abs() < 1e-12);
        assert!((1.0 / half.copy_gbps.unwrap() - 0.25).abs() < 1e-12);
        let m = half.memory.unwrap();
        assert!((m.cache_mib - 12.0).abs() < 1e-12 && (1.0 / m.miss_gbps - 0.3125).abs() < 1e-12);
        // Extrapolated, the cache never shrinks below the smaller of the two measured.
        assert_eq!(p.apply(base, 100.0).memory.unwrap().cache_mib, 8.0);
        // Past the measured point it extrapolates, up to four times as far.
        let far = p.apply(base, 100.0);
        assert!((far.host.latency_us - (0.25 + 4.0 * 4.0)).abs() < 1e-9);
        assert_eq!(p.apply(p.apply(base, 1.5), 1.5), p.apply(base, 1.5));
    }

    #[test]
    fn round_trips_through_toml_and_json() {
        let p = profile();
        let text = p.to_toml("written by a test\nsecond line");
        assert!(text.starts_with("# written by a test\n# second line\n"));
        assert_eq!(parse_profile(&text, "p.toml").unwrap(), p);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(parse_profile(&json, "p.json").unwrap(), p);
        assert_eq!(
            parse_profile("", "empty").unwrap(),
            CostProfile::default(),
            "an empty profile changes nothing"
        );
    }

    #[test]
    fn bad_profiles_name_file_line_and_figure() {
        let err = |text: &str| parse_profile(text, "p").unwrap_err().to_string();
        let e = err("[tiers.host]\nbandwidth_gbps = 0.0\nlatency_us = 1.0\n");
        assert!(e.contains("p") && e.contains("tiers.host"), "{e}");
        let e = err("[tiers]\nrduce_gbps = 3.0\n");
        assert!(e.starts_with("p:2:") && e.contains("rduce_gbps"), "{e}");
        let e = err("[shared_core]\nranks_per_core = 1.0\n");
        assert!(e.contains("ranks_per_core"), "{e}");
        let e = err("[tiers.leaf]\nbandwidth_gbps = 1.0\nlatency_us = 1.0\ncpu_us = -2.0\n");
        assert!(e.contains("tiers.leaf") && e.contains("cpu_us"), "{e}");
        let e = err("[tiers]\ncall_us = -1.0\n");
        assert!(e.contains("call_us"), "{e}");
        let e = err("[tiers]\nschedule_us = -0.5\n");
        assert!(e.contains("schedule_us"), "{e}");
        let e =
            err("[shared_core]\nranks_per_core = 2.0\n[shared_core.tiers]\ncore_wait_us = -1.0\n");
        assert!(e.contains("shared_core.tiers.core_wait_us"), "{e}");
        let e = err("[tiers.memory]\ncache_mib = 0.0\nmiss_gbps = 5.0\n");
        assert!(e.contains("tiers.memory") && e.contains("cache_mib"), "{e}");
        let e = err("[tiers.slot_fill]\nslot_kib = 8.0\ngbps = -1.0\n");
        assert!(e.contains("tiers.slot_fill"), "{e}");
    }

    #[test]
    fn covers_what_was_measured() {
        let p = profile();
        assert!(p.covers(1.0) && p.covers(3.0));
        let one = CostProfile {
            shared_core: None,
            ..profile()
        };
        assert!(one.covers(0.5) && !one.covers(2.0));
    }
}
