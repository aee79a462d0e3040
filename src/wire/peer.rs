//! What every rank publishes about itself at bootstrap.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use strata_topology::HostIdentity;

/// What every rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Rank in the communicator.
    pub rank: usize,
    /// Host identity (decides shared memory).
    pub host: HostIdentity,
    /// Process id, for messages.
    pub pid: u32,
    /// A random number unique to the process (decides the in-process transport).
    pub process: u64,
    /// Where the rank's listener accepts data connections.
    pub listen: SocketAddr,
    /// Its GPU, NIC and switch path, from which every rank computes the same tiers.
    #[serde(default)]
    pub place: strata_topology::RankPlace,
    /// What each transport of the table published about this rank, by transport name (the
    /// RDMA providers it can use, for example); a transport with nothing to say is absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transports: BTreeMap<String, serde_json::Value>,
    /// What init measured of its host, from which every rank prices alike.
    #[serde(default)]
    pub probe: HostProbe,
}

/// What a rank measured of its host at init (`crate::comm::probe`): every rank takes the
/// same figures from the list of all of them. On the wire it is four numbers (`[cores, copy,
/// reduce, bound cpu]`, about 30 bytes of a table entry's ~300), since every rank receives
/// every rank's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "[u32; 4]", into = "[u32; 4]")]
pub struct HostProbe {
    /// Cores online on its host (0: unknown).
    pub cores: u32,
    /// Its memcpy rate, MB/s copied (0: not measured).
    pub copy_mbps: u32,
    /// Its rate of summing f32, MB/s of input combined (0: not measured).
    pub reduce_mbps: u32,
    /// One more than the CPU it is bound to, when its launcher bound it to exactly one (0:
    /// free to run on several): with it, the ranks of a host know which of them share a core.
    pub bound_cpu: u32,
}

impl PeerInfo {
    /// `host h (pid 4242)` for messages.
    pub fn describe(&self) -> String {
        format!("host {} (pid {})", self.host.hostname, self.pid)
    }
}

/// The random number identifying this process.
pub(crate) fn process_nonce() -> u64 {
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        super::random_bytes::<8>()
            .map(u64::from_le_bytes)
            .unwrap_or(std::process::id() as u64)
    })
}

impl From<[u32; 4]> for HostProbe {
    fn from([cores, copy_mbps, reduce_mbps, bound_cpu]: [u32; 4]) -> Self {
        Self {
            cores,
            copy_mbps,
            reduce_mbps,
            bound_cpu,
        }
    }
}

impl From<HostProbe> for [u32; 4] {
    fn from(p: HostProbe) -> Self {
        [p.cores, p.copy_mbps, p.reduce_mbps, p.bound_cpu]
    }
}
