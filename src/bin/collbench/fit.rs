//! Fitting the cost model's figures to measured times, for `collbench calibrate`.
//!
//! The unknowns are α, β and a message's CPU time of every tier the job spans, γ, local
//! copies, the cost of a call and of walking a schedule step by step, of a message's first
//! shared-memory slot, and of a byte beyond the host's caches. A price is homogeneous of
//! degree one in them and piecewise linear (a maximum over paths of sums of α, bytes·β and
//! bytes·γ), so near any figures it is the linear form its partial derivatives give. Each
//! Gauss-Newton step takes those derivatives by finite differences through the real pricing,
//! solves the least squares of the relative errors (predicted / measured - 1) for the figures
//! with every figure kept positive, and keeps the step only where the real error falls
//! (halving it otherwise). Where the caches end is not such a figure: it is searched. A
//! message's CPU time is fitted last, from several starts ([`fit_cpu`]).

use strata::Collective;
use strata::algorithms::Algorithm;
use strata::algorithms::tuner::Tuner;
use strata::topology::{MemoryTier, SlotFill, Tier, TierCosts, TierLink};

/// One figure the fit chooses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Figure {
    /// Seconds per message of a tier.
    Alpha(Tier),
    /// Seconds per byte of a tier.
    Beta(Tier),
    /// CPU seconds each end of a message over a tier spends on it ([`TierLink::cpu_us`]).
    Cpu(Tier),
    /// Seconds per reduced byte.
    Gamma,
    /// Seconds per byte copied locally.
    Copy,
    /// Seconds per call.
    Call,
    /// Seconds more per call walked step by step, not on the small all-reduce path
    /// ([`TierCosts::schedule_us`]).
    Schedule,
    /// Seconds more per byte beyond the host's caches ([`TierCosts::memory`]).
    Miss,
    /// Seconds more per byte of a message's first slot inside a host
    /// ([`TierCosts::slot_fill`]).
    Fill,
    /// Seconds a message waits for a turn on a shared core ([`TierCosts::core_wait_us`]).
    CoreWait,
}

/// A timed point: what ran and its median time.
#[derive(Clone, Debug)]
pub(super) struct Point {
    pub(super) collective: Collective,
    pub(super) algorithm: Algorithm,
    /// Bytes per rank, as the tuner prices.
    pub(super) bytes: usize,
    /// Measured seconds.
    pub(super) seconds: f64,
}

/// Where the fit assumes a host's caches end before it has looked, MiB.
const DEFAULT_CACHE_MIB: f64 = 32.0;

/// The shared-memory slot the fit assumes when not told, KiB (`STRATA_SHM_SLOT_SIZE`'s
/// default).
const DEFAULT_SLOT_KIB: f64 = 8.0;

/// The cache sizes [`fit`] tries, MiB: every half power of two from 1/2 MiB to 1 GiB (a
/// price is not linear in where the caches end, so that figure is searched, not solved).
fn cache_candidates() -> impl Iterator<Item = f64> {
    (-2..=20).map(|k| 2f64.powf(f64::from(k) / 2.0))
}

/// Fewest rounds of Gauss-Newton steps.
const STEPS: usize = 8;
/// Each figure stays at least this fraction of where the fit started.
const FLOOR: f64 = 1e-3;

/// The tier whose link `tier` prices with.
fn link_mut(c: &mut TierCosts, tier: Tier) -> &mut TierLink {
    match tier {
        Tier::SameDevice | Tier::Host => &mut c.host,
        Tier::NvLink => {
            let host = c.host;
            c.nvlink.get_or_insert(host)
        }
        Tier::Leaf => &mut c.leaf,
        Tier::Pod => &mut c.pod,
        Tier::Aggregation => &mut c.aggregation,
    }
}

