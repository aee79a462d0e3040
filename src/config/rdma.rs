//! RDMA settings: NCCL's `NCCL_IB_*` variables where they mean the same, `STRATA_RDMA_*` and
//! `STRATA_OFI_PROVIDER` for the rest.

use crate::error::{Error, Result};

/// One `NCCL_IB_HCA` entry: a device name (prefix, or exact with `=`) and optionally a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    /// Device name or prefix.
    pub name: String,
    /// Port, if given (`mlx5_0:1`).
    pub port: Option<u8>,
}

/// RDMA settings.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Lanes (queue pairs or endpoints) per connection (`NCCL_IB_QPS_PER_CONNECTION`,
    /// default 2): slots are spread over them, so a large message travels on all of them.
    pub lanes: usize,
    /// Receive slots per direction of a connection: the credits (`STRATA_RDMA_SLOTS`,
    /// default 8, at most 128).
    pub slots: usize,
    /// Bytes per slot (`STRATA_RDMA_SLOT_SIZE`, default 512 KiB, a multiple of 4 KiB, at most
    /// 8 MiB).
    pub slot_size: usize,
    /// Devices to use or avoid (`NCCL_IB_HCA`: `mlx5_0:1,mlx5_1`, `=mlx5_0` exact, `^mlx5_2`
    /// excluded).
    pub hca: Vec<HcaFilter>,
    /// Whether `NCCL_IB_HCA` lists devices to avoid (`^`).
    pub hca_exclude: bool,
    /// Whether `NCCL_IB_HCA` names match exactly (`=`).
    pub hca_exact: bool,
    /// RoCE GID index (`NCCL_IB_GID_INDEX`; default: the first RoCE v2 GID, else 0).
    pub gid_index: Option<u8>,
    /// Traffic class (`NCCL_IB_TC`, default 0).
    pub traffic_class: u8,
    /// InfiniBand service level (`NCCL_IB_SL`, default 0).
    pub service_level: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (`NCCL_IB_TIMEOUT`, default 20).
    pub timeout: u8,
    /// Transport retries (`NCCL_IB_RETRY_CNT`, default 7).
    pub retry_cnt: u8,
    /// Verbs turned off (`NCCL_IB_DISABLE=1`).
    pub ib_disabled: bool,
    /// The libfabric provider to use (`STRATA_OFI_PROVIDER`, else `FI_PROVIDER`): `efa`,
    /// `cxi`, `verbs;ofi_rxm`, `tcp;ofi_rxm`, ...
    pub ofi_provider: Option<String>,
    /// The network interface this rank's socket traffic uses (from the listen address): the
    /// verbs device on the same PCI function is preferred, and libfabric's domain of that name.
    pub interface: Option<String>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            lanes: 2,
            slots: 8,
            slot_size: 512 << 10,
            hca: Vec::new(),
            hca_exclude: false,
            hca_exact: false,
            gid_index: None,
            traffic_class: 0,
            service_level: 0,
            timeout: 20,
            retry_cnt: 7,
            ib_disabled: false,
            ofi_provider: None,
            interface: None,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    name: &str,
    default: T,
    min: T,
    max: T,
) -> Result<T> {
    let Some(v) = env(name) else {
        return Ok(default);
    };
    match v.trim().parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "{name}={v}: expected a number from {min} to {max}"
        ))),
    }
}

