//! What init measures of its host, and the tier costs every rank prices with.
//!
//! Each rank counts its host's online cores and, unless a cost profile prices this
//! communicator, times a memcpy and an f32 sum of [`PROBE_BYTES`] (about a millisecond in
//! all). It publishes the figures at rendezvous, so every rank sees every rank's and derives
//! the same costs: the medians over the ranks become the local copy rate, half of it the host
//! tier's bandwidth (a message through shared memory is copied twice) and the reduction rate
//! (where the topology file left them at their defaults), and the fullest host's
//! ranks per core choose between a profile's one-per-core and shared-core figures.

use std::time::Instant;

use strata_topology::{CostProfile, TierCosts};

use crate::dtype::{DataType, ReduceOp};
use crate::wire::{HostProbe, PeerInfo};

/// Bytes copied and summed by the timing probe.
pub(crate) const PROBE_BYTES: usize = 1 << 20;

/// Timed repetitions of each; the fastest counts.
const REPEATS: usize = 3;

/// Cores online on this host, 0 when unknown.
pub(crate) fn cores_online() -> u32 {
    // SAFETY: sysconf reads a system constant and has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).unwrap_or(0)
}

/// This host's cores and, when `time_rates`, its memcpy and f32 sum rates.
pub(crate) fn measure(time_rates: bool) -> HostProbe {
    let mut probe = HostProbe {
        cores: cores_online(),
        bound_cpu: bound_cpu().map_or(0, |c| c + 1),
        ..HostProbe::default()
    };
    if !time_rates {
        return probe;
    }
    let src = vec![1u8; PROBE_BYTES];
    let mut dst = vec![0u8; PROBE_BYTES];
    // The first copy touches every page; the timed ones run warm.
    dst.copy_from_slice(&src);
    let best = |f: &mut dyn FnMut()| {
        (0..REPEATS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let copy = best(&mut || {
        dst.copy_from_slice(std::hint::black_box(&src));
    });
    let sum = crate::reduce::combine_of(ReduceOp::Sum);
    let reduce = best(&mut || {
        crate::reduce::reduce_in_place(
            DataType::Float32,
            sum,
            &mut dst,
            std::hint::black_box(&src),
        );
    });
    let mbps = |s: f64| {
        if s > 0.0 && s.is_finite() {
            (PROBE_BYTES as f64 / s / 1e6).min(f64::from(u32::MAX)) as u32
        } else {
            0
        }
    };
    probe.copy_mbps = mbps(copy);
    probe.reduce_mbps = mbps(reduce);
    probe
}

/// The CPU this thread is bound to, when its affinity is exactly one CPU (a launcher's
/// binding, inherited by every thread the process starts).
pub(crate) fn bound_cpu() -> Option<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the call.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    // SAFETY: CPU_ISSET only reads the set, for indices below its size.
    let mut cpus =
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &allowed) });
    match (cpus.next(), cpus.next()) {
        (Some(c), None) => u32::try_from(c).ok(),
        _ => None,
    }
}

/// Whether rank `me` shares its core with another rank of its host (`peers` of the same
/// kernel, `me` among them), when every one of them is bound to one CPU; `None` when any
/// is free to move, since then only the host's count of ranks and cores tells.
pub(crate) fn shares_core(local: &[&HostProbe], me: &HostProbe) -> Option<bool> {
    if me.bound_cpu == 0 || local.iter().any(|p| p.bound_cpu == 0) {
        return None;
    }
    Some(local.iter().filter(|p| p.bound_cpu == me.bound_cpu).count() > 1)
}

/// Per rank, the core it shares with other ranks of its kernel, where every rank there is
/// bound to one CPU and another is bound to its own (ids numbered from 0 across the job); all
/// `None` where no rank is known to share, which leaves the tuner's model as it was.
pub(crate) fn shared_cores(peers: &[PeerInfo]) -> Vec<Option<u32>> {
    use std::collections::HashMap;
    // Ranks per (kernel, CPU), and whether each kernel has every rank bound.
    let mut on_cpu: HashMap<(&str, u32), usize> = HashMap::new();
    let mut all_bound: HashMap<&str, bool> = HashMap::new();
    for p in peers {
        let kernel = p.host.boot_id.as_str();
        if kernel.is_empty() {
            continue;
        }
        *all_bound.entry(kernel).or_insert(true) &= p.probe.bound_cpu > 0;
        *on_cpu.entry((kernel, p.probe.bound_cpu)).or_insert(0) += 1;
    }
    let mut ids: HashMap<(&str, u32), u32> = HashMap::new();
    let cores: Vec<Option<u32>> = peers
        .iter()
        .map(|p| {
            let key = (p.host.boot_id.as_str(), p.probe.bound_cpu);
            let shared = !key.0.is_empty()
                && all_bound.get(key.0) == Some(&true)
                && on_cpu.get(&key).is_some_and(|&n| n > 1);
            shared.then(|| {
                let next = ids.len() as u32;
                *ids.entry(key).or_insert(next)
            })
        })
        .collect();
    if cores.iter().all(Option::is_none) {
        Vec::new()
    } else {
        cores
    }
}

