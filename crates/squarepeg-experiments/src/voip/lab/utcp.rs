//! The userspace-TCP variants on the real lab: squarepeg's TCP on a TUN device at each end
//! of the lab (`squarepeg_lab::stack::LabStack`), crossing the emulator like any kernel TCP.
//!
//! The voice call runs the library: `squarepeg::Endpoint::listen_utcp` on the sender's
//! (server end, stack address `.4`) and `squarepeg::Connection::connect_utcp` on the
//! receiver's stack (client end, `.3`), each message with the scenario's playout offset as
//! lifetime; `utcp-ir` keeps `inconsistent_retransmissions` on, `utcp` turns it off. The
//! sender's message statuses (`Expired`, `Squashed`, `Replaced`) are what it dropped or
//! replaced.
//!
//! [`open_utcp_pair`] is the raw uTCP record interface across a lab, which the priority
//! experiment's lab run still uses.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use squarepeg_framing::FrameHeader;
use squarepeg_io::{StackConfig, TcpStream};
use squarepeg_lab::net::{Lab, Role};
use squarepeg_lab::sim::{KIND_DATA, decode_payload};
use squarepeg_lab::stack::{LabStack, stack_addresses};
use squarepeg_tcp::ConnectionConfig;
use squarepeg_tcp::utcp::record::{self, ReadRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::transports::{Library, open_library};
use super::{LabCall, LabEnds, LabTransport, VOICE_PORT, VoiceReceiver};
use crate::voip::VoipError;
use crate::voip::sim::tcp_host::unordered_reassembler;
use crate::voip::wire::Framing;

/// How long opening the call may take (handshake across the emulator).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the close handshake may take once a side is done.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes per `read` on the receiver.
const READ_BUFFER: usize = 64 * 1024;

/// uCOBS messages over squarepeg's userspace TCP at both ends of the lab, with unordered
/// delivery; `inconsistent` adds inconsistent retransmissions.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabUtcp {
    /// Inconsistent retransmissions (Hollywood §4.2).
    pub inconsistent: bool,
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> VoipError + '_ {
    move |e| VoipError::Transport(format!("{what}: {e}"))
}

fn runtime() -> Result<tokio::runtime::Runtime, VoipError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("building a tokio runtime"))
}

pub(crate) fn attach(lab: &Lab, role: Role) -> Result<LabStack, VoipError> {
    LabStack::attach(lab, role, StackConfig::new([]), None)
        .map_err(|e| VoipError::Transport(format!("userspace TCP on the {role:?} end: {e}")))
}

impl LabTransport for LabUtcp {
    fn name(&self) -> &'static str {
        if self.inconsistent { "utcp-ir" } else { "utcp" }
    }
    fn description(&self) -> &'static str {
        if self.inconsistent {
            "uCOBS messages over squarepeg's userspace TCP on TUN at both ends: unordered delivery, lifetimes, inconsistent retransmissions"
        } else {
            "uCOBS messages over squarepeg's userspace TCP on TUN at both ends: unordered delivery, lifetimes"
        }
    }
    fn framing(&self) -> Framing {
        Framing::Ucobs
    }
    fn addresses(&self, lab: &Lab) -> Option<(SocketAddr, SocketAddr)> {
        let (server, _) = stack_addresses(lab, Role::Server)?;
        let (client, _) = stack_addresses(lab, Role::Client)?;
        Some((
            SocketAddr::new(IpAddr::V4(server), VOICE_PORT),
            SocketAddr::new(IpAddr::V4(client), VOICE_PORT),
        ))
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        // The library end to end: `squarepeg::Connection` over each end's stack, each
        // message with the scenario's playout offset as lifetime (its deadline).
        let library = Library::Utcp {
            sender: Box::new(attach(lab, Role::Server)?),
            receiver: Box::new(attach(lab, Role::Client)?),
            inconsistent_retransmissions: self.inconsistent,
        };
        open_library(lab, call, library, call.scenario.playout_offset())
    }
}

/// A uTCP connection across a lab, from a userspace stack at the client end (receiving
/// segment records, on a thread of its own) to one at the server end (the caller's).
pub(crate) struct UtcpPair {
    /// The sender's runtime (drive `stream` with it).
    pub rt: tokio::runtime::Runtime,
    /// The sender's end of the connection.
    pub stream: TcpStream,
    /// The sender's stack: keep it while the connection is used.
    pub stack: LabStack,
    /// Every message frame's payload as delivered, with the time, each message once.
    pub receiver: UtcpReceiver,
}

