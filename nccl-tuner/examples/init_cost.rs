//! How long `init` prices a communicator: `cargo run --release -p strata-nccl-tuner --example
//! init_cost -- FILE RANKS NODES`; with `STRATA_NCCL_TUNER_CACHE=DIR`, as `init` does, the
//! first run prices and keeps the table there and the next reads it.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let fab = strata_topology::fabric::load_file(std::path::Path::new(&a[1])).unwrap();
    let (ranks, nodes): (usize, usize) = (a[2].parse().unwrap(), a[3].parse().unwrap());
    let s = std::time::Instant::now();
    let dir = std::env::var_os("STRATA_NCCL_TUNER_CACHE").map(std::path::PathBuf::from);
    let hosts: Vec<usize> = (0..nodes).collect();
    let (m, origin) = nccl_tuner_strata::cache::model_for(&fab, ranks, &hosts, dir.as_deref());
    println!(
        "{ranks} ranks on {nodes} nodes: {:.1} ms, {} prices extrapolated ({}); {origin:?}",
        s.elapsed().as_secs_f64() * 1e3,
        m.extrapolated,
        m.described
    );
    use nccl_tuner_strata::model::{algo, func};
    for k in [3usize, 16, 20, 24, 28] {
        let tree = m
            .seconds(func::ALL_REDUCE, algo::TREE, 1 << k)
            .unwrap_or(f64::NAN);
        let ring = m
            .seconds(func::ALL_REDUCE, algo::RING, 1 << k)
            .unwrap_or(f64::NAN);
        println!(
            "  all-reduce 2^{k}: tree {:.1} us, ring {:.1} us",
            tree * 1e6,
            ring * 1e6
        );
    }
}