/// The figures `figures` of `costs`, in seconds.
pub(super) fn read(costs: &TierCosts, figures: &[Figure]) -> Vec<f64> {
    figures
        .iter()
        .map(|f| match *f {
            Figure::Alpha(t) => costs.link(t).latency_us * 1e-6,
            Figure::Beta(t) => 1.0 / (costs.link(t).bandwidth_gbps * 1e9),
            Figure::Cpu(t) => costs.link(t).cpu_us * 1e-6,
            Figure::Gamma => 1.0 / (costs.reduce_gbps * 1e9),
            Figure::Copy => costs.copy_gbps.map_or(0.0, |g| 1.0 / (g * 1e9)),
            Figure::Call => costs.call_us * 1e-6,
            Figure::Schedule => costs.schedule_us * 1e-6,
            Figure::Miss => costs.memory.map_or(0.0, |m| 1.0 / (m.miss_gbps * 1e9)),
            Figure::Fill => costs.slot_fill.map_or(0.0, |f| 1.0 / (f.gbps * 1e9)),
            Figure::CoreWait => costs.core_wait_us * 1e-6,
        })
        .collect()
}

/// `base` with `figures` set to `values` (seconds).
pub(super) fn write(base: TierCosts, figures: &[Figure], values: &[f64]) -> TierCosts {
    let mut c = base;
    for (f, &v) in figures.iter().zip(values) {
        match *f {
            Figure::Alpha(t) => link_mut(&mut c, t).latency_us = v * 1e6,
            Figure::Beta(t) => link_mut(&mut c, t).bandwidth_gbps = 1.0 / (v * 1e9),
            Figure::Cpu(t) => link_mut(&mut c, t).cpu_us = v * 1e6,
            Figure::Gamma => c.reduce_gbps = 1.0 / (v * 1e9),
            Figure::Copy => c.copy_gbps = Some(1.0 / (v * 1e9)),
            Figure::Call => c.call_us = v * 1e6,
            Figure::Schedule => c.schedule_us = v * 1e6,
            Figure::CoreWait => c.core_wait_us = v * 1e6,
            Figure::Miss => {
                let cache_mib = c.memory.map_or(DEFAULT_CACHE_MIB, |m| m.cache_mib);
                c.memory = Some(MemoryTier {
                    cache_mib,
                    miss_gbps: 1.0 / (v * 1e9),
                });
            }
            Figure::Fill => {
                let slot_kib = c.slot_fill.map_or(DEFAULT_SLOT_KIB, |f| f.slot_kib);
                c.slot_fill = Some(SlotFill {
                    slot_kib,
                    gbps: 1.0 / (v * 1e9),
                });
            }
        }
    }
    c
}

/// The figures of a job over `tiers`: α, β and a message's CPU time of each, γ, local copies,
/// the call, the cost of a message's first slot inside a host (where the job has one) and of
/// a byte beyond the host's caches.
pub(super) fn figures_for(tiers: &[Tier]) -> Vec<Figure> {
    let mut out = Vec::new();
    for &t in tiers {
        out.push(Figure::Alpha(t));
        out.push(Figure::Beta(t));
        out.push(Figure::Cpu(t));
    }
    out.push(Figure::Gamma);
    out.push(Figure::Copy);
    out.push(Figure::Call);
    out.push(Figure::Schedule);
    if tiers.iter().any(|&t| t <= Tier::Host) {
        out.push(Figure::Fill);
    }
    out.push(Figure::Miss);
    out
}

/// Every point's predicted seconds with `costs` (`None` where the model cannot price it).
pub(super) fn predict(model: &Tuner, costs: TierCosts, points: &[Point]) -> Vec<Option<f64>> {
    let m = model.with_costs(costs);
    points
        .iter()
        .map(|p| m.price(p.collective, p.algorithm, p.bytes).seconds.ok())
        .collect()
}

