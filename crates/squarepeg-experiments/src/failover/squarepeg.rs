//! [`super::Rival::Squarepeg`]: one squarepeg multipath session (the `squarepeg` crate's
//! `Connection::connect_multipath` and `MultipathEndpoint`, TLS 1.3) over both paths of the
//! lab, carrying the bulk download as a stream and the call as messages in the same
//! session: the call's messages at the highest priority on the lowest-RTT connection, with
//! the playout delay as lifetime; the stream spread over both connections (aggregate).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use squarepeg::tls::config::{self, Trust};
use squarepeg::{
    Connection, ConnectionConfig, MessageProps, MessageStatus, MultipathEndpoint, MultipathOptions,
    PathAddress, PathPolicy, Priority, Stream,
};
use squarepeg_lab::net::Lab;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

use super::rivals::{
    BulkEnds, BulkReceiver, BulkSender, Detection, OpenRequest, Received, RivalEnds,
};
use crate::voip::VoipError;
use crate::voip::lab::{LabEnds, SenderDrops, VoiceReceiver, VoiceSender};

/// How long opening the session may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
const NAME: &str = "peg.lab";

/// The detection settings of the squarepeg row: a connection with data outstanding and no
/// session-level acknowledgement for `path_timeout` is dead (TCPLS's measurements used a
/// 250 ms user timeout); every connection is probed every `probe_interval`.
pub fn options() -> MultipathOptions {
    let mut options = MultipathOptions::default();
    options.core.path_timeout = Duration::from_millis(200);
    options.core.probe_interval = Duration::from_millis(50);
    options.rejoin_interval = Duration::from_millis(100);
    options.connect_timeout = Duration::from_secs(2);
    options
}

fn transport(what: &str) -> impl Fn(String) -> VoipError + '_ {
    move |e| VoipError::Transport(format!("squarepeg {what}: {e}"))
}

/// A runtime whose threads live in a namespace of the lab (built there, its workers inherit
/// it); futures that make sockets must be spawned on it, not blocked on from elsewhere.
fn runtime_in(ns: &squarepeg_lab::net::NetNs, name: &str) -> Result<Runtime, VoipError> {
    let name = name.to_owned();
    ns.run(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
    })?
    .map_err(VoipError::io("building a runtime"))
}

/// Waits for a task of `rt` from outside it, at most `limit`.
fn wait<T: Send + 'static>(
    rt: &Runtime,
    limit: Duration,
    task: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, VoipError> {
    let handle = rt.spawn(task);
    rt.block_on(async { tokio::time::timeout(limit, handle).await })
        .map_err(|_| VoipError::Transport("squarepeg: timed out opening the session".into()))?
        .map_err(|e| VoipError::Transport(format!("squarepeg: task failed: {e}")))
}

