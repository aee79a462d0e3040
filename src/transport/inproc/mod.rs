//! Rings between threads of one process: the connecting rank allocates the ring on the heap
//! and registers it under a random key; the accepting rank takes it from the registry.

use super::ring::{Geometry, HeapMemory, Memory, RingEndpoint};
use super::{Accepted, Answer, Connector, Dial, Offer, Transport, decode, encode, random_hex};
use crate::config::{Config, TransportPolicy};
use crate::error::{Error, Result};
use crate::wire::PeerInfo;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The in-process row of the transport table.
pub(crate) struct InProcess;

/// The row itself.
pub(crate) static CONNECTOR: InProcess = InProcess;

/// Ring segments handed between threads of one process, by key.
fn registry() -> &'static Mutex<HashMap<String, Arc<HeapMemory>>> {
    static REG: OnceLock<Mutex<HashMap<String, Arc<HeapMemory>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// What the connecting half tells the accepting half.
#[derive(Serialize, Deserialize)]
struct InProcessSetup {
    /// The segment's key in this process's registry.
    key: String,
}

/// A registered ring waiting for the peer thread to take it.
struct Registered {
    setup: serde_json::Value,
    key: String,
    ring: Option<RingEndpoint>,
}

impl Offer for Registered {
    fn setup(&self) -> serde_json::Value {
        self.setup.clone()
    }

    fn finish(mut self: Box<Self>, _reply: serde_json::Value) -> Result<Box<dyn Transport>> {
        let ring = self
            .ring
            .take()
            .ok_or_else(|| Error::Transport("internal: in-process ring finished twice".into()))?;
        Ok(Box::new(ring))
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Whatever happened, the peer took the segment or never will.
        if let Ok(mut r) = registry().lock() {
            r.remove(&self.key);
        }
    }
}

impl Connector for InProcess {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn can_connect(&self, cfg: &Config, me: &PeerInfo, peer: &PeerInfo) -> bool {
        cfg.transport != TransportPolicy::Tcp
            && me.host.same_host(&peer.host)
            && me.process == peer.process
    }

    fn offer(&self, dial: &Dial<'_>) -> Result<Box<dyn Offer>> {
        let geo = Geometry {
            slots: dial.cfg.shm_slots,
            slot_size: dial.cfg.shm_slot_size,
        };
        let memory = Arc::new(
            HeapMemory::new(geo.segment_bytes()).map_err(|e| Error::io("ring allocation", e))?,
        );
        let ring = RingEndpoint::create(memory.clone(), geo, "inproc")
            .map_err(|e| Error::io("inproc ring", e))?;
        let key = format!(
            "{}-{}-{}-{}",
            dial.comm,
            dial.me.rank,
            dial.peer.rank,
            random_hex()
        );
        registry()
            .lock()
            .map_err(|_| Error::Transport("registry lock poisoned".into()))?
            .insert(key.clone(), memory);
        Ok(Box::new(Registered {
            setup: encode(self.name(), &InProcessSetup { key: key.clone() })?,
            key,
            ring: Some(ring),
        }))
    }

    fn accept(&self, _answer: &Answer<'_>, setup: serde_json::Value) -> Result<Accepted> {
        let InProcessSetup { key } = decode(self.name(), setup)?;
        let memory = registry().lock().ok().and_then(|mut r| r.remove(&key));
        let Some(memory) = memory else {
            return Err(Error::InvalidArgument("unknown in-process segment".into()));
        };
        let memory: Arc<dyn Memory> = memory;
        let ring =
            RingEndpoint::attach(memory, "inproc").map_err(|e| Error::io("inproc ring", e))?;
        Ok(Accepted {
            data: Box::new(ring),
            reply: serde_json::Value::Null,
        })
    }
}