/// Attaches a stack to each end of `lab`, listens at `sender` (a server-end stack address)
/// with `send_config`, connects from the client end with `recv_config` (which must have
/// `unordered_receive`) and starts the receiver's thread.
pub(crate) fn open_utcp_pair(
    lab: &Lab,
    sender: SocketAddr,
    send_config: ConnectionConfig,
    recv_config: ConnectionConfig,
) -> Result<UtcpPair, VoipError> {
    let server = attach(lab, Role::Server)?;
    let client = attach(lab, Role::Client)?;
    let listener = server
        .stack()
        .listen_with(&[sender], send_config)
        .map_err(io_err("listening on the sender's stack"))?;
    let rt = runtime()?;

    let (messages_tx, messages_rx) = mpsc::channel::<(Vec<u8>, Instant)>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (connected_tx, connected_rx) = mpsc::channel::<Result<(), String>>();
    let receiver_thread = std::thread::Builder::new()
        .name("utcp-receiver".into())
        .spawn(move || {
            let Ok(rt) = runtime() else {
                let _ = connected_tx.send(Err("no tokio runtime".into()));
                return;
            };
            rt.block_on(async move {
                let connect = client.stack().connect_with(sender, recv_config);
                let mut stream = match tokio::time::timeout(OPEN_TIMEOUT, connect).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let _ = connected_tx.send(Err(format!("connect: {e}")));
                        return;
                    }
                    Err(_) => {
                        let _ = connected_tx.send(Err("connect: timed out".into()));
                        return;
                    }
                };
                let _ = connected_tx.send(Ok(()));
                tokio::select! {
                    _ = stop_rx => {}
                    r = receive_records(&mut stream, &messages_tx) => {
                        if let Err(e) = r {
                            eprintln!("utcp receiver: {e}");
                        }
                        // Our FIN, and the close handshake, before the stack goes.
                        drop(messages_tx);
                        if stream.shutdown().await.is_ok() {
                            let _ = tokio::time::timeout(CLOSE_TIMEOUT, stream.wait_closed())
                                .await;
                        }
                    }
                }
                drop(stream);
                drop(client);
            });
        })
        .map_err(io_err("spawning the receiver thread"))?;
    let receiver = UtcpReceiver {
        messages: messages_rx,
        stop: Some(stop_tx),
        thread: Some(receiver_thread),
    };
    let accepted =
        rt.block_on(async { tokio::time::timeout(OPEN_TIMEOUT, listener.accept()).await });
    let (stream, _) = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(VoipError::Transport(format!("accept: {e}"))),
        Err(_) => return Err(VoipError::Transport("accept: timed out".into())),
    };
    match connected_rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(VoipError::Transport(e)),
        Err(_) => return Err(VoipError::Transport("the receiver never connected".into())),
    }
    Ok(UtcpPair {
        rt,
        stream,
        stack: server,
        receiver,
    })
}

/// Reads segment records until the end of the stream, delivering each message once.
async fn receive_records(
    stream: &mut TcpStream,
    messages: &mpsc::Sender<(Vec<u8>, Instant)>,
) -> Result<(), String> {
    let mut reassembler = unordered_reassembler().map_err(|e| e.to_string())?;
    let mut seen = BTreeSet::new();
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        let at = Instant::now();
        for rec in record::decode_read(&buf[..n]) {
            let ReadRecord::Segment { offset, data } = rec.map_err(|e| e.to_string())? else {
                continue;
            };
            if let Err(e) = reassembler.insert(offset, data) {
                return Err(format!("reassembly: {e}"));
            }
            while let Some(frame) = reassembler.next_frame() {
                if let Ok(frame) = frame
                    && let FrameHeader::Message { .. } = frame.frame.header
                    && let Some((KIND_DATA, number, _)) = decode_payload(&frame.frame.payload)
                    && seen.insert(number)
                    && messages.send((frame.frame.payload.to_vec(), at)).is_err()
                {
                    return Ok(());
                }
            }
        }
    }
}

pub(crate) struct UtcpReceiver {
    messages: mpsc::Receiver<(Vec<u8>, Instant)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl VoiceReceiver for UtcpReceiver {
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            match self.messages.recv_timeout(deadline - now) {
                Ok(m) => return Ok(Some(m)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }
}

impl Drop for UtcpReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
