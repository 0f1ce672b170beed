//! The VoIP experiment on the deterministic simulator: sans-IO transports in virtual time.
//!
//! The call's sender sits on the right (server) side of the dumbbell, the receiver on the
//! left, so the voice crosses the downlink. The simulator's trace hooks record every packet
//! the sender sends and every packet the receiver gets, from which [`super::wire`] finds the
//! messages the network lost. A run is a pure function of its seed: the same seed gives the
//! same records and the same JSON.
//!
//! # Adding a transport
//!
//! Implement [`SimTransport`]: put the two ends of the call into the simulator
//! ([`SimTransport::install`]), say how messages lie on the wire ([`SimTransport::framing`])
//! and read back what each end recorded ([`SimTransport::collect`]); then list it in
//! [`transports`]. The TCP ends in [`tcp_host`] take a [`tcp_host::StreamCodec`], so a new
//! codec over the same TCP is one more variant there.

pub mod tcp_host;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use squarepeg_lab::Side;
use squarepeg_lab::packet::parse_ip;
use squarepeg_lab::sim::{HostId, PeriodicFlow, SimConfig, Simulator, TraceKind, UdpHost};

use super::analysis::{Observations, analyse};
use super::config::{Scenario, VoipConfig};
use super::wire::{Framing, lost_by_network, match_delivered};
use super::{Engine, RunResult, VoipError};
use tcp_host::{BulkClient, BulkServer, StreamCodec, TcpVoiceHost, TlsPair};

/// Where the call's ends sit in the simulator.
#[derive(Debug, Clone)]
pub struct SimCall {
    /// The sender (right side).
    pub sender: SocketAddr,
    /// The receiver (left side).
    pub receiver: SocketAddr,
    /// The application.
    pub config: VoipConfig,
    /// The scenario.
    pub scenario: Scenario,
    /// The run's seed (for endpoint secrets).
    pub seed: u64,
}

/// The hosts a transport installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimEnds {
    /// The sender's host.
    pub sender: HostId,
    /// The receiver's host.
    pub receiver: HostId,
}

/// What the ends recorded.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// Per message number, its send time from the start (`None`: refused).
    pub sent: Vec<Option<Duration>>,
    /// Arrivals at the receiving application: number and time from the start.
    pub arrivals: Vec<(u64, Duration)>,
    /// Errors the ends reported.
    pub errors: Vec<String>,
    /// Messages the sender dropped unsent (their deadline passed in its queue).
    pub dropped_by_sender: BTreeSet<u64>,
    /// Messages whose retransmission the sender filled with other messages (Hollywood
    /// §4.2 inconsistent retransmissions).
    pub replaced_by_sender: BTreeSet<u64>,
    /// Over TLS: the receiving end's record-layer counters (records opened, out of order).
    pub receiver_tls: Option<squarepeg_connection::TlsStats>,
}

/// A transport on the simulator: one implementation per transport.
pub trait SimTransport {
    /// The name in reports (`udp`, `tcp`, `squarepeg`, …).
    fn name(&self) -> &'static str;
    /// One line for people.
    fn description(&self) -> &'static str;
    /// How messages lie on the wire.
    fn framing(&self) -> Framing;
    /// Adds the sender (right side) and the receiver (left side) to the simulator.
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError>;
    /// Reads back what the ends recorded after the run.
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError>;
}

/// The lab's UDP host: no retransmissions, the reference for what the network lost.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimUdp;

impl SimTransport for SimUdp {
    fn name(&self) -> &'static str {
        "udp"
    }
    fn description(&self) -> &'static str {
        "UDP (the lab's UdpHost): one datagram per message, never retransmitted"
    }
    fn framing(&self) -> Framing {
        Framing::Datagram
    }
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError> {
        let start = sim.start();
        let mut sender = UdpHost::new(call.sender.ip(), start);
        sender
            .add_flow(PeriodicFlow {
                dest: call.receiver,
                src_port: call.sender.port(),
                payload_len: call.config.message_bytes,
                interval: call.config.interval,
                count: call.config.count,
                start: call.config.lead_in,
            })
            .map_err(|e| VoipError::Config(e.to_string()))?;
        let sender = sim.add_host(Side::Right, sender)?;
        let receiver = sim.add_host(Side::Left, UdpHost::new(call.receiver.ip(), start))?;
        Ok(SimEnds { sender, receiver })
    }
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError> {
        let start = sim.start();
        let receiver = sim
            .host::<UdpHost>(ends.receiver)
            .ok_or_else(|| VoipError::Transport("the UDP receiver is not a UdpHost".into()))?;
        let sender = sim
            .host::<UdpHost>(ends.sender)
            .ok_or_else(|| VoipError::Transport("the UDP sender is not a UdpHost".into()))?;
        // The host sends each datagram exactly when due (its timer fires then).
        let sent_count = sender.flow_sent(0).unwrap_or(0);
        Ok(Recorded {
            sent: (0..call.config.count)
                .map(|n| (n < sent_count).then(|| call.config.due(n)))
                .collect(),
            arrivals: receiver
                .received()
                .iter()
                .filter(|a| a.from == call.sender)
                .map(|a| (a.seq, a.received_at.saturating_duration_since(start)))
                .collect(),
            ..Recorded::default()
        })
    }
}

