//! The userspace-TCP variants on the real lab: squarepeg's TCP on a TUN device at each end
//! of the lab (`squarepeg_lab::stack::LabStack`), crossing the emulator like any kernel TCP.
//!
//! The voice call runs the library: `squarepeg::Endpoint::listen_utcp` on the sender's
//! (server end, stack address `.4`) and `squarepeg::Connection::connect_utcp` on the
//! receiver's stack (client end, `.3`), each message with the scenario's playout offset as
//! lifetime; `utcp-ir` keeps `inconsistent_retransmissions` on, `utcp` turns it off. The
//! sender's message statuses (`Expired`, `Squashed`, `Replaced`) are what it dropped or
//! replaced.

use std::net::{IpAddr, SocketAddr};

use squarepeg_io::StackConfig;
use squarepeg_lab::net::{Lab, Role};
use squarepeg_lab::stack::{LabStack, stack_addresses};
use squarepeg_tcp::ConnectionConfig;

use super::transports::{Library, LibraryCall, open_library};
use super::{LabCall, LabEnds, LabTransport, VOICE_PORT};
use crate::voip::VoipError;
use crate::voip::wire::Framing;

/// uCOBS messages over squarepeg's userspace TCP at both ends of the lab, with unordered
/// delivery; `inconsistent` adds inconsistent retransmissions; `tls` puts the messages in
/// numbered TLS 1.3 records opened out of order (under TLS the library keeps inconsistent
/// retransmissions off until the TCP has a padder that writes records: `utls-ir` asks for
/// them and runs as `utls` until then).
#[derive(Debug, Clone, Copy, Default)]
pub struct LabUtcp {
    /// Inconsistent retransmissions (Hollywood §4.2).
    pub inconsistent: bool,
    /// TLS 1.3 (a self-signed certificate the receiver pins).
    pub tls: bool,
}

/// Attaches a userspace stack to `role`'s end of `lab`, its connections with `tcp`'s
/// settings (buffers; the library adds the uTCP options).
pub(crate) fn attach(lab: &Lab, role: Role, tcp: ConnectionConfig) -> Result<LabStack, VoipError> {
    let mut config = StackConfig::new([]);
    config.connection = tcp;
    LabStack::attach(lab, role, config, None)
        .map_err(|e| VoipError::Transport(format!("userspace TCP on the {role:?} end: {e}")))
}

impl LabTransport for LabUtcp {
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
                "uCOBS messages over squarepeg's userspace TCP on TUN at both ends: unordered delivery, lifetimes"
            }
            (false, true) => {
                "uCOBS messages over squarepeg's userspace TCP on TUN at both ends: unordered delivery, lifetimes, inconsistent retransmissions"
            }
            (true, false) => {
                "squarepeg messages in numbered TLS 1.3 records over squarepeg's userspace TCP on TUN at both ends: records opened out of order, lifetimes"
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
    fn addresses(&self, lab: &Lab) -> Option<(SocketAddr, SocketAddr)> {
        let (server, _) = stack_addresses(lab, Role::Server)?;
        let (client, _) = stack_addresses(lab, Role::Client)?;
        Some((
            SocketAddr::new(IpAddr::V4(server), VOICE_PORT),
            SocketAddr::new(IpAddr::V4(client), VOICE_PORT),
        ))
    }
    fn open(&self, lab: &Lab, call: &LabCall) -> Result<LabEnds, VoipError> {
        // The library end to end: `squarepeg::Connection` over each end's stack, each
        // message with the scenario's playout offset as lifetime (its deadline).
        let library = Library::Utcp {
            sender: Box::new(attach(lab, Role::Server, ConnectionConfig::default())?),
            receiver: Box::new(attach(lab, Role::Client, ConnectionConfig::default())?),
            inconsistent_retransmissions: self.inconsistent,
        };
        let mut voice = LibraryCall::voice(call, call.scenario.playout_offset());
        if self.tls {
            voice = voice.with_tls()?;
        }
        Ok(open_library(lab, voice, library)?.boxed())
    }
}
