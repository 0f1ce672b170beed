//! The sans-IO core a connection's handles and drivers share: one connection
//! (`squarepeg_connection::Connection`, any substrate), or one session over several kernel-TCP
//! connections (`squarepeg_connection::MultipathConnection`), each of whose connections has a
//! driver task of its own. The application's side is the same session either way.

use std::time::Instant;

use squarepeg_connection::{
    Connection, Event, MultipathConnection, PathId, Send as SendKind, Session, Stats, Tls,
    TransportError,
};

/// Which transport connection of the core a driver runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Port {
    /// The only one.
    Single,
    /// One path of a multipath session.
    Path(PathId),
}

pub(crate) enum Core {
    Single(Box<Connection>),
    Multi(Box<MultipathConnection>),
}

impl From<Connection> for Core {
    fn from(c: Connection) -> Self {
        Core::Single(Box::new(c))
    }
}

impl From<MultipathConnection> for Core {
    fn from(m: MultipathConnection) -> Self {
        Core::Multi(Box::new(m))
    }
}

impl Core {
    pub(crate) fn session(&self) -> &Session {
        match self {
            Core::Single(c) => c.session(),
            Core::Multi(m) => m.session(),
        }
    }

    pub(crate) fn session_mut(&mut self) -> &mut Session {
        match self {
            Core::Single(c) => c.session_mut(),
            Core::Multi(m) => m.session_mut(),
        }
    }

    /// The single connection (`None` for a multipath session).
    pub(crate) fn single_mut(&mut self) -> Option<&mut Connection> {
        match self {
            Core::Single(c) => Some(c),
            Core::Multi(_) => None,
        }
    }

    pub(crate) fn multi_mut(&mut self) -> Option<&mut MultipathConnection> {
        match self {
            Core::Single(_) => None,
            Core::Multi(m) => Some(m),
        }
    }

    pub(crate) fn multi(&self) -> Option<&MultipathConnection> {
        match self {
            Core::Single(_) => None,
            Core::Multi(m) => Some(m),
        }
    }

    /// Whether writes leave as the TCP's tagged queue takes them (the driver must be woken for
    /// every message).
    pub(crate) fn sends_tagged(&self) -> bool {
        matches!(self, Core::Single(c) if c.substrate().send == SendKind::TaggedWrites)
    }

    /// Whether the core's idle timer gave memory back since the last call
    /// (`Connection::take_idle_released`; a multipath session's paths keep theirs).
    pub(crate) fn take_idle_released(&mut self) -> bool {
        match self {
            Core::Single(c) => c.take_idle_released(),
            Core::Multi(_) => false,
        }
    }

    /// Bytes the core's buffers hold (`Connection::buffer_capacity`; 0 for a multipath
    /// session, which does not count them).
    pub(crate) fn buffer_capacity(&self) -> usize {
        match self {
            Core::Single(c) => c.buffer_capacity(),
            Core::Multi(_) => 0,
        }
    }

    pub(crate) fn has_events(&self) -> bool {
        match self {
            Core::Single(c) => c.has_events(),
            Core::Multi(m) => m.session().has_events(),
        }
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        match self {
            Core::Single(c) => c.poll_event(),
            Core::Multi(m) => m.poll_event(),
        }
    }

    /// Ready for data: the TLS handshake is done (on some path).
    pub(crate) fn is_established(&self) -> bool {
        match self {
            Core::Single(c) => c.is_established(),
            Core::Multi(m) => m.has_usable_path(),
        }
    }

    /// Counters (of a multipath session: the session's, and the TLS counters of its
    /// lowest-numbered usable path; `Connection::multipath_stats` has the paths').
    pub(crate) fn stats(&self) -> Stats {
        match self {
            Core::Single(c) => c.stats(),
            Core::Multi(m) => {
                let mut s = Stats::default();
                s.session = m.stats().session;
                s.tls = self.tls().map(Tls::stats);
                s
            }
        }
    }

    /// The TLS connection (of a multipath session: its lowest-numbered usable path's).
    pub(crate) fn tls(&self) -> Option<&Tls> {
        match self {
            Core::Single(c) => c.tls(),
            Core::Multi(m) => m
                .paths()
                .iter()
                .find(|p| p.usable)
                .and_then(|p| m.tls(p.id)),
        }
    }

    pub(crate) fn tls_mut(&mut self) -> Option<&mut Tls> {
        match self {
            Core::Single(c) => c.tls_mut(),
            Core::Multi(m) => {
                let id = m.paths().iter().find(|p| p.usable)?.id;
                m.tls_mut(id)
            }
        }
    }

    // ------------------------------------------------------------------ per driver

    pub(crate) fn poll_shutdown(&mut self, port: Port) -> bool {
        match (self, port) {
            (Core::Single(c), _) => c.poll_shutdown(),
            (Core::Multi(m), Port::Path(id)) => m.poll_shutdown(id),
            (Core::Multi(_), Port::Single) => false,
        }
    }

    pub(crate) fn wants_read(&self, port: Port) -> bool {
        match (self, port) {
            (Core::Single(c), _) => c.wants_read(),
            (Core::Multi(m), Port::Path(id)) => m.wants_read(id),
            (Core::Multi(_), Port::Single) => false,
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Core::Single(c) => c.poll_timeout(),
            Core::Multi(m) => m.poll_timeout(),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self {
            Core::Single(c) => c.handle_timeout(now),
            Core::Multi(m) => m.handle_timeout(now),
        }
    }

    /// Whether the driver of `port` stops: the connection is finished, or (multipath) its
    /// path is closed or ended after the session.
    pub(crate) fn is_drained(&self, port: Port) -> bool {
        match (self, port) {
            (Core::Single(c), _) => c.is_drained(),
            (Core::Multi(m), Port::Path(id)) => m.path_is_finished(id),
            (Core::Multi(_), Port::Single) => true,
        }
    }

    /// The transport of `port` ended or failed.
    pub(crate) fn handle_transport_closed(
        &mut self,
        port: Port,
        now: Instant,
        reason: TransportError,
    ) {
        match (self, port) {
            (Core::Single(c), _) => c.handle_transport_closed(now, reason),
            (Core::Multi(m), Port::Path(id)) => m.handle_path_closed(id, now, reason),
            (Core::Multi(_), Port::Single) => {}
        }
    }

    /// Byte-stream output of `port` (see `Connection::poll_transmit`).
    pub(crate) fn poll_transmit(
        &mut self,
        port: Port,
        now: Instant,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> usize {
        match (self, port) {
            (Core::Single(c), _) => c.poll_transmit(now, out, limit),
            (Core::Multi(m), Port::Path(id)) => m.poll_transmit(id, now, out, limit),
            (Core::Multi(_), Port::Single) => 0,
        }
    }

    /// In-order bytes read on `port`.
    pub(crate) fn handle_bytes(&mut self, port: Port, now: Instant, data: &[u8]) {
        match (self, port) {
            (Core::Single(c), _) => c.handle_bytes(now, data),
            (Core::Multi(m), Port::Path(id)) => m.handle_bytes(id, now, data),
            (Core::Multi(_), Port::Single) => {}
        }
    }

    /// [`Self::handle_bytes`] for a read of `len` bytes into `buf`, which a single
    /// connection's record layer may keep, leaving another buffer (`Connection::handle_read`).
    pub(crate) fn handle_read(&mut self, port: Port, now: Instant, buf: &mut Vec<u8>, len: usize) {
        match self {
            Core::Single(c) => c.handle_read(now, buf, len),
            Core::Multi(_) => self.handle_bytes(port, now, &buf[..len]),
        }
    }
}
