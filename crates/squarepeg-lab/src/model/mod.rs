//! The link impairment model, shared by the simulator and the real-time emulator.
//!
//! A [`LinkDirection`] is a pure state machine: [`LinkDirection::offer`] takes the current time
//! and a packet length and returns a [`Verdict`] (arrival time, a second one for a duplicate,
//! or a [`DropReason`]). It holds no packets — the engine does — so the simulator and a
//! userspace forwarder drive it the same way. See the crate documentation for the order in
//! which the impairments apply.

mod config;
mod link;
pub mod presets;
mod spec;

pub use config::{
    ConfigError, DEFAULT_QUEUE_PACKETS, Fates, GilbertElliott, Jitter, JitterDistribution,
    LinkConfig, MAX_DELAY, QueueLimit, Reorder,
};
pub use link::{DropReason, LinkDirection, LinkStats, Verdict};
pub use presets::Bottleneck;
pub use spec::{SpecError, parse_spec};
