//! Joins: a further TCP connection proves that it belongs to an established session with a
//! single-use TLS 1.3 session ticket that the server issued on one of the session's
//! connections, inside the encrypted session.
//!
//! On the wire a join is an ordinary TLS 1.3 PSK resumption (RFC 8446 §2.2): a ClientHello
//! with `pre_shared_key` and `psk_key_exchange_modes` (psk_dhe_ke, so the joined connection
//! gets fresh (EC)DHE keys, RFC 8446 §4.2.9), nothing of squarepeg's own. The ticket the
//! client presents is the 32 random bytes rustls's stateful store names a session by; it was
//! sent inside the first connection's encrypted NewSessionTicket, and the session it belongs
//! to is known only to the server: the binding ticket → session lives server-side in the
//! [`JoinRegistry`], never in a ticket.
//!
//! **Server:** a [`JoinRegistry`] wraps a server configuration. Every incoming connection
//! gets its own configuration from [`JoinRegistry::connection`] together with a
//! [`JoinProbe`], which sees the tickets rustls issues on that connection and the ticket it
//! is offered. [`JoinRegistry::start_session`] makes a connection the first of a new session
//! (its tickets become join tickets of that session); [`JoinRegistry::admit`] judges a
//! connection meant to join one, and counts the verdict ([`JoinStats`]). Tickets are single
//! use: rustls's stateful store takes a ticket out when it is presented (a replay finds
//! none and gets a full handshake), and the registry remembers used tickets for a while so
//! that a replay is counted as one.
//!
//! **Client:** a [`JoinTickets`] store collects the tickets of a session's connections
//! (configured with [`JoinTickets::collecting_config`]), apart from ordinary resumption, and
//! [`Tls::client_join`] starts a connection resuming with one of them, taken out for good.
//!
//! rustls issues tickets only at the end of a server handshake (`send_tls13_tickets` of
//! them), not later on request: a session has as many join tickets as its connections were
//! issued, refilled by each join's own tickets.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::pki_types::ServerName;
use rustls::server::StoresServerSessions;
use rustls::{ClientConfig, HandshakeKind, NamedGroup, ServerConfig};

use crate::{Tls, TlsError};

type Tls12Value = rustls::client::Tls12ClientSessionValue;
type Tls13Value = rustls::client::Tls13ClientSessionValue;

/// A session's identifier, random, known only to the server (it never goes on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId([u8; 16]);

impl SessionId {
    /// The identifier's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId(")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Why a join was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRefusal {
    /// The ticket was used before (a replayed or copied ClientHello).
    Replayed,
    /// The ticket belongs to no live session: the session ended, or the ticket was issued on
    /// a connection that never became part of a session.
    UnknownSession,
    /// The ticket is older than the registry's ticket lifetime.
    Expired,
    /// The connection did not resume with a ticket of this server (none offered, a forged
    /// or unknown one, or a failed resumption): a full handshake where a join was expected.
    NotResumed,
}

/// What [`JoinRegistry::admit`] decided about a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinVerdict {
    /// Not decided yet: the ClientHello has not been processed, or the resumption handshake
    /// has not finished.
    Pending,
    /// The connection joins this session.
    Accepted(SessionId),
    /// The connection must be closed.
    Refused(JoinRefusal),
}

/// Joins counted by a [`JoinRegistry`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Connections that joined a live session.
    pub joins_accepted: u64,
    /// Joins with a ticket used before.
    pub joins_refused_replayed: u64,
    /// Joins with a ticket of an ended or never-started session.
    pub joins_refused_unknown_session: u64,
    /// Joins with a ticket older than the ticket lifetime.
    pub joins_refused_expired: u64,
    /// Connections meant to join that made a full handshake instead (no ticket, or an
    /// unknown or forged one).
    pub joins_refused_not_resumed: u64,
}

/// How a [`JoinRegistry`] issues and keeps join tickets.
#[derive(Clone, Copy, Debug)]
pub struct JoinConfig {
    /// Tickets issued at the end of each handshake (rustls's `send_tls13_tickets`): how many
    /// joins a connection enables (each join brings as many again).
    pub tickets_per_connection: usize,
    /// How long a join ticket is good for after its connection became part of a session.
    pub ticket_lifetime: Duration,
    /// Most tickets kept (live and used ones), the oldest dropped first.
    pub capacity: usize,
}

impl Default for JoinConfig {
    fn default() -> Self {
        JoinConfig {
            tickets_per_connection: 4,
            ticket_lifetime: Duration::from_secs(600),
            capacity: 64 * 1024,
        }
    }
}

