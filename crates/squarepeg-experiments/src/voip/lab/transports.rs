//! The lab's transports: kernel UDP, kernel TCP with length-prefixed records, and the
//! `squarepeg` crate's messages over kernel TCP (and, through [`open_library`], over its
//! userspace TCP: `super::utcp`). [`open_library`] also opens the priority experiment's
//! connections (`crate::priority`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use squarepeg::{
    Connection, ConnectionConfig, Endpoint, MessageProps, MessageStatus, Priority, SendError,
    TlsStats,
};
use squarepeg_lab::net::{Lab, NetNs};
use squarepeg_lab::stack::LabStack;

use super::{LabCall, LabEnds, LabTransport, SenderDrops, VoiceReceiver, VoiceSender};
use crate::voip::VoipError;
use crate::voip::config::MAX_MESSAGE_BYTES;
use crate::voip::wire::{Framing, encode_record, take_records};

/// The longest a receive call blocks, so that the deadline is checked.
const RECEIVE_POLL: Duration = Duration::from_millis(50);
/// How long opening a call may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

fn wait_for(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.min(RECEIVE_POLL))
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Kernel UDP: one datagram per message, never retransmitted.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabUdp;

struct UdpSender(UdpSocket);
struct UdpReceiver {
    socket: UdpSocket,
    buf: Vec<u8>,
}

impl VoiceSender for UdpSender {
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError> {
        match self.0.send(message) {
            Ok(_) => Ok(true),
            // A full socket buffer drops the datagram, as a real-time sender would.
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(VoipError::io("sending a datagram")(e)),
        }
    }
    fn close(self: Box<Self>) -> Result<SenderDrops, VoipError> {
        Ok(SenderDrops::default())
    }
}

impl VoiceReceiver for UdpReceiver {
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError> {
        while let Some(wait) = wait_for(deadline) {
            self.socket
                .set_read_timeout(Some(wait))
                .map_err(VoipError::io("UDP receiver"))?;
            match self.socket.recv(&mut self.buf) {
                Ok(n) => return Ok(Some((self.buf[..n].to_vec(), Instant::now()))),
                Err(e) if timed_out(&e) => {}
                Err(e) => return Err(VoipError::io("receiving a datagram")(e)),
            }
        }
        Ok(None)
    }
}

impl LabTransport for LabUdp {
    fn name(&self) -> &'static str {
        "udp"
    }
    fn description(&self) -> &'static str {
        "kernel UDP: one datagram per message, never retransmitted"
    }
    fn framing(&self) -> Framing {
        Framing::Datagram
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        let receiver = lab
            .client()
            .run(|| UdpSocket::bind(call.receiver))?
            .map_err(VoipError::io("binding the UDP receiver"))?;
        let sender = lab
            .server()
            .run(|| {
                let s = UdpSocket::bind(call.sender)?;
                s.connect(call.receiver)?;
                Ok::<_, std::io::Error>(s)
            })?
            .map_err(VoipError::io("binding the UDP sender"))?;
        Ok(LabEnds {
            sender: Box::new(UdpSender(sender)),
            receiver: Box::new(UdpReceiver {
                socket: receiver,
                buf: vec![0; 65_536],
            }),
        })
    }
}

/// Kernel TCP: length-prefixed records, `TCP_NODELAY`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabTcp;

struct TcpSender {
    stream: TcpStream,
    record: Vec<u8>,
}
struct TcpReceiver {
    stream: TcpStream,
    partial: Vec<u8>,
    ready: std::collections::VecDeque<(Vec<u8>, Instant)>,
    buf: Vec<u8>,
    closed: bool,
}

impl VoiceSender for TcpSender {
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError> {
        self.record.clear();
        encode_record(message, &mut self.record);
        // A 164-byte record always fits the socket buffer of a call that keeps up; if the
        // buffer is full the write blocks, as an application's would.
        self.stream
            .write_all(&self.record)
            .map_err(VoipError::io("writing a record"))?;
        Ok(true)
    }
    fn close(self: Box<Self>) -> Result<SenderDrops, VoipError> {
        // FIN after the queued data; the receiver reads to the end.
        self.stream
            .shutdown(std::net::Shutdown::Write)
            .map_err(VoipError::io("closing the TCP sender"))?;
        Ok(SenderDrops::default())
    }
}

impl VoiceReceiver for TcpReceiver {
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError> {
        loop {
            if let Some(next) = self.ready.pop_front() {
                return Ok(Some(next));
            }
            if self.closed {
                return Ok(None);
            }
            let Some(wait) = wait_for(deadline) else {
                return Ok(None);
            };
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(VoipError::io("TCP receiver"))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    let at = Instant::now();
                    self.partial.extend_from_slice(&self.buf[..n]);
                    for record in take_records(&mut self.partial, MAX_MESSAGE_BYTES)? {
                        self.ready.push_back((record, at));
                    }
                }
                Err(e) if timed_out(&e) => {}
                Err(e) => return Err(VoipError::io("reading records")(e)),
            }
        }
    }
}