/// Length-prefixed records over squarepeg's userspace TCP in standard mode (in order, every
/// byte retransmitted until acknowledged): the plain-TCP baseline.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimTcp;

/// squarepeg session messages (uCOBS frames) over squarepeg's userspace TCP in standard
/// mode, each message with its playout budget as lifetime.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimSession;

fn install_tcp(
    sim: &mut Simulator,
    call: &SimCall,
    codec: impl Fn() -> Result<StreamCodec, VoipError>,
) -> Result<SimEnds, VoipError> {
    let start = sim.start();
    let sender = TcpVoiceHost::sender(call.sender, start, call.config, codec()?, call.seed);
    let receiver = TcpVoiceHost::receiver(
        call.receiver,
        call.sender,
        start,
        call.config,
        codec()?,
        call.seed,
    );
    let sender = sim.add_host(Side::Right, sender)?;
    let receiver = sim.add_host(Side::Left, receiver)?;
    Ok(SimEnds { sender, receiver })
}

fn collect_tcp(sim: &Simulator, ends: SimEnds, call: &SimCall) -> Result<Recorded, VoipError> {
    let get = |id| {
        sim.host::<TcpVoiceHost>(id)
            .ok_or_else(|| VoipError::Transport("a TCP end is not a TcpVoiceHost".into()))
    };
    let sender = get(ends.sender)?;
    let receiver = get(ends.receiver)?;
    let mut sent = sender.sent().to_vec();
    sent.resize(call.config.count as usize, None);
    let mut errors: Vec<String> = sender.errors().to_vec();
    errors.extend(receiver.errors().iter().cloned());
    let (dropped_by_sender, replaced_by_sender) = match sender.codec() {
        StreamCodec::Squarepeg(c) => (c.dropped().clone(), c.replaced().clone()),
        _ => Default::default(),
    };
    let receiver_tls = match receiver.codec() {
        StreamCodec::Squarepeg(c) => c.tls_stats(),
        StreamCodec::Records { .. } => None,
    };
    Ok(Recorded {
        sent,
        arrivals: receiver.arrivals().to_vec(),
        errors,
        dropped_by_sender,
        replaced_by_sender,
        receiver_tls,
    })
}

impl SimTransport for SimTcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn description(&self) -> &'static str {
        "length-prefixed records over squarepeg's userspace TCP, standard mode (CUBIC, SACK, no Nagle)"
    }
    fn framing(&self) -> Framing {
        Framing::LengthPrefixed
    }
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError> {
        install_tcp(sim, call, || Ok(StreamCodec::records()))
    }
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError> {
        collect_tcp(sim, ends, call)
    }
}

impl SimTransport for SimSession {
    fn name(&self) -> &'static str {
        "squarepeg"
    }
    fn description(&self) -> &'static str {
        "squarepeg messages over squarepeg's userspace TCP read in order, standard mode (the kernel substrate's behaviour: plain frames after the handshake)"
    }
    fn framing(&self) -> Framing {
        Framing::Ucobs
    }
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError> {
        let lifetime = Some(call.scenario.playout_delay);
        install_tcp(sim, call, || Ok(StreamCodec::session(lifetime)))
    }
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError> {
        collect_tcp(sim, ends, call)
    }
}

/// squarepeg session messages over TLS 1.3 over squarepeg's userspace TCP read in order,
/// standard mode: the kernel substrate's behaviour with TLS (records opened in order), each
/// message with its playout budget as lifetime.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimTls;

impl SimTransport for SimTls {
    fn name(&self) -> &'static str {
        "tls"
    }
    fn description(&self) -> &'static str {
        "squarepeg messages in TLS 1.3 records over squarepeg's userspace TCP read in order, standard mode (the kernel substrate's behaviour)"
    }
    fn framing(&self) -> Framing {
        Framing::Tls
    }
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError> {
        let lifetime = Some(call.scenario.playout_delay);
        let tls = sim_tls()?;
        install_tcp(sim, call, || {
            Ok(StreamCodec::session(lifetime).with_tls(tls.clone()))
        })
    }
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError> {
        collect_tcp(sim, ends, call)
    }
}

