//! The connecting side: a data connection to a higher rank through the first transport of the
//! table that joins the two, and a probe of a peer's listener.

use super::Connection;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::{self, Dial};
use crate::wire::{
    self, ConnectKind, Msg, PeerInfo, Secret, TransportSetup, open_request, peer_failed,
};
use std::time::{Duration, Instant};

/// Checks that `peer`'s listener still answers for this communicator; `PeerFailed` if not.
pub(crate) fn probe(
    comm: &str,
    me: &PeerInfo,
    peer: &PeerInfo,
    secret: &Secret,
    cfg: &Config,
) -> Result<()> {
    let gone = |reason: String| peer_failed(peer, reason);
    let deadline = Instant::now() + cfg.handshake_timeout;
    let hs = cfg.handshake_timeout;
    let mut s = open_request(
        comm,
        me.rank,
        peer,
        secret,
        deadline,
        hs,
        ConnectKind::Probe,
    )
    .map_err(|e| {
        if wire::is_out_of_descriptors(&e) {
            return peer_failed(me, format!("probing rank {}: {e}", peer.rank));
        }
        let cause = wire::unreachable_cause(&e);
        gone(format!(
            "its listener at {} cannot be reached ({e}); {cause}",
            peer.listen
        ))
    })?;
    s.set_read_timeout(Some(cfg.handshake_timeout)).ok();
    match wire::recv_msg(&mut s) {
        Ok(Msg::Ack) => Ok(()),
        Ok(other) => Err(gone(format!(
            "its listener answered a probe with {other:?}"
        ))),
        Err(e) => Err(gone(format!("its listener did not answer a probe: {e}"))),
    }
}

/// Opens a connection from `me` to the higher rank `peer` through the first transport of the
/// table that joins them.
pub(crate) fn connect(
    comm: &str,
    me: &PeerInfo,
    peer: &PeerInfo,
    secret: &Secret,
    cfg: &Config,
    deadline: Instant,
) -> Result<Connection> {
    let hs = cfg.handshake_timeout;
    let unreachable = |e: Error| {
        if wire::is_out_of_descriptors(&e) {
            return peer_failed(me, format!("connecting to rank {}: {e}", peer.rank));
        }
        let cause = wire::unreachable_cause(&e);
        peer_failed(
            peer,
            format!(
                "its listener at {} cannot be reached ({e}); {cause}",
                peer.listen
            ),
        )
    };
    let request =
        |kind| open_request(comm, me.rank, peer, secret, deadline, hs, kind).map_err(unreachable);
    let connector = transport::choose(cfg, me, peer).ok_or_else(|| {
        Error::Unsupported(format!(
            "no transport joins rank {} and rank {}",
            me.rank, peer.rank
        ))
    })?;
    let name = connector.name();
    let open_stream = |index: usize| {
        request(ConnectKind::Stream {
            transport: name.to_string(),
            index,
        })
    };
    let offer = connector.offer(&Dial {
        comm,
        me,
        peer,
        cfg,
        open_stream: &open_stream,
    })?;
    let mut control = request(ConnectKind::Control {
        transport: TransportSetup {
            transport: name.to_string(),
            setup: offer.setup(),
        },
    })?;
    // The listener's side of the setup is bounded by the handshake timeout, so a reply that
    // has not come by then never will (a stopped or wedged peer).
    let reply_wait = hs.min(deadline.saturating_duration_since(Instant::now()));
    control
        .set_read_timeout(Some(reply_wait.max(Duration::from_millis(10))))
        .ok();
    match wire::recv_msg(&mut control)? {
        Msg::Accepted(reply) => {
            let data = offer.finish(reply)?;
            Connection::new(peer.rank, data, control)
        }
        Msg::Nack { reason } => Err(Error::Transport(format!(
            "rank {} refused the connection: {reason}",
            peer.rank
        ))),
        other => Err(Error::Transport(format!("unexpected reply {other:?}"))),
    }
}
