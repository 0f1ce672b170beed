//! The VoIP experiment on the real network lab: kernel stacks in network namespaces, the
//! lab's userspace link emulator between them, real time.
//!
//! Each run builds its own lab (`squarepeg_lab::net::Lab`: client, emulator and server
//! namespaces) with the scenario's links and the run's seed, and removes it afterwards, also
//! on failure (the lab's guard). The sender runs in the server namespace and the receiver in
//! the client namespace, as threads of this process: both read the same CLOCK_MONOTONIC
//! (`Instant`), so the one-way delay is measured directly. The sender's thread sleeps until
//! each message is due, stamps it with the current time and hands it to the transport; the
//! receiver's thread stamps each message when the transport hands it over.
//!
//! The emulator captures both of its interfaces; the server-facing capture holds the voice
//! packets as the sender sent them (before the impairments) and the client-facing one as
//! they were delivered, which [`super::wire`] turns into the messages the network lost.
//!
//! # Adding a transport
//!
//! Implement [`LabTransport`]: open the call ([`LabTransport::open`]) and return its two
//! ends as a [`VoiceSender`] and a [`VoiceReceiver`]; say how messages lie on the wire
//! ([`LabTransport::framing`]); list it in [`transports`].

pub(crate) mod transports;
pub(crate) mod utcp;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etherparse::{SlicedPacket, TransportSlice};
use squarepeg_lab::net::{CaptureSide, EmulatorStats, Lab, LabConfig, capture_path};
use squarepeg_lab::packet::parse_ip;
use squarepeg_lab::pcap::read_pcap;
use squarepeg_lab::sim::{KIND_DATA, decode_payload, encode_payload};

pub use transports::{LabSquarepeg, LabTcp, LabTls, LabUdp};
pub use utcp::LabUtcp;

use super::analysis::{Observations, analyse};
use super::config::{Scenario, VoipConfig};
use super::sim::bulk_start;
use super::wire::{Framing, lost_by_network, match_delivered};
use super::{Engine, RunResult, VoipError};

/// Port of the call at both ends.
pub const VOICE_PORT: u16 = 5004;
/// The congestion control of the bulk senders: loss-based like Minion's competing
/// transfers and the simulator's TCP, whatever the kernel's default is (BBR on the machine
/// of docs/results.md). The voice sockets keep the default: a call of 64 kbit/s is
/// application-limited, so its congestion window never binds, and the `squarepeg` crate
/// creates its own sockets.
pub const BULK_CONGESTION: &str = "cubic";

/// Port of the bulk transfers' server.
pub const BULK_PORT: u16 = 5001;

/// The call's addresses in a running lab.
#[derive(Debug, Clone)]
pub struct LabCall {
    /// The sender, in the server namespace.
    pub sender: SocketAddr,
    /// The receiver, in the client namespace.
    pub receiver: SocketAddr,
    /// The application.
    pub config: VoipConfig,
    /// The scenario.
    pub scenario: Scenario,
}

/// The sending end of a call.
pub trait VoiceSender: Send {
    /// Hands one message to the transport now. `Ok(false)`: the transport refused it (its
    /// queue is full); an error ends the run.
    fn send(&mut self, message: &[u8]) -> Result<bool, VoipError>;
    /// Ends the call after the last message (the transport may still deliver what it
    /// holds), and says which messages it dropped or replaced, if it knows.
    fn close(self: Box<Self>) -> Result<SenderDrops, VoipError>;
}

/// Messages a sender accepted but did not deliver as written (see
/// [`super::Observations`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderDrops {
    /// Dropped unsent (deadline passed).
    pub dropped: BTreeSet<u64>,
    /// Retransmission replaced by other messages (Hollywood §4.2).
    pub replaced: BTreeSet<u64>,
}

/// The receiving end of a call.
pub trait VoiceReceiver: Send {
    /// The next message and when the application got it; `None` once `deadline` has passed
    /// or the sender has closed the call.
    fn receive(&mut self, deadline: Instant) -> Result<Option<(Vec<u8>, Instant)>, VoipError>;
    /// Over TLS: the record layer's counters as of the last message received.
    fn tls_stats(&self) -> Option<squarepeg::TlsStats> {
        None
    }
}

/// The two ends of an open call.
pub struct LabEnds {
    /// In the server namespace.
    pub sender: Box<dyn VoiceSender>,
    /// In the client namespace.
    pub receiver: Box<dyn VoiceReceiver>,
}