impl LabTransport for LabTcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn description(&self) -> &'static str {
        "kernel TCP (Linux, default congestion control): length-prefixed records, TCP_NODELAY"
    }
    fn framing(&self) -> Framing {
        Framing::LengthPrefixed
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        let listener = lab
            .server()
            .run(|| TcpListener::bind(call.sender))?
            .map_err(VoipError::io("binding the TCP sender"))?;
        let receiver = lab
            .client()
            .run(|| TcpStream::connect_timeout(&call.sender, OPEN_TIMEOUT))?
            .map_err(VoipError::io("connecting the TCP receiver"))?;
        let (sender, _) = listener
            .accept()
            .map_err(VoipError::io("accepting the TCP receiver"))?;
        tcp_ends(sender, receiver)
    }
}

/// A call's ends over a connected pair of kernel stream sockets (TCP, or MPTCP for the
/// failover experiment, `crate::failover`): length-prefixed records, `TCP_NODELAY`.
pub(crate) fn tcp_ends(sender: TcpStream, receiver: TcpStream) -> Result<LabEnds, VoipError> {
    sender
        .set_nodelay(true)
        .map_err(VoipError::io("TCP_NODELAY"))?;
    receiver
        .set_nodelay(true)
        .map_err(VoipError::io("TCP_NODELAY"))?;
    Ok(LabEnds {
        sender: Box::new(TcpSender {
            stream: sender,
            record: Vec::new(),
        }),
        receiver: Box::new(TcpReceiver {
            stream: receiver,
            partial: Vec::new(),
            ready: std::collections::VecDeque::new(),
            buf: vec![0; 64 * 1024],
            closed: false,
        }),
    })
}

/// The `squarepeg` crate over kernel TCP: session messages in uCOBS frames, each with its
/// playout budget as lifetime, `TCP_NODELAY` and `TCP_NOTSENT_LOWAT` as the crate sets them.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabSquarepeg;

/// [`LabSquarepeg`] over TLS 1.3 (a self-signed certificate the receiver pins): records
/// opened in order, as kernel TCP delivers them.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabTls;

impl LabTransport for LabTls {
    fn name(&self) -> &'static str {
        "tls"
    }
    fn description(&self) -> &'static str {
        "squarepeg crate over TLS 1.3 on kernel TCP: messages in records opened in order, lifetime = playout delay"
    }
    fn framing(&self) -> Framing {
        Framing::Tls
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        let voice = LibraryCall::voice(call, call.scenario.playout_delay).with_tls()?;
        Ok(open_library(lab, voice, Library::Kernel)?.boxed())
    }
}

/// Runs a current-thread tokio runtime on a thread inside `ns`, so that the sockets it
/// creates belong to that namespace.
fn spawn_in<F>(
    ns: &NetNs,
    name: &str,
    f: impl FnOnce() -> F + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, VoipError>
where
    F: std::future::Future<Output = ()>,
{
    let ns = ns.try_clone()?;
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if ns.enter_current_thread().is_err() {
                return;
            }
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(f());
        })
        .map_err(VoipError::io("spawning a runtime thread"))
}

/// The sending end of a [`LibraryCall`]: a `squarepeg::Connection` driven on a runtime
/// thread in the server namespace.
pub(crate) struct SquarepegSender {
    connection: Connection,
    /// Every message's properties but its priority.
    props: MessageProps,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SquarepegSender {
    /// Hands `message` to the connection at `priority`, waiting while the session's message
    /// queue is full (a network-limited sender's send call).
    pub(crate) async fn send_waiting(
        &self,
        message: Vec<u8>,
        priority: Priority,
    ) -> Result<(), VoipError> {
        let props = MessageProps {
            priority,
            ..self.props.clone()
        };
        self.connection
            .send_message(message, props)
            .await
            .map(|_| ())
            .map_err(|e| VoipError::Transport(format!("squarepeg send: {e}")))
    }

    /// Closes the connection once everything queued is delivered (bounded by the call's
    /// close limit) and says which messages it dropped or replaced.
    pub(crate) fn finish(mut self) -> Result<SenderDrops, VoipError> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| VoipError::Transport("the sender runtime panicked".into()))?;
        }
        // The connection has closed (or given up): every message has its final status.
        let mut drops = SenderDrops::default();
        while let Some((number, status)) = self.connection.try_next_message_status() {
            match status {
                MessageStatus::Expired | MessageStatus::Squashed => {
                    drops.dropped.insert(number);
                }
                MessageStatus::Replaced => {
                    drops.replaced.insert(number);
                }
                _ => {}
            }
        }
        Ok(drops)
    }
}

