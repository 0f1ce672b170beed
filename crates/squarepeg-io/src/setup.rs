//! The host side of a TUN set-up: an address for the kernel on the device, the address
//! squarepeg's stack answers to behind it, and a route to the stack's address through the
//! device. Done with iproute2 (`ip`), the same commands `docs/tun.md` gives, so that what `peg`
//! does by itself and what a user types by hand are one thing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

use crate::error::Error;

/// One address family's pair: the kernel's address on the device (with its prefix, which also
/// gives the kernel a route for the prefix through the device) and the stack's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressPair {
    /// The kernel's own address on the TUN device.
    pub kernel: IpAddr,
    /// The prefix length of the kernel's address.
    pub prefix_len: u8,
    /// The address squarepeg's stack uses; the kernel reaches it through the device.
    pub stack: IpAddr,
}

/// Default lab addresses: kernel 10.77.0.1/24, stack 10.77.0.2.
pub const LAB_V4: AddressPair = AddressPair {
    kernel: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
    prefix_len: 24,
    stack: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)),
};

/// Default lab addresses: kernel fd00:77::1/64, stack fd00:77::2.
pub const LAB_V6: AddressPair = AddressPair {
    kernel: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1)),
    prefix_len: 64,
    stack: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2)),
};

impl AddressPair {
    /// Checks the pair: one family, unicast, distinct, a valid prefix.
    pub fn validate(&self) -> Result<(), Error> {
        let max = if self.kernel.is_ipv4() { 32 } else { 128 };
        if self.kernel.is_ipv4() != self.stack.is_ipv4() {
            return Err(Error::bad_address(
                self.stack,
                format!(
                    "the kernel-side address {} is of another family",
                    self.kernel
                ),
            ));
        }
        for a in [self.kernel, self.stack] {
            check_unicast(a)?;
        }
        if self.kernel == self.stack {
            return Err(Error::bad_address(
                self.stack,
                "the stack's address must differ from the kernel's",
            ));
        }
        if self.prefix_len == 0 || self.prefix_len > max {
            return Err(Error::bad_address(
                self.kernel,
                format!("prefix length {} is not in 1..={max}", self.prefix_len),
            ));
        }
        Ok(())
    }

    /// Whether the stack's address lies inside the kernel address's prefix (then the prefix
    /// route already leads to it).
    pub fn stack_in_prefix(&self) -> bool {
        match (self.kernel, self.stack) {
            (IpAddr::V4(k), IpAddr::V4(s)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(k) & mask == u32::from(s) & mask
            }
            (IpAddr::V6(k), IpAddr::V6(s)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(k) & mask == u128::from(s) & mask
            }
            _ => false,
        }
    }
}

