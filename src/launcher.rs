//! Where rank and world size come from: torchrun, Slurm, Open MPI or MPICH variables.

use crate::error::{Error, Result};

/// What a launcher told this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Rank among the ranks of this host, when known.
    pub local_rank: Option<usize>,
    /// Ranks on this host, when known.
    pub local_size: Option<usize>,
    /// `torchrun`, `slurm`, `openmpi` or `mpich`.
    pub launcher: &'static str,
}

/// Reads the launcher variables through `get` (the environment in [`detect`]). Under
/// srun + torchrun, torchrun's variables win.
pub fn detect_with(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    let num = |name: &str| -> Result<Option<usize>> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a number"))),
        }
    };
    let sets: [(&'static str, [&str; 4]); 4] = [
        (
            "torchrun",
            ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
        ),
        (
            "openmpi",
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ],
        ),
        (
            "mpich",
            ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
        ),
        (
            "slurm",
            [
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "SLURM_NTASKS_PER_NODE",
            ],
        ),
    ];
    for (launcher, [r, s, lr, ls]) in sets {
        if let (Some(rank), Some(size)) = (num(r)?, num(s)?) {
            if size == 0 || rank >= size {
                return Err(Error::InvalidArgument(format!(
                    "{r}={rank} is out of range for {s}={size}"
                )));
            }
            // SLURM_NTASKS_PER_NODE may be "4(x2)"; only a plain number is used.
            let local_size = if launcher == "slurm" {
                get(ls).and_then(|v| v.parse().ok())
            } else {
                num(ls)?
            };
            return Ok(Some(LaunchInfo {
                rank,
                size,
                local_rank: num(lr)?,
                local_size,
                launcher,
            }));
        }
    }
    Ok(None)
}

/// Reads the launcher variables of this process.
pub fn detect() -> Result<Option<LaunchInfo>> {
    detect_with(|k| std::env::var(k).ok())
}

/// The bootstrap root a Slurm step implies, as (host, port), read through `get`; `None`
/// outside a step. The host is the first of `SLURM_STEP_NODELIST` (where task 0 runs); the
/// port is `STRATA_PORT`, else the first of `SLURM_STEP_RESV_PORTS` (srun `--resv-ports`),
/// else one derived from the job and step ids in 20000-31999 (below Linux's ephemeral
/// ports), so every task of the step computes the same root with no variable set by hand.
pub fn slurm_root_with(get: impl Fn(&str) -> Option<String>) -> Result<Option<(String, u16)>> {
    let (Some(nodes), Some(job)) = (get("SLURM_STEP_NODELIST"), get("SLURM_JOB_ID")) else {
        return Ok(None);
    };
    let host = first_host(&nodes).ok_or_else(|| {
        Error::InvalidArgument(format!("SLURM_STEP_NODELIST={nodes} names no host"))
    })?;
    let port = if let Some(p) = strata_port(&get)? {
        p
    } else if let Some(ports) = get("SLURM_STEP_RESV_PORTS") {
        let first = ports.split([',', '-']).next().unwrap_or_default().trim();
        first.parse::<u16>().map_err(|_| {
            Error::InvalidArgument(format!("SLURM_STEP_RESV_PORTS={ports} names no port"))
        })?
    } else {
        let step = get("SLURM_STEP_ID").unwrap_or_default();
        let mut h = blake3::Hasher::new();
        h.update(b"strata slurm port");
        h.update(job.trim().as_bytes());
        h.update(b"/");
        h.update(step.trim().as_bytes());
        let b = h.finalize();
        20000 + u16::from_le_bytes([b.as_bytes()[0], b.as_bytes()[1]]) % 12000
    };
    Ok(Some((host, port)))
}

/// `STRATA_PORT`, read through `get`, when it is set: the bootstrap root's port whatever
/// else names the root's host (`MASTER_ADDR`, a Slurm step).
pub fn strata_port(get: impl Fn(&str) -> Option<String>) -> Result<Option<u16>> {
    get("STRATA_PORT")
        .map(|p| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| Error::InvalidArgument(format!("STRATA_PORT={p} is not a port")))
        })
        .transpose()
}

