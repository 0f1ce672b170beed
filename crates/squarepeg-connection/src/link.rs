//! Driving a [`Connection`] on a connection of a sans-IO `squarepeg_tcp::Endpoint`: what
//! the simulator's hosts and the tests do, with no I/O anywhere (the endpoint is fed packets
//! and the time by whoever owns it).

use std::time::Instant;

use squarepeg_framing::encode_padding;
use squarepeg_tcp::{CloseReason, ConnectionHandle, Endpoint, Error as TcpError, Padder};

use crate::{Connection, Receive, Send, TransportError};

/// Bytes read from the TCP connection per segment read.
const READ_CHUNK: usize = 64 * 1024;

/// Bytes of frames taken from the session at a time on a byte-stream connection: the next
/// batch only when the TCP has taken the last one, so frames wait in the session, where the
/// scheduler still orders them.
const WRITE_SLICE: usize = 16 * 1024;

/// The TCP settings a connection of `substrate` needs on top of `base`: for segments,
/// unordered receive; for tagged writes, consistent segmentation (each message starts a
/// segment, Minion §4.2) and, with `inconsistent_retransmissions`, the uCOBS padder that lets
/// the queue replace the retransmission of expired messages with live ones (Hollywood §4.2).
pub fn tcp_config(
    base: squarepeg_tcp::ConnectionConfig,
    substrate: crate::Substrate,
    inconsistent_retransmissions: bool,
) -> squarepeg_tcp::ConnectionConfig {
    let mut c = base;
    if let Receive::Segments { .. } = substrate.receive {
        c.unordered_receive = true;
    }
    if substrate.send == Send::TaggedWrites {
        c.consistent_segmentation = true;
        c.message_writes = true;
        if inconsistent_retransmissions {
            c.padder = Some(Padder::from_fn(encode_padding));
        }
    }
    c
}

/// The end of a userspace TCP connection, as the session sees it.
pub fn transport_error(reason: CloseReason) -> TransportError {
    match reason {
        CloseReason::Normal => TransportError::PeerClosed,
        CloseReason::Reset => TransportError::Reset,
        CloseReason::Refused => TransportError::Refused,
        CloseReason::TimedOut => TransportError::TimedOut,
        CloseReason::Aborted => TransportError::Io(std::io::ErrorKind::ConnectionAborted),
    }
}

/// A failed operation on a userspace TCP connection, as the session sees it.
pub fn tcp_error(e: TcpError) -> TransportError {
    match e {
        TcpError::ConnectionReset => TransportError::Reset,
        TcpError::ConnectionRefused => TransportError::Refused,
        TcpError::TimedOut => TransportError::TimedOut,
        TcpError::Closed => TransportError::PeerClosed,
        TcpError::Aborted => TransportError::Io(std::io::ErrorKind::ConnectionAborted),
        TcpError::UnknownConnection | TcpError::NotConnected => {
            TransportError::Io(std::io::ErrorKind::NotConnected)
        }
        _ => TransportError::Io(std::io::ErrorKind::Other),
    }
}

/// Moves a [`Connection`]'s data between it and one connection of an endpoint, for either
/// substrate: an in-order byte stream (`read`/`write`) or the uTCP interface
/// (`read_segment`, `write_message`, `poll_report`).
#[derive(Debug)]
pub struct EndpointLink {
    handle: ConnectionHandle,
    /// Byte stream: frames taken from the connection, written from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// Segments: one segment read; under TLS on a byte stream, one read of ciphertext.
    read_buf: Vec<u8>,
    fin_pending: bool,
    /// The connection's own padder replaced the configured one.
    padder_installed: bool,
}

impl EndpointLink {
    /// The link of endpoint connection `handle` (opened with a config from [`tcp_config`]).
    pub fn new(handle: ConnectionHandle) -> Self {
        Self {
            handle,
            out: Vec::new(),
            out_pos: 0,
            read_buf: Vec::new(),
            fin_pending: false,
            padder_installed: false,
        }
    }

    /// The endpoint connection.
    pub fn handle(&self) -> ConnectionHandle {
        self.handle
    }