/// The server's join tickets and live sessions, and the verdicts on joins. Sans-IO: every
/// call that depends on time takes `now`, any monotonic clock's reading. Clones share the
/// same registry.
#[derive(Clone)]
pub struct JoinRegistry {
    shared: Arc<Mutex<Registry>>,
    base: Arc<ServerConfig>,
    config: JoinConfig,
}

impl fmt::Debug for JoinRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("JoinRegistry")
            .field("sessions", &state.sessions.len())
            .field("tickets", &state.tickets.len())
            .field("stats", &state.stats)
            .finish_non_exhaustive()
    }
}

/// One connection's view of the registry: the tickets rustls issued on it and the ticket it
/// was offered. From [`JoinRegistry::connection`].
#[derive(Clone, Debug)]
pub struct JoinProbe {
    state: Arc<Mutex<ProbeState>>,
}

#[derive(Debug, Default)]
struct ProbeState {
    /// Ticket ids rustls stored on this connection.
    issued: Vec<Vec<u8>>,
    offered: Offered,
    verdict: Option<JoinVerdict>,
    session: Option<SessionId>,
}

#[derive(Debug, Default, Clone, Copy)]
enum Offered {
    /// No ticket looked up (yet).
    #[default]
    Nothing,
    /// A live ticket, taken out of the store.
    Taken(Option<Binding>),
    /// A ticket no longer live.
    Used(Used),
    /// A ticket this server does not know.
    Unknown,
}

/// The session a ticket belongs to and when its connection joined the session.
#[derive(Debug, Clone, Copy)]
struct Binding {
    session: SessionId,
    since: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Used {
    binding: Option<Binding>,
    why: JoinRefusal,
}

struct Ticket {
    value: Vec<u8>,
    binding: Option<Binding>,
}

#[derive(Default)]
struct Registry {
    tickets: HashMap<Vec<u8>, Ticket>,
    used: HashMap<Vec<u8>, Used>,
    /// Ids of `tickets` and `used`, oldest first (may name ids already gone).
    order: VecDeque<Vec<u8>>,
    sessions: HashSet<SessionId>,
    stats: JoinStats,
    capacity: usize,
}

impl Registry {
    fn trim(&mut self) {
        while self.tickets.len() + self.used.len() > self.capacity {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            self.tickets.remove(&id);
            self.used.remove(&id);
        }
        if self.order.len() > 2 * self.capacity.max(16) {
            let (tickets, used) = (&self.tickets, &self.used);
            self.order
                .retain(|id| tickets.contains_key(id) || used.contains_key(id));
        }
    }

    /// Moves ticket `id` from the live tickets to the used ones, with the reason a later
    /// presentation of it is refused.
    fn retire(&mut self, id: &[u8], why: JoinRefusal) -> Option<Ticket> {
        let ticket = self.tickets.remove(id)?;
        self.used.insert(
            id.to_vec(),
            Used {
                binding: ticket.binding,
                why,
            },
        );
        Some(ticket)
    }

    fn bind(&mut self, probe: &mut ProbeState, session: SessionId, now: Duration) {
        probe.session = Some(session);
        for id in &probe.issued {
            if let Some(ticket) = self.tickets.get_mut(id) {
                ticket.binding = Some(Binding {
                    session,
                    since: now,
                });
            }
        }
    }
}

impl JoinRegistry {
    /// A registry issuing join tickets on connections of `base` (which must not have a
    /// ticketer: stateless tickets cannot be single use).
    pub fn new(base: Arc<ServerConfig>, config: JoinConfig) -> Result<JoinRegistry, TlsError> {
        if base.ticketer.enabled() {
            return Err(TlsError::Config(
                "joins need single-use (stateful) tickets, not a ticketer".into(),
            ));
        }
        if config.tickets_per_connection == 0 || config.capacity == 0 {
            return Err(TlsError::Config(
                "joins need at least one ticket per connection and room to keep it".into(),
            ));
        }
        Ok(JoinRegistry {
            shared: Arc::new(Mutex::new(Registry {
                capacity: config.capacity,
                ..Registry::default()
            })),
            base,
            config,
        })
    }

