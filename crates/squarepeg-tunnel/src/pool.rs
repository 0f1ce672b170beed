//! The server's tunnel subnets and the addresses it gives clients: the server takes the
//! first host address of each subnet, each client the lowest free one after it (one per
//! subnet, so one per family), returned to the pool when the client leaves.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use thiserror::Error;

use crate::control::Assigned;

/// A tunnel subnet, `NETWORK/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    network: IpAddr,
    prefix_len: u8,
}

/// Why a subnet is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SubnetError {
    /// Not `IP/PREFIX`.
    #[error("`{0}`: expected a subnet as IP/PREFIX, e.g. 10.99.0.0/24 or fd00:99::/64")]
    Syntax(String),
    /// Too small for a server and one client (IPv4: /30 at most; IPv6: /126).
    #[error("{0} has no room for the server and a client: use a shorter prefix")]
    TooSmall(String),
    /// Host bits set.
    #[error("{given} has host bits set: did you mean {network}?")]
    HostBits {
        /// What was given.
        given: String,
        /// The network it belongs to.
        network: String,
    },
}

impl Subnet {
    /// The subnet of `network`/`prefix_len`.
    pub fn new(network: IpAddr, prefix_len: u8) -> Result<Subnet, SubnetError> {
        let width = width(network);
        let shown = format!("{network}/{prefix_len}");
        if prefix_len > width || width - prefix_len < 2 {
            return Err(SubnetError::TooSmall(shown));
        }
        let s = Subnet {
            network,
            prefix_len,
        };
        if to_bits(network) & s.host_mask() != 0 {
            return Err(SubnetError::HostBits {
                given: shown,
                network: format!(
                    "{}/{prefix_len}",
                    from_bits(network, to_bits(network) & !s.host_mask())
                ),
            });
        }
        Ok(s)
    }

