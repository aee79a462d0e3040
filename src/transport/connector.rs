//! The seam every transport implements: whether it can join two ranks, what its connecting
//! half offers, and how its accepting half answers. The connection layer walks
//! [`TABLE`](super::TABLE) in order and takes the first transport that can connect; the
//! listener hands the offer to the transport it names. Neither knows any transport by name.

use super::Transport;
use crate::config::Config;
use crate::error::Result;
use crate::wire::PeerInfo;
use std::net::TcpStream;

/// What a transport's connecting half (the lower rank of the pair) works with.
pub(crate) struct Dial<'a> {
    /// The communicator's id.
    pub comm: &'a str,
    /// This rank.
    pub me: &'a PeerInfo,
    /// The higher rank it connects to.
    pub peer: &'a PeerInfo,
    /// Settings.
    pub cfg: &'a Config,
    /// Opens side stream `index` to the peer's listener: an authenticated TCP stream the
    /// listener keeps for this transport's accepting half.
    pub open_stream: &'a dyn Fn(usize) -> Result<TcpStream>,
}

/// What a transport's accepting half (the higher rank's listener) works with.
pub(crate) struct Answer<'a> {
    /// Settings.
    pub cfg: &'a Config,
    /// Takes side streams `0..n` that the connecting half opened, waiting for them until the
    /// handshake timeout.
    pub take_streams: &'a dyn Fn(usize) -> Result<Vec<TcpStream>>,
}

/// The accepting half's result: its data path, and what it tells the connecting half (`null`
/// when nothing).
pub(crate) struct Accepted {
    /// The data path.
    pub data: Box<dyn Transport>,
    /// The reply to the offer.
    pub reply: serde_json::Value,
}

/// A connecting half waiting for the accepting half's answer. Dropping it unanswered releases
/// whatever it holds for the peer (a named segment, a registry entry).
pub(crate) trait Offer: Send {
    /// What the accepting half needs to build its side.
    fn setup(&self) -> serde_json::Value;
    /// Completes the data path with the accepting half's reply.
    fn finish(self: Box<Self>, reply: serde_json::Value) -> Result<Box<dyn Transport>>;
}

/// One row of the transport table.
pub(crate) trait Connector: Sync {
    /// The name the offer travels under and logs use: `shm`, `tcp`.
    fn name(&self) -> &'static str;
    /// What this rank publishes for this transport at bootstrap ([`PeerInfo::transports`]), or
    /// `None`; an error when `cfg` demands what this process cannot do.
    fn publish(&self, _cfg: &Config) -> Result<Option<serde_json::Value>> {
        Ok(None)
    }
    /// Whether this transport joins `me` and `peer` under `cfg`, from what both published.
    fn can_connect(&self, cfg: &Config, me: &PeerInfo, peer: &PeerInfo) -> bool;
    /// The connecting half: builds this side and says what the peer needs to know.
    fn offer(&self, dial: &Dial<'_>) -> Result<Box<dyn Offer>>;
    /// The accepting half: builds this side from the connecting half's `setup`. An error is
    /// sent back to the connecting rank as the reason it was refused.
    fn accept(&self, answer: &Answer<'_>, setup: serde_json::Value) -> Result<Accepted>;
}

/// Reads a transport's own setup record out of an offer or a reply.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    transport: &str,
    v: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(v).map_err(|e| {
        crate::error::Error::Transport(format!("malformed {transport} connection setup: {e}"))
    })
}

/// A record as the JSON value an offer or a reply carries.
pub(crate) fn encode<T: serde::Serialize>(
    transport: &str,
    record: &T,
) -> Result<serde_json::Value> {
    serde_json::to_value(record).map_err(|e| {
        crate::error::Error::Transport(format!("encoding the {transport} connection setup: {e}"))
    })
}
