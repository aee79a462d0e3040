//! `collbench health`: screens the hosts of a job before it starts. Every rank measures its
//! memory copy rate; the ranks of each host all-reduce among themselves (the host's internal
//! rate); one rank per host then exchanges a fixed message with one other host per round,
//! each way in turn, pairing host i with host i XOR 2^k in round k: ceil(log2 hosts) rounds,
//! so the check grows with log p, not p². Each rate is compared with the median of its kind,
//! and each exchange with the topology file's figure for it when `STRATA_TOPO_FILE` gives
//! one, else with the median of its round (rounds cross different tiers); one table names
//! what is out of line.
//!
//! Naming a link end: a slow exchange a→b is a's egress or b's ingress. An end slow in every
//! round it took part in (two or more) is named; a slow exchange neither explains is put on
//! the end slow in the larger share of its rounds, then on an end whose host is already named
//! the other way (a link seldom fails one way only), else on both ends ("the path a→b"), as
//! when only these two hosts ever meet at a tier where the fault shows.

use super::*;

/// Options of `collbench health`.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct HealthArgs {
    #[command(flatten)]
    pub(super) launch: LaunchArgs,
    /// Bytes each pair of hosts sends each way per round.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    bytes: usize,
    /// A rate below (1 - tolerance) times the median of its kind is out of line.
    #[arg(long, default_value_t = 0.25)]
    tolerance: f64,
    /// Also write the report as JSON to this file.
    #[arg(long = "json")]
    json: Option<std::path::PathBuf>,
}

/// What was measured of one host.
#[derive(Serialize, Clone, Debug, Default)]
pub(super) struct HostView {
    /// Its name (and leader rank where names repeat).
    name: String,
    /// Its ranks.
    ranks: Vec<usize>,
    /// The median memcpy rate of its ranks, GB/s.
    memcpy_gbs: f64,
    /// Bus bandwidth of an all-reduce among its ranks, GB/s (with two ranks or more).
    internal_busbw_gbs: Option<f64>,
    /// Per round: the partner host and the rate received from it, MB/s.
    ingress: Vec<Option<(usize, f64)>>,
    /// Another host of the job runs on the same kernel (emulated hosts): they share cores
    /// and memory, so their internal rates are shown but not compared.
    shares_machine: bool,
}

/// One finding.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(super) struct Outlier {
    /// The host, by index into the report's hosts.
    host: usize,
    /// What is slow: `memcpy`, `internal`, `egress`, `ingress`, or `path to <host>`.
    what: String,
    /// Measured against expected.
    measured: f64,
    expected: f64,
    /// Unit of the two figures.
    unit: &'static str,
}

#[derive(Serialize)]
struct HealthReport<'a> {
    hosts: &'a [HostView],
    rounds: usize,
    bytes: usize,
    tolerance: f64,
    seconds: f64,
    outliers: &'a [Outlier],
}

/// Transfers each way per pair and round; the best counts.
const REPEATS: usize = 3;

/// Host `host`'s partner in round `round` of `hosts`: host XOR 2^round, if there is one.
fn partner(host: usize, round: usize, hosts: usize) -> Option<usize> {
    Some(host ^ (1 << round)).filter(|&p| p < hosts)
}

/// Rounds of pairwise exchanges that give every host a partner: ceil(log2 hosts).
fn rounds_for(hosts: usize) -> usize {
    hosts.next_power_of_two().trailing_zeros() as usize
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the check on `comm` (every rank) and prints the table at rank 0; failure when
/// anything is out of line.
pub(super) fn health_main(h: &HealthArgs, comm: &Communicator) -> ExitCode {
    match run(h, comm) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(3),
        Err(e) => {
            eprintln!("collbench health: rank {}: {e}", comm.rank());
            ExitCode::FAILURE
        }
    }
}

