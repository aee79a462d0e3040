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
