//! Connections between two ranks of a communicator: a data path (a [`Transport`]) plus a TCP
//! control stream that carries out-of-band frames (failure notices, goodbyes) and whose loss
//! means the peer is gone.
//!
//! The lower rank of a pair always opens the connection ([`dial`]): it walks the transport
//! table for the first transport that joins the two ranks, builds its half, and sends the
//! offer on the control stream. The higher rank's listener ([`listener`]) authenticates it,
//! hands the offer to the transport it names, and parks the finished connection until the
//! owning thread asks for it, so opening a connection never waits for the other rank's thread.
//! The listener serves the other kinds of incoming connection (bootstrap tree edges, watchdog
//! links, status and census questions, shrinks) through handlers their modules register.

mod dial;
mod listener;

pub(crate) use crate::wire::ControlFrame;
pub(crate) use dial::{connect, probe};
pub(crate) use listener::{CommListener, DESTROYED, NOT_SERVED, Routes};

use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::wire::PeerInfo;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Largest control frame.
const MAX_CONTROL_FRAME: usize = 1 << 20;

/// A connection to one peer.
pub(crate) struct Connection {
    pub peer: usize,
    pub data: Box<dyn Transport>,
    pub control: TcpStream,
    control_in: Vec<u8>,
    /// The peer said goodbye.
    pub gone: bool,
    /// Bytes of the current operation's incoming header read so far.
    pub hdr_in: Vec<u8>,
}

impl Connection {
    fn new(peer: usize, data: Box<dyn Transport>, control: TcpStream) -> Result<Self> {
        control
            .set_nonblocking(true)
            .map_err(|e| Error::io("control stream", e))?;
        control.set_read_timeout(None).ok();
        Ok(Self {
            peer,
            data,
            control,
            control_in: Vec::new(),
            gone: false,
            hdr_in: Vec::new(),
        })
    }

    /// Waits, up to `within`, until nothing this side sent is still on its way to the peer
    /// ([`Transport::sending`]), so a goodbye never overtakes the data and tearing the
    /// connection down loses nothing. A connection that fails meanwhile has nothing left to
    /// wait for. Returns `false` only when the time ran out with data still on its way.
    pub fn finish_sending(&mut self, within: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            match self.data.sending() {
                Ok(false) | Err(_) => return true,
                Ok(true) if start.elapsed() >= within => return false,
                Ok(true) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }

    /// Sends a control frame (best effort: the peer may already be gone).
    pub fn send_control(&mut self, frame: &ControlFrame) {
        let Ok(body) = serde_json::to_vec(frame) else {
            return;
        };
        let mut buf = (body.len() as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(&body);
        let _ = self.control.set_nonblocking(false);
        let _ = self.control.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.control.write_all(&buf);
        let _ = self.control.set_nonblocking(true);
    }

    /// Reads whatever control frames have arrived. `Ok(None)` when nothing is pending; an
    /// `Err` when the peer failed or vanished without a goodbye.
    pub fn poll_control(&mut self, peer_info: &PeerInfo) -> Result<Option<ControlFrame>> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(frame) = self.take_frame()? {
                if matches!(frame, ControlFrame::Goodbye) {
                    self.gone = true;
                }
                return Ok(Some(frame));
            }
            match self.control.read(&mut chunk) {
                Ok(0) => {
                    if self.gone {
                        return Ok(None);
                    }
                    return Err(Error::PeerFailed {
                        rank: self.peer,
                        host: peer_info.host.hostname.clone(),
                        pid: peer_info.pid,
                        reason: format!(
                            "connection closed without a goodbye (pid {} exited or was killed?)",
                            peer_info.pid
                        ),
                    });
                }
                Ok(n) => self.control_in.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if self.gone {
                        return Ok(None);
                    }
                    return Err(Error::PeerFailed {
                        rank: self.peer,
                        host: peer_info.host.hostname.clone(),
                        pid: peer_info.pid,
                        reason: format!("control stream: {e}"),
                    });
                }
            }
        }
    }

    fn take_frame(&mut self) -> Result<Option<ControlFrame>> {
        if self.control_in.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([
            self.control_in[0],
            self.control_in[1],
            self.control_in[2],
            self.control_in[3],
        ]) as usize;
        if len > MAX_CONTROL_FRAME {
            return Err(Error::Transport(format!(
                "rank {} sent a {len}-byte control frame",
                self.peer
            )));
        }
        if self.control_in.len() < 4 + len {
            return Ok(None);
        }
        let frame = serde_json::from_slice(&self.control_in[4..4 + len]).map_err(|e| {
            Error::Transport(format!(
                "rank {} sent a malformed control frame: {e}",
                self.peer
            ))
        });
        self.control_in.drain(..4 + len);
        frame.map(Some)
    }
}
