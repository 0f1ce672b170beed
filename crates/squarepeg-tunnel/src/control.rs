//! The tunnel's own messages (docs/wire.md §6): a client says hello, the server gives it its
//! addresses or refuses it. They travel as squarepeg messages on [`CONTROL_SUBSTREAM`]; IP
//! packets travel on [`PACKET_SUBSTREAM`], one packet per message.
//!
//! ```text
//! Hello   = 0x01 version(1) [token_len(1) token]
//! Assign  = 0x02 version(1) mtu(2) count(1) count × Address
//! Address = family(1: 4 or 6) client_ip(4|16) prefix_len(1) server_ip(4|16)
//! Refuse  = 0x03 reason (UTF-8, at most 255 bytes)
//! ```
//! Integers are big-endian. A receiver rejects unknown types, versions it does not speak,
//! trailing bytes and prefix lengths beyond the family's width.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

/// The version of the tunnel protocol this crate speaks.
pub const VERSION: u8 = 1;
/// The substream of [`Control`] messages.
pub const CONTROL_SUBSTREAM: u64 = 0;
/// The substream of tunneled IP packets.
pub const PACKET_SUBSTREAM: u64 = 1;
/// The longest [`Control::Hello`] token.
pub const MAX_TOKEN: usize = 255;
/// The longest [`Control::Refuse`] reason (longer ones are cut at a character boundary).
pub const MAX_REASON: usize = 255;

/// One tunnel address a server gives a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    /// The client's address inside the tunnel.
    pub client: IpAddr,
    /// The tunnel subnet's prefix length.
    pub prefix_len: u8,
    /// The server's address in the same subnet.
    pub server: IpAddr,
}

/// A tunnel control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Client → server, first: the protocol version it speaks, and the server's shared
    /// secret if it asks for one (empty: none; sent only inside TLS).
    Hello {
        /// [`VERSION`].
        version: u8,
        /// The shared secret, at most [`MAX_TOKEN`] bytes; empty when none.
        token: Vec<u8>,
    },
    /// Server → client: its addresses (one per family) and the tunnel MTU.
    Assign {
        /// [`VERSION`].
        version: u8,
        /// The largest IP packet the tunnel carries.
        mtu: u16,
        /// The addresses, at most one per family.
        addresses: Vec<Assigned>,
    },
    /// Server → client: no addresses for it, and why; the server then closes.
    Refuse {
        /// Why.
        reason: String,
    },
}

/// Why a control message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Empty message.
    #[error("an empty control message")]
    Empty,
    /// A type this version does not know.
    #[error("unknown control message type {0:#04x}")]
    UnknownType(u8),
    /// The message ends inside a field.
    #[error("control message cut short")]
    Truncated,
    /// Bytes after the last field.
    #[error("{0} bytes after the end of the control message")]
    Trailing(usize),
    /// An address family other than 4 or 6.
    #[error("unknown address family {0}")]
    Family(u8),
    /// A prefix length beyond the family's width.
    #[error("prefix length {0} is too long for its family")]
    PrefixLen(u8),
    /// Two addresses of one family, or client and server of different families.
    #[error("inconsistent addresses: {0}")]
    Addresses(&'static str),
    /// A hello with a token length of 0 (no token is sent as no length at all).
    #[error("a hello with an empty token")]
    EmptyToken,
    /// A refusal whose reason is not UTF-8.
    #[error("the refusal's reason is not UTF-8")]
    Reason,
}

impl Control {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Control::Hello { version, token } => {
                out.extend_from_slice(&[0x01, *version]);
                if !token.is_empty() {
                    let token = &token[..token.len().min(MAX_TOKEN)];
                    out.push(token.len() as u8);
                    out.extend_from_slice(token);
                }
            }
            Control::Assign {
                version,
                mtu,
                addresses,
            } => {
                out.extend_from_slice(&[0x02, *version]);
                out.extend_from_slice(&mtu.to_be_bytes());
                out.push(addresses.len() as u8);
                for a in addresses {
                    out.push(if a.client.is_ipv4() { 4 } else { 6 });
                    push_ip(&mut out, a.client);
                    out.push(a.prefix_len);
                    push_ip(&mut out, a.server);
                }
            }
            Control::Refuse { reason } => {
                out.push(0x03);
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&reason.as_bytes()[..end]);
            }
        }
        out
    }

    /// Decodes one message.
    pub fn decode(bytes: &[u8]) -> Result<Control, ControlError> {
        let (&kind, rest) = bytes.split_first().ok_or(ControlError::Empty)?;
        let mut r = Reader(rest);
        let message = match kind {
            0x01 => {
                let version = r.u8()?;
                let token = if r.0.is_empty() {
                    Vec::new()
                } else {
                    let len = r.u8()?;
                    if len == 0 {
                        return Err(ControlError::EmptyToken);
                    }
                    r.take(usize::from(len))?.to_vec()
                };
                Control::Hello { version, token }
            }
            0x02 => {
                let version = r.u8()?;
                let mtu = u16::from_be_bytes([r.u8()?, r.u8()?]);
                let count = r.u8()?;
                let mut addresses: Vec<Assigned> = Vec::new();
                for _ in 0..count {
                    let family = r.u8()?;
                    let client = r.ip(family)?;
                    let prefix_len = r.u8()?;
                    let server = r.ip(family)?;
                    let width = if family == 4 { 32 } else { 128 };
                    if prefix_len > width {
                        return Err(ControlError::PrefixLen(prefix_len));
                    }
                    if addresses
                        .iter()
                        .any(|a| a.client.is_ipv4() == client.is_ipv4())
                    {
                        return Err(ControlError::Addresses("two addresses of one family"));
                    }
                    addresses.push(Assigned {
                        client,
                        prefix_len,
                        server,
                    });
                }
                Control::Assign {
                    version,
                    mtu,
                    addresses,
                }
            }
            0x03 => {
                let reason = std::str::from_utf8(r.0).map_err(|_| ControlError::Reason)?;
                r.0 = &[];
                Control::Refuse {
                    reason: reason.to_string(),
                }
            }
            other => return Err(ControlError::UnknownType(other)),
        };
        if !r.0.is_empty() {
            return Err(ControlError::Trailing(r.0.len()));
        }
        Ok(message)
    }
}

fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ControlError> {
        if self.0.len() < n {
            return Err(ControlError::Truncated);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, ControlError> {
        Ok(self.take(1)?[0])
    }

    fn ip(&mut self, family: u8) -> Result<IpAddr, ControlError> {
        match family {
            4 => {
                let b: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
                Ok(IpAddr::V4(Ipv4Addr::from(b)))
            }
            6 => {
                let b: [u8; 16] = self.take(16)?.try_into().expect("16 bytes");
                Ok(IpAddr::V6(Ipv6Addr::from(b)))
            }
            other => Err(ControlError::Family(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign() -> Control {
        Control::Assign {
            version: VERSION,
            mtu: 1380,
            addresses: vec![
                Assigned {
                    client: "10.99.0.2".parse().unwrap(),
                    prefix_len: 24,
                    server: "10.99.0.1".parse().unwrap(),
                },
                Assigned {
                    client: "fd00:99::2".parse().unwrap(),
                    prefix_len: 64,
                    server: "fd00:99::1".parse().unwrap(),
                },
            ],
        }
    }

    /// The vectors of docs/wire.md §6.
    #[test]
    fn wire_vectors() {
        assert_eq!(
            Control::Hello {
                version: 1,
                token: vec![]
            }
            .encode(),
            [0x01, 0x01]
        );
        assert_eq!(
            hex(&Control::Hello {
                version: 1,
                token: b"s3cret".to_vec()
            }
            .encode()),
            "01 01 06 73 33 63 72 65 74"
        );
        let v4_only = Control::Assign {
            version: 1,
            mtu: 1380,
            addresses: vec![Assigned {
                client: "10.99.0.2".parse().unwrap(),
                prefix_len: 24,
                server: "10.99.0.1".parse().unwrap(),
            }],
        };
        assert_eq!(
            hex(&v4_only.encode()),
            "02 01 05 64 01 04 0a 63 00 02 18 0a 63 00 01"
        );
        assert_eq!(
            hex(&Control::Refuse {
                reason: "full".into()
            }
            .encode()),
            "03 66 75 6c 6c"
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn round_trips() {
        for m in [
            Control::Hello {
                version: 1,
                token: vec![],
            },
            Control::Hello {
                version: 1,
                token: vec![7; 255],
            },
            assign(),
            Control::Refuse {
                reason: "the pool is empty".into(),
            },
            Control::Refuse {
                reason: String::new(),
            },
        ] {
            assert_eq!(Control::decode(&m.encode()).unwrap(), m);
        }
        // A long reason is cut at a character boundary.
        let long = Control::Refuse {
            reason: "é".repeat(200),
        };
        let Control::Refuse { reason } = Control::decode(&long.encode()).unwrap() else {
            panic!()
        };
        assert_eq!(reason.len(), 254);
    }

    #[test]
    fn bad_messages_are_typed_errors() {
        let good = assign().encode();
        for cut in 1..good.len() {
            assert_eq!(
                Control::decode(&good[..cut]),
                Err(ControlError::Truncated),
                "{cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(Control::decode(&trailing), Err(ControlError::Trailing(1)));
        assert_eq!(Control::decode(&[]), Err(ControlError::Empty));
        assert_eq!(
            Control::decode(&[0x7f]),
            Err(ControlError::UnknownType(0x7f))
        );
        assert_eq!(
            Control::decode(&[0x02, 1, 5, 0x64, 1, 5, 0, 0, 0, 0]),
            Err(ControlError::Family(5))
        );
        assert_eq!(
            Control::decode(&[0x02, 1, 5, 0x64, 1, 4, 10, 0, 0, 2, 33, 10, 0, 0, 1]),
            Err(ControlError::PrefixLen(33))
        );
        let twice = [
            0x02, 1, 5, 0x64, 2, 4, 10, 0, 0, 2, 24, 10, 0, 0, 1, 4, 10, 0, 0, 3, 24, 10, 0, 0, 1,
        ];
        assert!(matches!(
            Control::decode(&twice),
            Err(ControlError::Addresses(_))
        ));
        assert_eq!(Control::decode(&[0x03, 0xff]), Err(ControlError::Reason));
        assert_eq!(
            Control::decode(&[0x01, 1, 0]),
            Err(ControlError::EmptyToken)
        );
        assert_eq!(
            Control::decode(&[0x01, 1, 3, 1]),
            Err(ControlError::Truncated)
        );
        // Every byte string decodes or fails; none panics.
        let mut x = 0x1234_5678u32;
        for len in 0..64 {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                let _ = Control::decode(&bytes);
            }
        }
    }
}