    fn state(&self) -> MutexGuard<'_, Registry> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration for one incoming connection ([`Tls::server`]) and its probe. Every
    /// connection needs its own: the probe tells which tickets were issued on it and which
    /// one it was offered.
    pub fn connection(&self) -> (Arc<ServerConfig>, JoinProbe) {
        let probe = JoinProbe {
            state: Arc::new(Mutex::new(ProbeState::default())),
        };
        let mut config = (*self.base).clone();
        config.session_storage = Arc::new(ConnectionStore {
            registry: self.shared.clone(),
            probe: probe.clone(),
        });
        config.send_tls13_tickets = self.config.tickets_per_connection;
        (Arc::new(config), probe)
    }

    /// Makes the connection of `probe` the first of a new session, once its handshake is
    /// done: the tickets issued on it become the session's join tickets, good from `now` for
    /// the ticket lifetime.
    pub fn start_session(&self, now: Duration, probe: &JoinProbe) -> SessionId {
        let mut bytes = [0u8; 16];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system's random generator works");
        let session = SessionId(bytes);
        let mut state = self.state();
        state.sessions.insert(session);
        state.bind(&mut probe.lock(), session, now);
        session
    }

    /// Judges the connection of `probe`, meant to join a session: accepted if it resumed
    /// with a live, unexpired ticket of a live session (its own tickets then become join
    /// tickets of that session too), refused otherwise. A refusal is known as soon as the
    /// ClientHello has been processed when the ticket was used, expired, revoked or unknown;
    /// an acceptance once the resumption handshake has finished. Each connection is counted
    /// once; later calls return the same verdict. The tickets a refused connection was
    /// issued are revoked.
    pub fn admit(&self, now: Duration, probe: &JoinProbe, tls: &Tls) -> JoinVerdict {
        // Registry before probe, as in the store.
        let mut state = self.state();
        let mut p = probe.lock();
        if let Some(verdict) = p.verdict {
            return verdict;
        }
        // A failed handshake (e.g. a ticket offered without its PSK: a bad binder) is over.
        let finished = !tls.is_handshaking() || tls.has_failed();
        let verdict = match p.offered {
            Offered::Used(used) => JoinVerdict::Refused(used.why),
            Offered::Unknown => JoinVerdict::Refused(JoinRefusal::NotResumed),
            Offered::Nothing if finished => JoinVerdict::Refused(JoinRefusal::NotResumed),
            Offered::Nothing => JoinVerdict::Pending,
            Offered::Taken(_) if !finished => JoinVerdict::Pending,
            Offered::Taken(_)
                if tls.has_failed() || tls.handshake_kind() != Some(HandshakeKind::Resumed) =>
            {
                JoinVerdict::Refused(JoinRefusal::NotResumed)
            }
            Offered::Taken(None) => JoinVerdict::Refused(JoinRefusal::UnknownSession),
            Offered::Taken(Some(binding)) => {
                if !state.sessions.contains(&binding.session) {
                    JoinVerdict::Refused(JoinRefusal::UnknownSession)
                } else if now.saturating_sub(binding.since) > self.config.ticket_lifetime {
                    JoinVerdict::Refused(JoinRefusal::Expired)
                } else {
                    JoinVerdict::Accepted(binding.session)
                }
            }
        };
        let stats = &mut state.stats;
        match verdict {
            JoinVerdict::Pending => return verdict,
            JoinVerdict::Accepted(_) => stats.joins_accepted += 1,
            JoinVerdict::Refused(JoinRefusal::Replayed) => stats.joins_refused_replayed += 1,
            JoinVerdict::Refused(JoinRefusal::UnknownSession) => {
                stats.joins_refused_unknown_session += 1
            }
            JoinVerdict::Refused(JoinRefusal::Expired) => stats.joins_refused_expired += 1,
            JoinVerdict::Refused(JoinRefusal::NotResumed) => stats.joins_refused_not_resumed += 1,
        }
        match verdict {
            JoinVerdict::Accepted(session) => state.bind(&mut p, session, now),
            _ => {
                // A refused connection's own tickets join nothing (they were bound to no
                // session: only `start_session` and an accepted join bind them).
                for id in &p.issued {
                    state.retire(id, JoinRefusal::UnknownSession);
                }
            }
        }
        p.verdict = Some(verdict);
        verdict
    }

    /// Ends `session`: its tickets are revoked, a join with one is refused
    /// ([`JoinRefusal::UnknownSession`]).
    pub fn end_session(&self, session: SessionId) {
        let mut state = self.state();
        state.sessions.remove(&session);
        let revoked: Vec<Vec<u8>> = state
            .tickets
            .iter()
            .filter(|(_, t)| t.binding.is_some_and(|b| b.session == session))
            .map(|(id, _)| id.clone())
            .collect();
        for id in revoked {
            state.retire(&id, JoinRefusal::UnknownSession);
        }
    }

