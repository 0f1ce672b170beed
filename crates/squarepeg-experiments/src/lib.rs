//! Experiments that run squarepeg's transports and their rivals over the lab and report.
//!
//! Each experiment runs on both of the lab's engines (`squarepeg_lab`): the deterministic
//! simulator, where sans-IO transports (squarepeg's userspace TCP, the session core, the lab's
//! UDP host) run in virtual time and a seed replays a run exactly, and the real network of
//! namespaces joined through the userspace link emulator, where the kernel's TCP and UDP and
//! the `squarepeg` crate run in real time.
//!
//! | module | experiment |
//! |---|---|
//! | [`voip`] | the VoIP late-loss experiment: Hollywood §5.1-5.2 (ADSL 8/1 Mbit/s, RTT 15 ms with 110 ms playout and RTT 70 ms with 30 ms playout, 0.1 % loss) and Minion §8.2 (a call competing with bulk TCP transfers) |
//! | [`failover`] | issue 12: a bulk download and a voice call while one of two paths dies (`peg lab failover`), and aggregate goodput over two paths (`peg lab multipath`): kernel TCP on one path, kernel MPTCP over both, real lab only |
//! | [`priority`] | Minion §8.3: send-side prioritization under a network-limited sender, high- vs low-priority message delay with and without message priorities |
//! | [`rpc`] | NGTCP's transaction: one request and its answer over TCP, TCP + TLS 1.3, squarepeg at first contact and returning (TCP Fast Open + TLS 1.3 early data), quinn at first contact and with 0-RTT: round trips and segments from the lab's captures, and a replay attempt (`peg bench rpc`), real lab only |
//! | [`transfer`] | McTiny appendix A: a 1 MB answer over 100 Mbit/s at RTT 117 ms, kernel TCP (CUBIC, BBR) and the userspace TCP, cold and for a returning client (Careful Resume from cached path state), real lab only |
//! | [`tunnel`] | Minion §8.4: voice and bulk TCP through an IP tunnel over TCP (`peg tunnel` unordered, with and without priACKs, over kernel TCP; OpenVPN in TCP mode; the direct path), real lab only |

#![warn(missing_docs)]

pub mod failover;
pub mod priority;
pub mod rpc;
pub mod transfer;
pub mod tunnel;
pub mod voip;

/// Writes `value` to the sysctl file `path` (under /proc/sys) inside namespace `ns`.
pub(crate) fn write_sysctl(
    ns: &squarepeg_lab::net::NetNs,
    path: &str,
    value: &str,
) -> Result<(), voip::VoipError> {
    ns.run(|| std::fs::write(path, value))?
        .map_err(voip::VoipError::io(format!("writing {value} to {path}")))
}
