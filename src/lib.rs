//! strata: topology-aware collective communication.
//!
//! A collective is *planned* once by `strata-algorithms` (a pure [`RankSchedule`] per rank) and
//! *executed* many times by this crate's runtime over shared memory, TCP or in-process rings.
//! [`Communicator`] is the type most users need:
//!
//! ```no_run
//! use strata::{Communicator, ReduceOp, UniqueId};
//! // Rank 0 creates the id and ships its 128 bytes to the others (any channel will do).
//! let id = UniqueId::new()?;
//! let comm = Communicator::init(&id, 1, 0)?;
//! let mut grads = vec![1.0f32; 1024];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok::<(), strata::Error>(())
//! ```
//!
//! [`RankSchedule`]: strata_algorithms::RankSchedule

pub mod bootstrap;
pub mod check;
mod comm;
pub mod config;
mod connection;
pub mod copy;
mod diagnosis;
pub mod dtype;
pub mod error;
mod executor;
pub mod gpu;
pub mod launcher;
pub mod metrics;
pub mod reduce;
pub mod status;
pub(crate) mod transport;
pub mod tuning;
pub mod watchdog;
mod wire;

pub use bootstrap::{PeerInfo, UNIQUE_ID_BYTES, UniqueId};
pub use comm::device::{DeviceTransfer, DeviceWork, GpuPath, KernelChoice, KernelTiming, Staged};
pub use comm::{CallSpec, Communicator, LayoutComms, Transfer, tuner_trial_calls};
pub use config::{Config, RankOrder, TransportPolicy};
pub use dtype::{DataType, Element, F8E4M3, F8E5M2, ReduceOp, Scalar};
pub use error::{Error, Result};
pub use strata_algorithms::{Algorithm, Collective};
pub use transport::rdma;
pub use watchdog::{FlightRecord, Progress, Straggler};
pub use wire::HostProbe;

/// Host and fabric topology: discovery, NCCL XML, Slurm and strata topology files, tiers.
pub use strata_topology as topology;

/// The pure schedule library: algorithms, schedules, the cost model and the in-memory checker.
pub use strata_algorithms as algorithms;

/// Starts `tracing` output once, filtered by `STRATA_LOG` (e.g. `STRATA_LOG=debug`), or by
/// `NCCL_DEBUG=INFO|WARN`; quiet (errors only) by default. Does nothing if the application
/// already installed a subscriber.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("STRATA_LOG").ok().or_else(|| {
            std::env::var("NCCL_DEBUG")
                .ok()
                .map(|v| match v.to_ascii_uppercase().as_str() {
                    "INFO" | "TRACE" => "debug".to_string(),
                    "WARN" => "warn".to_string(),
                    _ => "error".to_string(),
                })
        });
        let filter =
            tracing_subscriber::EnvFilter::try_new(filter.unwrap_or_else(|| "error".into()))
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