/// A transport on the real lab: one implementation per transport.
pub trait LabTransport: Sync {
    /// The name in reports (`udp`, `tcp`, `squarepeg`, …).
    fn name(&self) -> &'static str;
    /// One line for people.
    fn description(&self) -> &'static str;
    /// How messages lie on the wire.
    fn framing(&self) -> Framing;
    /// Opens the call across `lab`: the sender at `call.sender` in the server namespace, the
    /// receiver at `call.receiver` in the client namespace (sockets stay in the namespace
    /// they are created in, see `NetNs::run`).
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError>;
    /// The call's sender and receiver addresses when they are not the kernels' (a
    /// userspace stack has addresses of its own); `None`: the server's and the client's.
    fn addresses(&self, _lab: &Lab) -> Option<(SocketAddr, SocketAddr)> {
        None
    }
}

/// Every lab transport, in report order.
pub fn transports() -> Vec<Box<dyn LabTransport>> {
    vec![
        Box::new(LabUdp),
        Box::new(LabTcp),
        Box::new(LabSquarepeg),
        Box::new(LabTls),
        Box::new(LabUtcp {
            inconsistent: false,
            tls: false,
        }),
        Box::new(LabUtcp {
            inconsistent: true,
            tls: false,
        }),
        Box::new(LabUtcp {
            inconsistent: false,
            tls: true,
        }),
        Box::new(LabUtcp {
            inconsistent: true,
            tls: true,
        }),
    ]
}

/// A lab transport by name.
pub fn transport(name: &str) -> Result<Box<dyn LabTransport>, VoipError> {
    let all = transports();
    let known = all.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ");
    all.into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| VoipError::UnknownTransport {
            name: name.to_owned(),
            known,
        })
}

/// Progress of a running call: messages sent so far and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Messages sent.
    pub sent: u64,
    /// Messages to send.
    pub total: u64,
}

static LABS: AtomicU32 = AtomicU32::new(0);