/// The most ranks per core of any host (ranks grouped by kernel, as shared memory groups
/// them), 0 when no rank knows its cores.
pub(crate) fn ranks_per_core(peers: &[PeerInfo]) -> f64 {
    let mut hosts: Vec<(&str, u32, usize)> = Vec::new();
    for p in peers {
        let id = p.host.boot_id.as_str();
        match hosts.iter_mut().find(|h| !id.is_empty() && h.0 == id) {
            Some(h) => h.2 += 1,
            None => hosts.push((id, p.probe.cores, 1)),
        }
    }
    hosts
        .iter()
        .filter(|h| h.1 > 0)
        .map(|h| h.2 as f64 / f64::from(h.1))
        .fold(0.0, f64::max)
}

/// The median of the measured (non-zero) figures in GB/s, if any.
fn median_gbps(mut mbps: Vec<u32>) -> Option<f64> {
    mbps.retain(|x| *x > 0);
    if mbps.is_empty() {
        return None;
    }
    mbps.sort_unstable();
    let n = mbps.len();
    let mid = if n % 2 == 1 {
        f64::from(mbps[n / 2])
    } else {
        (f64::from(mbps[n / 2 - 1]) + f64::from(mbps[n / 2])) / 2.0
    };
    Some(mid / 1e3)
}

