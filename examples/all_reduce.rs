//! Four ranks as threads of one process all-reduce a vector.
//!
//! Run: `cargo run --release --example all_reduce`. For ranks in separate processes the same
//! code runs with the unique id's 128 bytes shipped to every process (see `collbench`).

use strata::{Communicator, ReduceOp, UniqueId};

fn main() -> strata::Result<()> {
    let nranks = 4;
    let id = UniqueId::new()?; // starts the rendezvous root in this process
    let ranks: Vec<_> = (0..nranks)
        .map(|rank| {
            std::thread::spawn(move || -> strata::Result<Vec<f32>> {
                let comm = Communicator::init(&id, nranks, rank)?;
                let mut grads = vec![rank as f32; 8];
                comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
                Ok(grads)
            })
        })
        .collect();
    for (rank, r) in ranks.into_iter().enumerate() {
        let grads = r.join().expect("rank thread panicked")?;
        println!("rank {rank}: {:?}", grads);
    }
    Ok(())
}
