//! Bootstrap: the unique id and the rendezvous that hands every rank the rank table (through
//! the root's directory and a tree of the ranks' listeners, see [`tree`]).
//!
//! The connections it makes are authenticated and their frames bounded ([`crate::wire`]).

use crate::error::{Error, Result};
use crate::wire::{Secret, deepen_backlog, random_bytes};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

/// What every rank publishes about itself (kept here too, where users find it).
pub use crate::wire::PeerInfo;

mod tree;
pub use tree::{JobRoot, TREE_FANOUT, directory_registration_time, tree_depth};
pub(crate) use tree::{TreeInbox, rendezvous, tree_children, tree_parent};

/// Bytes in a [`UniqueId`], as in `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 8] = b"STRATAID";
/// The byte that is 1 when the root listened before the id existed (a root served by
/// [`UniqueId::new`]): a refused connection to it then means the root is gone, not late.
const ROOT_LISTENED_FIRST: usize = 44;
/// How long a rank keeps trying a root that listened first and now refuses connections.
pub(crate) const ROOT_GONE_GRACE: Duration = Duration::from_secs(2);

/// The token every rank of a job needs to join it: a magic, the root's address and a fresh
/// random secret. Opaque 128 bytes, like `ncclUniqueId`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        write!(f, "UniqueId(root {})", self.root_addr())
    }
}

impl UniqueId {
    /// Creates an id and starts the rendezvous root in this process, listening on the
    /// configured interface (like `ncclGetUniqueId`). The root serves one communicator and
    /// exits when it is built or when the init deadline runs out.
    pub fn new() -> Result<Self> {
        let cfg = crate::Config::from_env()?;
        Self::serve(
            SocketAddr::new(cfg.listen_ip, 0),
            random_bytes()?,
            cfg.init_timeout,
        )
    }

    /// Starts a root bound to `addr` with the given secret (used by `from_env` on rank 0).
    pub(crate) fn serve(addr: SocketAddr, secret: Secret, timeout: Duration) -> Result<Self> {
        Self::serve_door(addr, secret, timeout, None)
    }

    /// [`UniqueId::serve`] for a job's well-known root: after init the root stays open for
    /// status clients until the returned [`JobRoot`] is dropped.
    pub(crate) fn serve_job(
        addr: SocketAddr,
        secret: Secret,
        timeout: Duration,
    ) -> Result<(Self, JobRoot)> {
        let (root, door) = tree::job_root();
        let id = Self::serve_door(addr, secret, timeout, Some(door))?;
        Ok((id, root))
    }

    fn serve_door(
        addr: SocketAddr,
        secret: Secret,
        timeout: Duration,
        door: Option<tree::RootDoor>,
    ) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("binding the bootstrap root to {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap root address", e))?;
        deepen_backlog(&listener, 4096);
        let mut id = Self::from_parts(local, &secret);
        id.bytes[ROOT_LISTENED_FIRST] = 1;
        std::thread::Builder::new()
            .name("strata-root".into())
            .spawn(move || tree::directory_main(listener, secret, timeout, door))
            .map_err(|e| Error::io("spawning the bootstrap root", e))?;
        Ok(id)
    }

    /// An id naming an existing root.
    pub(crate) fn from_parts(root: SocketAddr, secret: &Secret) -> Self {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes[..8].copy_from_slice(ID_MAGIC);
        bytes[8] = 1; // layout version
        match root.ip() {
            IpAddr::V4(ip) => {
                bytes[9] = 4;
                bytes[12..16].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes[9] = 6;
                bytes[12..28].copy_from_slice(&ip.octets());
            }
        }
        bytes[10..12].copy_from_slice(&root.port().to_be_bytes());
        bytes[28..44].copy_from_slice(secret);
        Self { bytes }
    }

    /// Parses 128 bytes produced by [`UniqueId::as_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "a unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        if &bytes[..8] != ID_MAGIC || bytes[8] != 1 || !matches!(bytes[9], 4 | 6) {
            return Err(Error::InvalidArgument(
                "not a strata unique id (bad magic or version)".into(),
            ));
        }
        Ok(Self { bytes })
    }

    /// The opaque bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// The id as 256 hex digits, for passing it through an environment variable or a file.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`UniqueId::to_hex`]'s output.
    pub fn from_hex(s: &str) -> Result<Self> {
        let bytes = decode_hex(s).ok_or_else(|| {
            Error::InvalidArgument("a unique id in hex must be 256 hex digits".into())
        })?;
        Self::from_bytes(&bytes)
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        let port = u16::from_be_bytes([self.bytes[10], self.bytes[11]]);
        let ip = if self.bytes[9] == 6 {
            let o: [u8; 16] = self.bytes[12..28].try_into().unwrap_or([0; 16]);
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                self.bytes[12],
                self.bytes[13],
                self.bytes[14],
                self.bytes[15],
            ))
        };
        SocketAddr::new(ip, port)
    }

    /// Whether the root listened before this id was made, so that it cannot be late.
    pub(crate) fn root_listened_first(&self) -> bool {
        self.bytes[ROOT_LISTENED_FIRST] == 1
    }

    pub(crate) fn secret(&self) -> Secret {
        self.bytes[28..44].try_into().unwrap_or([0; 16])
    }
}

/// Decodes an even number of hex digits (surrounding white space ignored).
pub(crate) fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_and_rejects_garbage() {
        let id = UniqueId::from_parts("127.0.0.1:4242".parse().unwrap(), &[7; 16]);
        let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
        assert_eq!(back.root_addr(), "127.0.0.1:4242".parse().unwrap());
        assert_eq!(back.secret(), [7; 16]);
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(UniqueId::from_hex("abc").is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
        assert_eq!(decode_hex(" 0aff "), Some(vec![0x0a, 0xff]));
        assert!(!format!("{id:?}").contains("7, 7"));
    }

    /// A rank given the id of a root that listened first and is gone (its process exited; a
    /// stale id read again from a store that outlived a restart) says so within the grace,
    /// instead of retrying until the init deadline; the same address in an id whose root may
    /// still be starting (from `from_env`) is retried.
    #[test]
    fn an_id_whose_root_is_gone_fails_at_once_and_says_why() {
        let gone = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = gone.local_addr().unwrap();
        drop(gone);
        let mut id = UniqueId::from_parts(addr, &[3; 16]);
        id.bytes[ROOT_LISTENED_FIRST] = 1;
        let mut cfg = crate::Config::from_env().unwrap();
        cfg.init_timeout = Duration::from_secs(30);
        let start = std::time::Instant::now();
        let Err(err) = crate::Communicator::init_with_config(&id, 2, 1, cfg.clone()) else {
            panic!("init with a gone root succeeded");
        };
        let took = start.elapsed();
        let text = err.to_string();
        assert!(
            text.contains("nothing listens there any more") && text.contains("the id is stale"),
            "{text}"
        );
        assert!(
            took < ROOT_GONE_GRACE + Duration::from_secs(3),
            "{took:?}: {text}"
        );
        // Without the flag, refusals are a root not up yet: retried to the deadline.
        cfg.init_timeout = Duration::from_secs(4);
        let late = UniqueId::from_parts(addr, &[3; 16]);
        let start = std::time::Instant::now();
        let Err(err) = crate::Communicator::init_with_config(&late, 2, 1, cfg) else {
            panic!("init with a gone root succeeded");
        };
        assert!(start.elapsed() >= Duration::from_secs(4), "{err}");
        assert!(err.to_string().contains("timed out"), "{err}");
    }
}
