//! Advertised-window rewriting.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::TcpView;

/// How the window field is rewritten. Values are the raw 16-bit field: the box does not track
/// window scaling, just as the middleboxes that do this do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowMode {
    /// Every window becomes this value.
    Fixed(u16),
    /// Windows above this value become this value.
    Cap(u16),
}

/// Configuration of a [`WindowRewriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRewriteConfig {
    /// Directions acted on.
    #[serde(default)]
    pub directions: DirectionFilter,
    /// The rewrite.
    pub mode: WindowMode,
}

/// Counters of a [`WindowRewriter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WindowRewriteStats {
    /// Segments whose window changed.
    pub segments_rewritten: u64,
}

/// Clamps or overwrites the advertised receive window of every TCP segment, as some
/// middleboxes (and traffic shapers) do.
pub struct WindowRewriter {
    config: WindowRewriteConfig,
    stats: WindowRewriteStats,
}

impl WindowRewriter {
    /// A rewriter.
    pub fn new(config: WindowRewriteConfig) -> Self {
        Self {
            config,
            stats: WindowRewriteStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> WindowRewriteStats {
        self.stats
    }
}

impl Middlebox for WindowRewriter {
    fn name(&self) -> &'static str {
        "window-rewrite"
    }

    fn process(&mut self, now: Instant, dir: Direction, mut packet: Vec<u8>, out: &mut Vec<Emit>) {
        if self.config.directions.applies(dir)
            && let Some(view) = TcpView::parse(&packet)
        {
            let window = view.window(&packet);
            let new = match self.config.mode {
                WindowMode::Fixed(value) => value,
                WindowMode::Cap(cap) => window.min(cap),
            };
            if new != window {
                view.set_window(&mut packet, new);
                self.stats.segments_rewritten += 1;
            }
        }
        pass(now, dir, packet, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("window_segments_rewritten", self.stats.segments_rewritten)]
    }
}
