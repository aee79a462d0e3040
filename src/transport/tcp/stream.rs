//! The data path: several non-blocking streams per peer, bytes striped across them in
//! fixed-size stripes (stripe k of the connection's byte stream travels on stream k mod n).

use crate::transport::{Direction, Transport, Wait};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Bytes of the receive staging buffer used for reductions.
const STAGING: usize = 1 << 20;

/// A striped multi-stream TCP connection.
pub(crate) struct TcpTransport {
    streams: Vec<TcpStream>,
    stripe: u64,
    sent: u64,
    received: u64,
    staging: Vec<u64>,
    st_start: usize,
    st_end: usize,
}

/// Sets the options every data socket gets: no Nagle, large buffers, non-blocking.
pub(crate) fn tune_socket(s: &TcpStream, buffer_bytes: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    let fd = s.as_raw_fd();
    let size = buffer_bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setting an int socket option on a valid descriptor.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &size as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    Ok(())
}

impl TcpTransport {
    /// Wraps connected streams (same order on both sides).
    pub fn new(streams: Vec<TcpStream>, stripe: usize) -> io::Result<Self> {
        if streams.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no streams"));
        }
        for s in &streams {
            s.set_nonblocking(true)?;
        }
        Ok(Self {
            streams,
            stripe: stripe.max(4096) as u64,
            sent: 0,
            received: 0,
            staging: vec![0u64; STAGING / 8],
            st_start: 0,
            st_end: 0,
        })
    }

    fn next_stream(&self, pos: u64) -> (usize, usize) {
        let idx = ((pos / self.stripe) % self.streams.len() as u64) as usize;
        let room = (self.stripe - pos % self.stripe) as usize;
        (idx, room)
    }

    fn staging_bytes(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.staging)
    }

    /// Reads from the streams straight into `dst`, respecting stripe boundaries.
    fn read_streams(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < dst.len() {
            let (idx, room) = self.next_stream(self.received);
            let n = room.min(dst.len() - done);
            match self.streams[idx].read(&mut dst[done..done + n]) {
                // Bytes read before a close or an error are delivered first; the next read
                // meets the close again and reports it. (A peer that sends its last bytes and
                // exits at once must not lose them to the read-ahead that finds its FIN.)
                Ok(0) if done > 0 => break,
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed by peer",
                    ));
                }
                Ok(k) => {
                    done += k;
                    self.received += k as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn fill_staging(&mut self) -> io::Result<()> {
        if self.st_start == self.st_end {
            self.st_start = 0;
            self.st_end = 0;
        } else if !self.st_start.is_multiple_of(64) || self.st_end == STAGING {
            let (s, e) = (self.st_start, self.st_end);
            self.staging_bytes().copy_within(s..e, 0);
            self.st_end = e - s;
            self.st_start = 0;
        }
        let end = self.st_end;
        let mut tmp = std::mem::take(&mut self.staging);
        let got = self.read_streams(&mut bytemuck::cast_slice_mut(&mut tmp)[end..]);
        self.staging = tmp;
        self.st_end += got?;
        Ok(())
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < data.len() {
            let (idx, room) = self.next_stream(self.sent);
            let n = room.min(data.len() - done);
            match self.streams[idx].write(&data[done..done + n]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "connection closed",
                    ));
                }
                Ok(k) => {
                    done += k;
                    self.sent += k as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn send_some_pair(&mut self, head: &[u8], tail: &[u8]) -> io::Result<usize> {
        // A small pair goes out in one write (one segment, one system call).
        const JOIN_MAX: usize = 4096;
        let n = head.len() + tail.len();
        if n > JOIN_MAX || head.is_empty() || tail.is_empty() {
            return crate::transport::send_in_turn(self, head, tail);
        }
        let mut joined = [0u8; JOIN_MAX];
        joined[..head.len()].copy_from_slice(head);
        joined[head.len()..n].copy_from_slice(tail);
        self.send_some(&joined[..n])
    }

    fn recv_some(
        &mut self,
        max: usize,
        granule: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let granule = granule.max(1);
        let mut consumed = 0;
        loop {
            let avail = self.st_end - self.st_start;
            let take = avail.min(max - consumed);
            let take = take - take % granule;
            if take > 0 {
                let (s, e) = (self.st_start, self.st_start + take);
                f(&bytemuck::cast_slice::<u64, u8>(&self.staging)[s..e]);
                self.st_start += take;
                consumed += take;
            }
            if consumed + granule > max {
                return Ok(consumed);
            }
            let before = self.st_end - self.st_start;
            self.fill_staging()?;
            if self.st_end - self.st_start == before {
                return Ok(consumed);
            }
        }
    }

    fn peek(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.st_end - self.st_start < dst.len() {
            self.fill_staging()?;
        }
        let n = (self.st_end - self.st_start).min(dst.len());
        let s = self.st_start;
        dst[..n].copy_from_slice(&bytemuck::cast_slice::<u64, u8>(&self.staging)[s..s + n]);
        Ok(n)
    }

    fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let staged = (self.st_end - self.st_start).min(dst.len());
        if staged > 0 {
            let s = self.st_start;
            let from = &bytemuck::cast_slice::<u64, u8>(&self.staging)[s..s + staged];
            crate::copy::copy(&mut dst[..staged], from);
            self.st_start += staged;
        }
        Ok(staged + self.read_streams(&mut dst[staged..])?)
    }

    fn wait_for(&mut self, dir: Direction) -> Wait {
        match dir {
            Direction::Send => Wait::Fd {
                fd: self.streams[self.next_stream(self.sent).0].as_raw_fd(),
                events: libc::POLLOUT,
            },
            Direction::Recv => Wait::Fd {
                fd: self.streams[self.next_stream(self.received).0].as_raw_fd(),
                events: libc::POLLIN,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Two ends of `streams` loopback streams striped by `stripe` bytes.
    fn striped_pair(streams: usize, stripe: usize) -> (TcpTransport, TcpTransport) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut client = Vec::new();
        let mut server = Vec::new();
        for _ in 0..streams {
            client.push(TcpStream::connect(addr).unwrap());
            server.push(l.accept().unwrap().0);
        }
        (
            TcpTransport::new(client, stripe).unwrap(),
            TcpTransport::new(server, stripe).unwrap(),
        )
    }

    #[test]
    fn striped_streams_preserve_order_and_reduce_granules() {
        let (mut a, mut b) = striped_pair(3, 4096);
        let data: Vec<u8> = (0..200_001u32).map(|i| (i % 253) as u8).collect();
        let mut got = Vec::new();
        let mut sent = 0;
        let start = std::time::Instant::now();
        while got.len() < data.len() {
            assert!(start.elapsed().as_secs() < 20);
            sent += a.send_some(&data[sent..]).unwrap();
            let want = data.len() - got.len();
            // Deliver in granules of 4 bytes except for the ragged end.
            let g = if want >= 4 { 4 } else { 1 };
            b.recv_some(want, g, &mut |x| {
                assert_eq!(x.len() % g, 0);
                got.extend_from_slice(x)
            })
            .unwrap();
        }
        assert_eq!(got, data);
    }

    #[test]
    fn pairs_arrive_whole_and_in_order_small_or_large() {
        let (mut a, mut b) = striped_pair(1, 1 << 20);
        let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        // Joined into one write (small), then sent in turn (large).
        let mut want = [[7u8; 32].as_slice(), &[3; 40]].concat();
        want.extend_from_slice(&[8; 32]);
        want.extend_from_slice(&big);
        assert_eq!(a.send_some_pair(&[7; 32], &[3; 40]).unwrap(), 72);
        let mut sent = a.send_some_pair(&[8; 32], &big).unwrap();
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.len() < want.len() {
            assert!(start.elapsed().as_secs() < 20);
            if sent < 32 + big.len() {
                sent += if sent < 32 {
                    a.send_some_pair(&[8; 32][sent..], &big).unwrap()
                } else {
                    a.send_some(&big[sent - 32..]).unwrap()
                };
            }
            b.recv_some(want.len() - got.len(), 1, &mut |x| got.extend_from_slice(x))
                .unwrap();
        }
        assert_eq!(got, want);
    }

    /// A peer that sends its last bytes and closes at once (a rank leaving after its part of
    /// the last call): the bytes are delivered, and only the next read reports the close.
    #[test]
    fn last_bytes_before_a_close_are_delivered_before_the_eof() {
        let (mut a, mut b) = striped_pair(2, 4096);
        // 6000 bytes: the first stripe on one stream, the rest on the other.
        let data: Vec<u8> = (0..6000u32).map(|i| (i % 249) as u8).collect();
        let mut sent = 0;
        while sent < data.len() {
            sent += a.send_some(&data[sent..]).unwrap();
        }
        drop(a);
        // Both FINs are queued behind the data before the first read.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.len() < data.len() {
            assert!(start.elapsed().as_secs() < 20);
            b.recv_some(data.len() - got.len(), 4, &mut |x| got.extend_from_slice(x))
                .expect("bytes sent before the close");
        }
        assert_eq!(got, data);
        let err = b.recv_some(4, 4, &mut |_| ()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(b.recv_into(&mut [0u8; 8]).is_err());
    }
}
