//! Priced tables kept between communicators (`STRATA_NCCL_TUNER_CACHE=DIR`).
//!
//! Pricing a communicator grows with its ranks (0.2-0.5 s at 2,048, 3-5 s at 24,576, 13-19 s
//! at 98,304 on a 2-core VM), and every rank of every job on the same fabric prices
//! the same thing. With a cache directory, `init` first looks there for the table of its key
//! (a hash of the plugin's version, the fabric's layout and tier costs, the ranks and the
//! fabric hosts of its nodes) and reads it: a file of one line per collective and power of
//! two, the same whatever the ranks. Without one it prices, and then writes the table through
//! a file of its own beside it and a rename, so a reader never sees half of one and ranks
//! writing at once leave one whole table. A table that cannot be read (cut short, another
//! version) is priced again and replaced; a directory that cannot be written costs nothing
//! but the write.

use std::path::{Path, PathBuf};

use crate::model::Model;
use strata_topology::fabric::Fabric;

/// Where a communicator's model came from.
#[derive(Debug)]
pub enum Origin {
    /// Read from this table.
    Loaded(PathBuf),
    /// Priced now; then written to this table, or why not (`None`: no cache directory).
    Priced(Option<Result<PathBuf, String>>),
    /// Priced now because the table there could not be used (why), then written again.
    Replaced(PathBuf, String, Result<(), String>),
}

/// 64-bit FNV-1a: stable across processes and builds, unlike `std`'s hasher.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of a communicator of `n_ranks` ranks on fabric hosts `hosts` of `fab`: what its
/// prices depend on (the file's path and name do not count, nor tier figures the plugin
/// drops, [`crate::model::nccl_tiers`]).
pub fn key(fab: &Fabric, n_ranks: usize, hosts: &[usize]) -> u64 {
    let what = format!(
        "{} {} {:?} {:?} {n_ranks} {hosts:?}",
        env!("CARGO_PKG_VERSION"),
        fab.gpus_per_host,
        fab.layout,
        crate::model::nccl_tiers(fab.tiers)
    );
    fnv1a(what.as_bytes(), 0xcbf2_9ce4_8422_2325)
}

/// The table file of `key` in `dir`.
pub fn table_path(dir: &Path, key: u64, n_ranks: usize, n_nodes: usize) -> PathBuf {
    dir.join(format!(
        "strata-nccl-{n_ranks}r-{n_nodes}n-{key:016x}.table"
    ))
}

/// Writes `model`'s table to `path` through a file of this process's own and a rename.
fn store(path: &Path, model: &Model, key: u64) -> Result<(), String> {
    let tmp = path.with_extension(format!("partial.{}", std::process::id()));
    std::fs::write(&tmp, model.to_table(key))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", path.display())
        })
}

