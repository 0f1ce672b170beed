//! What the tunnel needs to know about an IP packet, and the one change it makes to some:
//! checking that a buffer is one whole IPv4 or IPv6 packet, its addresses, its class (urgent
//! or bulk, Minion §8.4's prioritised ACKs), and clamping the MSS of TCP SYNs so that
//! tunneled TCP segments fit the tunnel's MTU without fragmentation.

use std::net::IpAddr;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use thiserror::Error;

/// Why a buffer is not a packet the tunnel forwards.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PacketError {
    /// Not a well-formed IPv4 or IPv6 packet (bad version, header or length fields).
    #[error("not a well-formed IP packet: {0}")]
    Malformed(String),
    /// The buffer is longer or shorter than the length its IP header gives.
    #[error("the IP header says {header} bytes, the buffer has {buffer}")]
    LengthMismatch {
        /// The length from the header.
        header: usize,
        /// The buffer's length.
        buffer: usize,
    },
    /// Longer than the tunnel's MTU.
    #[error("a packet of {len} bytes exceeds the tunnel's MTU of {mtu}")]
    Oversize {
        /// The packet's length.
        len: usize,
        /// The MTU.
        mtu: u16,
    },
}

/// How urgently a packet should cross the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Pure TCP ACKs and other segments without data (SYN, FIN, RST), ICMP, DNS and small
    /// packets: they go ahead of bulk data (Minion §8.4: prioritised ACKs keep the tunneled
    /// TCPs' ACK clocks and interactive flows running while bulk transfers fill the queue).
    Urgent,
    /// Everything else.
    Bulk,
}

/// Packets up to this length (IP header included) are [`Class::Urgent`]: a voice frame
/// (G.711 at 20 ms: 160 bytes of payload, 200 with IP/UDP/RTP headers) or a game update
/// fits; a bulk segment does not.
pub const DEFAULT_SMALL_PACKET: usize = 256;

/// DNS (RFC 1035 §4.2), over UDP or TCP.
const DNS_PORT: u16 = 53;

/// A checked IP packet's facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    /// The source address.
    pub source: IpAddr,
    /// The destination address.
    pub destination: IpAddr,
    /// The packet's length.
    pub len: usize,
    /// Its class, with [`DEFAULT_SMALL_PACKET`] or the threshold given to [`inspect`].
    pub class: Class,
    /// A TCP segment with SYN set (its MSS option may need clamping).
    pub tcp_syn: bool,
}

/// Checks that `packet` is one whole IPv4 or IPv6 packet of at most `mtu` bytes, and
/// returns its facts; `small` is the length up to which a packet is urgent.
pub fn inspect(packet: &[u8], mtu: u16, small: usize) -> Result<PacketInfo, PacketError> {
    if packet.len() > usize::from(mtu) {
        return Err(PacketError::Oversize {
            len: packet.len(),
            mtu,
        });
    }
    let header_len = ip_length(packet)?;
    if header_len != packet.len() {
        return Err(PacketError::LengthMismatch {
            header: header_len,
            buffer: packet.len(),
        });
    }
    let sliced =
        SlicedPacket::from_ip(packet).map_err(|e| PacketError::Malformed(e.to_string()))?;
    let (source, destination) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => (
            IpAddr::V4(v4.header().source_addr()),
            IpAddr::V4(v4.header().destination_addr()),
        ),
        Some(NetSlice::Ipv6(v6)) => (
            IpAddr::V6(v6.header().source_addr()),
            IpAddr::V6(v6.header().destination_addr()),
        ),
        // `from_ip` always sets the network layer; anything else is not an IP packet.
        _ => return Err(PacketError::Malformed("no IP header".into())),
    };
    let mut tcp_syn = false;
    let urgent_kind = match &sliced.transport {
        Some(TransportSlice::Tcp(tcp)) => {
            tcp_syn = tcp.syn();
            tcp.payload().is_empty()
                || tcp.source_port() == DNS_PORT
                || tcp.destination_port() == DNS_PORT
        }
        Some(TransportSlice::Udp(udp)) => {
            udp.source_port() == DNS_PORT || udp.destination_port() == DNS_PORT
        }
        Some(TransportSlice::Icmpv4(_)) | Some(TransportSlice::Icmpv6(_)) => true,
        // A later fragment, or a protocol the tunnel does not look into.
        _ => false,
    };
    let urgent = urgent_kind || packet.len() <= small;
    Ok(PacketInfo {
        source,
        destination,
        len: packet.len(),
        class: if urgent { Class::Urgent } else { Class::Bulk },
        tcp_syn,
    })
}

