//! Middlebox transforms: sans-IO packet processors on the path that see both directions.
//!
//! Each transform reproduces a behaviour that Honda et al. ("Is it still possible to extend
//! TCP?", IMC 2011 — the TCPExposure study cited by Hollywood §5.3 and Minion §4.3) observed on
//! real paths, and that squarepeg must survive:
//!
//! | transform | behaviour |
//! |---|---|
//! | [`Resegmenter`] | splits segments at seeded points and coalesces adjacent in-order segments |
//! | [`RetransmitCache`] | re-sent sequence ranges carry the bytes first seen (split-TCP proxies, Hollywood §5.3 table 5.2) |
//! | [`OptionStripper`] | removes TCP options that are not on an allow-list |
//! | [`SeqRewriter`] | shifts one direction's sequence numbers by a per-flow random offset (ISN randomisation) |
//! | [`WindowRewriter`] | clamps or overwrites the advertised window |
//! | [`SynDataDropper`] | drops SYNs that carry data (firewalls against TCP Fast Open, RFC 7413 §7.1) |
//! | [`PathMtu`] | not a TCPExposure behaviour: a narrower link on the path, that drops packets longer than its MTU and answers with ICMP Fragmentation Needed / Packet Too Big (RFC 1191, RFC 8201), or silently (an ICMP black hole) |
//! | [`Forger`] | an attacker, not a TCPExposure behaviour: injects fake TLS record headers, flips bits in retransmissions, splices earlier records in (uTLS must deliver none of it) |
//!
//! Every transform keeps packets valid (lengths, IP and TCP checksums) and passes anything it
//! does not understand — non-TCP, fragments, malformed headers — unchanged ([`PathMtu`] acts
//! on every IP packet, TCP or not, and passes non-IP and malformed ones). A
//! [`MiddleboxChain`] composes them and is itself a [`Middlebox`], so the simulator and the
//! real-time emulator ([`crate::net`]) drive one object per position on the path.
//! [`parse_middleboxes`] reads the compact command-line form
//! (`resegment,retx-cache,strip-options=keep:mss,seq-offset,window=cap:1000,forge,mtu=1400`).

mod chain;
mod flows;
mod forge;
mod options;
mod path_mtu;
mod resegment;
mod retransmit_cache;
mod seq_rewrite;
mod spec;
mod syn_data;
mod window;

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use chain::MiddleboxChain;
pub use forge::{ForgeConfig, ForgeStats, Forger};
pub use options::{OptionStripper, OptionStripperStats, StripMode, StripOptionsConfig};
pub use path_mtu::{PathMtu, PathMtuConfig, PathMtuStats};
pub use resegment::{ResegmentConfig, ResegmentStats, Resegmenter};
pub use retransmit_cache::{RetransmitCache, RetransmitCacheConfig, RetransmitCacheStats};
pub use seq_rewrite::{SeqRewriteConfig, SeqRewriteStats, SeqRewriter};
pub use spec::{MiddleboxSpecError, parse_middleboxes};
pub use syn_data::{DropSynDataConfig, SynDataDropper, SynDataDropperStats};
pub use window::{WindowMode, WindowRewriteConfig, WindowRewriteStats, WindowRewriter};

use crate::Direction;

/// A packet a middlebox releases: when, which way, and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    /// When the packet leaves the middlebox (not before the `now` it was produced at).
    pub at: Instant,
    /// The direction it travels (a middlebox may answer back).
    pub dir: Direction,
    /// The raw IP packet.
    pub packet: Vec<u8>,
}

/// A sans-IO packet processor on the path.
///
/// The engine calls [`process`](Middlebox::process) for every packet that reaches the box, and
/// [`handle_timeout`](Middlebox::handle_timeout) once [`poll_timeout`](Middlebox::poll_timeout)
/// has passed. Outputs go to `out`; a box that holds packets releases them from
/// `handle_timeout`. `Send` so that a real-time forwarder can run the box on its own thread.
pub trait Middlebox: Send {
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// Handles one packet travelling in `dir` at `now`.
    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>);
    /// The earliest time the box wants [`handle_timeout`](Middlebox::handle_timeout).
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    /// Releases whatever is due at `now`.
    fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Emit>) {
        let _ = (now, out);
    }
    /// Named counters for reports.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// Which directions a transform acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectionFilter {
    /// Both directions.
    #[default]
    Both,
    /// Only left to right.
    LeftToRight,
    /// Only right to left.
    RightToLeft,
}