    /// The subnet of `prefix_len` bits that holds `ip` (host bits cleared). A prefix beyond
    /// the family's width is taken as the full width.
    pub fn containing(ip: IpAddr, prefix_len: u8) -> Subnet {
        let s = Subnet {
            network: ip,
            prefix_len: prefix_len.min(width(ip)),
        };
        Subnet {
            network: from_bits(ip, to_bits(ip) & !s.host_mask()),
            ..s
        }
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` lies in the subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.network.is_ipv4()
            && to_bits(ip) & !self.host_mask() == to_bits(self.network)
    }

    fn host_mask(&self) -> u128 {
        let host_bits = u32::from(width(self.network) - self.prefix_len);
        if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        }
    }

    /// The host with index `n` (0 is the network address).
    fn host(&self, n: u128) -> IpAddr {
        from_bits(self.network, to_bits(self.network) | n)
    }

    /// The last usable host index (IPv4 keeps the broadcast address free).
    fn last_host(&self) -> u128 {
        if self.network.is_ipv4() {
            self.host_mask() - 1
        } else {
            self.host_mask()
        }
    }

    /// The server's address: the first host.
    pub fn server(&self) -> IpAddr {
        self.host(1)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl FromStr for Subnet {
    type Err = SubnetError;

    fn from_str(s: &str) -> Result<Subnet, SubnetError> {
        let (ip, len) = s
            .split_once('/')
            .ok_or_else(|| SubnetError::Syntax(s.into()))?;
        let ip: IpAddr = ip.parse().map_err(|_| SubnetError::Syntax(s.into()))?;
        let len: u8 = len.parse().map_err(|_| SubnetError::Syntax(s.into()))?;
        Subnet::new(ip, len)
    }
}

fn width(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn to_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(family: IpAddr, bits: u128) -> IpAddr {
    match family {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

/// Why a pool could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No subnet given.
    #[error("the tunnel needs a subnet")]
    NoSubnet,
    /// Two subnets of one family.
    #[error("two subnets of one family ({0} and {1}); give at most one IPv4 and one IPv6")]
    SameFamily(Subnet, Subnet),
}

/// The addresses of the server's subnets, given out to clients.
#[derive(Debug, Clone)]
pub struct AddressPool {
    subnets: Vec<(Subnet, BTreeSet<u128>)>,
}

impl AddressPool {
    /// A pool over `subnets`, at most one per family.
    pub fn new(subnets: &[Subnet]) -> Result<AddressPool, PoolError> {
        if subnets.is_empty() {
            return Err(PoolError::NoSubnet);
        }
        for (i, a) in subnets.iter().enumerate() {
            if let Some(b) = subnets[..i]
                .iter()
                .find(|b| b.network.is_ipv4() == a.network.is_ipv4())
            {
                return Err(PoolError::SameFamily(*b, *a));
            }
        }
        Ok(AddressPool {
            subnets: subnets.iter().map(|s| (*s, BTreeSet::new())).collect(),
        })
    }

    /// The subnets.
    pub fn subnets(&self) -> impl Iterator<Item = Subnet> + '_ {
        self.subnets.iter().map(|(s, _)| *s)
    }

    /// One address per subnet for a new client, or `None` when a subnet is full.
    pub fn allocate(&mut self) -> Option<Vec<Assigned>> {
        let mut picks = Vec::with_capacity(self.subnets.len());
        for (subnet, used) in &self.subnets {
            // The lowest free index from 2 (1 is the server's): the first gap in `used`.
            let mut n = 2u128;
            for &u in used.iter() {
                if u != n {
                    break;
                }
                n += 1;
            }
            if n > subnet.last_host() {
                return None;
            }
            picks.push(n);
        }
        let mut out = Vec::with_capacity(picks.len());
        for ((subnet, used), n) in self.subnets.iter_mut().zip(picks) {
            used.insert(n);
            out.push(Assigned {
                client: subnet.host(n),
                prefix_len: subnet.prefix_len,
                server: subnet.server(),
            });
        }
        Some(out)
    }

    /// Returns a client's addresses to the pool.
    pub fn release(&mut self, addresses: &[Assigned]) {
        for a in addresses {
            for (subnet, used) in &mut self.subnets {
                if subnet.contains(a.client) {
                    used.remove(&(to_bits(a.client) & subnet.host_mask()));
                }
            }
        }
    }

    /// How many clients hold addresses.
    pub fn clients(&self) -> usize {
        self.subnets.first().map_or(0, |(_, used)| used.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_check() {
        let s: Subnet = "10.99.0.0/24".parse().unwrap();
        assert_eq!(s.server(), "10.99.0.1".parse::<IpAddr>().unwrap());
        assert!(s.contains("10.99.0.200".parse().unwrap()));
        assert!(!s.contains("10.99.1.1".parse().unwrap()));
        assert!(!s.contains("fd00::1".parse().unwrap()));
        assert!(
            matches!("10.99.0.1/24".parse::<Subnet>(), Err(SubnetError::HostBits { network, .. }) if network == "10.99.0.0/24")
        );
        assert!(matches!(
            "10.99.0.0/31".parse::<Subnet>(),
            Err(SubnetError::TooSmall(_))
        ));
        assert!(matches!(
            "10.99.0.0/33".parse::<Subnet>(),
            Err(SubnetError::TooSmall(_))
        ));
        assert!(matches!(
            "10.99.0.0".parse::<Subnet>(),
            Err(SubnetError::Syntax(_))
        ));
        assert!(matches!(
            "x/24".parse::<Subnet>(),
            Err(SubnetError::Syntax(_))
        ));
        let v6: Subnet = "fd00:99::/64".parse().unwrap();
        assert_eq!(v6.server(), "fd00:99::1".parse::<IpAddr>().unwrap());
        assert!("::/0".parse::<Subnet>().is_ok());
        let c = Subnet::containing("10.99.3.7".parse().unwrap(), 16);
        assert_eq!(c.to_string(), "10.99.0.0/16");
        assert_eq!(
            Subnet::containing("fd00::5".parse().unwrap(), 200).prefix_len(),
            128
        );
    }

    #[test]
    fn addresses_are_given_and_returned() {
        let v4: Subnet = "10.99.0.0/30".parse().unwrap(); // server .1, one client .2
        let v6: Subnet = "fd00:99::/64".parse().unwrap();
        let mut pool = AddressPool::new(&[v4, v6]).unwrap();
        let a = pool.allocate().unwrap();
        assert_eq!(a[0].client, "10.99.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(a[0].server, "10.99.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(a[0].prefix_len, 30);
        assert_eq!(a[1].client, "fd00:99::2".parse::<IpAddr>().unwrap());
        // .3 is the broadcast address: the v4 subnet is full, and nothing is taken from v6.
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.clients(), 1);
        pool.release(&a);
        assert_eq!(pool.clients(), 0);
        assert_eq!(pool.allocate().unwrap(), a);
    }

    #[test]
    fn the_lowest_free_address_is_reused() {
        let mut pool = AddressPool::new(&["10.9.0.0/24".parse().unwrap()]).unwrap();
        let all: Vec<_> = (0..5).map(|_| pool.allocate().unwrap()).collect();
        pool.release(&all[1]);
        pool.release(&all[3]);
        assert_eq!(pool.allocate().unwrap(), all[1]);
        assert_eq!(pool.allocate().unwrap(), all[3]);
        assert_eq!(
            pool.allocate().unwrap()[0].client,
            "10.9.0.7".parse::<IpAddr>().unwrap()
        );
        // A /24 has 253 client addresses.
        let mut pool = AddressPool::new(&["10.9.0.0/24".parse().unwrap()]).unwrap();
        assert_eq!((0..300).filter_map(|_| pool.allocate()).count(), 253);
    }

    #[test]
    fn pools_need_one_subnet_per_family() {
        assert_eq!(AddressPool::new(&[]).unwrap_err(), PoolError::NoSubnet);
        let a: Subnet = "10.1.0.0/24".parse().unwrap();
        let b: Subnet = "10.2.0.0/24".parse().unwrap();
        assert!(matches!(
            AddressPool::new(&[a, b]),
            Err(PoolError::SameFamily(..))
        ));
    }
}
