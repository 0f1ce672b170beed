//! The deterministic simulator: sans-IO hosts on a dumbbell in virtual time.
//!
//! ```text
//!  left hosts ── left chain ══ bottleneck (LinkConfig per direction) ══ right chain ── right hosts
//! ```
//!
//! Hosts implement [`Host`]; each is on the left or the right. A packet a host transmits is
//! routed by its destination address (parsed from the IP header): to a host on the other side
//! it crosses the left and right middlebox chains and the bottleneck direction between them;
//! to a host on the same side it is delivered at once (a local switch); to an address no host
//! claims it crosses to the other side's *default host* if that side has one
//! ([`Simulator::set_default_host`]: the real-time emulator's ports, which stand for whole
//! networks), and is otherwise dropped and counted. Time is virtual: it starts at one real `Instant` and advances
//! only by the durations the link model and the hosts' timers produce, so a run is exactly
//! reproducible from its seed and much faster than real time.
//!
//! Events at the same instant run in the order they were scheduled. A bound on events per
//! instant ([`SimConfig::max_events_per_instant`]) turns a livelock — a host whose timer is
//! always due, or two hosts answering each other forever without time passing — into
//! [`SimError::Livelock`].

mod udp_host;

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use udp_host::{
    Arrival, KIND_DATA, KIND_ECHO, MIN_PAYLOAD, PeriodicFlow, RttSample, UdpHost, UdpHostError,
    decode_payload, encode_payload,
};

use crate::middlebox::{Emit, Middlebox, MiddleboxChain};
use crate::model::{Bottleneck, ConfigError, DropReason, LinkDirection, LinkStats, Verdict};
use crate::packet::parse_ip;
use crate::pcap::PcapWriter;
use crate::rng::derive_seed;
use crate::{Direction, Side};

/// A sans-IO endpoint the simulator drives.
///
/// After every call into a host the simulator drains [`poll_transmit`](Host::poll_transmit)
/// and re-reads [`poll_timeout`](Host::poll_timeout); it calls
/// [`handle_timeout`](Host::handle_timeout) once that time is reached (a timeout in the past
/// fires at once). Changes made through [`Simulator::host_mut`] are picked up before the next
/// event.
pub trait Host: Any {
    /// The addresses whose packets are delivered to this host (read once, when added).
    fn addresses(&self) -> Vec<IpAddr>;
    /// A packet for this host arrives.
    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>);
    /// The next packet the host sends, if any.
    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>>;
    /// When the host next wants [`handle_timeout`](Host::handle_timeout).
    fn poll_timeout(&mut self) -> Option<Instant>;
    /// The host's timer fires.
    fn handle_timeout(&mut self, now: Instant);
}

/// A host's handle in one simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(usize);

impl HostId {
    /// The index of the host in the order added.
    pub fn index(self) -> usize {
        self.0
    }
}

/// Simulator settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seed of every random decision (each link direction gets a seed derived from it).
    pub seed: u64,
    /// The bottleneck's two directions.
    pub bottleneck: Bottleneck,
    /// Most events at one virtual instant before the run fails with [`SimError::Livelock`].
    pub max_events_per_instant: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            bottleneck: Bottleneck::default(),
            max_events_per_instant: 1_000_000,
        }
    }
}

impl SimConfig {
    /// A simulator over `bottleneck` with `seed`.
    pub fn new(seed: u64, bottleneck: Bottleneck) -> Self {
        Self {
            seed,
            bottleneck,
            ..Self::default()
        }
    }
}

/// Why a simulation cannot go on.
#[derive(Debug, Error)]
pub enum SimError {
    /// Too many events at one virtual instant.
    #[error("livelock: more than {limit} events at virtual time {at:?}")]
    Livelock {
        /// Virtual time since the start.
        at: Duration,
        /// The limit that was passed.
        limit: u64,
    },
    /// Two hosts claim one address.
    #[error("address {0} belongs to two hosts")]
    DuplicateAddress(IpAddr),
    /// A link config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Writing a pcap capture failed.
    #[error("pcap capture: {0}")]
    Capture(#[from] io::Error),
}

/// Why the simulator dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DropCause {
    /// The bottleneck dropped it.
    Link {
        /// Its direction.
        dir: Direction,
        /// The link's reason.
        reason: DropReason,
    },
    /// No host has its destination address (on the side it reached).
    Unroutable,
    /// Not an IP packet.
    Malformed,
}