/// The sum of squared relative errors of `predicted` against the points.
fn error(points: &[Point], predicted: &[Option<f64>]) -> f64 {
    points
        .iter()
        .zip(predicted)
        .filter_map(|(p, t)| Some((t.as_ref()? / p.seconds - 1.0).powi(2)))
        .sum()
}

/// Solves `a x = b` (n × n, row-major) by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<f64>, mut b: Vec<f64>, n: usize) -> Option<Vec<f64>> {
    for col in 0..n {
        let pivot =
            (col..n).max_by(|&i, &j| a[i * n + col].abs().total_cmp(&a[j * n + col].abs()))?;
        if a[pivot * n + col].abs() < 1e-300 {
            return None;
        }
        for k in 0..n {
            a.swap(col * n + k, pivot * n + k);
        }
        b.swap(col, pivot);
        for row in col + 1..n {
            let f = a[row * n + col] / a[col * n + col];
            for k in col..n {
                a[row * n + k] -= f * a[col * n + k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row * n + k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row * n + row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Least squares of `rows · u ≈ 1` for multipliers `u ≥ floor`, by fixing at the floor what
/// falls below it and solving again for the rest.
fn multipliers(rows: &[Vec<f64>], n: usize, floor: f64) -> Option<Vec<f64>> {
    let mut fixed = vec![false; n];
    loop {
        let free: Vec<usize> = (0..n).filter(|&k| !fixed[k]).collect();
        let m = free.len();
        let mut a = vec![0.0; m * m];
        let mut b = vec![0.0; m];
        for r in rows {
            let rest: f64 = (0..n).filter(|&k| fixed[k]).map(|k| r[k] * floor).sum();
            for (i, &ki) in free.iter().enumerate() {
                b[i] += r[ki] * (1.0 - rest);
                for (j, &kj) in free.iter().enumerate() {
                    a[i * m + j] += r[ki] * r[kj];
                }
            }
        }
        // A little ridge toward where it started, for figures the points hardly see.
        let trace: f64 = (0..m).map(|i| a[i * m + i]).sum::<f64>().max(1e-300);
        for i in 0..m {
            a[i * m + i] += 1e-9 * trace;
            b[i] += 1e-9 * trace;
        }
        let x = solve(a, b, m)?;
        let mut u = vec![floor; n];
        let mut clamped = false;
        for (i, &k) in free.iter().enumerate() {
            if x[i] < floor {
                fixed[k] = true;
                clamped = true;
            } else {
                u[k] = x[i];
            }
        }
        if !clamped || free.is_empty() {
            return Some(u);
        }
    }
}

/// The fitted costs: `base` with `figures` chosen to minimise the relative errors of the
/// predictions at `points`. With [`Figure::Miss`] among them, every cache size of
/// [`cache_candidates`] is fitted in turn, and so is a model without one (every byte at the
/// same rates); the one whose predictions err least is kept.
pub(super) fn fit(
    model: &Tuner,
    base: TierCosts,
    figures: &[Figure],
    points: &[Point],
) -> TierCosts {
    if !figures.contains(&Figure::Miss) {
        return fit_cpu(model, base, figures, points);
    }
    let without: Vec<Figure> = figures
        .iter()
        .copied()
        .filter(|f| *f != Figure::Miss)
        .collect();
    let flat = TierCosts {
        memory: None,
        ..base
    };
    let mut best = fit_cpu(model, flat, &without, points);
    let mut best_err = error(points, &predict(model, best, points));
    for cache_mib in cache_candidates() {
        let start = TierCosts {
            memory: Some(MemoryTier {
                cache_mib,
                miss_gbps: base.memory.map_or(START_MISS_GBPS, |m| m.miss_gbps),
            }),
            ..base
        };
        let fitted = fit_cpu(model, start, figures, points);
        let err = error(points, &predict(model, fitted, points));
        if err < best_err {
            (best, best_err) = (fitted, err);
        }
    }
    best
}

/// Where the cost of a byte beyond the caches starts, as a rate (GB/s).
const START_MISS_GBPS: f64 = 20.0;

/// [`fit_linear`], with a message's CPU time ([`Figure::Cpu`]) fitted last. It prices much
/// as α does wherever a rank has one message at a time, so fitted from the start beside it
/// the steps can settle far from the truth: it is fitted from the figures fitted without it,
/// starting from several shares of each tier's α moved to it, and kept only where it lowers
/// the error.
fn fit_cpu(model: &Tuner, base: TierCosts, figures: &[Figure], points: &[Point]) -> TierCosts {
    let first: Vec<Figure> = figures
        .iter()
        .copied()
        .filter(|f| !matches!(f, Figure::Cpu(_)))
        .collect();
    let without = fit_linear(model, base, &first, points);
    if first.len() == figures.len() {
        return without;
    }
    let err = |c| error(points, &predict(model, c, points));
    let mut best = (err(without), without);
    for share in CPU_SHARES {
        let mut start = without;
        for f in figures {
            if let Figure::Cpu(t) = *f {
                let l = link_mut(&mut start, t);
                l.cpu_us = l.latency_us * share;
                l.latency_us *= 1.0 - share;
            }
        }
        let fitted = fit_linear(model, start, figures, points);
        let e = err(fitted);
        if e < best.0 {
            best = (e, fitted);
        }
    }
    best.1
}

/// The shares of each tier's α a fit of [`Figure::Cpu`] starts from.
const CPU_SHARES: [f64; 4] = [0.1, 0.3, 0.5, 0.7];

/// Gauss-Newton steps over `figures` (every one a price is homogeneous of degree one in), from
/// where `base` has them; where the caches end stays as `base` has it.
fn fit_linear(model: &Tuner, base: TierCosts, figures: &[Figure], points: &[Point]) -> TierCosts {
    // A figure at zero (a call cost never measured, copies never priced) starts from a
    // small value.
    let start: Vec<f64> = read(&base, figures)
        .into_iter()
        .zip(figures)
        .map(|(v, f)| match f {
            Figure::Alpha(_)
            | Figure::Cpu(_)
            | Figure::Call
            | Figure::Schedule
            | Figure::CoreWait => v.max(1e-7),
            Figure::Copy | Figure::Fill => v.max(1e-11),
            _ => v,
        })
        .collect();
    let floors: Vec<f64> = start.iter().map(|v| v * FLOOR).collect();
    let mut theta = start;
    let mut now = predict(model, write(base, figures, &theta), points);
    let mut err = error(points, &now);
    for _ in 0..STEPS {
        // Each point's derivative in each figure, scaled by the figure and the measured time.
        let mut rows: Vec<Vec<f64>> = points.iter().map(|_| vec![0.0; figures.len()]).collect();
        for k in 0..figures.len() {
            let mut nudged = theta.clone();
            nudged[k] *= 1.01;
            let moved = predict(model, write(base, figures, &nudged), points);
            for (i, p) in points.iter().enumerate() {
                if let (Some(a), Some(b)) = (now[i], moved[i]) {
                    rows[i][k] = (b - a) / (0.01 * theta[k]) * theta[k] / p.seconds;
                }
            }
        }
        rows.retain(|r| r.iter().any(|v| *v != 0.0));
        let floor_u = floors
            .iter()
            .zip(&theta)
            .map(|(f, t)| f / t)
            .fold(0.0, f64::max);
        let Some(u) = multipliers(&rows, figures.len(), floor_u) else {
            break;
        };
        // Keep the step where the real error falls; halve it (geometrically) otherwise.
        let mut improved = false;
        for half in 0..4 {
            let e = 0.5f64.powi(half);
            let cand: Vec<f64> = theta
                .iter()
                .zip(&u)
                .zip(&floors)
                .map(|((t, m), f)| (t * m.powf(e)).max(*f))
                .collect();
            let pred = predict(model, write(base, figures, &cand), points);
            let ce = error(points, &pred);
            if ce < err {
                theta = cand;
                now = pred;
                err = ce;
                improved = true;
                break;
            }
        }
        if !improved {
            break;
        }
    }
    write(base, figures, &theta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata::algorithms::Hierarchy;
    use strata::algorithms::algorithms_for;

    /// `p` ranks on one host.
    fn model(p: usize) -> Tuner {
        let host = strata::topology::HostIdentity::detect();
        let ranks: Vec<_> = (0..p).map(|_| (host.clone(), Default::default())).collect();
        let tiers = strata::topology::TierMatrix::new(&ranks, TierCosts::default());
        Tuner::new(Hierarchy::from_tiers(&tiers), TierCosts::default(), true)
    }

    /// The largest |predicted / measured - 1| over `pts` with `costs`.
    fn worst_error(model: &Tuner, costs: TierCosts, pts: &[Point]) -> f64 {
        pts.iter()
            .zip(predict(model, costs, pts))
            .map(|(p, t)| (t.unwrap() / p.seconds - 1.0).abs())
            .fold(0.0, f64::max)
    }

    fn points(model: &Tuner, truth: TierCosts) -> Vec<Point> {
        points_at(model, truth, &[8usize, 512, 32 << 10, 2 << 20])
    }

    fn points_at(model: &Tuner, truth: TierCosts, sizes: &[usize]) -> Vec<Point> {
        let m = model.with_costs(truth);
        let mut out = Vec::new();
        for c in [Collective::AllReduce, Collective::AllGather] {
            for &a in algorithms_for(c) {
                for &bytes in sizes {
                    if let Ok(s) = m.price(c, a, bytes).seconds {
                        out.push(Point {
                            collective: c,
                            algorithm: a,
                            bytes,
                            seconds: s,
                        });
                    }
                }
            }
        }
        out
    }

    /// Times priced with known figures are fitted back to those figures, from defaults
    /// several times off.
    #[test]
    fn recovers_the_figures_that_made_the_times() {
        let m = model(4);
        let mut truth = TierCosts::default();
        truth.host.latency_us = 2.5;
        truth.host.bandwidth_gbps = 3.0;
        truth.reduce_gbps = 1.5;
        truth.call_us = 0.8;
        truth.schedule_us = 0.4;
        truth.copy_gbps = Some(2.0);
        let pts = points(&m, truth);
        let figures = figures_for(&[Tier::Host]);
        let fitted = fit(&m, TierCosts::default(), &figures, &pts);
        let worst = worst_error(&m, fitted, &pts);
        assert!(worst < 0.02, "worst relative error {worst}: {fitted:?}");
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
        assert!(close(fitted.host.latency_us, 2.5), "{fitted:?}");
        assert!(close(fitted.host.bandwidth_gbps, 3.0), "{fitted:?}");
        assert!(close(fitted.reduce_gbps, 1.5), "{fitted:?}");
        // Told apart by the small all-reduces (rd and one-shot up to 4 KiB), which skip it.
        assert!(close(fitted.call_us, 0.8), "{fitted:?}");
        assert!(close(fitted.schedule_us, 0.4), "{fitted:?}");
        let before = worst_error(&m, TierCosts::default(), &pts);
        assert!(
            before > 0.5,
            "the defaults were off to start with: {before}"
        );
    }

    /// At 3 ranks with ranks 0 and 2 on one core, times priced with a turn on that core
    /// are fitted back to it and to α: rings (every rank busy in every step) and rd (its fold
    /// and unfold hand over between 0 and 2) tell the two apart.
    #[test]
    fn recovers_a_turn_on_a_shared_core() {
        let m = model(3).with_shared_cores(vec![Some(0), None, Some(0)]);
        assert!(m.shares_cores() && !model(3).shares_cores());
        let mut truth = TierCosts::default();
        truth.host.latency_us = 0.7;
        truth.host.bandwidth_gbps = 5.0;
        truth.call_us = 1.5;
        truth.core_wait_us = 0.6;
        let pts = points_at(&m, truth, &[8, 512, 4096]);
        let mut figures = figures_for(&[Tier::Host]);
        figures.push(Figure::CoreWait);
        let fitted = fit(&m, TierCosts::default(), &figures, &pts);
        let worst = worst_error(&m, fitted, &pts);
        assert!(worst < 0.02, "worst relative error {worst}: {fitted:?}");
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
        assert!(close(fitted.core_wait_us, 0.6), "{fitted:?}");
        assert!(close(fitted.host.latency_us, 0.7), "{fitted:?}");
        // Without the figure, no α and call fit both kinds of schedule.
        let without = fit(&m, TierCosts::default(), &figures_for(&[Tier::Host]), &pts);
        assert!(worst_error(&m, without, &pts) > 0.1, "{without:?}");
    }

    /// Times priced with a CPU cost per message are fitted back to it: one-shot sends to
    /// every peer at once, rings one message at a time, so α and the CPU time come apart.
    #[test]
    fn recovers_a_messages_cpu_time() {
        let m = model(4);
        let mut truth = TierCosts::default();
        truth.host.latency_us = 1.2;
        truth.host.cpu_us = 0.8;
        truth.host.bandwidth_gbps = 4.0;
        truth.call_us = 0.5;
        let pts = points(&m, truth);
        let figures = figures_for(&[Tier::Host]);
        let fitted = fit(&m, TierCosts::default(), &figures, &pts);
        let worst = worst_error(&m, fitted, &pts);
        assert!(worst < 0.02, "worst relative error {worst}: {fitted:?}");
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.1;
        assert!(close(fitted.host.cpu_us, 0.8), "{fitted:?}");
        assert!(close(fitted.host.latency_us, 1.2), "{fitted:?}");
        let no_cpu: Vec<Figure> = figures
            .iter()
            .copied()
            .filter(|f| !matches!(f, Figure::Cpu(_)))
            .collect();
        let without = fit(&m, TierCosts::default(), &no_cpu, &pts);
        assert!(worst_error(&m, without, &pts) > 0.1, "{without:?}");
    }

    /// Times made with a cache edge (8 MiB of buffers, then 4 GB/s more per byte) are
    /// fitted back to that edge and rate; a flat model could not fit them.
    #[test]
    fn finds_where_the_caches_end() {
        let m = model(4);
        let mut truth = TierCosts::default();
        truth.host.bandwidth_gbps = 10.0;
        truth.reduce_gbps = 5.0;
        truth.call_us = 0.3;
        truth.copy_gbps = Some(20.0);
        truth.memory = Some(MemoryTier {
            cache_mib: 8.0,
            miss_gbps: 4.0,
        });
        let pts = points_at(&m, truth, &[64, 32 << 10, 256 << 10, 2 << 20, 16 << 20]);
        let fitted = fit(&m, TierCosts::default(), &figures_for(&[Tier::Host]), &pts);
        let worst = |c: TierCosts| worst_error(&m, c, &pts);
        assert!(worst(fitted) < 0.03, "{}: {fitted:?}", worst(fitted));
        let mem = fitted.memory.expect("a cache edge");
        assert_eq!(mem.cache_mib, 8.0, "{fitted:?}");
        assert!((mem.miss_gbps / 4.0 - 1.0).abs() < 0.1, "{fitted:?}");
        let flat = fit_linear(
            &m,
            TierCosts::default(),
            &figures_for(&[Tier::Host])[..5],
            &pts,
        );
        assert!(
            worst(flat) > 0.25,
            "a flat model fits as well: {}",
            worst(flat)
        );
    }

    /// Times made with a slot fill (a message's first 8 KiB at 10 GB/s more) are fitted back
    /// to that rate; without the figure, no α and β fit small and large messages at once.
    #[test]
    fn finds_what_a_messages_first_slot_costs() {
        let m = model(2);
        let mut truth = TierCosts::default();
        truth.host.bandwidth_gbps = 20.0;
        truth.reduce_gbps = 10.0;
        truth.copy_gbps = Some(20.0);
        truth.slot_fill = Some(SlotFill {
            slot_kib: 8.0,
            gbps: 10.0,
        });
        let pts = points_at(&m, truth, &[64, 4 << 10, 32 << 10, 256 << 10, 2 << 20]);
        let start = TierCosts {
            slot_fill: Some(SlotFill {
                slot_kib: 8.0,
                gbps: 100.0,
            }),
            ..TierCosts::default()
        };
        let figures = figures_for(&[Tier::Host]);
        let worst = |c: TierCosts| worst_error(&m, c, &pts);
        let fitted = fit(&m, start, &figures, &pts);
        assert!(worst(fitted) < 0.03, "{}: {fitted:?}", worst(fitted));
        let f = fitted.slot_fill.unwrap();
        assert!((f.gbps / 10.0 - 1.0).abs() < 0.1, "{fitted:?}");
        let without: Vec<Figure> = figures
            .iter()
            .copied()
            .filter(|f| *f != Figure::Fill)
            .collect();
        let plain = TierCosts {
            slot_fill: None,
            ..TierCosts::default()
        };
        let flat = fit(&m, plain, &without, &pts);
        assert!(worst(flat) > 0.15, "α and β alone fit: {}", worst(flat));
    }

    #[test]
    fn figures_read_and_write_in_seconds() {
        let figures = figures_for(&[Tier::Host, Tier::Leaf]);
        let c = write(
            TierCosts::default(),
            &figures,
            &[
                1e-6, 1e-9, 2e-7, 5e-6, 1e-10, 3e-6, 2e-10, 4e-10, 3e-7, 7e-7, 5e-11, 1e-10,
            ],
        );
        assert!((c.host.cpu_us - 0.2).abs() < 1e-9 && (c.leaf.cpu_us - 3.0).abs() < 1e-9);
        assert!((c.copy_gbps.unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(c.host.latency_us, 1.0);
        assert!((c.host.bandwidth_gbps - 1.0).abs() < 1e-9);
        assert!((c.leaf.bandwidth_gbps - 10.0).abs() < 1e-9);
        assert!((c.reduce_gbps - 5.0).abs() < 1e-9);
        assert!((c.call_us - 0.3).abs() < 1e-9);
        assert!((c.schedule_us - 0.7).abs() < 1e-9);
        let m = c.memory.unwrap();
        assert!((m.miss_gbps - 10.0).abs() < 1e-9 && m.cache_mib == DEFAULT_CACHE_MIB);
        let f = c.slot_fill.unwrap();
        assert!((f.gbps - 20.0).abs() < 1e-9 && f.slot_kib == DEFAULT_SLOT_KIB);
        assert!(!figures_for(&[Tier::Leaf]).contains(&Figure::Fill));
        let waits = write(c, &[Figure::CoreWait], &[6e-7]);
        assert!((waits.core_wait_us - 0.6).abs() < 1e-12);
        assert_eq!(read(&waits, &[Figure::CoreWait]), vec![6e-7]);
        let back = read(&c, &figures);
        assert!((back[4] - 1e-10).abs() < 1e-22 && (back[5] - 3e-6).abs() < 1e-18);
    }

    #[test]
    fn least_squares_keep_every_multiplier_above_the_floor() {
        // u0 alone explains the rows; u1 would go negative without the floor.
        let rows = vec![vec![1.0, -0.5], vec![2.0, 0.0], vec![0.5, 0.1]];
        let u = multipliers(&rows, 2, 0.01).unwrap();
        assert!(u[1] >= 0.01 && u[0] > 0.0, "{u:?}");
    }
}
