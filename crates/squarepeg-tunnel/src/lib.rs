//! `peg tunnel`'s library: an IP tunnel whose packets travel as squarepeg messages (Minion
//! §8.4). Each IP packet read from a TUN device is one message on the packet substream,
//! with a lifetime (a packet still unsent when it goes stale is dropped, not delivered
//! late) and a priority: the tunneled flows' pure ACKs, DNS, ICMP and small packets go ahead
//! of bulk data. Over the userspace TCP the messages are delivered out of order, so a lost
//! outer segment delays only the packets it carried; over kernel TCP the tunnel still works,
//! in order, with late binding.
//!
//! - [`packet`]: checking packets, their class, MSS clamping.
//! - [`control`]: the tunnel's own messages (hello, address assignment, refusal).
//! - [`pool`]: the server's subnets and the addresses it gives out.
//! - [`forward`]: the client's and the server's forwarding between a [`PacketIo`] device and
//!   connections.
//! - [`setup`]: the host configuration around the device (addresses, routes), undone on drop.
//! - [`memory`]: a channel device for tests.

pub mod control;
pub mod forward;
pub mod memory;
pub mod packet;
pub mod pool;
pub mod setup;

pub use control::{Assigned, Control, ControlError};
pub use forward::{
    Assignment, PacketIo, Server, StatsSnapshot, TunnelConfig, TunnelError, TunnelStats,
    client_handshake, normal_close, run_client,
};
pub use pool::{AddressPool, Subnet};