/// What happened to a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// A host transmitted it.
    Sent {
        /// The sender.
        host: HostId,
    },
    /// It was handed to a host.
    Delivered {
        /// The receiver.
        host: HostId,
    },
    /// It was dropped.
    Dropped {
        /// Why.
        cause: DropCause,
    },
}

/// One packet event, as the trace hooks see it.
#[derive(Debug, Clone, Copy)]
pub struct TraceEvent<'a> {
    /// Virtual time.
    pub time: Instant,
    /// Virtual time since the start.
    pub elapsed: Duration,
    /// What happened.
    pub kind: TraceKind,
    /// The packet.
    pub packet: &'a [u8],
}

/// Where a pcap capture listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// Every packet any host sends, as sent.
    Sent,
    /// Every packet handed to a host, as received (after the link and the middleboxes).
    Delivered,
    /// What one host sends and receives, like tcpdump on that host.
    Host(HostId),
}

/// Counters of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// The left-to-right bottleneck direction.
    pub left_to_right: LinkStats,
    /// The right-to-left bottleneck direction.
    pub right_to_left: LinkStats,
    /// Packets hosts sent.
    pub sent: u64,
    /// Packets handed to hosts.
    pub delivered: u64,
    /// Packets between hosts on the same side.
    pub local: u64,
    /// Packets for unknown addresses.
    pub unroutable: u64,
    /// Packets that were not IP.
    pub malformed: u64,
    /// Events processed.
    pub events: u64,
}

/// Why [`Simulator::run_while`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The condition became false.
    Condition,
    /// Nothing is left to happen.
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    Chain(Side),
    Link(Direction),
    Hosts(Side),
}

impl Hop {
    /// Where a packet leaving this hop in `dir` goes next.
    fn next(self, dir: Direction) -> Hop {
        use Direction::{LeftToRight, RightToLeft};
        use Side::{Left, Right};
        match (self, dir) {
            (Hop::Hosts(side), _) => Hop::Chain(side),
            (Hop::Chain(Left), LeftToRight) => Hop::Link(LeftToRight),
            (Hop::Chain(Left), RightToLeft) => Hop::Hosts(Left),
            (Hop::Chain(Right), LeftToRight) => Hop::Hosts(Right),
            (Hop::Chain(Right), RightToLeft) => Hop::Link(RightToLeft),
            (Hop::Link(LeftToRight), _) => Hop::Chain(Right),
            (Hop::Link(RightToLeft), _) => Hop::Chain(Left),
        }
    }
}

enum Event {
    HostTimer {
        host: HostId,
        generation: u64,
    },
    ChainTimer {
        side: Side,
        generation: u64,
    },
    Arrive {
        hop: Hop,
        dir: Direction,
        packet: Vec<u8>,
    },
}

