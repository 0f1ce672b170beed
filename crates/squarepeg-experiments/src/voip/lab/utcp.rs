//! The userspace-TCP variants on the real lab: squarepeg's TCP on a TUN device at each end
//! of the lab (`squarepeg_io::lab::LabStack`), crossing the emulator like any kernel TCP,
//! with the uTCP interface through the stack's byte stream as records
//! (`squarepeg_tcp::utcp::record`, Minion's socket options).
//!
//! - Sender (server end, stack address `.4`): `message_writes` — each voice message is one
//!   uCOBS message frame in one message record, with its message number as id and the
//!   scenario's playout offset as lifetime (the connection turns it into a deadline when it
//!   takes the write); `utcp-ir` also sets the padder (inconsistent retransmissions).
//! - Receiver (client end, `.3`): `unordered_receive` — every `read` returns segment records
//!   (offset and bytes), which go into a `squarepeg_framing::Reassembler`; each whole
//!   message frame is delivered at once, deduplicated by number.
//!
//! Each end runs its own current-thread tokio runtime; the stacks' driver threads do the
//! packet I/O. The sender's connection has `unordered_receive` too, so that its message
//! reports (replaced, expired) come back through `read` as report records; the run counts
//! them as replaced or dropped by the sender.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use squarepeg_framing::{FrameHeader, encode_frame, encode_padding};
use squarepeg_io::lab::{LabStack, stack_addresses};
use squarepeg_io::{StackConfig, TcpStream};
use squarepeg_lab::net::{Lab, Role};
use squarepeg_lab::sim::{KIND_DATA, decode_payload};
use squarepeg_tcp::utcp::record::{self, MessageMeta, ReadRecord};
use squarepeg_tcp::{ConnectionConfig, MessageReport, Padder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{LabCall, LabEnds, LabTransport, SenderDrops, VOICE_PORT, VoiceReceiver, VoiceSender};
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
        let send_config = ConnectionConfig {
            message_writes: true,
            // The message reports come back through `read` as records only in this mode
            // (the peer sends no data).
            unordered_receive: true,
            consistent_segmentation: true,
            padder: self.inconsistent.then_some(Padder(encode_padding)),
            ..ConnectionConfig::default()
        };
        let recv_config = ConnectionConfig {
            unordered_receive: true,
            ..ConnectionConfig::default()
        };
        let pair = open_utcp_pair(lab, call.sender, send_config, recv_config)?;
        Ok(LabEnds {
            sender: Box::new(UtcpSender {
                rt: pair.rt,
                stream: Some(pair.stream),
                _stack: pair.stack,
                lifetime: call.scenario.playout_offset(),
                drain: call.config.drain,
                record: Vec::new(),
                frame: Vec::new(),
                reports: vec![0; READ_BUFFER],
                drops: SenderDrops::default(),
            }),
            receiver: Box::new(pair.receiver),
        })
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

struct UtcpSender {
    rt: tokio::runtime::Runtime,
    stream: Option<TcpStream>,
    /// Kept alive while the call runs (its TUN device carries the connection).
    _stack: LabStack,
    lifetime: Duration,
    /// How long after the last message the call's data may still be in flight.
    drain: Duration,
    record: Vec<u8>,
    frame: Vec<u8>,
    /// Read buffer for report records.
    reports: Vec<u8>,
    drops: SenderDrops,
}

impl UtcpSender {
    /// Takes the report records waiting (without waiting for more). Reports are bounded in
    /// the connection (`MAX_PENDING_REPORTS`), so they are taken after every message.
    fn take_reports(&mut self) -> Result<(), VoipError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        loop {
            // A zero timeout polls the read once: records now, or nothing.
            let read = self.rt.block_on(async {
                tokio::time::timeout(Duration::ZERO, stream.read(&mut self.reports)).await
            });
            let n = match read {
                Ok(Ok(n)) if n > 0 => n,
                Ok(Ok(_)) | Err(_) => return Ok(()),
                Ok(Err(e)) => return Err(VoipError::Transport(format!("read reports: {e}"))),
            };
            note_reports(&self.reports[..n], &mut self.drops)?;
        }
    }
}

/// Notes the replaced and dropped messages among report records.
fn note_reports(buf: &[u8], drops: &mut SenderDrops) -> Result<(), VoipError> {
    for rec in record::decode_read(buf) {
        match rec.map_err(|e| VoipError::Transport(e.to_string()))? {
            ReadRecord::Report(MessageReport::Replaced { id }) => {
                drops.replaced.insert(id);
            }
            ReadRecord::Report(MessageReport::Expired { id } | MessageReport::Squashed { id }) => {
                drops.dropped.insert(id);
            }
            _ => {}
        }
    }
    Ok(())
}

impl VoiceSender for UtcpSender {
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError> {
        let Some((KIND_DATA, number, _)) = decode_payload(message) else {
            return Err(VoipError::Transport("not a voice message".into()));
        };
        self.frame.clear();
        encode_frame(
            &FrameHeader::Message {
                substream: 0,
                number,
            },
            message,
            &mut self.frame,
        )
        .map_err(|e| VoipError::Transport(format!("frame: {e}")))?;
        self.record.clear();
        let meta = MessageMeta {
            lifetime: Some(self.lifetime),
            message_id: Some(number),
            ..MessageMeta::default()
        };
        record::encode_message(&meta, &self.frame, &mut self.record);
        self.take_reports()?;
        let Some(stream) = self.stream.as_mut() else {
            return Ok(false);
        };
        // A message record is taken whole or not at all; a full send buffer refuses it
        // rather than blocking the call's clock.
        let record = &self.record;
        let written = self.rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(1), stream.write(record)).await
        });
        match written {
            Ok(Ok(n)) if n == record.len() => Ok(true),
            Ok(Ok(n)) => Err(VoipError::Transport(format!(
                "the stack took {n} of a {}-byte message record",
                record.len()
            ))),
            Ok(Err(e)) => Err(VoipError::Transport(format!("write: {e}"))),
            Err(_) => Ok(false),
        }
    }

    fn close(mut self: Box<Self>) -> Result<SenderDrops, VoipError> {
        self.take_reports()?;
        if let Some(mut stream) = self.stream.take() {
            // FIN after everything queued. The stack (and so the connection) must live until
            // the receiver has everything: until the peer's FIN (the end of our read side)
            // and the close handshake, or the call's drain time. Reports keep coming until
            // then (a retransmission may be replaced after the last write).
            self.rt
                .block_on(stream.shutdown())
                .map_err(io_err("shutdown"))?;
            let drain = self.drain;
            let (buf, drops) = (&mut self.reports, &mut self.drops);
            let outcome = self.rt.block_on(async {
                tokio::time::timeout(drain, async {
                    loop {
                        match stream.read(buf).await {
                            Ok(0) => break,
                            Ok(n) => note_reports(&buf[..n], drops)?,
                            Err(e) => {
                                return Err(VoipError::Transport(format!("read reports: {e}")));
                            }
                        }
                    }
                    let _ = stream.wait_closed().await;
                    Ok(())
                })
                .await
            });
            if let Ok(r) = outcome {
                r?;
            }
        }
        Ok(std::mem::take(&mut self.drops))
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