/// The length the IP header gives for the whole packet (IPv6: fixed header + payload).
fn ip_length(packet: &[u8]) -> Result<usize, PacketError> {
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            Ok(usize::from(u16::from_be_bytes([packet[2], packet[3]])))
        }
        Some(6) if packet.len() >= 40 => {
            Ok(40 + usize::from(u16::from_be_bytes([packet[4], packet[5]])))
        }
        Some(4) | Some(6) => Err(PacketError::Malformed(format!(
            "{} bytes: shorter than an IP header",
            packet.len()
        ))),
        Some(v) => Err(PacketError::Malformed(format!("IP version {v}"))),
        None => Err(PacketError::Malformed("empty".into())),
    }
}

/// The largest TCP MSS whose segments fit `mtu` for a packet of `packet`'s family: the MTU
/// minus the fixed IP and TCP headers (RFC 9293 §3.7.1, RFC 8200 §8.3).
pub fn mss_for(mtu: u16, ipv6: bool) -> u16 {
    mtu.saturating_sub(if ipv6 { 60 } else { 40 })
}

/// Lowers the MSS option of a TCP SYN in `packet` (checked by [`inspect`]) to at most the
/// value that fits `mtu`, fixing the TCP checksum incrementally (RFC 1624 eqn. 3). Returns
/// whether it changed the packet. The tunneled TCPs then send segments that fit the tunnel
/// without fragmentation or path-MTU discovery (as `iptables … TCPMSS --clamp-mss-to-pmtu`
/// does on a router), which matters where ICMP is filtered.
pub fn clamp_mss(packet: &mut [u8], mtu: u16) -> bool {
    let Some((tcp_start, ipv6)) = tcp_offset(packet) else {
        return false;
    };
    let limit = mss_for(mtu, ipv6);
    let Some(tcp) = packet.get(tcp_start..) else {
        return false;
    };
    if tcp.len() < 20 || tcp[13] & 0x02 == 0 {
        return false; // not a SYN
    }
    let data_offset = usize::from(tcp[12] >> 4) * 4;
    if data_offset < 20 || data_offset > tcp.len() {
        return false;
    }
    // Walk the options (RFC 9293 §3.2): kind 0 ends them, kind 1 is one byte, every other
    // kind has a length byte.
    let mut at = 20;
    while at < data_offset {
        match tcp[at] {
            0 => return false,
            1 => at += 1,
            kind => {
                let Some(&len) = tcp.get(at + 1) else {
                    return false;
                };
                let len = usize::from(len);
                if len < 2 || at + len > data_offset {
                    return false;
                }
                if kind == 2 && len == 4 {
                    let mss = u16::from_be_bytes([tcp[at + 2], tcp[at + 3]]);
                    if mss <= limit {
                        return false;
                    }
                    set_checksummed(&mut packet[tcp_start..], at + 2, limit.to_be_bytes());
                    return true;
                }
                at += len;
            }
        }
    }
    false
}

/// Where the TCP header starts in a checked packet, and whether it is IPv6; `None` for
/// anything but an unfragmented TCP segment.
fn tcp_offset(packet: &[u8]) -> Option<(usize, bool)> {
    let sliced = SlicedPacket::from_ip(packet).ok()?;
    let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else {
        return None;
    };
    let ipv6 = matches!(sliced.net, Some(NetSlice::Ipv6(_)));
    // The TCP slice borrows from `packet`: its distance from the start is the IP headers'
    // length (IPv6 extension headers included).
    let start = tcp.slice().as_ptr() as usize - packet.as_ptr() as usize;
    Some((start, ipv6))
}