/// Removes a directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs one transport over one scenario on a lab of its own; `progress` is called about
/// once a second while the call runs.
pub fn run(
    scenario: &Scenario,
    transport: &dyn LabTransport,
    config: &VoipConfig,
    seed: u64,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<RunResult, VoipError> {
    config.validate()?;
    let index = LABS.fetch_add(1, Ordering::Relaxed);
    let captures =
        TempDir(std::env::temp_dir().join(format!("sqpg-voip-{}-{index}", std::process::id())));
    let lab_config = LabConfig::new(&format!("voip{index}"))
        .with_bottleneck(scenario.bottleneck.clone())
        .with_seed(seed)
        .with_capture_dir(&captures.0);
    let lab = Lab::start(lab_config)?;
    let addresses = *lab.addresses();
    let (sender, receiver) = transport.addresses(&lab).unwrap_or((
        SocketAddr::new(addresses.server_v4.into(), VOICE_PORT),
        SocketAddr::new(addresses.client_v4.into(), VOICE_PORT),
    ));
    let call = LabCall {
        sender,
        receiver,
        config: *config,
        scenario: scenario.clone(),
    };
    // Everything that can fail while the lab runs; the lab is torn down either way.
    let outcome = run_call(&lab, &call, transport, progress);
    let stats = lab.teardown();
    let (sent, arrivals, mut warnings, drops, receiver_tls) = outcome?;
    let stats = stats?;
    let log = wire_log(&captures.0, &call, transport.framing())?;
    let lost = lost_by_network(&log, transport.framing())?;
    let down = &stats.down;
    if down.kernel_drops > 0 || down.dropped_overload > 0 {
        warnings.push(format!(
            "the emulator missed {} frames and refused {} packets on the downlink: \
             the network losses may be undercounted",
            down.kernel_drops, down.dropped_overload
        ));
    }
    let observations = Observations {
        sent,
        arrivals,
        lost_by_network: lost,
        dropped_by_sender: drops.dropped,
        replaced_by_sender: drops.replaced,
    };
    let analysis = analyse(config, scenario, &observations);
    Ok(RunResult {
        engine: Engine::Lab,
        scenario: scenario.clone(),
        transport: transport.name().to_owned(),
        transport_description: transport.description().to_owned(),
        seed,
        analysis,
        engine_stats: {
            let mut e = engine_stats(&stats, &log);
            super::note_tls(&mut e, transport.framing(), receiver_tls.as_ref());
            e
        },
        warnings,
    })
}

fn engine_stats(stats: &EmulatorStats, log: &[super::wire::WirePacket]) -> serde_json::Value {
    serde_json::json!({
        "voice_packets_sent": log.len(),
        "voice_packets_dropped": log.iter().filter(|p| !p.delivered).count(),
        "down": stats.down,
        "up": stats.up,
        "elapsed_s": stats.elapsed_s,
    })
}

pub(crate) type CallOutcome = (
    Vec<Option<Duration>>,
    Vec<(u64, Duration)>,
    Vec<String>,
    SenderDrops,
    Option<squarepeg::TlsStats>,
);

pub(crate) fn run_call(
    lab: &Lab,
    call: &LabCall,
    transport: &dyn LabTransport,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<CallOutcome, VoipError> {
    let config = call.config;
    let stop = Arc::new(AtomicBool::new(false));
    let bulk = match call.scenario.bulk {
        Some(b) => Some(Bulk::start(lab, b.flows, Arc::clone(&stop))?),
        None => None,
    };
    let LabEnds {
        mut sender,
        mut receiver,
    } = transport.open(lab, call)?;
    let epoch = Instant::now();
    let end = epoch + config.end();
    let arrivals: Mutex<Vec<(u64, Duration)>> = Mutex::new(Vec::new());
    let result = std::thread::scope(
        |scope| -> Result<(Vec<Option<Duration>>, SenderDrops), VoipError> {
            let receiving = scope.spawn(|| -> Result<(), VoipError> {
                while let Some((message, at)) = receiver.receive(end)? {
                    if let Some((KIND_DATA, number, _)) = decode_payload(&message)
                        && let Ok(mut a) = arrivals.lock()
                    {
                        a.push((number, at.saturating_duration_since(epoch)));
                    }
                }
                Ok(())
            });
            let bulk_clients = bulk
                .as_ref()
                .map(|b| b.schedule_clients(scope, lab, &config, epoch));
            let mut sent = Vec::with_capacity(config.count as usize);
            let mut last_report = Instant::now();
            let mut failure = None;
            for number in 0..config.count {
                let due = epoch + config.due(number);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let at = Instant::now().saturating_duration_since(epoch);
                let message = encode_payload(KIND_DATA, number, at, config.message_bytes);
                match sender.send(&message) {
                    Ok(accepted) => sent.push(accepted.then_some(at)),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
                if last_report.elapsed() >= Duration::from_secs(1) {
                    progress(Progress {
                        sent: number + 1,
                        total: config.count,
                    });
                    last_report = Instant::now();
                }
            }
            progress(Progress {
                sent: sent.len() as u64,
                total: config.count,
            });
            // The bulk flows stop with the call; the receiver drains until the end.
            stop.store(true, Ordering::Relaxed);
            let closed = sender.close();
            let received = receiving
                .join()
                .map_err(|_| VoipError::Transport("the receiver thread panicked".into()))?;
            if let Some(clients) = bulk_clients {
                let _ = clients.join();
            }
            if let Some(e) = failure {
                return Err(e);
            }
            let drops = closed?;
            received?;
            sent.resize(config.count as usize, None);
            Ok((sent, drops))
        },
    );
    stop.store(true, Ordering::Relaxed);
    let warnings = match bulk {
        Some(b) => b.finish(),
        None => Vec::new(),
    };
    let (sent, drops) = result?;
    let arrivals = arrivals
        .into_inner()
        .map_err(|_| VoipError::Transport("the receiver thread panicked".into()))?;
    Ok((sent, arrivals, warnings, drops, receiver.tls_stats()))
}

/// Reads the emulator's captures back: the voice flow's packets from the sender, as sent
/// (server-facing interface) and as delivered (client-facing interface).
fn wire_log(
    dir: &Path,
    call: &LabCall,
    framing: Framing,
) -> Result<Vec<super::wire::WirePacket>, VoipError> {
    let read = |side| -> Result<Vec<Vec<u8>>, VoipError> {
        let path = capture_path(dir, side);
        let bytes =
            std::fs::read(&path).map_err(VoipError::io(format!("reading {}", path.display())))?;
        let file = read_pcap(&bytes)
            .map_err(|e| VoipError::Wire(format!("capture {}: {e}", path.display())))?;
        Ok(file
            .records
            .into_iter()
            .filter(|r| is_voice(&r.data, call, framing))
            .map(|r| r.data)
            .collect())
    };
    let sent = read(CaptureSide::Server)?;
    let delivered = read(CaptureSide::Client)?;
    match_delivered(sent, &delivered)
}

fn is_voice(packet: &[u8], call: &LabCall, framing: Framing) -> bool {
    let Ok(ip) = parse_ip(packet) else {
        return false;
    };
    if ip.src != call.sender.ip() || ip.dst != call.receiver.ip() {
        return false;
    }
    let Ok(sliced) = SlicedPacket::from_ip(packet) else {
        return false;
    };
    match (sliced.transport, framing) {
        (Some(TransportSlice::Udp(u)), Framing::Datagram) => u.source_port() == call.sender.port(),
        (Some(TransportSlice::Tcp(t)), Framing::LengthPrefixed | Framing::Ucobs | Framing::Tls) => {
            t.source_port() == call.sender.port()
        }
        _ => false,
    }
}

/// Bulk TCP downloads through the lab (Minion §8.2): kernel TCP, server namespace to client
/// namespace, each writing as fast as TCP takes data until the call ends.
struct Bulk {
    server: SocketAddr,
    flows: u32,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<Vec<String>>>,
}

/// How long a bulk socket call blocks before the stop flag is checked again.
const BULK_POLL: Duration = Duration::from_millis(100);

impl Bulk {
    fn start(lab: &Lab, flows: u32, stop: Arc<AtomicBool>) -> Result<Self, VoipError> {
        let server = SocketAddr::new(lab.addresses().server_v4.into(), BULK_PORT);
        let listener = lab
            .server()
            .run(|| TcpListener::bind(server))?
            .map_err(VoipError::io("binding the bulk server"))?;
        listener
            .set_nonblocking(true)
            .map_err(VoipError::io("bulk server"))?;
        let flag = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            let mut writers = Vec::new();
            let mut errors = Vec::new();
            while !flag.load(Ordering::Relaxed) && writers.len() < flows as usize {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let flag = Arc::clone(&flag);
                        writers.push(std::thread::spawn(move || write_bulk(stream, &flag)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        errors.push(format!("bulk accept: {e}"));
                        break;
                    }
                }
            }
            for w in writers {
                match w.join() {
                    Ok(Err(e)) => errors.push(format!("bulk writer: {e}")),
                    Err(_) => errors.push("a bulk writer panicked".into()),
                    Ok(Ok(())) => {}
                }
            }
            errors
        });
        Ok(Self {
            server,
            flows,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Connects flow k at its start time from the client namespace and reads it until the
    /// stop flag; returns the thread doing so.
    fn schedule_clients<'scope, 'env>(
        &'env self,
        scope: &'scope std::thread::Scope<'scope, 'env>,
        lab: &'env Lab,
        config: &VoipConfig,
        epoch: Instant,
    ) -> std::thread::ScopedJoinHandle<'scope, ()> {
        let starts: Vec<Instant> = (0..self.flows)
            .map(|k| epoch + bulk_start(config, k, self.flows))
            .collect();
        scope.spawn(move || {
            let mut readers = Vec::new();
            for start in starts {
                while Instant::now() < start {
                    if self.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep((start - Instant::now()).min(BULK_POLL));
                }
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                let server = self.server;
                if let Ok(Ok(stream)) = lab.client().run(|| TcpStream::connect(server)) {
                    let stop = Arc::clone(&self.stop);
                    readers.push(std::thread::spawn(move || read_bulk(stream, &stop)));
                }
            }
            for r in readers {
                let _ = r.join();
            }
        })
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.acceptor
            .take()
            .and_then(|a| a.join().ok())
            .unwrap_or_else(|| vec!["the bulk server panicked".into()])
    }
}

fn write_bulk(mut stream: TcpStream, stop: &AtomicBool) -> std::io::Result<()> {
    use std::io::Write;
    socket2::SockRef::from(&stream).set_tcp_congestion(BULK_CONGESTION.as_bytes())?;
    stream.set_write_timeout(Some(BULK_POLL))?;
    let chunk = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match stream.write(&chunk) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            // The client went away at the end of the run.
            Err(_) => break,
        }
    }
    Ok(())
}

fn read_bulk(mut stream: TcpStream, stop: &AtomicBool) {
    use std::io::Read;
    let _ = stream.set_read_timeout(Some(BULK_POLL));
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}