fn run(h: &HealthArgs, comm: &Communicator) -> Result<usize, String> {
    let start = Instant::now();
    let err = |e: strata::Error| e.to_string();
    let (rank, n) = (comm.rank(), comm.size());
    // Hosts in the order of their lowest rank; a host's leader is that rank.
    let mut hosts = Vec::new();
    for p in comm.peers() {
        match hosts
            .iter_mut()
            .find(|(id, _): &&mut (_, Vec<usize>)| *id == p.host)
        {
            Some((_, ranks)) => ranks.push(p.rank),
            None => hosts.push((p.host.clone(), vec![p.rank])),
        }
    }
    let me = hosts
        .iter()
        .position(|(_, r)| r.contains(&rank))
        .ok_or("this rank is on no host")?;
    let leader = hosts[me].1[0] == rank;
    let rounds = rounds_for(hosts.len());

    let memcpy = memory::memcpy_rate(comm)? / 1e9;
    let local = comm.split(Some(me as u32), rank as i32).map_err(err)?;
    let mut internal = f64::NAN;
    if let Some(local) = local.as_ref().filter(|c| c.size() > 1) {
        let mut buf = vec![1f32; h.bytes / 4];
        local
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .map_err(err)?;
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            local
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .map_err(err)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let k = local.size() as f64;
        internal = 2.0 * (k - 1.0) / k * (buf.len() * 4) as f64 / best / 1e9;
    }

    // The leaders' exchanges: ingress rate (MB/s) per round, NaN where no partner.
    let leaders = comm.split(leader.then_some(0), rank as i32).map_err(err)?;
    let mut ingress = vec![f64::NAN; rounds];
    if let Some(lc) = &leaders {
        let i = lc.rank();
        let mut data = vec![0u8; h.bytes.max(1)];
        for (k, slot) in ingress.iter_mut().enumerate() {
            let p = partner(i, k, lc.size());
            // Every pair of the round moves the same way at once, between barriers of all
            // the leaders, so that flows sharing a tier share it alike in every repeat
            // (unsynchronised, a flow that finished early left the next the whole link, and
            // one round's rates varied twofold). Lower to higher, then back; each receiver
            // times from the barrier; best of REPEATS: a link is never faster than it is.
            let mut best = 0f64;
            for _ in 0..REPEATS {
                for lower_sends in [true, false] {
                    lc.barrier().map_err(err)?;
                    let Some(p) = p else {
                        continue;
                    };
                    if (i < p) == lower_sends {
                        lc.send(&data, p).map_err(err)?;
                    } else {
                        let t = Instant::now();
                        lc.recv(&mut data, p).map_err(err)?;
                        best = best.max(data.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
                    }
                }
            }
            if p.is_some() {
                *slot = best;
            }
        }
    }

    // Every rank's figures to every rank: [host, memcpy, internal, ingress per round].
    let words = 3 + rounds;
    let mut mine = vec![f64::NAN; words];
    mine[0] = me as f64;
    mine[1] = memcpy;
    mine[2] = internal;
    mine[3..].copy_from_slice(&ingress);
    let mut all = vec![0f64; words * n];
    comm.all_gather(&mine, &mut all).map_err(err)?;
    let repeated = |name: &str| hosts.iter().filter(|(id, _)| id.hostname == name).count() > 1;
    let views: Vec<HostView> = hosts
        .iter()
        .enumerate()
        .map(|(hi, (id, ranks))| {
            let rows: Vec<&[f64]> = ranks.iter().map(|&r| &all[r * words..][..words]).collect();
            let lead = rows[0];
            HostView {
                name: if repeated(&id.hostname) {
                    format!("{} (rank {})", id.hostname, ranks[0])
                } else {
                    id.hostname.clone()
                },
                ranks: ranks.clone(),
                shares_machine: hosts
                    .iter()
                    .filter(|(o, _)| o.boot_id == id.boot_id)
                    .count()
                    > 1,
                memcpy_gbs: median(rows.iter().map(|r| r[1]).collect()),
                internal_busbw_gbs: lead[2].is_finite().then_some(lead[2]),
                ingress: (0..rounds)
                    .map(|k| {
                        let rate = lead[3 + k];
                        partner(hi, k, hosts.len())
                            .filter(|_| rate.is_finite())
                            .map(|p| (p, rate))
                    })
                    .collect(),
            }
        })
        .collect();
    let expected = fabric_expectations(comm, &hosts_leaders(&views), rounds);
    let outliers = judge(&views, rounds, h.tolerance, expected.as_ref());
    let seconds = start.elapsed().as_secs_f64();
    if rank == 0 {
        let against = if expected.is_some() {
            "the median (exchanges: of the topology file's figure, STRATA_TOPO_FILE)"
        } else {
            "the median"
        };
        print_table(&views, &outliers, h, (rounds, seconds), against);
        if let Some(path) = &h.json {
            let report = HealthReport {
                hosts: &views,
                rounds,
                bytes: h.bytes,
                tolerance: h.tolerance,
                seconds,
                outliers: &outliers,
            };
            let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    Ok(outliers.len())
}

/// What each exchange should reach by the topology file: the host link, or its share of an
/// oversubscribed uplink that the round's other flows from (and into) the same leaf or pod
/// share in the same direction. Built in O(hosts × rounds).
pub(super) struct Expected {
    /// The host link's rate, MB/s.
    host_link: f64,
    /// Per round and host: the partner's tier and the per-flow rates out of and into the
    /// host's groups, MB/s (the tightest of the tiers crossed).
    per_round: Vec<Vec<f64>>,
}

impl Expected {
    /// The rate `from` should reach sending to its partner in `round`, MB/s.
    fn rate(&self, from: usize, _to: usize, round: usize) -> f64 {
        self.per_round
            .get(round)
            .and_then(|r| r.get(from))
            .copied()
            .unwrap_or(self.host_link)
    }
}

/// The leader rank of each host.
fn hosts_leaders(views: &[HostView]) -> Vec<usize> {
    views.iter().map(|v| v.ranks[0]).collect()
}

/// [`Expected`] from the communicator's fabric when `STRATA_TOPO_FILE` described it, else
/// `None` (the rounds' medians are the reference then).
fn fabric_expectations(comm: &Communicator, leaders: &[usize], rounds: usize) -> Option<Expected> {
    use strata_topology::Tier;
    if std::env::var_os("STRATA_TOPO_FILE").is_none() || !comm.tiers().fabric_known() {
        return None;
    }
    let costs = comm.tiers().costs();
    let h = leaders.len();
    // A host's group below each shared tier: its leaf (under the pod tier) and its pod
    // (under the aggregation tier).
    let group = |x: usize, t: Tier| -> String {
        let sw = &comm.peers()[leaders[x]].place.switches;
        match t {
            Tier::Aggregation => sw.first().cloned().unwrap_or_default(),
            _ => sw.join("/"),
        }
    };
    let shared = [Tier::Pod, Tier::Aggregation];
    let mut members: std::collections::HashMap<(Tier, String), f64> = Default::default();
    for x in 0..h {
        for t in shared {
            *members.entry((t, group(x, t))).or_default() += 1.0;
        }
    }
    let host_link = costs.link(Tier::Leaf).bandwidth_gbps * 1e3;
    let per_round = (0..rounds)
        .map(|k| {
            // Flows out of and into each group per direction (lower to higher, or back).
            let mut flows: std::collections::HashMap<(Tier, String, bool, bool), f64> =
                Default::default();
            for x in 0..h {
                let Some(p) = partner(x, k, h) else {
                    continue;
                };
                let crossed = comm.tier(leaders[x], leaders[p]);
                for t in shared.into_iter().filter(|&t| crossed >= t) {
                    *flows.entry((t, group(x, t), x < p, true)).or_default() += 1.0;
                    *flows.entry((t, group(p, t), x < p, false)).or_default() += 1.0;
                }
            }
            (0..h)
                .map(|x| {
                    let Some(p) = partner(x, k, h) else {
                        return host_link;
                    };
                    let crossed = comm.tier(leaders[x], leaders[p]);
                    let mut rate = host_link;
                    for t in shared.into_iter().filter(|&t| crossed >= t) {
                        let link = costs.link(t);
                        for (end, out) in [(x, true), (p, false)] {
                            let g = group(end, t);
                            let n = flows
                                .get(&(t, g.clone(), x < p, out))
                                .copied()
                                .unwrap_or(1.0);
                            let capacity = link.bandwidth_gbps * 1e3 * members[&(t, g)]
                                / link.oversubscription.max(1.0);
                            let mut each = (capacity / n).min(link.bandwidth_gbps * 1e3);
                            if n > 1.0 {
                                each *= link.shared_efficiency;
                            }
                            rate = rate.min(each);
                        }
                    }
                    rate
                })
                .collect()
        })
        .collect();
    Some(Expected {
        host_link,
        per_round,
    })
}

/// One measured transfer: (from host, to host, round, MB/s).
type Exchange = (usize, usize, usize, f64);

/// Finds what is out of line (see the module doc).
pub(super) fn judge(
    hosts: &[HostView],
    rounds: usize,
    tolerance: f64,
    expected: Option<&Expected>,
) -> Vec<Outlier> {
    let floor = 1.0 - tolerance;
    let mut out = Vec::new();
    // Internal rates against the median of hosts like them, where hosts are machines.
    let memcpy = median(hosts.iter().map(|h| h.memcpy_gbs).collect());
    for (i, h) in hosts.iter().enumerate().filter(|(_, h)| !h.shares_machine) {
        if h.memcpy_gbs < floor * memcpy {
            out.push(outlier(i, "memcpy", h.memcpy_gbs, memcpy, "GB/s"));
        }
        if let Some(bw) = h.internal_busbw_gbs {
            let like: Vec<f64> = hosts
                .iter()
                .filter(|o| o.ranks.len() == h.ranks.len())
                .filter_map(|o| o.internal_busbw_gbs)
                .collect();
            let m = median(like);
            if bw < floor * m {
                out.push(outlier(i, "internal", bw, m, "GB/s"));
            }
        }
    }
    // Exchanges (from, to, round, rate) against their round's median.
    let exchanges: Vec<Exchange> = hosts
        .iter()
        .enumerate()
        .flat_map(|(b, h)| {
            h.ingress
                .iter()
                .enumerate()
                .filter_map(move |(k, x)| x.map(|(a, rate)| (a, b, k, rate)))
        })
        .collect();
    let round_median: Vec<f64> = (0..rounds)
        .map(|k| median(exchanges.iter().filter(|e| e.2 == k).map(|e| e.3).collect()))
        .collect();
    // What an exchange is measured against: the topology file's figure, else its round's
    // median.
    let reference = |e: &Exchange| expected.map_or(round_median[e.2], |x| x.rate(e.0, e.1, e.2));
    let slow = |e: &Exchange| e.3 < floor * reference(e);
    // Per host: (slow, total) of its egress and of its ingress exchanges.
    let mut egress = vec![(0usize, 0usize); hosts.len()];
    let mut ingress = vec![(0usize, 0usize); hosts.len()];
    for e in &exchanges {
        let s = usize::from(slow(e));
        egress[e.0].0 += s;
        egress[e.0].1 += 1;
        ingress[e.1].0 += s;
        ingress[e.1].1 += 1;
    }
    let always = |(s, t): (usize, usize)| t >= 2 && s == t;
    let mut named_out: Vec<bool> = egress.iter().map(|&c| always(c)).collect();
    let mut named_in: Vec<bool> = ingress.iter().map(|&c| always(c)).collect();
    let share = |(s, t): (usize, usize)| s as f64 / t.max(1) as f64;
    let mut ties = Vec::new();
    for e in exchanges.iter().filter(|e| slow(e)) {
        let (a, b) = (e.0, e.1);
        if named_out[a] || named_in[b] {
            continue;
        }
        let (sa, sb) = (share(egress[a]), share(ingress[b]));
        if sa > sb {
            named_out[a] = true;
        } else if sb > sa {
            named_in[b] = true;
        } else {
            ties.push(*e);
        }
    }
    // A tie goes to an end whose host is already named the other way (a link seldom fails
    // in one direction only); else it is the path's.
    let mut paths = Vec::new();
    for e in ties {
        let (a, b) = (e.0, e.1);
        if named_out[a] || named_in[b] {
            continue;
        }
        match (named_in[a], named_out[b]) {
            (true, false) => named_out[a] = true,
            (false, true) => named_in[b] = true,
            _ => paths.push(e),
        }
    }
    // The figure of a named end: its slowest exchange against that round's median.
    let worst = |pick: &dyn Fn(&Exchange) -> bool| {
        exchanges
            .iter()
            .filter(|e| pick(e))
            .map(|e| (e.3, reference(e)))
            .min_by(|x, y| (x.0 / x.1).total_cmp(&(y.0 / y.1)))
    };
    for i in 0..hosts.len() {
        if named_out[i]
            && let Some((m, x)) = worst(&|e| e.0 == i)
        {
            out.push(outlier(i, "egress", m, x, "MB/s"));
        }
        if named_in[i]
            && let Some((m, x)) = worst(&|e| e.1 == i)
        {
            out.push(outlier(i, "ingress", m, x, "MB/s"));
        }
    }
    for e in paths {
        let what = format!("path to {} (either end)", hosts[e.1].name);
        out.push(outlier(e.0, &what, e.3, reference(&e), "MB/s"));
    }
    out
}

fn outlier(host: usize, what: &str, measured: f64, expected: f64, unit: &'static str) -> Outlier {
    Outlier {
        host,
        what: what.to_string(),
        measured,
        expected,
        unit,
    }
}

fn print_table(
    hosts: &[HostView],
    outliers: &[Outlier],
    h: &HealthArgs,
    (rounds, s): (usize, f64),
    against: &str,
) {
    let ranks: usize = hosts.iter().map(|x| x.ranks.len()).sum();
    println!(
        "# collbench health: {} hosts, {ranks} ranks; {rounds} rounds of pairwise exchanges of \
         {} bytes each way (host i with i XOR 2^k); out of line below {:.0}% of {against}; {s:.1} s",
        hosts.len(),
        h.bytes,
        100.0 * (1.0 - h.tolerance)
    );
    println!(
        "# {:<24} {:>5} {:>11} {:>13} {:>22} {:>22}  verdict",
        "host",
        "ranks",
        "memcpy GB/s",
        "internal GB/s",
        "egress MB/s (min, x)",
        "ingress MB/s (min, x)"
    );
    let exchanges = |i: usize, out: bool| -> Vec<f64> {
        hosts
            .iter()
            .enumerate()
            .flat_map(|(b, v)| v.ingress.iter().flatten().map(move |&(a, r)| (a, b, r)))
            .filter(|&(a, b, _)| if out { a == i } else { b == i })
            .map(|e| e.2)
            .collect()
    };
    let min = |v: Vec<f64>| v.into_iter().reduce(f64::min);
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
    for (i, v) in hosts.iter().enumerate() {
        let mine: Vec<String> = outliers
            .iter()
            .filter(|o| o.host == i)
            .map(|o| {
                format!(
                    "{} {:.1} vs {:.1} {}",
                    o.what, o.measured, o.expected, o.unit
                )
            })
            .collect();
        println!(
            "  {:<24} {:>5} {:>11.2} {:>13} {:>22} {:>22}  {}",
            v.name,
            v.ranks.len(),
            v.memcpy_gbs,
            v.internal_busbw_gbs
                .map_or("-".into(), |x| format!("{x:.2}")),
            fmt(min(exchanges(i, true))),
            fmt(min(exchanges(i, false))),
            if mine.is_empty() {
                "ok".into()
            } else {
                format!("OUT OF LINE: {}", mine.join("; "))
            }
        );
    }
    if hosts.iter().any(|h| h.shares_machine) {
        println!(
            "# Hosts on one kernel share its cores and memory: their memcpy and internal rates \
             are not compared"
        );
    }
    if outliers.is_empty() {
        println!("# Health: every host in line");
    } else {
        let named: std::collections::BTreeSet<&str> = outliers
            .iter()
            .map(|o| hosts[o.host].name.as_str())
            .collect();
        println!(
            "# Health: {} out of line: {}",
            outliers.len(),
            named.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts of one rank each whose leader received `rates[i][k]` in round k.
    fn hosts(rates: &[&[f64]]) -> Vec<HostView> {
        rates
            .iter()
            .enumerate()
            .map(|(i, r)| HostView {
                name: format!("h{i}"),
                ranks: vec![i],
                memcpy_gbs: 10.0,
                internal_busbw_gbs: None,
                shares_machine: false,
                ingress: r
                    .iter()
                    .enumerate()
                    .map(|(k, &x)| partner(i, k, rates.len()).map(|p| (p, x)))
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn rounds_grow_with_log_hosts() {
        assert_eq!(rounds_for(1), 0);
        assert_eq!(rounds_for(2), 1);
        assert_eq!(rounds_for(5), 3);
        assert_eq!(rounds_for(8), 3);
        assert_eq!(rounds_for(24_576), 15);
    }

    #[test]
    fn a_host_whose_sends_are_slow_in_every_round_is_named_and_no_other() {
        // Host 2's egress is half: host 3 (round 0) and host 0 (round 1) receive slowly.
        let h = hosts(&[
            &[100.0, 50.0],
            &[100.0, 100.0],
            &[100.0, 100.0],
            &[50.0, 100.0],
        ]);
        let out = judge(&h, 2, 0.25, None);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].host, out[0].what.as_str()), (2, "egress"));
        assert_eq!((out[0].measured, out[0].expected), (50.0, 100.0));
    }

    #[test]
    fn a_slow_exchange_nothing_else_explains_names_the_path_and_a_clean_job_nothing() {
        // Two hosts: only 1 -> 0 is slow; either end could be at fault.
        let out = judge(&hosts(&[&[40.0], &[100.0]]), 1, 0.25, None);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].what.starts_with("path to h0"), "{out:?}");
        // Noise within the tolerance names no one, with a non-power-of-two host count.
        let out = judge(
            &hosts(&[&[90.0, 101.0], &[100.0, 99.0], &[95.0, 97.0]]),
            2,
            0.25,
            None,
        );
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn a_tie_goes_to_the_host_already_named_the_other_way() {
        // Host 1's link is slow both ways, seen only with host 0 in round 0 (its other
        // rounds cross a tier that hides it), but its sends are slow in round 1 too.
        let h = hosts(&[
            &[50.0, 100.0],
            &[50.0, 100.0],
            &[100.0, 100.0],
            &[100.0, 50.0],
        ]);
        let out = judge(&h, 2, 0.25, None);
        let named: Vec<(usize, &str)> = out.iter().map(|o| (o.host, o.what.as_str())).collect();
        assert_eq!(named, vec![(1, "egress"), (1, "ingress")], "{out:?}");
    }

    #[test]
    fn a_job_slow_everywhere_is_named_against_the_topology_file_not_against_its_median() {
        let h = hosts(&[&[50.0, 50.0], &[50.0, 50.0], &[50.0, 50.0], &[50.0, 50.0]]);
        assert!(
            judge(&h, 2, 0.25, None).is_empty(),
            "alike: in line with each other"
        );
        let fabric = Expected {
            host_link: 100.0,
            per_round: vec![vec![100.0; 4]; 2],
        };
        let out = judge(&h, 2, 0.25, Some(&fabric));
        let named: std::collections::BTreeSet<usize> = out.iter().map(|o| o.host).collect();
        assert_eq!(named, (0..4).collect(), "{out:?}");
        assert!(out.iter().all(|o| o.expected == 100.0), "{out:?}");
    }

    #[test]
    fn a_host_with_a_slow_memory_is_named() {
        let mut h = hosts(&[&[100.0], &[100.0]]);
        h[1].memcpy_gbs = 4.0;
        let out = judge(&h, 1, 0.25, None);
        assert_eq!(out, vec![outlier(1, "memcpy", 4.0, 7.0, "GB/s")]);
    }
}