/// The TLS set-ups of the simulator's calls: one Ed25519 certificate per process (made once:
/// handshakes of one size, so a seed gives the same run every time), pinned by the client.
pub fn sim_tls() -> Result<TlsPair, VoipError> {
    use squarepeg::tls::config::{self, Trust};
    type Made = Result<(String, String, [u8; 32]), String>;
    static CERT: std::sync::OnceLock<Made> = std::sync::OnceLock::new();
    let made = CERT.get_or_init(|| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(|e| e.to_string())?;
        let mut params =
            rcgen::CertificateParams::new(vec!["peg.sim".to_owned()]).map_err(|e| e.to_string())?;
        // A fixed serial: the default (from the key's hash) may lose a leading zero byte.
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x5a; 16]));
        let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
        let fingerprint = config::certificate_fingerprint(cert.der());
        Ok((cert.pem(), key.serialize_pem(), fingerprint))
    });
    let (cert_pem, key_pem, fingerprint) = made
        .as_ref()
        .map_err(|e| VoipError::Config(format!("TLS certificate: {e}")))?;
    let tls = |e: squarepeg::TlsError| VoipError::Config(format!("TLS: {e}"));
    let server = config::server_config(cert_pem.as_bytes(), key_pem.as_bytes()).map_err(tls)?;
    let client = config::client_config(Trust::PinnedSha256(*fingerprint)).map_err(tls)?;
    Ok(TlsPair {
        client: squarepeg_connection::TlsSetup::Client {
            config: client,
            server_name: "peg.sim".to_owned(),
        },
        server: squarepeg_connection::TlsSetup::Server { config: server },
    })
}

/// uCOBS message frames over squarepeg's userspace TCP with the uTCP interface (Minion §4,
/// Hollywood §4): the receiver takes every segment at once and delivers each message as
/// soon as its frame is whole (no head-of-line blocking); the sender writes each message
/// with its playout time as deadline. With `inconsistent`, a retransmission of messages
/// that would arrive after their deadline carries live messages instead, padded to the
/// same length (Hollywood §4.2). With `tls`, the frames travel in numbered TLS 1.3 records
/// that the receiver opens out of order (docs/wire.md §5); inconsistent retransmissions then
/// wait for a padder that writes records (until it exists `utls-ir` runs as `utls`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SimUtcp {
    /// Inconsistent retransmissions.
    pub inconsistent: bool,
    /// TLS 1.3 in the connection core.
    pub tls: bool,
}

impl SimTransport for SimUtcp {
    fn name(&self) -> &'static str {
        match (self.tls, self.inconsistent) {
            (false, false) => "utcp",
            (false, true) => "utcp-ir",
            (true, false) => "utls",
            (true, true) => "utls-ir",
        }
    }
    fn description(&self) -> &'static str {
        match (self.tls, self.inconsistent) {
            (false, false) => {
                "uCOBS messages over squarepeg's userspace TCP: unordered delivery (Minion §4.1), deadlines, every byte retransmitted"
            }
            (false, true) => {
                "uCOBS messages over squarepeg's userspace TCP: unordered delivery, deadlines and inconsistent retransmissions (Hollywood §4.2)"
            }
            (true, false) => {
                "squarepeg messages in numbered TLS 1.3 records over squarepeg's userspace TCP: records opened out of order, deadlines, every byte retransmitted"
            }
            (true, true) => {
                "as utls, with inconsistent retransmissions asked for (no effect until the TCP has a padder that writes TLS records)"
            }
        }
    }
    fn framing(&self) -> Framing {
        if self.tls {
            Framing::Tls
        } else {
            Framing::Ucobs
        }
    }
    fn install(&self, sim: &mut Simulator, call: &SimCall) -> Result<SimEnds, VoipError> {
        let offset = call.scenario.playout_offset();
        let tls = if self.tls { Some(sim_tls()?) } else { None };
        install_tcp(sim, call, || {
            let codec = StreamCodec::unordered(Some(offset), self.inconsistent);
            Ok(match &tls {
                Some(t) => codec.with_tls(t.clone()),
                None => codec,
            })
        })
    }
    fn collect(
        &self,
        sim: &Simulator,
        ends: SimEnds,
        call: &SimCall,
    ) -> Result<Recorded, VoipError> {
        collect_tcp(sim, ends, call)
    }
}

/// Every simulator transport, in report order.
pub fn transports() -> Vec<Box<dyn SimTransport>> {
    vec![
        Box::new(SimUdp),
        Box::new(SimTcp),
        Box::new(SimSession),
        Box::new(SimTls),
        Box::new(SimUtcp {
            inconsistent: false,
            tls: false,
        }),
        Box::new(SimUtcp {
            inconsistent: true,
            tls: false,
        }),
        Box::new(SimUtcp {
            inconsistent: false,
            tls: true,
        }),
        Box::new(SimUtcp {
            inconsistent: true,
            tls: true,
        }),
    ]
}