/// The model of a communicator of `n_ranks` ranks on `hosts` of `fab`: read from `dir`'s
/// table when it holds a good one, else priced (and, with `dir`, written there).
pub fn model_for(
    fab: &Fabric,
    n_ranks: usize,
    hosts: &[usize],
    dir: Option<&Path>,
) -> (Model, Origin) {
    let Some(dir) = dir else {
        return (Model::build(fab, n_ranks, hosts), Origin::Priced(None));
    };
    let key = key(fab, n_ranks, hosts);
    let path = table_path(dir, key, n_ranks, hosts.len());
    let bad = match std::fs::read_to_string(&path) {
        Ok(text) => match Model::from_table(&text, key) {
            Ok(m) if m.shape() == (n_ranks, hosts.len()) => return (m, Origin::Loaded(path)),
            Ok(m) => Some(format!("it is for {:?} (ranks, nodes)", m.shape())),
            Err(e) => Some(e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
    };
    let model = Model::build(fab, n_ranks, hosts);
    let stored = store(&path, &model, key);
    let origin = match bad {
        Some(why) => Origin::Replaced(path, why, stored),
        None => Origin::Priced(Some(stored.map(|()| path))),
    };
    (model, origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{algo, func};
    use strata_topology::fabric;

    fn emulated() -> Fabric {
        let text = include_str!("../../examples/topology/emulated-fat-tree.toml");
        fabric::parse_file(text, "emulated-fat-tree.toml").unwrap()
    }

    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn temp_dir(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    /// Every price of the table, NaN where unmodelled, as bits.
    fn bits(m: &Model) -> Vec<u64> {
        let mut out = Vec::new();
        for f in [
            func::ALL_REDUCE,
            func::ALL_GATHER,
            func::REDUCE_SCATTER,
            func::BROADCAST,
        ] {
            for k in 0..=30 {
                for a in 0..algo::COUNT {
                    out.push(m.seconds(f, a, 1 << k).map_or(u64::MAX, f64::to_bits));
                }
            }
        }
        out
    }

    /// A table reads back to the same prices, bit for bit; another key, a cut, a bad number
    /// are refused with a reason.
    #[test]
    fn a_table_reads_back_to_the_same_prices() {
        let fab = emulated();
        let m = Model::build(&fab, 8, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let text = m.to_table(7);
        let back = Model::from_table(&text, 7).unwrap();
        assert_eq!(bits(&back), bits(&m));
        assert!(bits(&m).contains(&u64::MAX), "unmodelled entries exist");
        assert_eq!(back.shape(), (8, 8));
        assert!(Model::from_table(&text, 8).unwrap_err().contains("key"));
        let cut = &text[..text.len() - 40];
        assert!(Model::from_table(cut, 7).is_err());
        let lines: Vec<&str> = text.lines().collect();
        let short = lines[..lines.len() - 1].join("\n");
        let e = Model::from_table(&short, 7).unwrap_err();
        assert!(e.contains("price lines"), "{e}");
        let garbled = text.replacen(" 0.", " x.", 1);
        assert!(Model::from_table(&garbled, 7).is_err());
    }

    /// The first communicator prices and writes; the next reads; another shape prices on its
    /// own; a spoilt table is priced again and replaced.
    #[test]
    fn a_cache_directory_prices_each_communicator_once() {
        let fab = emulated();
        let dir = temp_dir("nccl-cache");
        let hosts: Vec<usize> = (0..8).collect();
        let (first, origin) = model_for(&fab, 8, &hosts, Some(&dir.0));
        let Origin::Priced(Some(Ok(path))) = origin else {
            panic!("{origin:?}");
        };
        assert!(path.exists());
        let (again, origin) = model_for(&fab, 8, &hosts, Some(&dir.0));
        assert!(
            matches!(origin, Origin::Loaded(ref p) if *p == path),
            "{origin:?}"
        );
        assert_eq!(bits(&again), bits(&first));
        // Figures the plugin does not price with leave the key as it was.
        let mut host_copies = fab.clone();
        host_copies.tiers.slot_fill = Some(strata_topology::SlotFill {
            slot_kib: 8.0,
            gbps: 1.0,
        });
        assert_eq!(key(&host_copies, 8, &hosts), key(&fab, 8, &hosts));
        // Other nodes of the fabric: another key, another table.
        let other: Vec<usize> = (0..4).chain(6..10).collect();
        assert_ne!(key(&fab, 8, &other), key(&fab, 8, &hosts));
        let (_, origin) = model_for(&fab, 8, &other, Some(&dir.0));
        assert!(matches!(origin, Origin::Priced(Some(Ok(_)))), "{origin:?}");
        // Cut short: priced again, replaced, then read.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        let (fresh, origin) = model_for(&fab, 8, &hosts, Some(&dir.0));
        assert!(
            matches!(origin, Origin::Replaced(_, _, Ok(()))),
            "{origin:?}"
        );
        assert_eq!(bits(&fresh), bits(&first));
        assert!(matches!(
            model_for(&fab, 8, &hosts, Some(&dir.0)).1,
            Origin::Loaded(_)
        ));
        // Nothing left behind but the tables.
        let names: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".table")), "{names:?}");
        // A directory that cannot be written: priced, the failure said.
        let missing = dir.0.join("no/such/dir");
        let (_, origin) = model_for(&fab, 8, &hosts, Some(&missing));
        assert!(matches!(origin, Origin::Priced(Some(Err(_)))), "{origin:?}");
    }
}
