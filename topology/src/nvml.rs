//! NVLink connectivity from NVML, loaded at run time (`libnvidia-ml.so.1` through
//! `nvml-wrapper`), so the build needs no CUDA and a host without the library or a GPU is
//! simply reported as such.

use crate::host::{HostTopology, NvLink, PciNode};
use nvml_wrapper::Nvml;

/// What NVML says about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlGpu {
    /// PCI bus id, normalised to `dddd:bb:dd.f`.
    pub bus_id: String,
    /// Active NVLinks, grouped by remote end.
    pub nvlinks: Vec<NvLink>,
}

/// NVML's `00000000:1B:00.0` as strata's `0000:1b:00.0`.
pub fn normalize_bus_id(s: &str) -> String {
    let s = s.trim().trim_end_matches('\0').to_ascii_lowercase();
    match s.len() {
        n if n > 12 => s[n - 12..].to_string(),
        _ => s,
    }
}

/// Lists the GPUs NVML sees with their active NVLinks, or says why it cannot.
/// A link whose far end is not one of the GPUs is taken to end at an NVSwitch.
pub fn probe() -> Result<Vec<NvmlGpu>, String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    let mut gpus: Vec<(String, Vec<(String, u32)>)> = Vec::new();
    for i in 0..count {
        let dev = nvml.device_by_index(i).map_err(|e| e.to_string())?;
        let bus = normalize_bus_id(&dev.pci_info().map_err(|e| e.to_string())?.bus_id);
        let mut links: Vec<(String, u32)> = Vec::new();
        for l in 0..nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS {
            let link = dev.link_wrapper_for(l);
            if !link.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote) = link.remote_pci_info() else {
                continue;
            };
            let target = normalize_bus_id(&remote.bus_id);
            match links.iter_mut().find(|(t, _)| *t == target) {
                Some(e) => e.1 += 1,
                None => links.push((target, 1)),
            }
        }
        gpus.push((bus, links));
    }
    let ids: Vec<String> = gpus.iter().map(|g| g.0.clone()).collect();
    Ok(gpus
        .into_iter()
        .map(|(bus_id, links)| NvmlGpu {
            bus_id,
            nvlinks: links
                .into_iter()
                .map(|(target, count)| NvLink {
                    to_switch: !ids.contains(&target),
                    target,
                    count,
                })
                .collect(),
        })
        .collect())
}

/// Attaches NVML's NVLinks to the matching GPUs of `topo`; returns how many GPUs matched.
pub fn merge(topo: &mut HostTopology, gpus: &[NvmlGpu]) -> usize {
    fn visit(n: &mut PciNode, gpus: &[NvmlGpu], hits: &mut usize) {
        if let Some(g) = gpus.iter().find(|g| g.bus_id == n.bus_id) {
            n.nvlinks = g.nvlinks.clone();
            *hits += 1;
        }
        for c in &mut n.children {
            visit(c, gpus, hits);
        }
    }
    let mut hits = 0;
    for numa in &mut topo.numa {
        for n in &mut numa.pci {
            visit(n, gpus, &mut hits);
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("0000:1b:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id(""), "");
    }

    #[test]
    fn merge_attaches_links_to_the_right_gpus() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/azure-ndv5-h100-nccl-topo.xml");
        let mut t = crate::nccl_xml::load(&path).unwrap();
        let link = NvLink {
            target: "0000:ff:00.0".into(),
            count: 18,
            to_switch: true,
        };
        let gpus = vec![
            NvmlGpu {
                bus_id: "0001:00:00.0".into(),
                nvlinks: vec![link.clone()],
            },
            NvmlGpu {
                bus_id: "9999:00:00.0".into(),
                nvlinks: vec![],
            },
        ];
        assert_eq!(merge(&mut t, &gpus), 1);
        let g = t.gpus();
        assert_eq!(g[0].nvlinks, vec![link]);
        assert!(g[1].nvlinks.is_empty());
    }

    #[test]
    fn probe_reports_instead_of_failing() {
        match probe() {
            Err(reason) => println!("NVML query skipped: {reason}"),
            Ok(gpus) => {
                for g in gpus {
                    assert_eq!(g.bus_id.len(), 12, "{g:?}");
                }
            }
        }
    }
}