impl RdmaConfig {
    /// Reads the environment; a malformed value is an error naming the variable.
    pub fn from_env() -> Result<Self> {
        let d = Self::default();
        let slot_size = number("STRATA_RDMA_SLOT_SIZE", d.slot_size, 4096, 8 << 20)?;
        if !slot_size.is_multiple_of(4096) {
            return Err(Error::InvalidArgument(format!(
                "STRATA_RDMA_SLOT_SIZE={slot_size}: must be a multiple of 4096"
            )));
        }
        let (hca, hca_exclude, hca_exact) = match env("NCCL_IB_HCA") {
            Some(v) => parse_hca(&v)?,
            None => (Vec::new(), false, false),
        };
        Ok(Self {
            lanes: number("NCCL_IB_QPS_PER_CONNECTION", d.lanes, 1, 16)?,
            slots: number("STRATA_RDMA_SLOTS", d.slots, 2, 128)?,
            slot_size,
            hca,
            hca_exclude,
            hca_exact,
            gid_index: match env("NCCL_IB_GID_INDEX") {
                // NCCL's -1 means "choose": the default here too.
                Some(v) if v.trim() == "-1" => None,
                Some(_) => Some(number("NCCL_IB_GID_INDEX", 0u8, 0, 255)?),
                None => None,
            },
            traffic_class: number("NCCL_IB_TC", 0u8, 0, 255)?,
            service_level: number("NCCL_IB_SL", 0u8, 0, 15)?,
            timeout: number("NCCL_IB_TIMEOUT", d.timeout, 1, 31)?,
            retry_cnt: number("NCCL_IB_RETRY_CNT", d.retry_cnt, 0, 7)?,
            ib_disabled: number("NCCL_IB_DISABLE", 0u8, 0, 1)? == 1,
            ofi_provider: env("STRATA_OFI_PROVIDER").or_else(|| env("FI_PROVIDER")),
            interface: None,
        })
    }

    /// Whether device `name` (port `port`) passes `NCCL_IB_HCA`.
    pub fn hca_allows(&self, name: &str, port: u8) -> bool {
        if self.hca.is_empty() {
            return true;
        }
        let listed = self.hca.iter().any(|f| {
            let name_ok = if self.hca_exact {
                f.name == name
            } else {
                name.starts_with(&f.name)
            };
            name_ok && f.port.is_none_or(|p| p == port)
        });
        listed != self.hca_exclude
    }
}

/// Parses `NCCL_IB_HCA`: `[^][=]name[:port][,name[:port]...]`.
fn parse_hca(v: &str) -> Result<(Vec<HcaFilter>, bool, bool)> {
    let mut s = v.trim();
    let exclude = s.starts_with('^');
    if exclude {
        s = &s[1..];
    }
    let exact = s.starts_with('=');
    if exact {
        s = &s[1..];
    }
    let mut list = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, port) = match item.split_once(':') {
            Some((n, p)) => {
                let port = p.parse::<u8>().map_err(|_| {
                    Error::InvalidArgument(format!("NCCL_IB_HCA={v}: bad port in {item}"))
                })?;
                (n, Some(port))
            }
            None => (item, None),
        };
        list.push(HcaFilter {
            name: name.to_string(),
            port,
        });
    }
    if list.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "NCCL_IB_HCA={v}: no device named"
        )));
    }
    Ok((list, exclude, exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_ib_hca_forms() {
        let (l, ex, exact) = parse_hca("mlx5_0:1,mlx5_1").unwrap();
        assert_eq!(l.len(), 2);
        assert!(!ex && !exact);
        let cfg = RdmaConfig {
            hca: l,
            ..Default::default()
        };
        assert!(cfg.hca_allows("mlx5_0", 1));
        assert!(!cfg.hca_allows("mlx5_0", 2));
        assert!(cfg.hca_allows("mlx5_1", 2));
        assert!(cfg.hca_allows("mlx5_10", 1), "a prefix matches without =");
        assert!(!cfg.hca_allows("mlx4_0", 1));

        let (l, ex, exact) = parse_hca("^=mlx5_1").unwrap();
        let cfg = RdmaConfig {
            hca: l,
            hca_exclude: ex,
            hca_exact: exact,
            ..Default::default()
        };
        assert!(cfg.hca_allows("mlx5_0", 1));
        assert!(!cfg.hca_allows("mlx5_1", 1));
        assert!(cfg.hca_allows("mlx5_10", 1), "= matches exactly");
        assert!(parse_hca("mlx5_0:x").is_err());
        assert!(parse_hca("^").is_err());
    }
}
