//! The squarepeg lab: a network the project controls, for claims about behaviour under loss,
//! delay and middleboxes (design §5). The kernel here has no netem, so the lab brings its own.
//!
//! Everything that crosses the lab is a raw IP packet — IPv4 or IPv6, no link-layer header,
//! exactly what a TUN device carries — and every component is sans-IO: state machines fed the
//! current time (`std::time::Instant`) and packets, polled for output and timers.
//!
//! **One impairment model, two engines.** The in-process, virtual-time [`sim`]ulator runs
//! sans-IO hosts on a dumbbell: middlebox chain, bottleneck, middlebox chain. The real
//! network ([`net`]) runs *the same simulator* against the wall clock between network
//! namespaces: a userspace bridge reads Ethernet frames from two veths with AF_PACKET,
//! injects each IP packet into the simulator's path at its arrival time through a port host,
//! and writes what the path delivers when its time comes. No impairment or middlebox exists
//! twice, so a link spec means the same in both (a test checks that they agree on loss and
//! delay quantiles).
//!
//! | module | what it is |
//! |---|---|
//! | [`model`] | the link impairment model: [`model::LinkConfig`] (serde, builder, and the compact spec `delay=35ms rate=8mbit loss=0.1% …`), [`model::LinkDirection`] (offer a packet, get its arrival time(s) or drop reason), counters, presets |
//! | [`sim`] | the deterministic simulator: sans-IO [`sim::Host`]s on a dumbbell around one bottleneck, virtual time, livelock detection, trace hooks, pcap taps; the [`sim::UdpHost`] test and VoIP reference host |
//! | [`net`] | the real network: [`net::Topology`] (client, emulator and server namespaces, veths, IPv4 and IPv6), [`net::Emulator`] (the real-time engine, statistics as JSON, captures), [`net::Lab`] (both behind one guard; used by tests and `peg lab`) |
//! | [`middlebox`] | path transforms after Honda et al.'s TCPExposure study: re-segmentation, retransmission cache, option stripping, sequence-number and window rewriting; a narrower path MTU with or without its ICMP errors ([`middlebox::PathMtu`]); [`middlebox::MiddleboxChain`]; [`middlebox::parse_middleboxes`] for command lines |
//! | [`pcap`] | classic pcap (LINKTYPE_RAW) writer and reader |
//! | [`packet`], [`checksum`] | IP header facts and the Internet checksum, full and incremental |
//! | [`units`] | exact parsing and printing of durations, rates, sizes and percentages |
//! | [`rng`] | seed derivation |
//! | `stack` | (feature `stack`) squarepeg's userspace TCP in the lab: `stack::LabStack` (a `squarepeg_io::Stack` on one end of a [`net::Lab`]), the link model as the driver's impairment shim, pcap captures of its device |
//!
//! # The link model, exactly
//!
//! One [`model::LinkDirection`] models one direction of a link. [`offer`] takes the time a
//! packet reaches the link and its length in IP bytes, decides everything at once, and returns
//! [`Verdict::Deliver`] with the arrival time (and a second one for a duplicate) or
//! [`Verdict::Drop`] with the reason. It holds no packets: the engine does. The steps, in order:
//!
//! 1. **Admission.** A link set down ([`set_up`]) drops everything (`LinkDown`); a packet
//!    longer than the MTU is dropped (`TooBig`).
//! 2. **Queue and rate.** Without a rate, the packet departs at once. With a rate, packets
//!    are serialised one after another in FIFO order, each taking
//!    `(IP bytes + overhead_bytes) · 8 / rate` (exact to the nanosecond, the sub-nanosecond
//!    remainder carried to the next packet, so the long-run rate is exact). A packet arriving
//!    while the transmitter is busy waits in a drop-tail queue; it is dropped (`QueueFull`) if
//!    the packets already waiting plus it would exceed the packet limit or their bytes would
//!    exceed the byte limit. The packet being transmitted does not count (as in Linux
//!    qdiscs). Departure = end of its serialisation. A big queue at a low rate is
//!    bufferbloat: the queueing delay is the backlog's serialisation time.
//! 3. **Loss on the wire** — the packet has used the bottleneck, then vanishes. First
//!    independent random loss with probability `loss` (`RandomLoss`); then Gilbert-Elliott
//!    (`BurstLoss`): the packet is lost with the loss probability of the chain's current state
//!    (`loss_in_bad` or `loss_in_good`), then the chain steps (Good → Bad with `p`, Bad → Good
//!    with `r`), once per packet that reached the wire, as netem's `gemodel`. Long-run loss
//!    is `(p·bad + r·good)/(p + r)`; runs of Bad last `1/r` packets on average.
//! 4. **Propagation and jitter.** Arrival = departure + `delay` + a deviation drawn from
//!    [`JitterDistribution`] within ±`jitter.amount` (uniform, or normal with σ = amount/2
//!    truncated at ±2σ), never before the departure. With `preserve_order` (the default) the
//!    arrival is raised to the previous packet's, so jitter never reorders — a FIFO link whose
//!    delay varies; without it, packets whose deviations cross arrive out of order (netem's
//!    behaviour).
//! 5. **Reordering.** With probability `reorder.probability` the packet is *held back*: it
//!    arrives `reorder.extra_delay` later than step 4 says, so packets offered within that
//!    time overtake it. A held packet does not hold back its successors (even when order is
//!    otherwise preserved). Counted in `reordered`.
//! 6. **Duplication.** With probability `duplicate` a second copy arrives too, with its own
//!    jitter draw (not before the original's in-order position when order is preserved).
//!
//! Times never go backwards: an `offer` earlier than the previous one is treated as at the
//! previous one. Each impairment draws from its own ChaCha8 stream of the link's seed, and
//! every stream draws for every packet, so enabling one impairment does not change another's
//! pattern; decisions use integer thresholds and IEEE-exact arithmetic only, so a seed gives
//! the same trace on every machine (a test pins one).
//!
//! With [`model::Fates::PerInstant`] the draws of steps 3 (random loss), 4, 5 and 6 come
//! instead from the instant the packet was offered (and its rank among packets offered at
//! that instant), and step 4's deviation varies smoothly with that instant: two runs — two
//! transports — that offer a packet at the same moment give it the same fate whatever else
//! they sent (common random numbers), so they can be compared seed by seed. The
//! Gilbert-Elliott chain still steps per packet.
//!
//! # What the seeds ask for
//!
//! - Hollywood §5.1.2, figure 5.3: the ADSL dumbbell (8 Mbit/s down, 1 Mbit/s up) with RTT 15
//!   or 70 ms and 0.1 % random loss — [`model::presets::hollywood_adsl_15ms`] and
//!   [`_70ms`](model::presets::hollywood_adsl_70ms) — and the VoIP application of 160-byte
//!   messages every 20 ms for a minute — [`sim::PeriodicFlow::voip`] on [`sim::UdpHost`],
//!   which records each message's one-way delay.
//! - Hollywood §5.3 and table 5.2: split-TCP proxies that deliver the original bytes instead
//!   of an inconsistent retransmission — [`middlebox::RetransmitCache`]; Hollywood §3.2/§4
//!   (figure 4.3) and Minion §4.3: middleboxes that split and coalesce segments —
//!   [`middlebox::Resegmenter`]; and the other TCPExposure behaviours (Honda et al., IMC 2011).
//! - Minion §8.2: a VoIP flow competing with bulk transfers over one bottleneck — several
//!   hosts on each side of the simulator's dumbbell.
//!
//! # Example
//!
//! One minute of VoIP over Hollywood's intercontinental ADSL path, in a few milliseconds:
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use squarepeg_lab::Side;
//! use squarepeg_lab::model::presets;
//! use squarepeg_lab::sim::{PeriodicFlow, SimConfig, Simulator, UdpHost};
//!
//! let mut sim = Simulator::new(SimConfig::new(7, presets::hollywood_adsl_70ms()))?;
//! let (caller, callee): (SocketAddr, SocketAddr) = ("10.0.0.1:4000".parse()?, "10.0.1.1:4000".parse()?);
//! let mut phone = UdpHost::new(caller.ip(), sim.start());
//! phone.add_flow(PeriodicFlow::voip(callee, caller.port()))?;
//! sim.add_host(Side::Left, phone)?;
//! let far = sim.add_host(Side::Right, UdpHost::new(callee.ip(), sim.start()))?;
//! sim.run_for(Duration::from_secs(61))?;
//!
//! let received = sim.host::<UdpHost>(far).expect("a UdpHost").received();
//! // 35 ms of propagation plus 1.504 ms to send 188 bytes at 1 Mbit/s; 0.1 % lost.
//! assert!(received.iter().all(|m| m.one_way_delay() == Duration::from_micros(36_504)));
//! assert!(received.len() > 2980);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`offer`]: model::LinkDirection::offer
//! [`set_up`]: model::LinkDirection::set_up
//! [`Verdict::Deliver`]: model::Verdict::Deliver
//! [`Verdict::Drop`]: model::Verdict::Drop
//! [`JitterDistribution`]: model::JitterDistribution