/// Opens the session over both paths of `lab` (both ends with `options`, as [`options`]
/// makes them or varied) and the flows `request` asks for, the call's messages steered by
/// `voice`.
pub fn open_squarepeg(
    lab: &Lab,
    request: &OpenRequest,
    voice: PathPolicy,
    options: MultipathOptions,
) -> Result<RivalEnds, VoipError> {
    let tls = |e: squarepeg::TlsError| VoipError::Config(format!("TLS: {e}"));
    let cert = config::self_signed(&[NAME.to_owned()]).map_err(tls)?;
    let server_config = ConnectionConfig::default().with_tls_server(
        config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).map_err(tls)?,
    );
    let client_config = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(cert.fingerprint)).map_err(tls)?,
        NAME,
    );
    let mut listen = Vec::new();
    let mut locals = Vec::new();
    for path in 0..lab.path_count() {
        let a = lab.path_addresses(path)?;
        listen.push(SocketAddr::new(a.server_v4.into(), 0));
        locals.push(SocketAddr::new(a.client_v4.into(), 0));
    }
    let server_rt = runtime_in(lab.server(), "sq-server")?;
    let client_rt = runtime_in(lab.client(), "sq-client")?;
    let server_options = options.clone();
    let mut endpoint = wait(&server_rt, OPEN_TIMEOUT, async move {
        MultipathEndpoint::bind(&listen, server_config, server_options).await
    })?
    .map_err(|e| transport("bind")(e.to_string()))?;
    let paths: Vec<PathAddress> = endpoint
        .local_addrs()
        .iter()
        .zip(&locals)
        .map(|(&remote, &local)| PathAddress::from_local(local, remote))
        .collect();
    let client = wait(&client_rt, OPEN_TIMEOUT, async move {
        Connection::connect_multipath(&paths, client_config, options).await
    })?
    .map_err(|e| transport("connect")(e.to_string()))?;
    let server = server_rt
        .block_on(async { tokio::time::timeout(OPEN_TIMEOUT, endpoint.accept()).await })
        .map_err(|_| transport("accept")("no session".into()))?
        .map_err(|e| transport("accept")(e.to_string()))?;
    // Both paths joined before the clock starts, as MPTCP's subflows are.
    let deadline = Instant::now() + OPEN_TIMEOUT;
    while client.paths().iter().filter(|p| p.usable).count() < lab.path_count() {
        if Instant::now() > deadline {
            return Err(transport("join")(format!("paths: {:?}", client.paths())));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut ends = RivalEnds::default();
    if request.bulk {
        let s = server.clone();
        let sender = wait(
            &server_rt,
            OPEN_TIMEOUT,
            async move { s.open_stream().await },
        )?
        .map_err(|e| transport("open_stream")(e.to_string()))?;
        sender
            .set_path(PathPolicy::Aggregate)
            .map_err(|e| transport("set_path")(e.to_string()))?;
        // The stream shows at the client with its first bytes: accepted on the first read.
        let c = client.clone();
        let accepting = client_rt.spawn(async move { c.accept_stream().await });
        ends.bulk = Some(BulkEnds {
            sender: Box::new(SqBulkSender {
                stream: Some(sender),
                rt: server_rt.handle().clone(),
            }),
            receiver: Box::new(SqBulkReceiver {
                stream: None,
                accepting: Some(accepting),
                rt: client_rt.handle().clone(),
            }),
        });
    }
    if let Some(call) = &request.voice {
        let (tx, rx) = mpsc::channel();
        let c = client.clone();
        client_rt.spawn(async move {
            while let Ok(m) = c.recv_message().await {
                if tx.send((Vec::from(m.payload), Instant::now())).is_err() {
                    break;
                }
            }
        });
        ends.voice = Some(LabEnds {
            sender: Box::new(SqVoiceSender {
                connection: server.clone(),
                props: MessageProps {
                    priority: Priority::HIGHEST,
                    lifetime: Some(call.scenario.playout_delay),
                    path: Some(voice),
                    ..MessageProps::default()
                },
            }),
            receiver: Box::new(SqVoiceReceiver { messages: rx }),
        });
    }
    // The senders (the download's and the call's) are the server's: its detection is what
    // moves their data.
    let s = server.clone();
    ends.detection = Some(Box::new(move |since| {
        s.closed_paths()
            .into_iter()
            .filter(|p| p.at >= since)
            .min_by_key(|p| p.at)
            .map(|p| Detection {
                at: p.at,
                survivor_rtt: p.survivor_srtt,
                suspected: p.suspected,
            })
    }));
    ends.keep.push(Box::new(Session {
        endpoint: Some(endpoint),
        connections: vec![server, client],
        runtimes: vec![server_rt, client_rt],
    }));
    Ok(ends)
}

/// What lives as long as the run: the endpoint, the session's two handles, the runtimes
/// (dropped last, after the handles have aborted the session).
struct Session {
    endpoint: Option<MultipathEndpoint>,
    connections: Vec<Connection>,
    runtimes: Vec<Runtime>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for c in &self.connections {
            c.abort(0, b"");
        }
        self.connections.clear();
        self.endpoint = None;
        for rt in self.runtimes.drain(..) {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

struct SqBulkSender {
    stream: Option<Stream>,
    rt: tokio::runtime::Handle,
}

impl BulkSender for SqBulkSender {
    fn send(&mut self, data: &[u8], deadline: Instant) -> Result<usize, VoipError> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(VoipError::Transport("squarepeg: stream finished".into()));
        };
        let written = self
            .rt
            .block_on(async { tokio::time::timeout_at(deadline.into(), stream.write(data)).await });
        match written {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(VoipError::io("writing the squarepeg stream")(e)),
            Err(_) => Ok(0),
        }
    }

    fn finish(&mut self) -> Result<(), VoipError> {
        match self.stream.take() {
            Some(s) => s
                .finish()
                .map_err(|e| VoipError::Transport(format!("squarepeg finish: {e}"))),
            None => Ok(()),
        }
    }
}

struct SqBulkReceiver {
    stream: Option<Stream>,
    accepting: Option<tokio::task::JoinHandle<Result<Stream, squarepeg::ConnectionError>>>,
    rt: tokio::runtime::Handle,
}

impl BulkReceiver for SqBulkReceiver {
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> Result<Received, VoipError> {
        if self.stream.is_none() {
            let Some(accepting) = self.accepting.as_mut() else {
                return Err(VoipError::Transport("squarepeg: no stream".into()));
            };
            let accepted = self
                .rt
                .block_on(async { tokio::time::timeout_at(deadline.into(), accepting).await });
            match accepted {
                Err(_) => return Ok(Received::Nothing),
                Ok(Ok(Ok(s))) => {
                    self.accepting = None;
                    self.stream = Some(s);
                }
                Ok(Ok(Err(e))) => {
                    return Err(VoipError::Transport(format!(
                        "squarepeg accept_stream: {e}"
                    )));
                }
                Ok(Err(e)) => return Err(VoipError::Transport(format!("squarepeg: {e}"))),
            }
        }
        let stream = self.stream.as_mut().expect("accepted above");
        let read = self
            .rt
            .block_on(async { tokio::time::timeout_at(deadline.into(), stream.read(buf)).await });
        match read {
            Err(_) => Ok(Received::Nothing),
            Ok(Ok(0)) => Ok(Received::Closed),
            Ok(Ok(n)) => Ok(Received::Data(n)),
            Ok(Err(e)) if e.kind() == ErrorKind::WouldBlock => Ok(Received::Nothing),
            Ok(Err(e)) => Err(VoipError::io("reading the squarepeg stream")(e)),
        }
    }
}

struct SqVoiceSender {
    connection: Connection,
    props: MessageProps,
}

impl VoiceSender for SqVoiceSender {
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError> {
        crate::voip::lab::transports::try_send_voice(&self.connection, message, &self.props)
    }

    fn close(self: Box<Self>) -> Result<SenderDrops, VoipError> {
        // The session carries the download too: it stays open; the statuses so far are
        // the messages' (a message still queued has none yet and counts as sent).
        let mut drops = SenderDrops::default();
        while let Some((number, status)) = self.connection.try_next_message_status() {
            if matches!(status, MessageStatus::Expired | MessageStatus::Squashed) {
                drops.dropped.insert(number);
            }
        }
        Ok(drops)
    }
}

struct SqVoiceReceiver {
    messages: mpsc::Receiver<(Vec<u8>, Instant)>,
}

impl VoiceReceiver for SqVoiceReceiver {
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.messages.recv_timeout(wait) {
            Ok(m) => Ok(Some(m)),
            Err(_) => Ok(None),
        }
    }
}