/// Which TCP the `squarepeg` crate runs over in a lab call.
pub(crate) enum Library {
    /// The kernel's, in the lab's namespaces.
    Kernel,
    /// Its userspace TCP on a TUN stack at each end (kept alive by the call's threads).
    Utcp {
        sender: Box<LabStack>,
        receiver: Box<LabStack>,
        inconsistent_retransmissions: bool,
    },
}

/// A voice sender's send on a `squarepeg::Connection`: `Ok(false)` when the session's queue
/// is full.
pub(crate) fn try_send_voice(
    connection: &Connection,
    message: &[u8],
    props: &MessageProps,
) -> Result<bool, VoipError> {
    match connection.try_send_message(message.to_vec(), props.clone()) {
        Ok(_) => Ok(true),
        Err(SendError::QueueFull { .. }) => Ok(false),
        Err(e) => Err(VoipError::Transport(format!("squarepeg send: {e}"))),
    }
}

impl VoiceSender for SquarepegSender {
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError> {
        try_send_voice(&self.connection, message, &self.props)
    }
    fn close(self: Box<Self>) -> Result<SenderDrops, VoipError> {
        self.finish()
    }
}

impl Drop for SquarepegSender {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
    }
}

/// The receiving end of a [`LibraryCall`]: every message with the time the connection
/// delivered it, from a runtime thread in the client namespace.
pub(crate) struct SquarepegReceiver {
    messages: mpsc::Receiver<(Vec<u8>, Instant)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Over TLS: the record layer's counters as of the last message.
    tls: Arc<Mutex<Option<TlsStats>>>,
}