/// Rejects addresses a TCP endpoint cannot use as its own or as a peer.
pub fn check_unicast(a: IpAddr) -> Result<(), Error> {
    let reason = match a {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("unspecified"),
        IpAddr::V4(v4) if v4.is_loopback() => Some("loopback (never routed to a TUN device)"),
        IpAddr::V4(v4) if v4.is_multicast() || v4.is_broadcast() => Some("not unicast"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("loopback (never routed to a TUN device)"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("not unicast"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            Some("an IPv4-mapped IPv6 address; use the IPv4 address")
        }
        _ => None,
    };
    match reason {
        Some(r) => Err(Error::bad_address(a, r)),
        None => Ok(()),
    }
}

/// What to configure on the host for one TUN device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSetup {
    /// The TUN device.
    pub device: String,
    /// The network namespace the device is in (`None`: the caller's).
    pub netns: Option<String>,
    /// At most one pair per address family.
    pub pairs: Vec<AddressPair>,
}

impl HostSetup {
    /// The lab defaults ([`LAB_V4`], [`LAB_V6`]) on `device`.
    pub fn lab(device: impl Into<String>) -> Self {
        HostSetup {
            device: device.into(),
            netns: None,
            pairs: vec![LAB_V4, LAB_V6],
        }
    }

    /// Checks the device name and every pair; at most one pair per family.
    pub fn validate(&self) -> Result<(), Error> {
        crate::device::validate_device_name(&self.device)?;
        if self.pairs.is_empty() {
            return Err(Error::bad_address("(none)", "no address pair to configure"));
        }
        for (i, p) in self.pairs.iter().enumerate() {
            p.validate()?;
            if self.pairs[..i]
                .iter()
                .any(|q| q.kernel.is_ipv4() == p.kernel.is_ipv4())
            {
                return Err(Error::bad_address(
                    p.stack,
                    "more than one address pair of this family",
                ));
            }
        }
        Ok(())
    }

    /// The stack's addresses, for [`StackConfig::addresses`](crate::StackConfig::addresses).
    pub fn stack_addresses(&self) -> Vec<IpAddr> {
        self.pairs.iter().map(|p| p.stack).collect()
    }

    /// The `ip` commands (without the leading `ip`) that configure an up device: one address
    /// per family on the device (whose prefix route leads to the stack's address), plus a host
    /// route when the stack's address is outside the prefix. IPv6 addresses skip duplicate
    /// address detection, which a point-to-point TUN link does not need.
    pub fn commands(&self) -> Vec<Vec<String>> {
        let dev = self.device.clone();
        let mut out = vec![vec![
            "link".into(),
            "set".into(),
            "dev".into(),
            dev.clone(),
            "up".into(),
        ]];
        for p in &self.pairs {
            let family = if p.kernel.is_ipv4() { "-4" } else { "-6" };
            let mut add = vec![
                family.to_string(),
                "addr".into(),
                "add".into(),
                format!("{}/{}", p.kernel, p.prefix_len),
                "dev".into(),
                dev.clone(),
            ];
            if p.kernel.is_ipv6() {
                add.push("nodad".into());
            }
            out.push(add);
            if !p.stack_in_prefix() {
                out.push(vec![
                    family.to_string(),
                    "route".into(),
                    "add".into(),
                    p.stack.to_string(),
                    "dev".into(),
                    dev.clone(),
                ]);
            }
        }
        out
    }

    /// The commands as a person would type them (`ip [-n NS] ...`).
    pub fn command_lines(&self) -> Vec<String> {
        self.commands()
            .into_iter()
            .map(|args| {
                let ns = self
                    .netns
                    .as_ref()
                    .map(|n| format!("-n {n} "))
                    .unwrap_or_default();
                format!("ip {ns}{}", args.join(" "))
            })
            .collect()
    }

    /// Runs the commands. The device must exist. On a device this process created, everything
    /// configured here goes away with the device when the process closes it.
    pub fn apply(&self) -> Result<(), Error> {
        self.validate()?;
        for args in self.commands() {
            run_command(self.ip().args(&args))?;
        }
        Ok(())
    }

    fn ip(&self) -> Command {
        let mut c = Command::new("ip");
        if let Some(ns) = &self.netns {
            c.args(["-n", ns]);
        }
        c
    }

    /// Creates a persistent TUN device owned by `user` (`ip tuntap add`), sets its MTU and
    /// applies the addresses: after this, `user` can attach to it without root.
    pub fn create_persistent(&self, user: Option<&str>, mtu: Option<u16>) -> Result<(), Error> {
        self.validate()?;
        let mut add = self.ip();
        add.args(["tuntap", "add", "dev", &self.device, "mode", "tun"]);
        if let Some(u) = user {
            add.args(["user", u]);
        }
        run_command(&mut add)?;
        let rest = (|| {
            if let Some(m) = mtu {
                crate::device::validate_mtu(u32::from(m))?;
                run_command(self.ip().args([
                    "link",
                    "set",
                    "dev",
                    &self.device,
                    "mtu",
                    &m.to_string(),
                ]))?;
            }
            self.apply()
        })();
        if rest.is_err() {
            let _ = self.remove_persistent();
        }
        rest
    }

    /// Deletes a persistent device (its addresses and routes go with it).
    pub fn remove_persistent(&self) -> Result<(), Error> {
        crate::device::validate_device_name(&self.device)?;
        run_command(self.ip().args(["link", "del", "dev", &self.device]))?;
        Ok(())
    }
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
fn run_command(command: &mut Command) -> Result<String, Error> {
    let line = format!("{command:?}").replace('"', "");
    let out = command.output().map_err(|e| Error::Command {
        command: line.clone(),
        message: if e.kind() == std::io::ErrorKind::NotFound {
            "not found: install iproute2".to_string()
        } else {
            e.to_string()
        },
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: line,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_commands() {
        let s = HostSetup::lab("sp0");
        s.validate().unwrap();
        assert_eq!(
            s.command_lines(),
            vec![
                "ip link set dev sp0 up",
                "ip -4 addr add 10.77.0.1/24 dev sp0",
                "ip -6 addr add fd00:77::1/64 dev sp0 nodad",
            ]
        );
        assert_eq!(
            s.stack_addresses(),
            vec![
                "10.77.0.2".parse::<IpAddr>().unwrap(),
                "fd00:77::2".parse().unwrap()
            ]
        );
    }

    #[test]
    fn host_route_when_the_stack_is_outside_the_prefix() {
        let s = HostSetup {
            device: "sp1".into(),
            netns: Some("lab".into()),
            pairs: vec![AddressPair {
                kernel: "192.168.5.1".parse().unwrap(),
                prefix_len: 32,
                stack: "192.168.6.9".parse().unwrap(),
            }],
        };
        s.validate().unwrap();
        assert_eq!(
            s.command_lines(),
            vec![
                "ip -n lab link set dev sp1 up",
                "ip -n lab -4 addr add 192.168.5.1/32 dev sp1",
                "ip -n lab -4 route add 192.168.6.9 dev sp1",
            ]
        );
    }

    #[test]
    fn bad_pairs_are_refused() {
        let pair = |k: &str, p: u8, s: &str| AddressPair {
            kernel: k.parse().unwrap(),
            prefix_len: p,
            stack: s.parse().unwrap(),
        };
        for bad in [
            pair("10.0.0.1", 24, "10.0.0.1"),
            pair("10.0.0.1", 24, "fd00::2"),
            pair("10.0.0.1", 33, "10.0.0.2"),
            pair("10.0.0.1", 0, "10.0.0.2"),
            pair("127.0.0.1", 8, "127.0.0.2"),
            pair("10.0.0.1", 24, "224.0.0.1"),
            pair("10.0.0.1", 24, "0.0.0.0"),
            pair("fd00::1", 64, "::ffff:10.0.0.2"),
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::BadAddress { .. })),
                "{bad:?}"
            );
        }
        let twice = HostSetup {
            device: "sp0".into(),
            netns: None,
            pairs: vec![LAB_V4, pair("10.1.0.1", 24, "10.1.0.2")],
        };
        assert!(matches!(twice.validate(), Err(Error::BadAddress { .. })));
        assert!(pair("10.0.0.1", 24, "10.0.0.200").stack_in_prefix());
        assert!(!pair("10.0.0.1", 24, "10.0.1.2").stack_in_prefix());
        assert!(pair("fd00::1", 64, "fd00::ffff").stack_in_prefix());
        assert!(pair("fd00::1", 128, "fd00::2").validate().is_ok());
        assert!(!pair("fd00::1", 128, "fd00::2").stack_in_prefix());
    }
}
