//! RDMA's row of the transport table: each rank publishes the providers it can use
//! ([`RdmaCaps`]); a pair that shares one (under `STRATA_TRANSPORT`) connects its queue pairs
//! or endpoints through the offer and the reply.

use super::protocol::{RdmaSetup, RdmaTransport};
use super::{ProviderKind, RdmaCaps, caps_for, choose, open};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::{Accepted, Answer, Connector, Dial, Offer, Transport, decode, encode};
use crate::wire::{PeerInfo, peer_failed};

/// RDMA's row of the transport table.
pub(crate) struct Rdma;

/// The row itself.
pub(crate) static CONNECTOR: Rdma = Rdma;

/// The providers `p` published (none if it published nothing, or something unreadable).
fn caps_of(p: &PeerInfo) -> RdmaCaps {
    p.transports
        .get(CONNECTOR.name())
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The provider `me` and `peer` use under `cfg`, if RDMA.
pub(crate) fn provider_between(
    cfg: &Config,
    me: &PeerInfo,
    peer: &PeerInfo,
) -> Option<ProviderKind> {
    choose(
        cfg.transport,
        &caps_of(me),
        &caps_of(peer),
        me.host.same_host(&peer.host),
    )
}

/// A connecting half waiting for the peer's queue pairs or endpoints.
struct Pending {
    transport: RdmaTransport,
    setup: serde_json::Value,
    peer: PeerInfo,
}

impl Offer for Pending {
    fn setup(&self) -> serde_json::Value {
        self.setup.clone()
    }

    fn finish(self: Box<Self>, reply: serde_json::Value) -> Result<Box<dyn Transport>> {
        let theirs: RdmaSetup = decode(CONNECTOR.name(), reply)?;
        let Pending {
            mut transport,
            peer,
            ..
        } = *self;
        transport.connect(&theirs, true).map_err(|e| {
            peer_failed(
                &peer,
                format!(
                    "connecting to its {} ({}) failed: {e}",
                    theirs.provider.name(),
                    theirs.device
                ),
            )
        })?;
        Ok(Box::new(transport))
    }
}

impl Connector for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn publish(&self, cfg: &Config) -> Result<Option<serde_json::Value>> {
        let caps = caps_for(cfg)?;
        if caps == RdmaCaps::default() {
            return Ok(None);
        }
        encode(self.name(), &caps).map(Some)
    }

    fn can_connect(&self, cfg: &Config, me: &PeerInfo, peer: &PeerInfo) -> bool {
        provider_between(cfg, me, peer).is_some()
    }

    fn offer(&self, dial: &Dial<'_>) -> Result<Box<dyn Offer>> {
        let kind = provider_between(dial.cfg, dial.me, dial.peer).ok_or_else(|| {
            Error::Unsupported(format!("no RDMA provider joins rank {}", dial.peer.rank))
        })?;
        let fabric = open(kind, &dial.cfg.rdma)
            .map_err(|e| Error::Unsupported(format!("{}: {e}", kind.name())))?;
        let transport = RdmaTransport::from_config(fabric, &dial.cfg.rdma)
            .map_err(|e| Error::io(format!("{} transport", kind.name()), e))?;
        Ok(Box::new(Pending {
            setup: encode(self.name(), &transport.setup())?,
            transport,
            peer: dial.peer.clone(),
        }))
    }

    fn accept(&self, answer: &Answer<'_>, setup: serde_json::Value) -> Result<Accepted> {
        let theirs: RdmaSetup = decode(self.name(), setup)?;
        let transport = RdmaTransport::accept(&theirs, &answer.cfg.rdma)
            .map_err(|e| Error::Transport(format!("{}: {e}", theirs.provider.name())))?;
        Ok(Accepted {
            reply: encode(self.name(), &transport.setup())?,
            data: Box::new(transport),
        })
    }
}