struct Scheduled {
    at: Instant,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest, then the first scheduled.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

struct HostSlot {
    host: Box<dyn Host>,
    side: Side,
    timer: Option<Instant>,
    generation: u64,
    dirty: bool,
}

struct ChainSlot {
    chain: MiddleboxChain,
    timer: Option<Instant>,
    generation: u64,
}

struct Capture {
    tap: Tap,
    writer: PcapWriter<Box<dyn Write>>,
}

type TraceHook = Box<dyn FnMut(&TraceEvent<'_>)>;

/// The simulator. See the module documentation.
pub struct Simulator {
    start: Instant,
    now: Instant,
    queue: BinaryHeap<Scheduled>,
    next_order: u64,
    hosts: Vec<HostSlot>,
    /// Hosts to poll before the next event (added, or changed through `host_mut`).
    dirty: Vec<HostId>,
    routes: HashMap<IpAddr, HostId>,
    /// Per side, the host that takes packets for addresses no host claims.
    default_hosts: [Option<HostId>; 2],
    links: [LinkDirection; 2],
    chains: [ChainSlot; 2],
    stats: SimStats,
    traces: Vec<TraceHook>,
    captures: Vec<Capture>,
    capture_error: Option<io::Error>,
    counted_instant: Instant,
    events_at_instant: u64,
    max_events_per_instant: u64,
    scratch: Vec<Emit>,
}

impl Simulator {
    /// A simulator whose virtual clock starts at the current real time.
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        Self::with_start(config, Instant::now())
    }

    /// A simulator whose virtual clock starts at `start`.
    pub fn with_start(config: SimConfig, start: Instant) -> Result<Self, SimError> {
        let mut links = [
            LinkDirection::new(config.bottleneck.left_to_right, derive_seed(config.seed, 1))?,
            LinkDirection::new(config.bottleneck.right_to_left, derive_seed(config.seed, 2))?,
        ];
        for link in &mut links {
            link.set_epoch(start);
        }
        let chain = || ChainSlot {
            chain: MiddleboxChain::new(),
            timer: None,
            generation: 0,
        };
        Ok(Self {
            start,
            now: start,
            queue: BinaryHeap::new(),
            next_order: 0,
            hosts: Vec::new(),
            dirty: Vec::new(),
            routes: HashMap::new(),
            default_hosts: [None, None],
            links,
            chains: [chain(), chain()],
            stats: SimStats::default(),
            traces: Vec::new(),
            captures: Vec::new(),
            capture_error: None,
            counted_instant: start,
            events_at_instant: 0,
            max_events_per_instant: config.max_events_per_instant,
            scratch: Vec::new(),
        })
    }

    /// The virtual start time.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Adds a host on one side of the bottleneck.
    pub fn add_host<H: Host>(&mut self, side: Side, host: H) -> Result<HostId, SimError> {
        let id = HostId(self.hosts.len());
        let addresses = host.addresses();
        for (i, address) in addresses.iter().enumerate() {
            if self.routes.contains_key(address) || addresses[..i].contains(address) {
                return Err(SimError::DuplicateAddress(*address));
            }
        }
        for address in addresses {
            self.routes.insert(address, id);
        }
        self.hosts.push(HostSlot {
            host: Box::new(host),
            side,
            timer: None,
            generation: 0,
            dirty: true,
        });
        self.dirty.push(id);
        Ok(id)
    }

    /// Makes `id` the default host of its side: packets for addresses no host claims, sent
    /// from the other side (or arriving at this side), go to it. A host that claims no
    /// addresses and is the default of its side stands for a whole network behind a port —
    /// the real-time emulator's client and server interfaces. Replaces an earlier default of
    /// the same side; an unknown `id` is ignored.
    pub fn set_default_host(&mut self, id: HostId) {
        if let Some(slot) = self.hosts.get(id.0) {
            self.default_hosts[slot.side.index()] = Some(id);
        }
    }

    /// Events waiting (packets in flight on the links or held between hops, and timers): what
    /// a real-time driver bounds to keep memory bounded.
    pub fn pending_events(&self) -> usize {
        self.queue.len()
    }

    /// Appends a middlebox to one side's chain: the left chain sits between the left hosts and
    /// the bottleneck, the right chain between the bottleneck and the right hosts; each is
    /// ordered left to right, and `add_middlebox` appends at its right end.
    pub fn add_middlebox<M: Middlebox + 'static>(&mut self, side: Side, middlebox: M) {
        self.chains[side.index()].chain.push(Box::new(middlebox));
    }

    /// [`add_middlebox`](Simulator::add_middlebox) for a box already boxed, e.g. one built from
    /// a [`MiddleboxConfig`](crate::middlebox::MiddleboxConfig).
    pub fn add_boxed_middlebox(&mut self, side: Side, middlebox: Box<dyn Middlebox>) {
        self.chains[side.index()].chain.push(middlebox);
    }