/// The first host of a Slurm hostlist expression: `node[07-09,12],gpu3` gives `node07`,
/// `rack[1-2]-n[3-4]` gives `rack1-n3` (each bracket's first value, zero padding kept).
pub fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut in_brackets = false;
    let mut took_first = false;
    for c in list.trim().chars() {
        match c {
            '[' if !in_brackets => (in_brackets, took_first) = (true, false),
            ']' if in_brackets => in_brackets = false,
            ',' | '-' if in_brackets => took_first = true,
            ',' => break,
            _ if in_brackets && took_first => {}
            _ => host.push(c),
        }
    }
    (!host.is_empty() && !in_brackets).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Option<LaunchInfo>> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect_with(|k| m.get(k).cloned())
    }

    #[test]
    fn each_launcher_is_recognised() {
        let t = with(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.rank, t.size, t.local_rank, t.launcher),
            (3, 8, Some(1), "torchrun")
        );
        let s = with(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x4)"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.rank, s.size, s.local_size, s.launcher),
            (5, 16, None, "slurm")
        );
        let o = with(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .unwrap()
            .unwrap();
        assert_eq!(o.launcher, "openmpi");
        let m = with(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")])
            .unwrap()
            .unwrap();
        assert_eq!(m.launcher, "mpich");
        assert!(with(&[]).unwrap().is_none());
    }

    #[test]
    fn the_first_host_of_a_slurm_hostlist() {
        for (list, first) in [
            ("vm", "vm"),
            ("node[07-09,12],gpu3", "node07"),
            ("gpu3,node[1-2]", "gpu3"),
            ("rack[1-2]-n[3-4]", "rack1-n3"),
            ("n[5]", "n5"),
            ("a-b-c[010-011]", "a-b-c010"),
        ] {
            assert_eq!(first_host(list).as_deref(), Some(first), "{list}");
        }
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("node[1-2"), None);
    }

    #[test]
    fn a_slurm_step_implies_one_root_for_all_its_tasks() {
        let root = |vars: &[(&str, &str)]| {
            let m: HashMap<&str, &str> = vars.iter().copied().collect();
            slurm_root_with(|k| m.get(k).map(|v| v.to_string()))
        };
        let step = [
            ("SLURM_STEP_NODELIST", "node[3-4]"),
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_STEP_ID", "0"),
        ];
        let (host, port) = root(&step).unwrap().unwrap();
        assert_eq!(host, "node3");
        assert!((20000..32000).contains(&port), "{port}");
        // Another step of the same job gets another port; the same step, the same one.
        let next = root(&[step[0], step[1], ("SLURM_STEP_ID", "1")])
            .unwrap()
            .unwrap();
        assert_ne!(next.1, port);
        assert_eq!(root(&step).unwrap().unwrap().1, port);
        let resv = root(&[step[0], step[1], ("SLURM_STEP_RESV_PORTS", "12001-12004")]);
        assert_eq!(resv.unwrap().unwrap().1, 12001);
        let set = root(&[step[0], step[1], ("STRATA_PORT", "4242")]);
        assert_eq!(set.unwrap().unwrap().1, 4242);
        assert!(root(&[step[0], step[1], ("STRATA_PORT", "x")]).is_err());
        assert!(root(&[("SLURM_JOB_ID", "1")]).unwrap().is_none());
    }

    #[test]
    fn torchrun_wins_under_srun_and_bad_values_are_errors() {
        let t = with(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((t.rank, t.launcher), (2, "torchrun"));
        assert!(with(&[("RANK", "4"), ("WORLD_SIZE", "4")]).is_err());
        assert!(with(&[("RANK", "x"), ("WORLD_SIZE", "4")]).is_err());
    }
}