impl DirectionFilter {
    /// True if the transform acts on packets travelling in `dir`.
    pub fn applies(self, dir: Direction) -> bool {
        match self {
            DirectionFilter::Both => true,
            DirectionFilter::LeftToRight => dir == Direction::LeftToRight,
            DirectionFilter::RightToLeft => dir == Direction::RightToLeft,
        }
    }
}

/// Any of the lab's transforms, as configuration: what a command line or a JSON scenario
/// names, e.g. `{"kind": "window_rewrite", "mode": {"cap": 1000}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MiddleboxConfig {
    /// A [`Resegmenter`].
    Resegment(ResegmentConfig),
    /// A [`RetransmitCache`].
    RetransmitCache(RetransmitCacheConfig),
    /// An [`OptionStripper`].
    StripOptions(StripOptionsConfig),
    /// A [`SeqRewriter`].
    SeqRewrite(SeqRewriteConfig),
    /// A [`WindowRewriter`].
    WindowRewrite(WindowRewriteConfig),
    /// A [`Forger`].
    Forge(ForgeConfig),
    /// A [`SynDataDropper`].
    DropSynData(DropSynDataConfig),
    /// A [`PathMtu`].
    PathMtu(PathMtuConfig),
}

impl MiddleboxConfig {
    /// Builds the transform.
    pub fn build(&self) -> Box<dyn Middlebox> {
        match self {
            MiddleboxConfig::Resegment(c) => Box::new(Resegmenter::new(c.clone())),
            MiddleboxConfig::RetransmitCache(c) => Box::new(RetransmitCache::new(c.clone())),
            MiddleboxConfig::StripOptions(c) => Box::new(OptionStripper::new(c.clone())),
            MiddleboxConfig::SeqRewrite(c) => Box::new(SeqRewriter::new(c.clone())),
            MiddleboxConfig::WindowRewrite(c) => Box::new(WindowRewriter::new(*c)),
            MiddleboxConfig::Forge(c) => Box::new(Forger::new(c.clone())),
            MiddleboxConfig::DropSynData(c) => Box::new(SynDataDropper::new(*c)),
            MiddleboxConfig::PathMtu(c) => Box::new(PathMtu::new(*c)),
        }
    }
}

fn pass(now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
    out.push(Emit {
        at: now,
        dir,
        packet,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_from_json() {
        let json = r#"[
            {"kind": "resegment", "split_probability": 1.0, "coalesce": false},
            {"kind": "retransmit_cache", "max_bytes_per_flow": 1000},
            {"kind": "strip_options", "allowed": [2], "mode": "shrink"},
            {"kind": "seq_rewrite", "seed": 9, "directions": "left_to_right"},
            {"kind": "window_rewrite", "mode": {"cap": 1000}},
            {"kind": "path_mtu", "mtu": 1400}
        ]"#;
        let configs: Vec<MiddleboxConfig> = serde_json::from_str(json).expect("parse");
        let names: Vec<&str> = configs.iter().map(|c| c.build().name()).collect();
        assert_eq!(
            names,
            [
                "resegment",
                "retransmit-cache",
                "strip-options",
                "seq-rewrite",
                "window-rewrite",
                "path-mtu"
            ]
        );
        assert_eq!(
            configs[5],
            MiddleboxConfig::PathMtu(PathMtuConfig {
                mtu: 1400,
                icmp: true
            })
        );
        assert_eq!(
            configs[3],
            MiddleboxConfig::SeqRewrite(SeqRewriteConfig {
                seed: 9,
                directions: DirectionFilter::LeftToRight,
                ..SeqRewriteConfig::default()
            })
        );
        let back: Vec<MiddleboxConfig> =
            serde_json::from_str(&serde_json::to_string(&configs).expect("write")).expect("read");
        assert_eq!(back, configs);
        let typo = r#"{"kind": "resegment", "split_probabilty": 1.0}"#;
        assert!(serde_json::from_str::<MiddleboxConfig>(typo).is_err());
        assert!(serde_json::from_str::<MiddleboxConfig>(r#"{"kind": "nat"}"#).is_err());
    }
}
