//! Where the plugin learns the fabric and which of its hosts a communicator's nodes are.
//!
//! The fabric: strata's topology file named by `STRATA_TOPO_FILE` (layout and tier costs), else
//! Slurm's `topology.conf` (`STRATA_SLURM_TOPOLOGY`, or `/etc/slurm/topology.conf` inside a
//! Slurm job), whose layout comes with strata's default tier costs. Without either the plugin
//! knows nothing NCCL does not, and leaves NCCL's tuning alone.
//!
//! The nodes: NCCL tells a tuner how many nodes a communicator spans, not which. Inside a Slurm
//! job they are the first `nNodes` hosts of `SLURM_JOB_NODELIST` that the fabric places (a
//! communicator of the whole job spans exactly those); otherwise the first `nNodes` hosts of
//! the file, in its order (a packed allocation).

use strata_topology::fabric::{self, Fabric, Layout};
use strata_topology::hostlist;

/// Reads the fabric the environment names (`None`: no fabric is described). An error is a file
/// that was named but cannot be used; it fails the communicator's init rather than tune it on
/// a guess.
pub fn fabric_from_env() -> Result<Option<Fabric>, String> {
    if let Some(path) = std::env::var_os("STRATA_TOPO_FILE") {
        let path = std::path::PathBuf::from(path);
        return fabric::load_file(&path)
            .map(Some)
            .map_err(|e| format!("STRATA_TOPO_FILE: {e}"));
    }
    let slurm = match std::env::var_os("STRATA_SLURM_TOPOLOGY") {
        Some(p) => Some((std::path::PathBuf::from(p), true)),
        None if std::env::var_os("SLURM_JOB_NODELIST").is_some() => {
            Some(("/etc/slurm/topology.conf".into(), false))
        }
        None => None,
    };
    match slurm {
        Some((path, named)) => match std::fs::read_to_string(&path) {
            Ok(text) => fabric::parse_slurm(&text, &path.display().to_string())
                .map(Some)
                .map_err(|e| format!("Slurm topology: {e}")),
            Err(e) if named => Err(format!("STRATA_SLURM_TOPOLOGY {}: {e}", path.display())),
            Err(_) => Ok(None), // a Slurm job without the tree plugin's file
        },
        None => Ok(None),
    }
}

/// The fabric's host index of each of the communicator's `n_nodes` nodes, from `nodelist`
/// (Slurm's `SLURM_JOB_NODELIST`, if any) or the file's order.
pub fn node_hosts(
    fab: &Fabric,
    n_nodes: usize,
    nodelist: Option<&str>,
) -> Result<Vec<usize>, String> {
    if n_nodes == 0 {
        return Err("the communicator spans 0 nodes".into());
    }
    if let (Some(list), Layout::Named { hosts, .. }) = (nodelist, &fab.layout) {
        let names = hostlist::expand(list).map_err(|e| format!("SLURM_JOB_NODELIST: {e}"))?;
        let placed: Vec<usize> = names
            .iter()
            .filter_map(|n| hosts.iter().position(|h| h == n))
            .take(n_nodes)
            .collect();
        if placed.len() == n_nodes {
            return Ok(placed);
        }
        return Err(format!(
            "{} places {} of the {n_nodes} nodes in SLURM_JOB_NODELIST={list}",
            fab.source,
            placed.len()
        ));
    }
    if n_nodes > fab.hosts() {
        return Err(format!(
            "{} describes {} hosts; the communicator spans {n_nodes} nodes",
            fab.source,
            fab.hosts()
        ));
    }
    Ok((0..n_nodes).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named() -> Fabric {
        fabric::parse_file(
            "[[leaves]]\nhosts = \"n[0-3]\"\npod = \"p0\"\n[[leaves]]\nhosts = \"n[4-7]\"\npod = \"p1\"\n",
            "named.toml",
        )
        .unwrap()
    }

    #[test]
    fn nodes_come_from_the_slurm_nodelist_when_the_file_names_hosts() {
        let fab = named();
        assert_eq!(node_hosts(&fab, 2, Some("n[2,5]")).unwrap(), vec![2, 5]);
        assert_eq!(node_hosts(&fab, 3, None).unwrap(), vec![0, 1, 2]);
        let e = node_hosts(&fab, 2, Some("n2,other")).unwrap_err();
        assert!(e.contains("places 1 of the 2 nodes"), "{e}");
        let e = node_hosts(&fab, 9, None).unwrap_err();
        assert!(e.contains("describes 8 hosts"), "{e}");
        assert!(node_hosts(&fab, 0, None).is_err());
    }
}