    /// Moves data both ways: what the TCP connection received into `conn`, the TCP queue's
    /// reports, what `conn` has to send into the TCP connection (as far as it takes it), and
    /// the end of either direction. Call after anything happened to the endpoint or to
    /// `conn` (a packet, a timer, an application call).
    pub fn drive(&mut self, now: Instant, conn: &mut Connection, ep: &mut Endpoint) {
        let h = self.handle;
        if let Receive::Segments { .. } = conn.substrate().receive
            && ep.connection(h).is_some_and(|c| !c.unordered_receive())
        {
            // Fails only for a connection already gone, which the reads below report.
            let _ = ep.enable_unordered_receive(h);
        }
        if !self.padder_installed {
            self.padder_installed = true;
            // Inconsistent retransmissions are on where the TCP config has a padder; the
            // connection's own one knows its record layer (TLS seals padding records).
            if ep.connection(h).is_some_and(|c| c.has_padder()) {
                let _ = ep.set_padder(h, conn.padder());
            }
        }
        self.take_reports(conn, ep);
        self.receive(now, conn, ep);
        self.send(now, conn, ep);
        self.take_reports(conn, ep);
        if !conn.is_transport_closed() {
            match ep.connection(h).map(|c| c.close_reason()) {
                None => conn.handle_transport_closed(now, TransportError::PeerClosed),
                Some(Some(reason)) if reason != CloseReason::Normal => {
                    conn.handle_transport_closed(now, transport_error(reason));
                }
                Some(_) => {}
            }
        }
    }

    fn take_reports(&mut self, conn: &mut Connection, ep: &mut Endpoint) {
        if conn.substrate().send != Send::TaggedWrites {
            return;
        }
        while let Ok(Some(report)) = ep.poll_report(self.handle) {
            conn.handle_report(report);
        }
    }

    fn receive(&mut self, now: Instant, conn: &mut Connection, ep: &mut Endpoint) {
        let h = self.handle;
        while conn.wants_read() {
            let read = match conn.substrate().receive {
                Receive::InOrder => match conn.take_receiver() {
                    Some(mut r) => {
                        let read = ep.read(h, r.buffer());
                        if let Ok(n) = read {
                            r.filled(n);
                        }
                        conn.return_receiver(now, r);
                        read
                    }
                    // Under TLS the core keeps its receiver (records are opened first): the
                    // bytes go in through `handle_bytes`.
                    None => {
                        if self.read_buf.len() < READ_CHUNK {
                            self.read_buf.resize(READ_CHUNK, 0);
                        }
                        let read = ep.read(h, &mut self.read_buf);
                        if let Ok(n) = read
                            && n > 0
                        {
                            conn.handle_bytes(now, &self.read_buf[..n]);
                        }
                        read
                    }
                },
                Receive::Segments { .. } => {
                    if self.read_buf.len() < READ_CHUNK {
                        self.read_buf.resize(READ_CHUNK, 0);
                    }
                    ep.read_segment(h, &mut self.read_buf).map(|seg| {
                        if seg.len > 0 {
                            conn.handle_segment(now, seg.offset, &self.read_buf[..seg.len]);
                        }
                        seg.len
                    })
                }
            };
            match read {
                Ok(0) => conn.handle_transport_closed(now, TransportError::PeerClosed),
                Ok(_) => {}
                Err(TcpError::WouldBlock) => break,
                Err(e) => conn.handle_transport_closed(now, tcp_error(e)),
            }
        }
    }

    fn send(&mut self, now: Instant, conn: &mut Connection, ep: &mut Endpoint) {
        let h = self.handle;
        match conn.substrate().send {
            Send::ByteStream => loop {
                if self.out_pos == self.out.len() {
                    self.out.clear();
                    self.out_pos = 0;
                    // Under TLS the output may hold records with no frame (a handshake
                    // flight, a KeyUpdate): what counts is whether there are bytes.
                    conn.poll_transmit(now, &mut self.out, WRITE_SLICE);
                    if self.out.is_empty() {
                        break;
                    }
                }
                match ep.write(h, &self.out[self.out_pos..]) {
                    Ok(0) | Err(TcpError::WouldBlock) => break,
                    Ok(n) => self.out_pos += n,
                    Err(e) => {
                        self.out.clear();
                        self.out_pos = 0;
                        conn.handle_transport_closed(now, tcp_error(e));
                        break;
                    }
                }
            },
            Send::TaggedWrites => {
                while let Some(w) = conn.poll_write(now) {
                    match ep.write_message(h, w.frame, w.tag) {
                        Ok(()) => conn.write_done(),
                        Err(TcpError::WouldBlock) => break,
                        Err(e) => {
                            conn.handle_transport_closed(now, tcp_error(e));
                            break;
                        }
                    }
                }
            }
        }
        if conn.poll_shutdown() {
            self.fin_pending = true;
        }
        if self.fin_pending && self.out_pos == self.out.len() {
            self.fin_pending = false;
            let _ = ep.shutdown(now, h);
        }
    }
}
