//! The rivals of the failover and multipath experiments, and how each opens its connections
//! across a two-path lab.
//!
//! A rival is a [`Rival`] variant and one `open_*` function of the signature of
//! [`OpenFn`]: given the running lab and what to open ([`OpenRequest`]: a bulk download, a
//! voice call, or both), it returns the ends ([`RivalEnds`]), the senders in the server's
//! namespace and the receivers in the client's. The experiment drives them (one clock for
//! the traffic and the path's death), measures and reports; a rival never sees the death
//! coming.
//!
//! # Adding a rival
//!
//! 1. A variant with its name and description in [`Rival::name`], [`Rival::description`]
//!    and [`Rival::ALL`] (and [`Rival::FAILOVER`] / [`Rival::MULTIPATH`] for the default
//!    sets).
//! 2. An opener of the signature [`OpenFn`] (with the variant's fields as extra arguments)
//!    called from [`Rival::open`]: it opens what the request asks for across both paths
//!    (client addresses `lab.path_addresses(i)?.client_v4`, server addresses
//!    `…server_v4`, sockets made inside `lab.client().run(..)` / `lab.server().run(..)`)
//!    and returns
//!    - `bulk`: a [`BulkSender`] (server) and a [`BulkReceiver`] (client) carrying one
//!      byte stream, if `request.bulk`;
//!    - `voice`: the call's [`LabEnds`] (a `VoiceSender` in the server namespace, a
//!      `VoiceReceiver` in the client namespace: one message per `send`), if
//!      `request.voice` is set;
//!    - `keep`: anything that must live as long as the connections (listeners, runtimes);
//!    - `detection`: if the rival can tell when it declared the dying path dead.
//!
//! squarepeg's rows are [`super::squarepeg::open_squarepeg`].
//!
//! The receivers must return within their deadline (poll), and an error ends only that flow
//! (it is reported as the flow's failure, not as the run's).

use std::any::Any;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};
use squarepeg_lab::net::Lab;

use crate::voip::VoipError;
use crate::voip::lab::{LabCall, LabEnds};

/// `IPPROTO_MPTCP` (Linux 5.6+).
pub const IPPROTO_MPTCP: i32 = 262;
/// The longest one blocking socket call of a bulk flow lasts, so that deadlines are kept.
const POLL: Duration = Duration::from_millis(50);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A rival: one way of carrying the bulk download and the call over the two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Rival {
    /// One kernel TCP connection per flow, bound to the client's and the server's address on
    /// path `path` (it lives and dies with that path).
    Tcp {
        /// The path (0 or 1).
        path: usize,
    },
    /// Kernel MPTCP (`IPPROTO_MPTCP` sockets): the initial subflow on path 0, a second one
    /// from the client's path-1 address (an in-kernel path manager `subflow` endpoint).
    Mptcp,
    /// One squarepeg multipath session over both paths (TLS 1.3, a connection per path,
    /// the second joined by resumption; [`super::squarepeg`]).
    Squarepeg,
    /// The same with the call's messages sent redundantly on both connections (the
    /// receiver takes the first copy).
    SquarepegRedundant,
    /// [`Rival::Squarepeg`] re-sending a dead connection's frames in the order sent
    /// (`MultipathConfig::resend_missing_first` off): the comparison for that choice.
    SquarepegResendInOrder,
}

/// What a rival must open.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    /// A bulk download (server → client).
    pub bulk: bool,
    /// A voice call (server → client), its addresses on path 0 and its application.
    pub voice: Option<LabCall>,
    /// How long the whole run lasts: a bound for blocking calls the rival cannot poll.
    pub run_length: Duration,
}

/// The ends of a bulk download.
pub struct BulkEnds {
    /// In the server namespace.
    pub sender: Box<dyn BulkSender>,
    /// In the client namespace.
    pub receiver: Box<dyn BulkReceiver>,
}

/// What a rival opened.
#[derive(Default)]
pub struct RivalEnds {
    /// The bulk download, if asked for.
    pub bulk: Option<BulkEnds>,
    /// The call, if asked for.
    pub voice: Option<LabEnds>,
    /// What must live as long as the connections (listeners, runtimes…), dropped after the
    /// run.
    pub keep: Vec<Box<dyn Any + Send>>,
    /// Asked after the run with the instant the death was due, if the rival's own
    /// endpoints say so: the earliest instant from then on that one of them declared a
    /// connection dead (squarepeg's closed paths; the kernel's MPTCP does not tell). The
    /// failover report measures recovery from it.
    pub detection: Option<Box<dyn Fn(Instant) -> Option<Detection> + Send>>,
}