/// Writes `value` at `at` in a TCP segment and fixes its checksum (at 16) for the change,
/// word by word: an option's field need not be 16-bit aligned (an MSS after a NOP is not).
fn set_checksummed(tcp: &mut [u8], at: usize, value: [u8; 2]) {
    let first_word = at & !1;
    let last_word = (at + 1) & !1;
    let word = |t: &[u8], w: usize| u16::from_be_bytes([t[w], t.get(w + 1).copied().unwrap_or(0)]);
    let old: Vec<u16> = (first_word..=last_word)
        .step_by(2)
        .map(|w| word(tcp, w))
        .collect();
    tcp[at..at + 2].copy_from_slice(&value);
    let mut checksum = u16::from_be_bytes([tcp[16], tcp[17]]);
    for (i, w) in (first_word..=last_word).step_by(2).enumerate() {
        checksum = checksum_update(checksum, old[i], word(tcp, w));
    }
    tcp[16..18].copy_from_slice(&checksum.to_be_bytes());
}

/// The one's-complement checksum after a 16-bit field changed from `old` to `new`
/// (RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m')).
fn checksum_update(checksum: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!checksum) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{PacketBuilder, TcpOptionElement};

    fn tcp_v4(payload: &[u8], syn: bool, mss: Option<u16>) -> Vec<u8> {
        let mut b =
            PacketBuilder::ipv4([10, 99, 0, 2], [10, 99, 0, 1], 64).tcp(40000, 80, 7, 65535);
        if syn {
            b = b.syn();
        } else {
            b = b.ack(1);
        }
        if let Some(mss) = mss {
            b = b
                .options(&[
                    TcpOptionElement::Noop,
                    TcpOptionElement::MaximumSegmentSize(mss),
                    TcpOptionElement::WindowScale(7),
                ])
                .unwrap();
        }
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap();
        out
    }

    fn udp_v6(port: u16, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ipv6([0xfd; 16], [0xfe; 16], 64).udp(50000, port);
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap();
        out
    }

    /// The TCP checksum recomputed from scratch over the packet.
    fn tcp_checksum_ok(packet: &[u8]) -> bool {
        let sliced = SlicedPacket::from_ip(packet).unwrap();
        let Some(TransportSlice::Tcp(tcp)) = sliced.transport else {
            panic!("not TCP")
        };
        let Some(NetSlice::Ipv4(v4)) = sliced.net else {
            panic!("not v4")
        };
        let expected = tcp
            .to_header()
            .calc_checksum_ipv4(&v4.header().to_header(), tcp.payload())
            .unwrap();
        expected == tcp.checksum()
    }

    #[test]
    fn classes() {
        let ack = tcp_v4(&[], false, None);
        let info = inspect(&ack, 1400, DEFAULT_SMALL_PACKET).unwrap();
        assert_eq!(info.class, Class::Urgent);
        assert!(!info.tcp_syn);
        // A SYN is seen as one however small the packet (its MSS is clamped).
        assert!(
            inspect(&tcp_v4(&[], true, Some(1460)), 1400, 1000)
                .unwrap()
                .tcp_syn
        );
        assert_eq!(info.source, "10.99.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(info.destination, "10.99.0.1".parse::<IpAddr>().unwrap());
        let bulk = tcp_v4(&[7; 1200], false, None);
        assert_eq!(
            inspect(&bulk, 1400, DEFAULT_SMALL_PACKET).unwrap().class,
            Class::Bulk
        );
        // The small-packet rule alone.
        let small = tcp_v4(&[7; 100], false, None);
        assert_eq!(inspect(&small, 1400, 0).unwrap().class, Class::Bulk);
        assert_eq!(inspect(&small, 1400, 256).unwrap().class, Class::Urgent);
        // DNS however big, over UDP.
        let dns = udp_v6(53, &[1; 900]);
        assert_eq!(inspect(&dns, 1400, 0).unwrap().class, Class::Urgent);
        let other = udp_v6(5004, &[1; 900]);
        let info = inspect(&other, 1400, 0).unwrap();
        assert_eq!(info.class, Class::Bulk);
        assert!(info.destination.is_ipv6());
    }

    #[test]
    fn bad_packets_are_refused() {
        let good = tcp_v4(&[1; 300], false, None);
        assert!(matches!(
            inspect(&good, 200, 0),
            Err(PacketError::Oversize { len: 340, mtu: 200 })
        ));
        assert!(matches!(
            inspect(&good[..good.len() - 1], 1500, 0),
            Err(PacketError::LengthMismatch { .. })
        ));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(
            inspect(&longer, 1500, 0),
            Err(PacketError::LengthMismatch { .. })
        ));
        for junk in [&[][..], &[0x45][..], &[0x10; 60][..], &[0x60; 39][..]] {
            assert!(
                matches!(inspect(junk, 1500, 0), Err(PacketError::Malformed(_))),
                "{junk:?}"
            );
        }
        // A header length (IHL) beyond the packet.
        let mut bad_ihl = good.clone();
        bad_ihl[0] = 0x4f;
        assert!(inspect(&bad_ihl, 1500, 0).is_err());
    }

    #[test]
    fn mss_is_clamped_with_a_valid_checksum() {
        let mut syn = tcp_v4(&[], true, Some(1460));
        assert!(tcp_checksum_ok(&syn));
        assert!(clamp_mss(&mut syn, 1380));
        assert!(tcp_checksum_ok(&syn));
        let sliced = SlicedPacket::from_ip(&syn).unwrap();
        let Some(TransportSlice::Tcp(tcp)) = sliced.transport else {
            panic!()
        };
        let mss: Vec<_> = tcp
            .options_iterator()
            .filter_map(|o| match o {
                Ok(TcpOptionElement::MaximumSegmentSize(m)) => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(mss, vec![1340]);
        // Already small enough, not a SYN, or no option: unchanged.
        let mut small = tcp_v4(&[], true, Some(1200));
        let before = small.clone();
        assert!(!clamp_mss(&mut small, 1380));
        assert_eq!(small, before);
        let mut ack = tcp_v4(&[], false, Some(1460));
        assert!(!clamp_mss(&mut ack, 1380));
        let mut bare = tcp_v4(&[], true, None);
        assert!(!clamp_mss(&mut bare, 1380));
        let mut udp = udp_v6(53, &[0; 10]);
        assert!(!clamp_mss(&mut udp, 1380));
    }

    #[test]
    fn clamping_equals_a_packet_built_with_the_lower_mss() {
        // With a NOP first the MSS value sits at an odd offset; without, at an even one.
        for nop in [true, false] {
            for (old, new_mtu) in [
                (1460u16, 1380u16),
                (0xffff, 576),
                (9000, 1500),
                (1440, 1300),
            ] {
                let build = |mss: u16| {
                    let mut opts = vec![];
                    if nop {
                        opts.push(TcpOptionElement::Noop);
                    }
                    opts.push(TcpOptionElement::MaximumSegmentSize(mss));
                    opts.push(TcpOptionElement::SelectiveAcknowledgementPermitted);
                    let mut out = Vec::new();
                    PacketBuilder::ipv4([192, 0, 2, 1], [198, 51, 100, 7], 64)
                        .tcp(443, 51234, 0xdead_beef, 64240)
                        .syn()
                        .options(&opts)
                        .unwrap()
                        .write(&mut out, &[])
                        .unwrap();
                    out
                };
                let mut clamped = build(old);
                assert!(clamp_mss(&mut clamped, new_mtu));
                assert_eq!(
                    clamped,
                    build(mss_for(new_mtu, false)),
                    "nop {nop} {old}->{new_mtu}"
                );
                assert!(tcp_checksum_ok(&clamped));
            }
        }
    }
}