    /// Retires tickets older than the ticket lifetime (a join with one then gets a full
    /// handshake and is refused as [`JoinRefusal::Expired`]), and forgets used tickets
    /// twice that old (a replay of one then counts as [`JoinRefusal::NotResumed`]).
    pub fn expire(&self, now: Duration) {
        let lifetime = self.config.ticket_lifetime;
        let mut state = self.state();
        let old: Vec<Vec<u8>> = state
            .tickets
            .iter()
            .filter(|(_, t)| {
                t.binding
                    .is_some_and(|b| now.saturating_sub(b.since) > lifetime)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in old {
            state.retire(&id, JoinRefusal::Expired);
        }
        state.used.retain(|_, u| {
            u.binding
                .is_none_or(|b| now.saturating_sub(b.since) <= 2 * lifetime)
        });
    }

    /// Whether `session` is live.
    pub fn is_live(&self, session: SessionId) -> bool {
        self.state().sessions.contains(&session)
    }

    /// Unused join tickets of `session` the server holds.
    pub fn tickets_of(&self, session: SessionId) -> usize {
        self.state()
            .tickets
            .values()
            .filter(|t| t.binding.is_some_and(|b| b.session == session))
            .count()
    }

    /// The joins counted so far.
    pub fn stats(&self) -> JoinStats {
        self.state().stats
    }
}

impl JoinProbe {
    fn lock(&self) -> MutexGuard<'_, ProbeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many tickets rustls issued on this connection.
    pub fn tickets_issued(&self) -> usize {
        self.lock().issued.len()
    }

    /// Whether the ClientHello offered a ticket of this server's store (a join attempt,
    /// whatever the verdict): a connection that offered none is a session's first.
    pub fn offered_ticket(&self) -> bool {
        !matches!(self.lock().offered, Offered::Nothing)
    }

    /// The session this connection belongs to: started on it, or joined by it.
    pub fn session(&self) -> Option<SessionId> {
        self.lock().session
    }
}

/// rustls's stateful session store for one connection: shared tickets, a per-connection
/// record of what was issued and offered.
struct ConnectionStore {
    registry: Arc<Mutex<Registry>>,
    probe: JoinProbe,
}

impl fmt::Debug for ConnectionStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionStore").finish_non_exhaustive()
    }
}

impl ConnectionStore {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl StoresServerSessions for ConnectionStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let mut registry = self.registry();
        if registry.tickets.contains_key(&key) || registry.used.contains_key(&key) {
            return false;
        }
        registry.order.push_back(key.clone());
        registry.tickets.insert(
            key.clone(),
            Ticket {
                value,
                binding: None,
            },
        );
        registry.trim();
        // Bound to a session by `start_session` or `admit`: rustls issues tickets only at
        // the end of the handshake, before either.
        self.probe.lock().issued.push(key);
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        // TLS 1.2 only; the configurations here are TLS 1.3 only.
        self.registry().tickets.get(key).map(|t| t.value.clone())
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut registry = self.registry();
        let mut probe = self.probe.lock();
        let already = matches!(probe.offered, Offered::Taken(_));
        // The id keeps its place in `order`: retiring moves it between the two maps, so the
        // count `trim` bounds does not change.
        if let Some(ticket) = registry.retire(key, JoinRefusal::Replayed) {
            if !already {
                probe.offered = Offered::Taken(ticket.binding);
            }
            return Some(ticket.value);
        }
        if !already {
            probe.offered = match registry.used.get(key) {
                Some(used) => Offered::Used(*used),
                None => Offered::Unknown,
            };
        }
        None
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// The client's join tickets, per server name, apart from ordinary resumption: a
/// [`ClientSessionStore`] that keeps the TLS 1.3 tickets it is given and never offers them
/// by itself. Use it as the resumption store of a session's connections
/// ([`JoinTickets::collecting_config`]); [`Tls::client_join`] takes a ticket out to join.
pub struct JoinTickets {
    pockets: Mutex<HashMap<ServerName<'static>, VecDeque<Tls13Value>>>,
    /// Key exchange hints (and, with TLS 1.2, sessions) as rustls keeps them.
    other: ClientSessionMemoryCache,
    /// Most tickets kept per server, the oldest dropped first.
    per_server: usize,
}

impl fmt::Debug for JoinTickets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinTickets")
            .field("servers", &self.pockets().len())
            .finish_non_exhaustive()
    }
}