/// A rival's own detection of the death.
#[derive(Debug, Clone, Copy)]
pub struct Detection {
    /// When it declared a connection dead.
    pub at: Instant,
    /// The smoothed RTT of the connection its data moved to, as it measured it then.
    pub survivor_rtt: Option<Duration>,
    /// When it found that connection suspect and copied its data to another, before
    /// declaring it dead (squarepeg's reinjection).
    pub suspected: Option<Instant>,
}

/// The signature of a rival's opener ([`Rival::open`] calls one per variant; a variant with
/// fields passes them as extra arguments, as [`open_tcp`] takes its path).
pub type OpenFn = fn(&Lab, &OpenRequest) -> Result<RivalEnds, VoipError>;

/// The sending end of a bulk flow.
pub trait BulkSender: Send {
    /// Takes some of `data`, blocking at most until `deadline`; the bytes taken (0 if none
    /// by then). An error ends the flow.
    fn send(&mut self, data: &[u8], deadline: Instant) -> Result<usize, VoipError>;
    /// No more data: the receiver gets [`Received::Closed`] once it has everything.
    fn finish(&mut self) -> Result<(), VoipError>;
}

/// What a bulk receiver got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// This many bytes, now in the buffer's head.
    Data(usize),
    /// Nothing by the deadline.
    Nothing,
    /// The sender finished and every byte has been delivered.
    Closed,
}

/// The receiving end of a bulk flow.
pub trait BulkReceiver: Send {
    /// Bytes into `buf`, blocking at most until `deadline`. An error ends the flow.
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> Result<Received, VoipError>;
}

fn poll_until(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.min(POLL))
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A kernel stream socket (TCP or MPTCP) as either end of a bulk flow.
struct StreamBulk(TcpStream);

impl BulkSender for StreamBulk {
    fn send(&mut self, data: &[u8], deadline: Instant) -> Result<usize, VoipError> {
        while let Some(wait) = poll_until(deadline) {
            self.0
                .set_write_timeout(Some(wait))
                .map_err(VoipError::io("bulk sender"))?;
            match self.0.write(data) {
                Ok(n) => return Ok(n),
                Err(e) if timed_out(&e) => {}
                Err(e) => return Err(VoipError::io("writing the bulk flow")(e)),
            }
        }
        Ok(0)
    }
    fn finish(&mut self) -> Result<(), VoipError> {
        self.0
            .shutdown(std::net::Shutdown::Write)
            .map_err(VoipError::io("closing the bulk flow"))
    }
}

impl BulkReceiver for StreamBulk {
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> Result<Received, VoipError> {
        while let Some(wait) = poll_until(deadline) {
            self.0
                .set_read_timeout(Some(wait))
                .map_err(VoipError::io("bulk receiver"))?;
            match self.0.read(buf) {
                Ok(0) => return Ok(Received::Closed),
                Ok(n) => return Ok(Received::Data(n)),
                Err(e) if timed_out(&e) => {}
                Err(e) => return Err(VoipError::io("reading the bulk flow")(e)),
            }
        }
        Ok(Received::Nothing)
    }
}

impl Rival {
    /// Every rival.
    pub const ALL: [Rival; 6] = [
        Rival::Tcp { path: 0 },
        Rival::Tcp { path: 1 },
        Rival::Mptcp,
        Rival::Squarepeg,
        Rival::SquarepegRedundant,
        Rival::SquarepegResendInOrder,
    ];
    /// The failover experiment's default rows: TCP on the path that dies, MPTCP, squarepeg
    /// (the call on the lowest-RTT connection, and redundant).
    pub const FAILOVER: [Rival; 4] = [
        Rival::Tcp { path: 0 },
        Rival::Mptcp,
        Rival::Squarepeg,
        Rival::SquarepegRedundant,
    ];
    /// The multipath experiment's default rows: TCP on each path alone, MPTCP, squarepeg.
    pub const MULTIPATH: [Rival; 4] = [
        Rival::Tcp { path: 0 },
        Rival::Tcp { path: 1 },
        Rival::Mptcp,
        Rival::Squarepeg,
    ];

