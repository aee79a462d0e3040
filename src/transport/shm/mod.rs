//! Shared memory between processes of one host: a ring segment in `/dev/shm` that the
//! connecting rank creates and names, the accepting rank maps, and the name is removed as soon
//! as both have it mapped (or the offer is dropped unanswered).

use super::ring::{Geometry, RingEndpoint, ShmMemory};
use super::{Accepted, Answer, Connector, Dial, Offer, Transport, decode, encode, random_hex};
use crate::config::{Config, TransportPolicy};
use crate::error::{Error, Result};
use crate::wire::PeerInfo;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Longest segment name accepted from a peer.
const MAX_NAME: usize = 200;

/// Shared memory's row of the transport table.
pub(crate) struct Shm;

/// The row itself.
pub(crate) static CONNECTOR: Shm = Shm;

/// What the connecting half tells the accepting half.
#[derive(Serialize, Deserialize)]
struct ShmSetup {
    /// The segment's name in `/dev/shm`.
    name: String,
}

/// A created segment waiting for the peer to map it.
struct Created {
    setup: serde_json::Value,
    ring: Option<RingEndpoint>,
    memory: Arc<ShmMemory>,
}

impl Offer for Created {
    fn setup(&self) -> serde_json::Value {
        self.setup.clone()
    }

    fn finish(mut self: Box<Self>, _reply: serde_json::Value) -> Result<Box<dyn Transport>> {
        // Both sides have it mapped; the name is no longer needed.
        self.memory.unlink();
        let ring = self
            .ring
            .take()
            .ok_or_else(|| Error::Transport("internal: shm ring finished twice".into()))?;
        Ok(Box::new(ring))
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        // Answered or not, nobody else will open it by name.
        self.memory.unlink();
    }
}

/// How old a segment's name must be before a dead creator's segment is removed.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Removes the segments of processes that no longer exist: a rank killed between creating a
/// segment and its peer mapping it (when the name is removed) leaves it behind, and leaks
/// fill /dev/shm. A segment's name carries its creator's process id
/// (`/dev/shm/strata-<pid>-<hex>`); one still used by a live process, or made in the last 30 s,
/// is never touched.
/// Once per process, at its first shared-memory connection.
pub(crate) fn reap_stale_segments() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("strata-"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        // A name lives for the milliseconds between creation and the peer's open; an older
        // one is a leak. (The age also spares a live creator whose pid this process cannot
        // see, in another pid namespace sharing /dev/shm.)
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = old
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!("removed {removed} shared-memory segments of dead processes from /dev/shm");
    }
}

impl Connector for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn can_connect(&self, cfg: &Config, me: &PeerInfo, peer: &PeerInfo) -> bool {
        cfg.transport != TransportPolicy::Tcp && me.host.same_host(&peer.host)
    }

    fn offer(&self, dial: &Dial<'_>) -> Result<Box<dyn Offer>> {
        let geo = Geometry {
            slots: dial.cfg.shm_slots,
            slot_size: dial.cfg.shm_slot_size,
        };
        static REAPED: std::sync::Once = std::sync::Once::new();
        REAPED.call_once(reap_stale_segments);
        let name = format!("/strata-{}-{}", std::process::id(), random_hex());
        let memory = Arc::new(
            ShmMemory::create(&name, geo.segment_bytes())
                .map_err(|e| Error::io(format!("creating {name}"), e))?,
        );
        let ring = RingEndpoint::create(memory.clone(), geo, "shm")
            .map_err(|e| Error::io("shm ring", e))?;
        Ok(Box::new(Created {
            setup: encode(self.name(), &ShmSetup { name })?,
            ring: Some(ring),
            memory,
        }))
    }

    fn accept(&self, _answer: &Answer<'_>, setup: serde_json::Value) -> Result<Accepted> {
        let ShmSetup { name } = decode(self.name(), setup)?;
        if !name.starts_with("/strata-") || name.len() > MAX_NAME || name[1..].contains('/') {
            return Err(Error::InvalidArgument(format!("bad segment name {name:?}")));
        }
        let memory = ShmMemory::open(&name).map_err(|e| Error::io(format!("opening {name}"), e))?;
        let ring =
            RingEndpoint::attach(Arc::new(memory), "shm").map_err(|e| Error::io("shm ring", e))?;
        Ok(Accepted {
            data: Box::new(ring),
            reply: serde_json::Value::Null,
        })
    }
}
