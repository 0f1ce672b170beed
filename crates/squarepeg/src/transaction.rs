//! Transactions: a request and its answer in one round trip (NGTCP), and the transport
//! properties an application chooses when connecting, in TAPS vocabulary (RFC 9622).
//!
//! A transaction (an RPC, a lookup, a game's login, an API call) needs one round trip and a
//! handful of segments; TCP spends two round trips and TCP + TLS 1.3 three before the answer
//! arrives. [`Transactor::transact`] collapses them as far as the state it keeps allows:
//!
//! - **first contact**: TCP and TLS handshakes as usual, then the request and the answer;
//!   the client keeps the server's TLS tickets (single use) and the kernel the server's TCP
//!   Fast Open cookie;
//! - **returning client**: the ClientHello and the request as TLS 1.3 early data ride in the
//!   SYN (TCP Fast Open, RFC 7413), the server answers in its first flight (0.5-RTT data),
//!   and the answer arrives one round trip after the SYN left — as with QUIC's 0-RTT.
//!
//! Only requests the application marks safely replayable ([`TransportProperties::
//! safely_replayable`], TAPS `safelyReplayable`) go early: early data can be copied and
//! sent again by an attacker. The server side takes early data only with single-use tickets
//! (see [`crate::tls::config::server_accepting_early_data`]), so a replayed first flight gets
//! a full handshake that the replayer cannot finish, and its request is never executed a
//! second time (NGTCP's at-most-once). Fallbacks are the kernel's and TLS's own: a refused
//! cookie or a path that drops SYNs with data costs a round trip, refused early data is sent
//! again after the handshake, and the request is delivered once either way.
//!
//! Over kernel TCP the client's TIME-WAIT is the kernel's (60 s on Linux; many
//! transactions to one server need the ephemeral port range, or `tcp_tw_reuse`, which
//! Linux enables by default for loopback only).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use squarepeg_session::{ConfigError, ConnectionError, MessageProps, SendError};

use crate::TlsSetup;
use crate::config::ConnectionConfig;
use crate::connection::Connection;
use crate::endpoint::ConnectError;

/// How much an application wants a property (RFC 9622 §6.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Preference {
    /// Only connections with the property.
    Require,
    /// The property if available.
    Prefer,
    /// Either way.
    #[default]
    NoPreference,
    /// Rather without the property.
    Avoid,
    /// Only connections without the property.
    Prohibit,
}

impl Preference {
    /// Wanted: `Require` or `Prefer`.
    pub fn wanted(self) -> bool {
        matches!(self, Preference::Require | Preference::Prefer)
    }

    /// Unwanted: `Avoid` or `Prohibit`.
    pub fn unwanted(self) -> bool {
        matches!(self, Preference::Avoid | Preference::Prohibit)
    }
}

/// Transport properties chosen when connecting, as RFC 9622 names them, and what each does
/// in squarepeg. Start from `TransportProperties::default()` (a reliable, ordered
/// connection, as TCP) or [`TransportProperties::transaction`], and change fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportProperties {
    /// `reliability` (§6.2.1): every message delivered. `Require` refuses a
    /// [`msg_lifetime`](Self::msg_lifetime) (a message may then expire unsent).
    pub reliability: Preference,
    /// `preserveOrder` (§6.2.4): messages delivered in the order sent. Over kernel TCP
    /// (what a [`Transactor`] uses) delivery is always in order, so `Prohibit` is refused
    /// there: unordered delivery needs the userspace TCP ([`Connection::connect_utcp`]).
    pub preserve_order: Preference,
    /// `msgLifetime` (§9.1.3.1): how long a message stays worth sending; it is dropped
    /// unsent after that. `None`: forever.
    pub msg_lifetime: Option<Duration>,
    /// `safelyReplayable` (§9.1.3.4): the application takes the request more than once
    /// without harm (a read, an idempotent call). Only then may it go as 0-RTT data.
    pub safely_replayable: bool,
    /// `zeroRttMsg` (§6.2.5): send the first message with the connection's first packet:
    /// TCP Fast Open and TLS 1.3 early data for a returning client. `Require` also refuses
    /// a request that is not [`safely_replayable`](Self::safely_replayable).
    pub zero_rtt_msg: Preference,
    /// `multistreaming` (§6.2.6): several streams in one connection (always available in
    /// squarepeg; `Prohibit` only means the application will not open any).
    pub multistreaming: Preference,
}

impl Default for TransportProperties {
    fn default() -> Self {
        Self {
            reliability: Preference::Require,
            preserve_order: Preference::Require,
            msg_lifetime: None,
            safely_replayable: false,
            zero_rtt_msg: Preference::NoPreference,
            multistreaming: Preference::Prefer,
        }
    }
}

