use strata_algorithms::Algorithm;
use strata_algorithms::schedule::Collective;
use strata_algorithms::tuner::Tuner;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let fab = strata_topology::fabric::load_file(std::path::Path::new(&a[1])).unwrap();
    let ranks: usize = a[2].parse().unwrap();
    let bytes: usize = a[3].parse().unwrap();
    let h = strata_algorithms::Hierarchy::on_fabric(&fab, &(0..ranks).collect::<Vec<_>>());
    let t = Tuner::new(h, fab.tiers, true);
    let s = std::time::Instant::now();
    let p = t
        .price(Collective::AllReduce, Algorithm::Tree, bytes)
        .seconds;
    println!(
        "tree: {:?} in {:.1} ms",
        p.map(|x| x * 1e3),
        s.elapsed().as_secs_f64() * 1e3
    );
}