/// A simulator transport by name.
pub fn transport(name: &str) -> Result<Box<dyn SimTransport>, VoipError> {
    let all = transports();
    let names: Vec<&str> = all.iter().map(|t| t.name()).collect();
    let known = names.join(", ");
    all.into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| VoipError::UnknownTransport {
            name: name.to_owned(),
            known,
        })
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// The call's sender: right side.
pub const SENDER: SocketAddr = SocketAddr::new(v4(10, 0, 1, 1), 5004);
/// The call's receiver: left side.
pub const RECEIVER: SocketAddr = SocketAddr::new(v4(10, 0, 0, 1), 4000);
/// The bulk transfers' server: right side.
pub const BULK_SERVER: SocketAddr = SocketAddr::new(v4(10, 0, 1, 2), 5001);
/// The bulk transfers' client: left side.
pub const BULK_CLIENT: SocketAddr = SocketAddr::new(v4(10, 0, 0, 2), 0);

/// When bulk flow `k` of `flows` starts, from the run's start: the call is cut into
/// `flows + 1` equal parts and one more flow joins at the start of each part after the
/// first, so the first part is free of contention and the last has all flows (Minion
/// §8.2 adds its competing streams progressively).
pub fn bulk_start(config: &VoipConfig, k: u32, flows: u32) -> Duration {
    config.lead_in + config.duration() / (flows + 1) * (k + 1)
}

/// The voice packets seen by the trace hooks: as sent, and as delivered.
type WireCapture = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Runs one transport over one scenario on the simulator.
pub fn run(
    scenario: &Scenario,
    transport: &dyn SimTransport,
    config: &VoipConfig,
    seed: u64,
) -> Result<RunResult, VoipError> {
    config.validate()?;
    let mut sim = Simulator::new(SimConfig::new(seed, scenario.bottleneck.clone()))?;
    let start = sim.start();
    let call = SimCall {
        sender: SENDER,
        receiver: RECEIVER,
        config: *config,
        scenario: scenario.clone(),
        seed,
    };
    let ends = transport.install(&mut sim, &call)?;
    if let Some(bulk) = scenario.bulk {
        let stop = start + config.lead_in + config.duration();
        sim.add_host(Side::Right, BulkServer::new(BULK_SERVER, start, stop, seed))?;
        let starts = (0..bulk.flows)
            .map(|k| start + bulk_start(config, k, bulk.flows))
            .collect();
        sim.add_host(
            Side::Left,
            BulkClient::new(BULK_CLIENT, BULK_SERVER, start, starts, seed),
        )?;
    }
    // The voice flow's packets, sender to receiver, as sent and as delivered.
    let wire: Rc<RefCell<WireCapture>> = Rc::default();
    let hook = Rc::clone(&wire);
    let sender_ip = call.sender.ip();
    let receiver_ip = call.receiver.ip();
    sim.on_trace(move |event| {
        let voice =
            || parse_ip(event.packet).is_ok_and(|ip| ip.src == sender_ip && ip.dst == receiver_ip);
        match event.kind {
            TraceKind::Sent { host } if host == ends.sender && voice() => {
                hook.borrow_mut().0.push(event.packet.to_vec());
            }
            TraceKind::Delivered { host } if host == ends.receiver && voice() => {
                hook.borrow_mut().1.push(event.packet.to_vec());
            }
            _ => {}
        }
    });
    sim.run_until(start + config.end())?;

    let recorded = transport.collect(&sim, ends, &call)?;
    let (sent_packets, delivered_packets) = std::mem::take(&mut *wire.borrow_mut());
    let log = match_delivered(sent_packets, &delivered_packets)?;
    let lost = lost_by_network(&log, transport.framing())?;
    let observations = Observations {
        sent: recorded.sent,
        arrivals: recorded.arrivals,
        lost_by_network: lost,
        dropped_by_sender: recorded.dropped_by_sender,
        replaced_by_sender: recorded.replaced_by_sender,
    };
    let analysis = analyse(config, scenario, &observations);
    let stats = sim.stats();
    let mut engine_stats = serde_json::json!({
        "voice_packets_sent": log.len(),
        "voice_packets_dropped": log.iter().filter(|p| !p.delivered).count(),
        "down": stats.right_to_left,
        "up": stats.left_to_right,
        "events": stats.events,
    });
    super::note_tls(
        &mut engine_stats,
        transport.framing(),
        recorded.receiver_tls.as_ref(),
    );
    Ok(RunResult {
        engine: Engine::Sim,
        scenario: scenario.clone(),
        transport: transport.name().to_owned(),
        transport_description: transport.description().to_owned(),
        seed,
        analysis,
        engine_stats,
        warnings: recorded.errors,
    })
}