impl TransportProperties {
    /// A transaction's properties: reliable, `safelyReplayable`, and 0-RTT preferred.
    pub fn transaction() -> Self {
        Self {
            safely_replayable: true,
            zero_rtt_msg: Preference::Prefer,
            ..Self::default()
        }
    }

    /// Checks that the properties can be had together over kernel TCP.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.reliability == Preference::Require && self.msg_lifetime.is_some() {
            return Err(ConfigError(
                "reliability Require with a msgLifetime: a message may expire unsent",
            ));
        }
        if self.preserve_order == Preference::Prohibit {
            return Err(ConfigError(
                "preserveOrder Prohibit needs the userspace TCP (Connection::connect_utcp)",
            ));
        }
        if self.reliability == Preference::Prohibit {
            return Err(ConfigError(
                "reliability Prohibit: squarepeg's messages are reliable unless they expire",
            ));
        }
        if self.zero_rtt_msg == Preference::Require && !self.safely_replayable {
            return Err(ConfigError(
                "zeroRttMsg Require for a message that is not safelyReplayable",
            ));
        }
        Ok(())
    }

    /// The properties of a message sent under them.
    pub fn message_props(&self) -> MessageProps {
        MessageProps {
            lifetime: self.msg_lifetime,
            safely_replayable: self.safely_replayable && !self.zero_rtt_msg.unwanted(),
            ..MessageProps::default()
        }
    }

    /// `config` made to give these properties: Fast Open and a TLS client that offers early
    /// data when 0-RTT is wanted, neither when it is unwanted.
    pub fn apply(&self, mut config: ConnectionConfig) -> ConnectionConfig {
        // Without a preference, a replayable request may as well go early.
        let zero_rtt = self.zero_rtt_msg.wanted()
            || (self.zero_rtt_msg == Preference::NoPreference && self.safely_replayable);
        config.fast_open = zero_rtt;
        if let Some(TlsSetup::Client {
            config: tls,
            server_name,
        }) = &config.tls
            && tls.enable_early_data != zero_rtt
        {
            let mut tls = (**tls).clone();
            tls.enable_early_data = zero_rtt;
            config.tls = Some(TlsSetup::Client {
                config: std::sync::Arc::new(tls),
                server_name: server_name.clone(),
            });
        }
        config
    }
}

/// Why a transaction failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// The connection could not be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request could not be sent (too large, the connection closing).
    #[error("request: {0}")]
    Send(#[from] SendError),
    /// The connection ended before the answer arrived (the handshake failed, the server
    /// closed, reset or timed out).
    #[error("answer: {0}")]
    Connection(#[from] ConnectionError),
    /// The properties cannot be had together.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A client of transactions: opens a connection per transaction, or reuses one, and keeps
/// what makes the next transaction to the same server faster (TLS tickets in its
/// configuration, Fast Open cookies in the kernel, open connections if asked to).
#[derive(Debug)]
pub struct Transactor {
    config: ConnectionConfig,
    properties: TransportProperties,
    keep_open: bool,
    idle: Mutex<HashMap<SocketAddr, Connection>>,
}

impl Transactor {
    /// A transactor with `config` (over TLS: a client set-up, whose ticket store all its
    /// connections share) made to give `properties`.
    pub fn new(
        config: ConnectionConfig,
        properties: TransportProperties,
    ) -> Result<Self, ConfigError> {
        properties.check()?;
        let config = properties.apply(config);
        config.check(squarepeg_connection::Role::Client)?;
        Ok(Self {
            config,
            properties,
            keep_open: false,
            idle: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps each connection open after its transaction, for the next one to the same
    /// server (no handshake at all then); off by default: each transaction opens and closes
    /// its own, closing right after the answer (the close finishes in the background).
    pub fn keep_connections_open(mut self, keep: bool) -> Self {
        self.keep_open = keep;
        self
    }

    /// The configuration connections are opened with.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// Sends `request` to `server` and returns the first message that comes back.
    pub async fn transact(
        &self,
        server: SocketAddr,
        request: impl Into<Bytes>,
    ) -> Result<Bytes, TransactionError> {
        let request = request.into();
        let props = self.properties.message_props();
        let reused = self.idle.lock().expect("idle connections").remove(&server);
        let conn = match reused {
            Some(conn) if conn.close_reason().is_none() => {
                conn.send_message(request, props).await?;
                conn
            }
            _ => {
                Connection::connect_with_messages(
                    server,
                    self.config.clone(),
                    vec![(request, props)],
                )
                .await?
                .0
            }
        };
        let answer = conn.recv_message().await?;
        if self.keep_open {
            self.idle
                .lock()
                .expect("idle connections")
                .insert(server, conn);
        } else {
            // The answer is in: the close starts now (dropping the last handle closes
            // gracefully), so that it leaves with the client's last handshake flight, and
            // finishes in the background.
            drop(conn);
        }
        Ok(answer.payload)
    }
}
