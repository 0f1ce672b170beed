//! TCP option stripping.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::{TcpOption, TcpView, tcp_options};

/// What replaces a stripped option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StripMode {
    /// Overwrite it with NOPs: the header keeps its size.
    #[default]
    Nop,
    /// Remove it and shrink the header (remaining options padded to 4 bytes with EOL).
    Shrink,
}

/// Configuration of an [`OptionStripper`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StripOptionsConfig {
    /// Directions acted on.
    pub directions: DirectionFilter,
    /// Option kinds kept; every other kind is stripped (EOL and NOP are structure, not
    /// options).
    pub allowed: Vec<u8>,
    /// NOP-fill or shrink.
    pub mode: StripMode,
}

/// MSS (2), window scale (3), SACK-permitted (4), SACK (5), timestamps (8): the options of
/// RFC 9293 §3.2, RFC 7323 and RFC 2018.
pub const WELL_KNOWN_OPTIONS: [u8; 5] = [2, 3, 4, 5, 8];

impl Default for StripOptionsConfig {
    fn default() -> Self {
        Self {
            directions: DirectionFilter::Both,
            allowed: WELL_KNOWN_OPTIONS.to_vec(),
            mode: StripMode::Nop,
        }
    }
}

/// Counters of an [`OptionStripper`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OptionStripperStats {
    /// Packets that lost at least one option.
    pub packets_changed: u64,
    /// Options removed.
    pub options_stripped: u64,
    /// Option areas with a malformed tail (stripped from the bad option on).
    pub malformed: u64,
}

/// Removes TCP options whose kind is not on an allow-list, as firewalls and proxies that
/// Honda et al. measured do with unknown options (e.g. MPTCP's): a new extension must survive
/// losing its option. A malformed option and everything after it is stripped too. Checksums
/// and lengths are fixed.
pub struct OptionStripper {
    config: StripOptionsConfig,
    stats: OptionStripperStats,
}

impl OptionStripper {
    /// A stripper.
    pub fn new(config: StripOptionsConfig) -> Self {
        Self {
            config,
            stats: OptionStripperStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> OptionStripperStats {
        self.stats
    }
}

impl Middlebox for OptionStripper {
    fn name(&self) -> &'static str {
        "strip-options"
    }

    fn process(&mut self, now: Instant, dir: Direction, mut packet: Vec<u8>, out: &mut Vec<Emit>) {
        if !self.config.directions.applies(dir) {
            return pass(now, dir, packet, out);
        }
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        let options = view.options(&packet).to_vec();
        let parsed = tcp_options(&options);
        // Byte ranges to remove, and which options stay.
        let mut stripped: Vec<(usize, usize)> = Vec::new();
        let mut malformed = false;
        for option in &parsed {
            match *option {
                TcpOption::Option { kind, at, len } if !self.config.allowed.contains(&kind) => {
                    stripped.push((at, at + len));
                }
                TcpOption::Malformed { at } => {
                    stripped.push((at, options.len()));
                    malformed = true;
                }
                _ => {}
            }
        }
        if stripped.is_empty() {
            return pass(now, dir, packet, out);
        }
        self.stats.packets_changed += 1;
        self.stats.options_stripped += stripped.len() as u64;
        self.stats.malformed += u64::from(malformed);
        match self.config.mode {
            StripMode::Nop => {
                let mut new_options = options.clone();
                for &(from, to) in &stripped {
                    new_options[from..to].fill(1);
                }
                view.write_bytes(&mut packet, 20, &new_options);
                pass(now, dir, packet, out);
            }
            StripMode::Shrink => {
                // Keep allowed options with the NOPs that align them; drop the rest.
                let mut kept = Vec::with_capacity(options.len());
                let mut nops = 0;
                for option in &parsed {
                    match *option {
                        TcpOption::Nop { .. } => nops += 1,
                        TcpOption::Option { kind, at, len }
                            if self.config.allowed.contains(&kind) =>
                        {
                            kept.extend(std::iter::repeat_n(1u8, nops));
                            kept.extend_from_slice(&options[at..at + len]);
                            nops = 0;
                        }
                        _ => nops = 0,
                    }
                }
                // EOL, then zero padding to a 32-bit boundary (RFC 9293 §3.1).
                while kept.len() % 4 != 0 {
                    kept.push(0);
                }
                let rebuilt = view.rebuild(
                    &packet,
                    view.seq(&packet),
                    view.flags(&packet),
                    &kept,
                    view.payload(&packet),
                    None,
                );
                pass(now, dir, rebuilt, out);
            }
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("strip_packets_changed", self.stats.packets_changed),
            ("strip_options_stripped", self.stats.options_stripped),
            ("strip_malformed", self.stats.malformed),
        ]
    }
}