impl JoinTickets {
    /// An empty store keeping at most `per_server` tickets per server name.
    pub fn new(per_server: usize) -> Arc<JoinTickets> {
        Arc::new(JoinTickets {
            pockets: Mutex::new(HashMap::new()),
            other: ClientSessionMemoryCache::new(32),
            per_server: per_server.max(1),
        })
    }

    fn pockets(&self) -> MutexGuard<'_, HashMap<ServerName<'static>, VecDeque<Tls13Value>>> {
        self.pockets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `base` keeping the tickets its connections receive in `tickets` (and not resuming
    /// with them): the configuration for the connections of a session that may be joined.
    pub fn collecting_config(self: &Arc<Self>, base: &ClientConfig) -> Arc<ClientConfig> {
        let mut config = base.clone();
        config.resumption = Resumption::store(self.clone());
        Arc::new(config)
    }

    /// Join tickets held for `server_name`.
    pub fn len(&self, server_name: &str) -> usize {
        let Ok(name) = ServerName::try_from(server_name.to_owned()) else {
            return 0;
        };
        self.pockets().get(&name).map_or(0, VecDeque::len)
    }

    /// Whether no join ticket is held for `server_name`.
    pub fn is_empty(&self, server_name: &str) -> bool {
        self.len(server_name) == 0
    }

    /// Takes the oldest join ticket for `server_name` out of the store (used before it
    /// expires).
    fn take(&self, name: &ServerName<'static>) -> Option<Tls13Value> {
        self.pockets().get_mut(name).and_then(VecDeque::pop_front)
    }
}

impl ClientSessionStore for JoinTickets {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.other.set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.other.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12Value) {
        self.other.set_tls12_session(server_name, value)
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12Value> {
        self.other.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.other.remove_tls12_session(server_name)
    }

    fn insert_tls13_ticket(&self, server_name: ServerName<'static>, value: Tls13Value) {
        let mut pockets = self.pockets();
        let pocket = pockets.entry(server_name).or_default();
        if pocket.len() >= self.per_server {
            pocket.pop_front();
        }
        pocket.push_back(value);
    }

    fn take_tls13_ticket(&self, _server_name: &ServerName<'static>) -> Option<Tls13Value> {
        // Join tickets are offered only by a join (`ArmedTicket`).
        None
    }
}

/// The resumption store of one join: offers its one ticket once, keeps the tickets the
/// joined connection receives in the session's [`JoinTickets`].
struct ArmedTicket {
    ticket: Mutex<Option<Tls13Value>>,
    tickets: Arc<JoinTickets>,
}

impl fmt::Debug for ArmedTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArmedTicket").finish_non_exhaustive()
    }
}

impl ClientSessionStore for ArmedTicket {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.tickets.set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.tickets.kx_hint(server_name)
    }

    fn set_tls12_session(&self, _server_name: ServerName<'static>, _value: Tls12Value) {}

    fn tls12_session(&self, _server_name: &ServerName<'_>) -> Option<Tls12Value> {
        None
    }

    fn remove_tls12_session(&self, _server_name: &ServerName<'static>) {}

    fn insert_tls13_ticket(&self, server_name: ServerName<'static>, value: Tls13Value) {
        self.tickets.insert_tls13_ticket(server_name, value)
    }

    fn take_tls13_ticket(&self, _server_name: &ServerName<'static>) -> Option<Tls13Value> {
        self.ticket.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Tls {
    /// A client connection to `server_name` that joins the session whose tickets `tickets`
    /// holds: a TLS 1.3 resumption with one of its join tickets, taken out of the store for
    /// good (the tickets this connection receives go into `tickets`). `base` is the
    /// session's client configuration (trust, suites). Fails if no ticket is held for
    /// `server_name`.
    pub fn client_join(
        base: &ClientConfig,
        tickets: &Arc<JoinTickets>,
        server_name: &str,
    ) -> Result<Tls, TlsError> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| TlsError::Config(format!("server name {server_name:?}: {e}")))?;
        let ticket = tickets
            .take(&name)
            .ok_or_else(|| TlsError::Config(format!("no join ticket for {server_name:?}")))?;
        let mut config = base.clone();
        config.resumption = Resumption::store(Arc::new(ArmedTicket {
            ticket: Mutex::new(Some(ticket)),
            tickets: tickets.clone(),
        }));
        // A join carries no early data: the session's data goes over the joined connection
        // once it is admitted.
        config.enable_early_data = false;
        Tls::client(Arc::new(config), server_name)
    }
}