impl VoiceReceiver for SquarepegReceiver {
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError> {
        while let Some(wait) = wait_for(deadline) {
            match self.messages.recv_timeout(wait) {
                Ok(m) => return Ok(Some(m)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
        Ok(None)
    }
    fn tls_stats(&self) -> Option<TlsStats> {
        *self.tls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for SquarepegReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl LabTransport for LabSquarepeg {
    fn name(&self) -> &'static str {
        "squarepeg"
    }
    fn description(&self) -> &'static str {
        "squarepeg crate: messages over kernel TCP (plain frames after the handshake), lifetime = playout delay"
    }
    fn framing(&self) -> Framing {
        Framing::Ucobs
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        let voice = LibraryCall::voice(call, call.scenario.playout_delay);
        Ok(open_library(lab, voice, Library::Kernel)?.boxed())
    }
}

/// A call between two `squarepeg::Connection`s, beyond the TCP it runs over ([`Library`]).
pub(crate) struct LibraryCall {
    /// Where the sender listens, in the server namespace (or on its stack).
    pub sender: SocketAddr,
    /// The sender's configuration (its session queue, its kernel `TCP_NOTSENT_LOWAT`).
    pub sender_config: ConnectionConfig,
    /// The receiver's configuration.
    pub receiver_config: ConnectionConfig,
    /// Every message's lifetime (Hollywood §7.2); `None`: messages never expire.
    pub lifetime: Option<Duration>,
    /// How long the sender's close (delivering what it still holds) may take, so that a
    /// dead peer cannot hang the run.
    pub close_limit: Duration,
}

impl LibraryCall {
    /// The voice call `call` with the crate's default configuration, each message with
    /// `lifetime`.
    pub(crate) fn voice(call: &LabCall, lifetime: Duration) -> Self {
        Self {
            sender: call.sender,
            sender_config: ConnectionConfig::default(),
            receiver_config: ConnectionConfig::default(),
            lifetime: Some(lifetime),
            close_limit: call.config.drain.max(Duration::from_secs(5)),
        }
    }

    /// This call over TLS 1.3: the sender serves a self-signed certificate made for the
    /// call, which the receiver pins.
    pub(crate) fn with_tls(mut self) -> Result<Self, VoipError> {
        use squarepeg::tls::config::{self, Trust};
        let tls = |e: squarepeg::TlsError| VoipError::Config(format!("TLS: {e}"));
        let name = "peg.lab".to_owned();
        let cert = config::self_signed(std::slice::from_ref(&name)).map_err(tls)?;
        let server = config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes())
            .map_err(tls)?;
        let client = config::client_config(Trust::PinnedSha256(cert.fingerprint)).map_err(tls)?;
        self.sender_config = self.sender_config.with_tls_server(server);
        self.receiver_config = self.receiver_config.with_tls_client(client, name);
        Ok(self)
    }
}

/// The two ends of an open [`LibraryCall`].
pub(crate) struct LibraryEnds {
    /// In the server namespace.
    pub sender: SquarepegSender,
    /// In the client namespace.
    pub receiver: SquarepegReceiver,
}

impl LibraryEnds {
    /// The ends as a voice call's.
    pub(crate) fn boxed(self) -> LabEnds {
        LabEnds {
            sender: Box::new(self.sender),
            receiver: Box::new(self.receiver),
        }
    }
}

/// Opens `call` between two `squarepeg::Connection`s over `library`'s TCP. The sender's
/// message statuses become its [`SenderDrops`].
pub(crate) fn open_library(
    lab: &Lab,
    call: LibraryCall,
    library: Library,
) -> Result<LibraryEnds, VoipError> {
    let LibraryCall {
        sender: address,
        mut sender_config,
        mut receiver_config,
        lifetime,
        close_limit,
    } = call;
    let (sender_stack, receiver_stack) = match library {
        Library::Kernel => (None, None),
        Library::Utcp {
            sender,
            receiver,
            inconsistent_retransmissions,
        } => {
            sender_config.inconsistent_retransmissions = inconsistent_retransmissions;
            receiver_config.inconsistent_retransmissions = inconsistent_retransmissions;
            (Some(sender), Some(receiver))
        }
    };
    // Sender: listen, accept one connection, hand it over, wait for the end of the call.
    let (bound_tx, bound_rx) = mpsc::channel::<Result<(), String>>();
    let (accepted_tx, accepted_rx) = mpsc::channel::<Result<Connection, String>>();
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let sender_thread = spawn_in(lab.server(), "library-sender", move || async move {
        let bound = match &sender_stack {
            None => Endpoint::bind(address, sender_config).await,
            Some(stack) => Endpoint::listen_utcp(stack.stack(), address, sender_config),
        };
        let endpoint = match bound {
            Ok(e) => e,
            Err(e) => {
                let _ = bound_tx.send(Err(format!("bind: {e}")));
                return;
            }
        };
        let _ = bound_tx.send(Ok(()));
        let connection = match endpoint.accept().await {
            Ok(c) => c,
            Err(e) => {
                let _ = accepted_tx.send(Err(format!("accept: {e}")));
                return;
            }
        };
        let _ = accepted_tx.send(Ok(connection.clone()));
        let _ = shutdown_rx.await;
        let _ = tokio::time::timeout(close_limit, connection.close()).await;
        // The stack (if any) goes with this thread, after the close.
        drop(endpoint);
        drop(sender_stack);
    })?;
    match bound_rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(VoipError::Transport(format!("squarepeg sender: {e}"))),
        Err(_) => {
            return Err(VoipError::Transport(
                "squarepeg sender did not start".into(),
            ));
        }
    }
    // Receiver: connect and forward every message with its arrival time.
    let (messages_tx, messages_rx) = mpsc::channel();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (connected_tx, connected_rx) = mpsc::channel::<Result<(), String>>();
    let tls_stats = Arc::new(Mutex::new(None));
    let receiver_tls = Arc::clone(&tls_stats);
    spawn_in(lab.client(), "library-receiver", move || async move {
        let connected = match &receiver_stack {
            None => Connection::connect(address, receiver_config).await,
            Some(stack) => Connection::connect_utcp(stack.stack(), address, receiver_config).await,
        };
        let connection = match connected {
            Ok(c) => c,
            Err(e) => {
                let _ = connected_tx.send(Err(format!("connect: {e}")));
                return;
            }
        };
        let _ = connected_tx.send(Ok(()));
        loop {
            tokio::select! {
                m = connection.recv_message() => match m {
                    Ok(m) => {
                        let at = Instant::now();
                        if messages_tx.send((Vec::from(m.payload), at)).is_err() {
                            break;
                        }
                        if let Some(t) = connection.stats().tls {
                            *receiver_tls.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
                        }
                    }
                    Err(_) => break,
                },
                _ = &mut stop_rx => break,
            }
        }
        connection.abort(0, b"");
        drop(connection);
        drop(receiver_stack);
    })?;
    match connected_rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(VoipError::Transport(format!("squarepeg receiver: {e}"))),
        Err(_) => {
            return Err(VoipError::Transport(
                "squarepeg receiver did not connect".into(),
            ));
        }
    }
    let connection = match accepted_rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(VoipError::Transport(format!("squarepeg sender: {e}"))),
        Err(_) => {
            return Err(VoipError::Transport(
                "squarepeg sender accepted nothing".into(),
            ));
        }
    };
    Ok(LibraryEnds {
        sender: SquarepegSender {
            connection,
            props: MessageProps {
                lifetime,
                ..MessageProps::default()
            },
            shutdown: Some(shutdown_tx),
            thread: Some(sender_thread),
        },
        receiver: SquarepegReceiver {
            messages: messages_rx,
            stop: Some(stop_tx),
            tls: tls_stats,
        },
    })
}