    /// The name on the command line and in the JSON.
    pub fn name(self) -> String {
        match self {
            Rival::Tcp { path } => format!("tcp-path{path}"),
            Rival::Mptcp => "mptcp".to_owned(),
            Rival::Squarepeg => "squarepeg".to_owned(),
            Rival::SquarepegRedundant => "squarepeg-redundant".to_owned(),
            Rival::SquarepegResendInOrder => "squarepeg-resend-in-order".to_owned(),
        }
    }

    /// By name.
    pub fn by_name(name: &str) -> Result<Rival, VoipError> {
        Rival::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| VoipError::UnknownTransport {
                name: name.to_owned(),
                known: Rival::ALL.map(Rival::name).join(", "),
            })
    }

    /// One line for people.
    pub fn description(self) -> String {
        match self {
            Rival::Tcp { path } => format!(
                "kernel TCP bound to path {path}'s addresses (one connection per flow, lives and dies with the path)"
            ),
            Rival::Mptcp => "kernel MPTCP (IPPROTO_MPTCP, in-kernel path manager): initial subflow on path 0, a second from the client's path-1 address".to_owned(),
            Rival::Squarepeg => "squarepeg multipath session (TLS 1.3, a kernel TCP connection per path, joined by resumption; path timeout 200 ms, probes every 50 ms): the call as messages on the lowest-RTT connection, the download as a stream over both".to_owned(),
            Rival::SquarepegRedundant => "squarepeg as above, the call's messages sent on both connections (redundant steering: first copy wins, the receiver drops the second)".to_owned(),
            Rival::SquarepegResendInOrder => "squarepeg as above (the call on the lowest-RTT connection), a dead connection's frames re-sent in the order sent rather than those the peer is most likely missing first".to_owned(),
        }
    }

    /// The one path a single-path rival is bound to (`None`: it uses several). The
    /// multipath report compares every row with the best single-path row.
    pub fn single_path(self) -> Option<usize> {
        match self {
            Rival::Tcp { path } => Some(path),
            Rival::Mptcp
            | Rival::Squarepeg
            | Rival::SquarepegRedundant
            | Rival::SquarepegResendInOrder => None,
        }
    }

    /// Opens what `request` asks for across `lab`: one opener function per variant, each
    /// of the signature [`OpenFn`] (with the variant's fields as extra arguments).
    pub fn open(self, lab: &Lab, request: &OpenRequest) -> Result<RivalEnds, VoipError> {
        match self {
            Rival::Tcp { path } => open_tcp(lab, path, request),
            Rival::Mptcp => open_mptcp(lab, request),
            Rival::Squarepeg => super::squarepeg::open_squarepeg(
                lab,
                request,
                squarepeg::PathPolicy::LowestRtt,
                super::squarepeg::options(),
            ),
            Rival::SquarepegRedundant => super::squarepeg::open_squarepeg(
                lab,
                request,
                squarepeg::PathPolicy::Redundant,
                super::squarepeg::options(),
            ),
            Rival::SquarepegResendInOrder => {
                let mut options = super::squarepeg::options();
                options.core.resend_missing_first = false;
                super::squarepeg::open_squarepeg(
                    lab,
                    request,
                    squarepeg::PathPolicy::LowestRtt,
                    options,
                )
            }
        }
    }
}

impl From<Rival> for String {
    fn from(r: Rival) -> String {
        r.name()
    }
}

impl TryFrom<String> for Rival {
    type Error = VoipError;
    fn try_from(name: String) -> Result<Rival, VoipError> {
        Rival::by_name(&name)
    }
}

