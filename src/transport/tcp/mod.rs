//! TCP: the transport every pair of ranks can use, between hosts or (under
//! `STRATA_TRANSPORT=tcp`) within one. The connecting rank opens the data streams as side
//! streams of the connection, then the control stream says how many and how they are striped.

mod stream;

pub(crate) use stream::{TcpTransport, tune_socket};

use super::{Accepted, Answer, Connector, Dial, Offer, Transport, decode, encode};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::wire::PeerInfo;
use serde::{Deserialize, Serialize};

/// Most data streams one connection may ask for.
const MAX_STREAMS: usize = 64;

/// TCP's row of the transport table.
pub(crate) struct Tcp;

/// The row itself.
pub(crate) static CONNECTOR: Tcp = Tcp;

/// What the connecting half tells the accepting half.
#[derive(Serialize, Deserialize)]
struct TcpSetup {
    /// Data streams opened before the control stream.
    streams: usize,
    /// Bytes per stripe.
    stripe: usize,
}

/// A TCP connecting half: its data path is complete before the answer.
struct Opened {
    setup: serde_json::Value,
    data: TcpTransport,
}

impl Offer for Opened {
    fn setup(&self) -> serde_json::Value {
        self.setup.clone()
    }

    fn finish(self: Box<Self>, _reply: serde_json::Value) -> Result<Box<dyn Transport>> {
        Ok(Box::new(self.data))
    }
}

impl Connector for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn can_connect(&self, _cfg: &Config, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        true
    }

    fn offer(&self, dial: &Dial<'_>) -> Result<Box<dyn Offer>> {
        let cfg = dial.cfg;
        let mut streams = Vec::with_capacity(cfg.tcp_streams);
        for index in 0..cfg.tcp_streams {
            let s = (dial.open_stream)(index)?;
            tune_socket(&s, cfg.socket_buffer).map_err(|e| Error::io("socket options", e))?;
            streams.push(s);
        }
        let data = TcpTransport::new(streams, cfg.tcp_stripe)
            .map_err(|e| Error::io("tcp transport", e))?;
        let setup = TcpSetup {
            streams: cfg.tcp_streams,
            stripe: cfg.tcp_stripe,
        };
        Ok(Box::new(Opened {
            setup: encode(self.name(), &setup)?,
            data,
        }))
    }

    fn accept(&self, answer: &Answer<'_>, setup: serde_json::Value) -> Result<Accepted> {
        let TcpSetup { streams, stripe } = decode(self.name(), setup)?;
        if streams == 0 || streams > MAX_STREAMS {
            return Err(Error::InvalidArgument(format!(
                "{streams} streams requested (1 to {MAX_STREAMS})"
            )));
        }
        let list = (answer.take_streams)(streams)?;
        for s in &list {
            tune_socket(s, answer.cfg.socket_buffer).map_err(|e| Error::io("socket options", e))?;
        }
        let data = TcpTransport::new(list, stripe).map_err(|e| Error::io("tcp transport", e))?;
        Ok(Accepted {
            data: Box::new(data),
            reply: serde_json::Value::Null,
        })
    }
}
