//! The C entry points, by family. Each is re-exported at the crate root under its C name.

mod calls;
mod comms;
mod memory;

pub use calls::*;
pub use comms::*;
pub(crate) use comms::{derive, init_rank};
pub use memory::*;