/// A connected pair of kernel stream sockets from the client's address on `client_path` to
/// the server's address on `server_path`: (server end, client end, the listener, which
/// MPTCP's further subflows join through).
fn kernel_pair(
    lab: &Lab,
    client_path: usize,
    server_path: usize,
    protocol: Option<Protocol>,
) -> Result<(TcpStream, TcpStream, TcpListener), VoipError> {
    let server_ip: IpAddr = lab.path_addresses(server_path)?.server_v4.into();
    let client_ip: IpAddr = lab.path_addresses(client_path)?.client_v4.into();
    let listener = lab
        .server()
        .run(|| -> std::io::Result<TcpListener> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, protocol)?;
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::new(server_ip, 0).into())?;
            socket.listen(8)?;
            Ok(socket.into())
        })?
        .map_err(VoipError::io(format!("listening on {server_ip}")))?;
    let target = listener
        .local_addr()
        .map_err(VoipError::io("the listener's address"))?;
    let client = lab
        .client()
        .run(|| -> std::io::Result<TcpStream> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, protocol)?;
            socket.bind(&SocketAddr::new(client_ip, 0).into())?;
            socket.connect_timeout(&target.into(), CONNECT_TIMEOUT)?;
            Ok(socket.into())
        })?
        .map_err(VoipError::io(format!("connecting {client_ip} to {target}")))?;
    let (server, _) = listener
        .accept()
        .map_err(VoipError::io(format!("accepting on {target}")))?;
    Ok((server, client, listener))
}

/// Opens the bulk flow and the call over `protocol` sockets from path `path`'s addresses.
fn open_kernel(
    lab: &Lab,
    path: usize,
    protocol: Option<Protocol>,
    request: &OpenRequest,
) -> Result<RivalEnds, VoipError> {
    let mut ends = RivalEnds::default();
    if request.bulk {
        let (server, client, listener) = kernel_pair(lab, path, path, protocol)?;
        ends.bulk = Some(BulkEnds {
            sender: Box::new(StreamBulk(server)),
            receiver: Box::new(StreamBulk(client)),
        });
        ends.keep.push(Box::new(listener));
    }
    if request.voice.is_some() {
        let (server, client, listener) = kernel_pair(lab, path, path, protocol)?;
        // A record write blocks when the send buffer is full (a dead path): bounded by the
        // run, after which the sender gives up.
        server
            .set_write_timeout(Some(request.run_length))
            .map_err(VoipError::io("voice sender"))?;
        ends.voice = Some(crate::voip::lab::transports::tcp_ends(server, client)?);
        ends.keep.push(Box::new(listener));
    }
    Ok(ends)
}

/// [`Rival::Tcp`]: plain kernel TCP on one path.
pub fn open_tcp(lab: &Lab, path: usize, request: &OpenRequest) -> Result<RivalEnds, VoipError> {
    if path >= lab.path_count() {
        return Err(VoipError::Config(format!(
            "TCP on path {path}: the lab has {} paths",
            lab.path_count()
        )));
    }
    open_kernel(lab, path, None, request)
}

/// Whether the kernel makes MPTCP sockets (in the client's namespace of `lab`).
pub fn mptcp_supported(lab: &Lab) -> Result<bool, VoipError> {
    Ok(lab.client().run(|| {
        Socket::new(
            Domain::IPV4,
            Type::STREAM,
            Some(Protocol::from(IPPROTO_MPTCP)),
        )
        .is_ok()
    })?)
}

/// [`Rival::Mptcp`]: kernel MPTCP, the initial subflow on path 0 and a `subflow` endpoint on
/// the client's path-1 address (`ip mptcp limits set subflows 2 add_addr_accepted 2` at
/// both ends, `ip mptcp endpoint add <path-1 address> dev <path-1 interface> subflow` at the
/// client).
pub fn open_mptcp(lab: &Lab, request: &OpenRequest) -> Result<RivalEnds, VoipError> {
    if !mptcp_supported(lab)? {
        return Err(VoipError::Transport(
            "the kernel makes no MPTCP sockets (CONFIG_MPTCP, net.mptcp.enabled)".into(),
        ));
    }
    for ns in [lab.client(), lab.server()] {
        ns.ip(&[
            "mptcp",
            "limits",
            "set",
            "subflows",
            "2",
            "add_addr_accepted",
            "2",
        ])?;
    }
    for path in 1..lab.path_count() {
        let info = lab.path_info(path)?;
        lab.client().ip(&[
            "mptcp",
            "endpoint",
            "add",
            &info.addresses.client_v4.to_string(),
            "dev",
            &info.interfaces.client,
            "subflow",
        ])?;
    }
    open_kernel(lab, 0, Some(Protocol::from(IPPROTO_MPTCP)), request)
}