    /// A side's middlebox chain (for its counters).
    pub fn chain(&self, side: Side) -> &MiddleboxChain {
        &self.chains[side.index()].chain
    }

    /// A host, if `id` is a `T`.
    pub fn host<T: Host>(&self, id: HostId) -> Option<&T> {
        let host: &dyn Any = &*self.hosts.get(id.0)?.host;
        host.downcast_ref()
    }

    /// A host for changes (e.g. queueing data to send), if `id` is a `T`; the simulator polls
    /// it again before the next event.
    pub fn host_mut<T: Host>(&mut self, id: HostId) -> Option<&mut T> {
        let slot = self.hosts.get_mut(id.0)?;
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(id);
        }
        let host: &mut dyn Any = &mut *slot.host;
        host.downcast_mut()
    }

    /// One bottleneck direction (its config and counters).
    pub fn link(&self, dir: Direction) -> &LinkDirection {
        &self.links[dir.index()]
    }

    /// One bottleneck direction, to take it down or reconfigure it mid-run.
    pub fn link_mut(&mut self, dir: Direction) -> &mut LinkDirection {
        &mut self.links[dir.index()]
    }

    /// Calls `hook` for every packet sent, delivered or dropped.
    pub fn on_trace(&mut self, hook: impl FnMut(&TraceEvent<'_>) + 'static) {
        self.traces.push(Box::new(hook));
    }

    /// Writes the packets seen at `tap` to `sink` as pcap (LINKTYPE_RAW, nanosecond
    /// timestamps counted from the virtual start, i.e. shown as 1970-01-01 by readers). Call
    /// [`flush_captures`](Simulator::flush_captures) at the end of the run.
    pub fn capture_pcap<W: Write + 'static>(&mut self, tap: Tap, sink: W) -> Result<(), SimError> {
        let writer = PcapWriter::new(Box::new(sink) as Box<dyn Write>)?;
        self.captures.push(Capture { tap, writer });
        Ok(())
    }

    /// Flushes every pcap capture.
    pub fn flush_captures(&mut self) -> Result<(), SimError> {
        if let Some(error) = self.capture_error.take() {
            return Err(error.into());
        }
        for capture in &mut self.captures {
            capture.writer.flush()?;
        }
        Ok(())
    }

    /// The counters so far.
    pub fn stats(&self) -> SimStats {
        SimStats {
            left_to_right: self.links[0].stats().clone(),
            right_to_left: self.links[1].stats().clone(),
            ..self.stats.clone()
        }
    }

    /// The time of the next event, if any.
    pub fn next_event_time(&mut self) -> Result<Option<Instant>, SimError> {
        self.service_dirty()?;
        Ok(self.queue.peek().map(|s| s.at))
    }

    /// Processes the next event; returns its time, or `None` if nothing is left to happen.
    pub fn step(&mut self) -> Result<Option<Instant>, SimError> {
        self.service_dirty()?;
        let Some(scheduled) = self.queue.pop() else {
            return Ok(None);
        };
        self.now = self.now.max(scheduled.at);
        self.count_event()?;
        self.stats.events += 1;
        match scheduled.event {
            Event::HostTimer { host, generation } => {
                let slot = &mut self.hosts[host.0];
                if slot.generation == generation {
                    slot.timer = None;
                    slot.host.handle_timeout(self.now);
                    self.service_host(host)?;
                }
            }
            Event::ChainTimer { side, generation } => {
                let slot = &mut self.chains[side.index()];
                if slot.generation == generation {
                    slot.timer = None;
                    let mut out = std::mem::take(&mut self.scratch);
                    slot.chain.handle_timeout(self.now, &mut out);
                    self.forward_chain_output(side, &mut out);
                    self.scratch = out;
                    self.refresh_chain_timer(side);
                }
            }
            Event::Arrive { hop, dir, packet } => self.arrive(hop, dir, packet)?,
        }
        if let Some(error) = self.capture_error.take() {
            return Err(error.into());
        }
        Ok(Some(self.now))
    }

    /// Runs every event up to and including `deadline`, then sets the clock to `deadline`.
    pub fn run_until(&mut self, deadline: Instant) -> Result<(), SimError> {
        while self.next_event_time()?.is_some_and(|t| t <= deadline) {
            self.step()?;
        }
        self.now = self.now.max(deadline);
        Ok(())
    }

    /// Runs for `duration` of virtual time.
    pub fn run_for(&mut self, duration: Duration) -> Result<(), SimError> {
        self.run_until(self.now + duration)
    }

    /// Runs while `condition` holds (checked before each event) and something is left to
    /// happen.
    pub fn run_while(
        &mut self,
        mut condition: impl FnMut(&Simulator) -> bool,
    ) -> Result<Stop, SimError> {
        loop {
            if !condition(self) {
                return Ok(Stop::Condition);
            }
            if self.step()?.is_none() {
                return Ok(Stop::Idle);
            }
        }
    }

    fn count_event(&mut self) -> Result<(), SimError> {
        if self.now == self.counted_instant {
            self.events_at_instant += 1;
            if self.events_at_instant > self.max_events_per_instant {
                return Err(SimError::Livelock {
                    at: self.elapsed(),
                    limit: self.max_events_per_instant,
                });
            }
        } else {
            self.counted_instant = self.now;
            self.events_at_instant = 1;
        }
        Ok(())
    }

    fn schedule(&mut self, at: Instant, event: Event) {
        self.queue.push(Scheduled {
            at: at.max(self.now),
            order: self.next_order,
            event,
        });
        self.next_order += 1;
    }

    /// Schedules a packet's arrival at `hop`, skipping empty middlebox chains.
    fn schedule_arrival(&mut self, at: Instant, mut hop: Hop, dir: Direction, packet: Vec<u8>) {
        while let Hop::Chain(side) = hop {
            if !self.chains[side.index()].chain.is_empty() {
                break;
            }
            hop = hop.next(dir);
        }
        self.schedule(at, Event::Arrive { hop, dir, packet });
    }

    fn service_dirty(&mut self) -> Result<(), SimError> {
        while !self.dirty.is_empty() {
            // In the order they became dirty; servicing one never dirties another.
            for id in std::mem::take(&mut self.dirty) {
                if self.hosts[id.0].dirty {
                    self.service_host(id)?;
                }
            }
        }
        Ok(())
    }

    /// Drains a host's transmissions and re-arms its timer.
    fn service_host(&mut self, id: HostId) -> Result<(), SimError> {
        self.hosts[id.0].dirty = false;
        while let Some(packet) = self.hosts[id.0].host.poll_transmit(self.now) {
            // Each transmission counts, so a host that never stops sending is a livelock.
            self.count_event()?;
            self.inject(id, packet);
        }
        let slot = &mut self.hosts[id.0];
        let timeout = slot.host.poll_timeout();
        if timeout != slot.timer {
            slot.timer = timeout;
            slot.generation += 1;
            let generation = slot.generation;
            if let Some(at) = timeout {
                self.schedule(
                    at,
                    Event::HostTimer {
                        host: id,
                        generation,
                    },
                );
            }
        }
        Ok(())
    }

    fn inject(&mut self, from: HostId, packet: Vec<u8>) {
        self.stats.sent += 1;
        self.record(TraceKind::Sent { host: from }, &packet);
        let side = self.hosts[from.0].side;
        let destination = match parse_ip(&packet) {
            Ok(ip) => self
                .routes
                .get(&ip.dst)
                .copied()
                .or(self.default_hosts[side.opposite().index()]),
            Err(_) => {
                self.stats.malformed += 1;
                self.record(
                    TraceKind::Dropped {
                        cause: DropCause::Malformed,
                    },
                    &packet,
                );
                return;
            }
        };
        match destination {
            None => {
                self.stats.unroutable += 1;
                self.record(
                    TraceKind::Dropped {
                        cause: DropCause::Unroutable,
                    },
                    &packet,
                );
            }
            Some(to) if self.hosts[to.0].side == side => {
                self.stats.local += 1;
                self.schedule(
                    self.now,
                    Event::Arrive {
                        hop: Hop::Hosts(side),
                        dir: side.outgoing(),
                        packet,
                    },
                );
            }
            Some(_) => {
                let dir = side.outgoing();
                self.schedule_arrival(self.now, Hop::Hosts(side).next(dir), dir, packet);
            }
        }
    }

    fn arrive(&mut self, hop: Hop, dir: Direction, packet: Vec<u8>) -> Result<(), SimError> {
        match hop {
            Hop::Chain(side) => {
                let mut out = std::mem::take(&mut self.scratch);
                self.chains[side.index()]
                    .chain
                    .process(self.now, dir, packet, &mut out);
                self.forward_chain_output(side, &mut out);
                self.scratch = out;
                self.refresh_chain_timer(side);
            }
            Hop::Link(link_dir) => match self.links[link_dir.index()].offer(self.now, packet.len())
            {
                Verdict::Deliver { at, duplicate_at } => {
                    let next = hop.next(link_dir);
                    if let Some(copy_at) = duplicate_at {
                        self.schedule_arrival(at, next, link_dir, packet.clone());
                        self.schedule_arrival(copy_at, next, link_dir, packet);
                    } else {
                        self.schedule_arrival(at, next, link_dir, packet);
                    }
                }
                Verdict::Drop(reason) => {
                    let cause = DropCause::Link {
                        dir: link_dir,
                        reason,
                    };
                    self.record(TraceKind::Dropped { cause }, &packet);
                }
            },
            Hop::Hosts(side) => {
                let destination = match parse_ip(&packet) {
                    Ok(ip) => self
                        .routes
                        .get(&ip.dst)
                        .copied()
                        .filter(|id| self.hosts[id.0].side == side)
                        .or(self.default_hosts[side.index()]),
                    Err(_) => {
                        // Only a middlebox can produce this.
                        self.stats.malformed += 1;
                        self.record(
                            TraceKind::Dropped {
                                cause: DropCause::Malformed,
                            },
                            &packet,
                        );
                        return Ok(());
                    }
                };
                let Some(to) = destination else {
                    self.stats.unroutable += 1;
                    self.record(
                        TraceKind::Dropped {
                            cause: DropCause::Unroutable,
                        },
                        &packet,
                    );
                    return Ok(());
                };
                self.stats.delivered += 1;
                self.record(TraceKind::Delivered { host: to }, &packet);
                self.hosts[to.0].host.handle_packet(self.now, packet);
                self.service_host(to)?;
            }
        }
        Ok(())
    }

    fn forward_chain_output(&mut self, side: Side, out: &mut Vec<Emit>) {
        for emit in out.drain(..) {
            let next = Hop::Chain(side).next(emit.dir);
            self.schedule_arrival(emit.at, next, emit.dir, emit.packet);
        }
    }

    fn refresh_chain_timer(&mut self, side: Side) {
        let slot = &mut self.chains[side.index()];
        let timeout = slot.chain.poll_timeout();
        if timeout != slot.timer {
            slot.timer = timeout;
            slot.generation += 1;
            let generation = slot.generation;
            if let Some(at) = timeout {
                self.schedule(at, Event::ChainTimer { side, generation });
            }
        }
    }

    fn record(&mut self, kind: TraceKind, packet: &[u8]) {
        let event = TraceEvent {
            time: self.now,
            elapsed: self.now - self.start,
            kind,
            packet,
        };
        for hook in &mut self.traces {
            hook(&event);
        }
        for capture in &mut self.captures {
            let wanted = match (capture.tap, kind) {
                (Tap::Sent, TraceKind::Sent { .. }) => true,
                (Tap::Delivered, TraceKind::Delivered { .. }) => true,
                (Tap::Host(id), TraceKind::Sent { host } | TraceKind::Delivered { host }) => {
                    id == host
                }
                _ => false,
            };
            if wanted && let Err(error) = capture.writer.write_packet(event.elapsed, packet) {
                self.capture_error.get_or_insert(error);
            }
        }
    }
}