/// The costs every rank prices with: `base` (the topology file's or the defaults) with the
/// profile applied at the fullest host's ranks per core, else with the copy rate, the host
/// tier's bandwidth and the reduction rate from the ranks' probes where `base` has no figures
/// of its own. The same on every rank, since every rank has every probe.
pub(crate) fn priced_costs(
    base: TierCosts,
    peers: &[PeerInfo],
    profile: Option<&CostProfile>,
) -> TierCosts {
    if let Some(p) = profile {
        return p.apply(base, ranks_per_core(peers));
    }
    let defaults = TierCosts::default();
    let mut costs = base;
    // A message through shared memory is copied twice, into a slot and out of it.
    if base.host == defaults.host
        && let Some(copy) = median_gbps(peers.iter().map(|p| p.probe.copy_mbps).collect())
    {
        costs.host.bandwidth_gbps = copy / 2.0;
    }
    if base.copy_gbps.is_none()
        && let Some(copy) = median_gbps(peers.iter().map(|p| p.probe.copy_mbps).collect())
    {
        costs.copy_gbps = Some(copy);
    }
    if base.reduce_gbps == defaults.reduce_gbps
        && let Some(r) = median_gbps(peers.iter().map(|p| p.probe.reduce_mbps).collect())
    {
        costs.reduce_gbps = r;
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_topology::HostIdentity;

    fn peer(rank: usize, boot: &str, probe: HostProbe) -> PeerInfo {
        PeerInfo {
            rank,
            host: HostIdentity {
                hostname: boot.into(),
                boot_id: boot.into(),
                netns: String::new(),
            },
            pid: 0,
            process: 0,
            listen: "127.0.0.1:1".parse().unwrap(),
            place: Default::default(),
            transports: Default::default(),
            probe,
        }
    }

    fn probe(cores: u32, copy_gbps: f64, reduce_gbps: f64) -> HostProbe {
        HostProbe {
            cores,
            copy_mbps: (copy_gbps * 1e3) as u32,
            reduce_mbps: (reduce_gbps * 1e3) as u32,
            bound_cpu: 0,
        }
    }

    fn bound(cpu: u32) -> HostProbe {
        HostProbe {
            bound_cpu: cpu + 1,
            ..probe(2, 0.0, 0.0)
        }
    }

    #[test]
    fn a_rank_alone_on_its_core_is_told_apart_from_two_on_one() {
        // Three ranks on two cores, bound as `--np` binds them: 0 and 2 share core 0.
        let (r0, r1, r2) = (bound(0), bound(1), bound(0));
        let local = [&r0, &r1, &r2];
        assert_eq!(shares_core(&local, &r0), Some(true));
        assert_eq!(shares_core(&local, &r1), Some(false));
        assert_eq!(shares_core(&local, &r2), Some(true));
        // One rank free to move could land on any core: nobody can tell.
        let free = probe(2, 0.0, 0.0);
        assert_eq!(shares_core(&[&r1, &free], &r1), None);
        assert_eq!(shares_core(&[&r1, &free], &free), None);
    }

    #[test]
    fn ranks_bound_to_one_cpu_share_a_core_and_no_one_else_does() {
        // Host a: three ranks on two cores (0 and 2 share); host b: two ranks, two cores;
        // host c: two ranks on one CPU, but a third free to move.
        let peers = [
            peer(0, "a", bound(0)),
            peer(1, "a", bound(1)),
            peer(2, "a", bound(0)),
            peer(3, "b", bound(0)),
            peer(4, "b", bound(1)),
            peer(5, "c", bound(0)),
            peer(6, "c", bound(0)),
            peer(7, "c", probe(2, 0.0, 0.0)),
        ];
        let cores = shared_cores(&peers);
        assert_eq!(cores.len(), 8);
        assert!(cores[0].is_some() && cores[0] == cores[2], "{cores:?}");
        assert_eq!(cores[1], None);
        assert_eq!(&cores[3..], &[None; 5], "{cores:?}");
        // The same CPU number on another kernel is another core.
        let two_hosts = [
            peer(0, "a", bound(0)),
            peer(1, "a", bound(0)),
            peer(2, "b", bound(0)),
            peer(3, "b", bound(0)),
        ];
        let cores = shared_cores(&two_hosts);
        assert!(cores.iter().all(Option::is_some), "{cores:?}");
        assert_eq!((cores[0], cores[2]), (cores[1], cores[3]));
        assert_ne!(cores[0], cores[2]);
        // Nobody shares: nothing for the tuner to change.
        assert!(shared_cores(&peers[3..5]).is_empty());
    }

    #[test]
    fn the_probe_names_the_one_cpu_a_thread_is_bound_to() {
        let (before, probed) = std::thread::spawn(|| {
            let before = measure(false).bound_cpu;
            let cpu = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| {
                    // SAFETY: as in `bound_cpu`; this thread binds only itself.
                    unsafe {
                        let mut one: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(c, &mut one);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
                            == 0
                    }
                })
                .expect("some CPU to bind to");
            (before, (cpu, measure(false).bound_cpu))
        })
        .join()
        .unwrap();
        let (cpu, after) = probed;
        assert_eq!(after, cpu as u32 + 1);
        // A thread free to move on several CPUs names none (this machine has two or more).
        if cores_online() > 1 && bound_cpu_of_process_is_free() {
            assert_eq!(before, 0);
        }
    }

    /// Whether this test process itself may run on more than one CPU.
    fn bound_cpu_of_process_is_free() -> bool {
        std::thread::spawn(|| bound_cpu().is_none()).join().unwrap()
    }

    #[test]
    fn measures_cores_and_rates() {
        let p = measure(true);
        assert!(p.cores >= 1, "{p:?}");
        assert!(p.copy_mbps > 0 && p.reduce_mbps > 0, "{p:?}");
        let untimed = measure(false);
        assert_eq!((untimed.copy_mbps, untimed.reduce_mbps), (0, 0));
    }

    #[test]
    fn a_probe_is_four_numbers_on_the_wire() {
        let p = peer(3, "a", bound(1));
        let p = PeerInfo {
            probe: HostProbe {
                copy_mbps: 4000,
                reduce_mbps: 1000,
                ..p.probe
            },
            ..p
        };
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains(r#""probe":[2,4000,1000,2]"#), "{text}");
        let back: PeerInfo = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        // A table entry without one (a rank that did not probe) reads as unknown.
        let bare = text.replace(r#","probe":[2,4000,1000,2]"#, "");
        let old: PeerInfo = serde_json::from_str(&bare).unwrap();
        assert_eq!(old.probe, HostProbe::default());
    }

    #[test]
    fn the_fullest_host_sets_ranks_per_core() {
        let peers = [
            peer(0, "a", probe(2, 0.0, 0.0)),
            peer(1, "a", probe(2, 0.0, 0.0)),
            peer(2, "a", probe(2, 0.0, 0.0)),
            peer(3, "b", probe(4, 0.0, 0.0)),
        ];
        assert_eq!(ranks_per_core(&peers), 1.5);
        assert_eq!(ranks_per_core(&[peer(0, "a", probe(0, 0.0, 0.0))]), 0.0);
    }

    #[test]
    fn every_rank_prices_with_the_medians() {
        let peers = [
            peer(0, "a", probe(2, 4.0, 1.0)),
            peer(1, "a", probe(2, 9.0, 3.0)),
            peer(2, "a", probe(2, 6.0, 0.0)),
        ];
        let c = priced_costs(TierCosts::default(), &peers, None);
        assert_eq!(c.host.bandwidth_gbps, 3.0);
        assert_eq!(c.copy_gbps, Some(6.0));
        assert_eq!(c.reduce_gbps, 2.0, "unmeasured figures are left out");
        // A topology file's own host figures stand.
        let mut file = TierCosts::default();
        file.host.bandwidth_gbps = 100.0;
        assert_eq!(priced_costs(file, &peers, None).host.bandwidth_gbps, 100.0);
    }

    #[test]
    fn a_profile_wins_over_the_probes() {
        let text = "[tiers]\nreduce_gbps = 5.0\n[shared_core]\nranks_per_core = 2.0\n\
                    [shared_core.tiers]\nreduce_gbps = 1.0\n";
        let profile = strata_topology::profile::parse_profile(text, "p").unwrap();
        let one = [
            peer(0, "a", probe(2, 4.0, 1.0)),
            peer(1, "a", probe(2, 4.0, 1.0)),
        ];
        let c = priced_costs(TierCosts::default(), &one, Some(&profile));
        assert_eq!(c.reduce_gbps, 5.0);
        assert_eq!(c.host, TierCosts::default().host);
        let four: Vec<PeerInfo> = (0..4).map(|r| peer(r, "a", probe(2, 4.0, 1.0))).collect();
        assert_eq!(
            priced_costs(TierCosts::default(), &four, Some(&profile)).reduce_gbps,
            1.0
        );
    }
}