#![warn(missing_docs)]

pub mod checksum;
pub mod middlebox;
pub mod model;
pub mod net;
pub mod packet;
pub mod pcap;
pub mod rng;
pub mod sim;
#[cfg(feature = "stack")]
pub mod stack;
pub mod units;

use serde::{Deserialize, Serialize};

/// The direction a packet crosses the lab's dumbbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// From the left hosts to the right hosts.
    LeftToRight,
    /// From the right hosts to the left hosts.
    RightToLeft,
}

impl Direction {
    /// The other direction.
    pub fn reverse(self) -> Self {
        match self {
            Direction::LeftToRight => Direction::RightToLeft,
            Direction::RightToLeft => Direction::LeftToRight,
        }
    }

    /// 0 for left to right, 1 for right to left.
    pub fn index(self) -> usize {
        match self {
            Direction::LeftToRight => 0,
            Direction::RightToLeft => 1,
        }
    }
}

/// A side of the dumbbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The left (by convention the client or home) side.
    Left,
    /// The right (by convention the server or Internet) side.
    Right,
}

impl Side {
    /// The direction of packets leaving this side.
    pub fn outgoing(self) -> Direction {
        match self {
            Side::Left => Direction::LeftToRight,
            Side::Right => Direction::RightToLeft,
        }
    }

    /// 0 for left, 1 for right.
    pub fn index(self) -> usize {
        match self {
            Side::Left => 0,
            Side::Right => 1,
        }
    }

    /// The other side.
    pub fn opposite(self) -> Self {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }
}
