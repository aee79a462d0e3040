//! strata-topology: what the machine and the fabric look like.
//!
//! It knows the host identity of a process (which decides whether two ranks can use shared
//! memory); the inside of a host ([`host`]: NUMA nodes, PCIe tree, GPUs, NICs, NVLink, and
//! which NIC is nearest which GPU), read from sysfs ([`sysfs`]), hwloc (feature `hwloc`),
//! NVML ([`nvml`]) or NCCL's topology XML ([`nccl_xml`]); the fabric between hosts
//! ([`fabric`]: strata's topology file, Slurm's `topology.conf`); and the tier joining any two
//! ranks of a communicator ([`tiers`]), which every rank computes alike. Nothing here knows
//! about collectives.

pub mod costs;
pub mod error;
pub mod fabric;
pub mod host;
pub mod hostlist;
#[cfg(feature = "hwloc")]
pub mod hwloc;
pub mod nccl_xml;
pub mod nvml;
pub mod profile;
pub mod report;
pub mod sysfs;
pub mod tiers;

pub use error::TopoError;
pub use fabric::{Fabric, MemoryTier, Place, SlotFill, TierCosts, TierLink};
pub use host::{GpuInfo, HostTopology, LinkLayer, NicInfo, PciDistance};
pub use profile::CostProfile;
pub use tiers::{RankPlace, TierMatrix};

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies the operating-system instance and network namespace a process runs in.
///
/// Two ranks with equal identities can share memory; ranks in different network namespaces of
/// one machine (emulated hosts) are treated as different hosts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostIdentity {
    /// The host name, for messages.
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: unique per boot of a kernel.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/net`.
    pub netns: String,
}

impl HostIdentity {
    /// Reads the identity of the calling process. Missing sources become empty strings.
    pub fn detect() -> Self {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_default());
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let netns = std::fs::read_link("/proc/self/ns/net")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self {
            hostname,
            boot_id,
            netns,
        }
    }

    /// Whether two processes can map the same shared memory segment (same kernel instance and
    /// network namespace). Unknown boot ids never match.
    pub fn same_host(&self, other: &Self) -> bool {
        self.same_kernel(other) && self.netns == other.netns
    }

    /// Whether two processes run on the same kernel instance, and so share its cores, in any
    /// network namespace. Unknown boot ids never match.
    pub fn same_kernel(&self, other: &Self) -> bool {
        !self.boot_id.is_empty() && self.boot_id == other.boot_id
    }
}

impl fmt::Display for HostIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hostname)
    }
}

/// The narrowest level of the machine that joins two ranks, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// Both ranks use the same device.
    SameDevice,
    /// GPUs joined by NVLink.
    NvLink,
    /// Same host: PCIe and shared memory.
    Host,
    /// Hosts under one leaf switch.
    Leaf,
    /// Leaves under one pod's spines.
    Pod,
    /// Across the aggregation layer.
    Aggregation,
}

impl Tier {
    /// The tier joining two hosts when nothing is known about the fabric: same host or network.
    pub fn between(a: &HostIdentity, b: &HostIdentity) -> Tier {
        if a.same_host(b) {
            Tier::Host
        } else {
            Tier::Aggregation
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_this_process_matches_itself() {
        let me = HostIdentity::detect();
        assert!(me.same_host(&me.clone()) || me.boot_id.is_empty());
        let mut other = me.clone();
        other.netns = "net:[1]".into();
        assert!(!me.same_host(&other) || me.netns == "net:[1]");
        assert_eq!(
            Tier::between(&me, &other),
            if me.same_host(&other) {
                Tier::Host
            } else {
                Tier::Aggregation
            }
        );
    }

    #[test]
    fn unknown_boot_id_is_never_the_same_host() {
        let a = HostIdentity {
            hostname: "a".into(),
            boot_id: String::new(),
            netns: String::new(),
        };
        assert!(!a.same_host(&a.clone()));
    }
}
