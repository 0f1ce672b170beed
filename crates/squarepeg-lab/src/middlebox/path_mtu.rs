//! A narrower link in the middle of the path, and the ICMP errors of path MTU discovery.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Emit, Middlebox, pass};
use crate::Direction;
use crate::checksum;
use crate::packet::{IpInfo, IpVersion, parse_ip};

/// The smallest `mtu` the compact spec accepts (`mtu=<bytes>`): the datagram every IPv4 host
/// must accept (RFC 791, RFC 1122 §3.3.3). Below it hosts stop believing the errors — Linux
/// does not lower a path MTU below 552 bytes (`net.ipv4.route.min_pmtu`) and sends larger
/// packets without DF instead, which the box drops — so the path models nothing real.
pub(crate) const MIN_SPEC_MTU: u16 = 576;

/// IP protocol number of ICMP (RFC 792).
const PROTO_ICMP: u8 = 1;
/// IPv6 next-header value of ICMPv6 (RFC 4443).
const PROTO_ICMPV6: u8 = 58;
/// ICMPv4 Destination Unreachable (RFC 792).
const ICMP_DEST_UNREACHABLE: u8 = 3;
/// Its code 4, "fragmentation needed and DF set" (RFC 792, RFC 1191 §4).
const ICMP_FRAG_NEEDED: u8 = 4;
/// ICMPv4 error types (RFC 1812 §4.3.2.7: never an error about one of these): destination
/// unreachable, source quench, redirect, time exceeded, parameter problem.
const ICMP_ERROR_TYPES: [u8; 5] = [3, 4, 5, 11, 12];
/// ICMPv6 Packet Too Big (RFC 4443 §3.2).
const ICMPV6_PACKET_TOO_BIG: u8 = 2;
/// Largest ICMPv4 error datagram (RFC 1812 §4.3.2.3).
const ICMPV4_ERROR_MAX: usize = 576;
/// Largest ICMPv6 error packet: the IPv6 minimum MTU (RFC 4443 §2.4 (c), §3.2).
const ICMPV6_ERROR_MAX: usize = 1280;
/// TTL and hop limit of the errors.
const ERROR_TTL: u8 = 64;
/// Type of service of ICMPv4 errors: precedence 6, internetwork control (RFC 1812 §4.3.2.5).
const ERROR_TOS: u8 = 0xC0;

fn icmp_default() -> bool {
    true
}

/// Configuration of a [`PathMtu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathMtuConfig {
    /// The largest IP packet, in bytes (IP header included), that crosses the link, in both
    /// directions. The compact spec accepts 576 and above; a config built in code or read from
    /// JSON is taken as given.
    pub mtu: u16,
    /// Whether a packet dropped for its size is answered with the ICMP error a router sends
    /// (default `true`). `false` is an ICMP black hole (RFC 2923 §2.1): the packet is dropped
    /// silently and only a host that probes (RFC 4821, RFC 8899) finds the path MTU.
    #[serde(default = "icmp_default")]
    pub icmp: bool,
}

/// Counters of a [`PathMtu`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PathMtuStats {
    /// Packets passed: not longer than the MTU, or not IP at all (passed unchanged).
    pub passed: u64,
    /// Packets longer than the MTU that may not be fragmented (IPv4 with DF, every IPv6
    /// packet) dropped.
    pub dropped_too_big: u64,
    /// IPv4 packets longer than the MTU without DF dropped (a router would fragment them).
    pub dropped_fragmentable: u64,
    /// ICMP errors sent (Fragmentation Needed, Packet Too Big).
    pub icmp_sent: u64,
}

/// A link with a smaller MTU in the middle of the path, as the router in front of it behaves
/// (RFC 1191 and RFC 8201 path MTU discovery, RFC 792 and RFC 4443 errors). In both
/// directions, an IP packet longer than `mtu` (by its length field) is dropped:
///
/// - IPv4 with DF set, and every IPv6 packet (IPv6 routers never fragment, RFC 8200 §5), is
///   counted in `dropped_too_big` and, with `icmp`, answered with an ICMPv4 Destination
///   Unreachable, code 4 "fragmentation needed and DF set", whose Next-Hop MTU field
///   (RFC 1191 §4) is `mtu` and which quotes the packet from its IP header on, up to a
///   576-byte error (RFC 1812 §4.3.2.3: at least the header and 8 bytes, as RFC 792 asks),
///   or with an ICMPv6 Packet Too Big (RFC 4443 §3.2) whose MTU field is `mtu` and which quotes
///   as much of the packet as fits in 1280 bytes;
/// - IPv4 without DF would be fragmented by a real router; this box does not fragment: it
///   drops the packet (no ICMP) and counts it in `dropped_fragmentable`. Linux TCP sets DF on
///   every segment, so only other traffic (UDP without path MTU discovery) lands here.
///
/// The error travels back the way the packet came, at the time the packet arrived, from the
/// packet's destination address to its source with TTL (hop limit) 64. No error answers an
/// ICMP error, a non-initial IPv4 fragment, or a packet whose source is not a unicast address
/// or whose destination is multicast or broadcast (RFC 1812 §4.3.2.7, RFC 4443 §2.4 (e)):
/// those are dropped silently (still counted in `dropped_too_big`).
///
/// Packets that are not IP, or are malformed, pass unchanged whatever their size, as with the
/// other transforms. An IPv6 `mtu` below 1280 is a link IPv6 does not allow (RFC 8200 §5):
/// hosts do not lower their path MTU below 1280 whatever the error says (RFC 8201 §4), so IPv6
/// packets between `mtu` and 1280 bytes are lost for good.
///
/// The link model has an `mtu` of its own ([`LinkConfig::mtu`](crate::model::LinkConfig)):
/// it drops oversize packets silently, as `icmp: false` does here.
pub struct PathMtu {
    config: PathMtuConfig,
    stats: PathMtuStats,
}

impl PathMtu {
    /// A narrower link.
    pub fn new(config: PathMtuConfig) -> Self {
        Self {
            config,
            stats: PathMtuStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> PathMtuStats {
        self.stats
    }
}

impl Middlebox for PathMtu {
    fn name(&self) -> &'static str {
        "path-mtu"
    }

    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        let ip = match parse_ip(&packet) {
            Ok(ip) if ip.total_len > usize::from(self.config.mtu) => ip,
            _ => {
                self.stats.passed += 1;
                return pass(now, dir, packet, out);
            }
        };
        let error = match ip.version {
            IpVersion::V4 => {
                // Flags: bit 1 of the three is DF (RFC 791 §3.1).
                let dont_fragment = packet[6] & 0x40 != 0;
                if !dont_fragment {
                    self.stats.dropped_fragmentable += 1;
                    return;
                }
                self.stats.dropped_too_big += 1;
                self.config
                    .icmp
                    .then(|| fragmentation_needed(&packet, &ip, self.config.mtu))
                    .flatten()
            }
            IpVersion::V6 => {
                self.stats.dropped_too_big += 1;
                self.config
                    .icmp
                    .then(|| packet_too_big(&packet, &ip, self.config.mtu))
                    .flatten()
            }
        };
        if let Some(error) = error {
            self.stats.icmp_sent += 1;
            out.push(Emit {
                at: now,
                dir: dir.reverse(),
                packet: error,
            });
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("mtu_passed", self.stats.passed),
            ("mtu_dropped_too_big", self.stats.dropped_too_big),
            ("mtu_dropped_fragmentable", self.stats.dropped_fragmentable),
            ("mtu_icmp_sent", self.stats.icmp_sent),
        ]
    }
}

/// The ICMPv4 Fragmentation Needed that answers `packet` (IPv4, DF set), or `None` where RFC
/// 1812 §4.3.2.7 forbids an error.
fn fragmentation_needed(packet: &[u8], ip: &IpInfo, mtu: u16) -> Option<Vec<u8>> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (ip.src, ip.dst) else {
        return None;
    };
    let unicast = |a: Ipv4Addr| !(a.is_unspecified() || a.is_broadcast() || a.is_multicast());
    let offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1FFF;
    let icmp_error = ip.protocol == PROTO_ICMP
        && offset == 0
        && packet
            .get(ip.header_len)
            .is_some_and(|kind| ICMP_ERROR_TYPES.contains(kind));
    if !unicast(src) || !unicast(dst) || offset != 0 || icmp_error {
        return None;
    }
    // The original from its IP header on: at least the header and 8 bytes (RFC 792), as much
    // as a 576-byte error holds (RFC 1812 §4.3.2.3). The packet is longer than that.
    let quoted = &packet[..ip.total_len.min(ICMPV4_ERROR_MAX - 28)];
    let total = 28 + quoted.len();
    let mut error = Vec::with_capacity(total);
    // The box has no address of its own, so the error comes from the address the packet was
    // going to. Linux accepts a Fragmentation Needed (and a Packet Too Big) from any source: it
    // checks the quoted headers against its connections (the quoted sequence number must be
    // in flight) instead.
    error.extend_from_slice(&[0x45, ERROR_TOS]);
    error.extend_from_slice(&(total as u16).to_be_bytes());
    // Identification 0 and DF: an atomic datagram (RFC 6864 §4.1); no fragment offset.
    error.extend_from_slice(&[0, 0, 0x40, 0, ERROR_TTL, PROTO_ICMP, 0, 0]);
    error.extend_from_slice(&dst.octets());
    error.extend_from_slice(&src.octets());
    let header_sum = checksum::checksum(&error);
    error[10..12].copy_from_slice(&header_sum.to_be_bytes());
    // Type, code, checksum, 16 unused bits, Next-Hop MTU (RFC 1191 §4), the quote.
    error.extend_from_slice(&[ICMP_DEST_UNREACHABLE, ICMP_FRAG_NEEDED, 0, 0, 0, 0]);
    error.extend_from_slice(&mtu.to_be_bytes());
    error.extend_from_slice(quoted);
    let icmp_sum = checksum::checksum(&error[20..]);
    error[22..24].copy_from_slice(&icmp_sum.to_be_bytes());
    Some(error)
}

/// The ICMPv6 Packet Too Big that answers `packet`, or `None` where RFC 4443 §2.4 (e)
/// forbids an error or the box has no address to send it from.
fn packet_too_big(packet: &[u8], ip: &IpInfo, mtu: u16) -> Option<Vec<u8>> {
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (ip.src, ip.dst) else {
        return None;
    };
    let unicast = |a: Ipv6Addr| !(a.is_unspecified() || a.is_multicast());
    // Informational ICMPv6 messages have types 128 and up (RFC 4443 §2.1). (In a non-first
    // fragment the byte is data: such a fragment may go unanswered.)
    let icmp_error =
        ip.protocol == PROTO_ICMPV6 && packet.get(ip.header_len).is_some_and(|&kind| kind < 128);
    // RFC 4443 §2.4 (e.3) allows a Packet Too Big about a multicast packet, but the error's
    // source would be that multicast address (the box has none of its own): not sent.
    if !unicast(src) || !unicast(dst) || icmp_error {
        return None;
    }
    // As much of the original as fits in 1280 bytes (RFC 4443 §3.2). The packet is longer
    // than the MTU, so the quote is at least the IPv6 header and 8 bytes whenever the MTU is.
    let quoted = &packet[..ip.total_len.min(ICMPV6_ERROR_MAX - 48)];
    let payload_len = 8 + quoted.len();
    let mut error = Vec::with_capacity(40 + payload_len);
    // From the packet's destination: see `fragmentation_needed`.
    error.extend_from_slice(&[0x60, 0, 0, 0]);
    error.extend_from_slice(&(payload_len as u16).to_be_bytes());
    error.extend_from_slice(&[PROTO_ICMPV6, ERROR_TTL]);
    error.extend_from_slice(&dst.octets());
    error.extend_from_slice(&src.octets());
    // Type, code, checksum, MTU (32 bits), the quote.
    error.extend_from_slice(&[ICMPV6_PACKET_TOO_BIG, 0, 0, 0]);
    error.extend_from_slice(&u32::from(mtu).to_be_bytes());
    error.extend_from_slice(quoted);
    // The checksum covers the IPv6 pseudo-header (RFC 4443 §2.3, RFC 8200 §8.1).
    let sum = checksum::transport_checksum(dst.into(), src.into(), PROTO_ICMPV6, &error[40..]);
    error[42..44].copy_from_slice(&sum.to_be_bytes());
    Some(error)
}

#[cfg(test)]
mod tests {
    use etherparse::{
        Icmpv4Header, Icmpv4Type, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket,
        TransportSlice, icmpv4::DestUnreachableHeader,
    };
    use proptest::prelude::*;

    use super::*;

    const V6_CLIENT: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const V6_SERVER: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    fn path_mtu(mtu: u16, icmp: bool) -> PathMtu {
        PathMtu::new(PathMtuConfig { mtu, icmp })
    }

    /// An IPv4/TCP packet of `total` bytes from 10.0.0.1 to 10.0.0.2, DF as given, with valid
    /// checksums (built by etherparse).
    fn ipv4(total: usize, dont_fragment: bool) -> Vec<u8> {
        let mut ip = etherparse::Ipv4Header::new(
            0,
            64,
            etherparse::IpNumber::TCP,
            [10, 0, 0, 1],
            [10, 0, 0, 2],
        )
        .expect("header");
        ip.identification = 0x1234;
        ip.dont_fragment = dont_fragment;
        let payload: Vec<u8> = (0..total - 40).map(|i| i as u8).collect();
        let mut out = Vec::new();
        PacketBuilder::ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
            .tcp(40_000, 443, 0x0102_0304, 65_535)
            .write(&mut out, &payload)
            .expect("build");
        assert_eq!(out.len(), total);
        out
    }

    /// An IPv6/TCP packet of `total` bytes from fd00::1 to fd00::2.
    fn ipv6(total: usize) -> Vec<u8> {
        let payload: Vec<u8> = (0..total - 60).map(|i| (i * 3) as u8).collect();
        let mut out = Vec::new();
        PacketBuilder::ipv6(V6_CLIENT, V6_SERVER, 64)
            .tcp(40_000, 443, 7, 65_535)
            .write(&mut out, &payload)
            .expect("build");
        assert_eq!(out.len(), total);
        out
    }

    /// Runs one packet through `mtu` left to right.
    fn run(mtu: &mut PathMtu, packet: Vec<u8>) -> Vec<Emit> {
        let mut out = Vec::new();
        mtu.process(Instant::now(), Direction::LeftToRight, packet, &mut out);
        out
    }

    #[test]
    fn oversize_ipv4_with_df_is_answered_with_fragmentation_needed() {
        let mut mtu = path_mtu(1400, true);
        let packet = ipv4(1500, true);
        let now = Instant::now();
        let mut out = Vec::new();
        mtu.process(now, Direction::LeftToRight, packet.clone(), &mut out);
        assert_eq!(out.len(), 1, "the packet is dropped, one error answers it");
        let Emit {
            at,
            dir,
            packet: error,
        } = &out[0];
        assert_eq!((*at, *dir), (now, Direction::RightToLeft), "back at once");
        assert_eq!(
            error.len(),
            576,
            "a 576-byte error quotes as much as it holds"
        );

        // Checked with etherparse, independently of the lab's checksum code.
        let sliced = SlicedPacket::from_ip(error).expect("parses as IP");
        let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
            panic!("not IPv4: {sliced:?}");
        };
        let header = ip.header();
        assert_eq!(
            header.to_header().calc_header_checksum(),
            header.header_checksum()
        );
        assert_eq!(
            header.source(),
            [10, 0, 0, 2],
            "from the packet's destination"
        );
        assert_eq!(header.destination(), [10, 0, 0, 1], "to its source");
        assert_eq!(header.ttl(), 64);
        assert_eq!(usize::from(header.total_len()), error.len());
        let Some(TransportSlice::Icmpv4(icmp)) = &sliced.transport else {
            panic!("not ICMPv4: {sliced:?}");
        };
        assert_eq!((icmp.type_u8(), icmp.code_u8()), (3, 4));
        assert_eq!(
            icmp.icmp_type(),
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1400
            })
        );
        assert_eq!(
            Icmpv4Header::with_checksum(icmp.icmp_type(), icmp.payload()).checksum,
            icmp.checksum(),
            "ICMP checksum"
        );
        // The quote: the original IP header, unchanged, and its payload from the start.
        let quote = icmp.payload();
        assert_eq!(quote.len(), 576 - 28);
        assert_eq!(&quote[..20], &packet[..20]);
        assert_eq!(quote, &packet[..quote.len()]);
        assert_eq!(checksum::checksum(&error[..20]), 0);
        assert_eq!(checksum::checksum(&error[20..]), 0);

        assert_eq!(
            mtu.stats(),
            PathMtuStats {
                dropped_too_big: 1,
                icmp_sent: 1,
                ..PathMtuStats::default()
            }
        );
        // The other direction is limited too, and answered the other way.
        let mut out = Vec::new();
        mtu.process(now, Direction::RightToLeft, packet, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].dir, Direction::LeftToRight);
        assert_eq!(
            mtu.counters(),
            vec![
                ("mtu_passed", 0),
                ("mtu_dropped_too_big", 2),
                ("mtu_dropped_fragmentable", 0),
                ("mtu_icmp_sent", 2),
            ]
        );
    }

    #[test]
    fn a_short_packet_is_quoted_whole() {
        // Only a config built in code goes below 576: a 200-byte packet over a 100-byte MTU
        // fits in the error whole.
        let mut mtu = path_mtu(100, true);
        let packet = ipv4(200, true);
        let out = run(&mut mtu, packet.clone());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].packet.len(), 28 + 200);
        assert_eq!(&out[0].packet[28..], &packet[..]);
        assert_eq!(&out[0].packet[26..28], &100u16.to_be_bytes());
        assert_eq!(checksum::checksum(&out[0].packet[20..]), 0);
    }

    #[test]
    fn oversize_ipv4_without_df_is_dropped_without_an_error() {
        let mut mtu = path_mtu(1400, true);
        assert!(run(&mut mtu, ipv4(1401, false)).is_empty());
        assert_eq!(
            mtu.stats(),
            PathMtuStats {
                dropped_fragmentable: 1,
                ..PathMtuStats::default()
            }
        );
    }

    #[test]
    fn packets_within_the_mtu_pass_unchanged() {
        let mut mtu = path_mtu(1400, true);
        for packet in [ipv4(1400, true), ipv4(60, false), ipv6(1400), ipv6(80)] {
            let out = run(&mut mtu, packet.clone());
            assert_eq!(
                out,
                vec![Emit {
                    at: out[0].at,
                    dir: Direction::LeftToRight,
                    packet
                }]
            );
        }
        assert_eq!(mtu.stats().passed, 4);
        assert_eq!(mtu.stats().icmp_sent, 0);
    }

    #[test]
    fn oversize_ipv6_is_answered_with_packet_too_big() {
        let mut mtu = path_mtu(1400, true);
        let packet = ipv6(1500);
        let out = run(&mut mtu, packet.clone());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].dir, Direction::RightToLeft);
        let error = &out[0].packet;
        assert_eq!(error.len(), 1280, "as much as fits in 1280 bytes");
        let sliced = SlicedPacket::from_ip(error).expect("parses as IP");
        let Some(NetSlice::Ipv6(ip)) = &sliced.net else {
            panic!("not IPv6: {sliced:?}");
        };
        let header = ip.header();
        assert_eq!(header.source(), V6_SERVER);
        assert_eq!(header.destination(), V6_CLIENT);
        assert_eq!(header.hop_limit(), 64);
        assert_eq!(usize::from(header.payload_length()) + 40, error.len());
        let Some(TransportSlice::Icmpv6(icmp)) = &sliced.transport else {
            panic!("not ICMPv6: {sliced:?}");
        };
        assert_eq!((icmp.type_u8(), icmp.code_u8()), (2, 0));
        assert_eq!(icmp.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1400 });
        assert!(
            icmp.is_checksum_valid(V6_SERVER, V6_CLIENT),
            "ICMPv6 checksum"
        );
        assert_eq!(icmp.payload(), &packet[..1232]);
        assert_eq!(mtu.stats().dropped_too_big, 1);
        assert_eq!(mtu.stats().icmp_sent, 1);

        // A shorter oversize packet is quoted whole.
        let mut small = path_mtu(1000, true);
        let packet = ipv6(1100);
        let out = run(&mut small, packet.clone());
        assert_eq!(out[0].packet.len(), 48 + 1100);
        assert_eq!(&out[0].packet[48..], &packet[..]);
        assert!(checksum::verify_transport(
            V6_SERVER.into(),
            V6_CLIENT.into(),
            58,
            &out[0].packet[40..]
        ));
    }

    #[test]
    fn without_icmp_oversize_packets_vanish() {
        let mut blackhole = path_mtu(1400, false);
        assert!(run(&mut blackhole, ipv4(1500, true)).is_empty());
        assert!(run(&mut blackhole, ipv6(1500)).is_empty());
        assert!(run(&mut blackhole, ipv4(1500, false)).is_empty());
        assert_eq!(run(&mut blackhole, ipv4(1000, true)).len(), 1);
        assert_eq!(
            blackhole.stats(),
            PathMtuStats {
                passed: 1,
                dropped_too_big: 2,
                dropped_fragmentable: 1,
                icmp_sent: 0,
            }
        );
    }

    #[test]
    fn no_error_about_an_error_or_for_a_multicast_destination() {
        let mut mtu = path_mtu(1400, true);
        // An oversize ICMPv4 Destination Unreachable with DF.
        let mut error = ipv4(1500, true);
        error[9] = PROTO_ICMP;
        error[20] = 3;
        error[10..12].fill(0);
        let sum = checksum::checksum(&error[..20]);
        error[10..12].copy_from_slice(&sum.to_be_bytes());
        assert!(run(&mut mtu, error.clone()).is_empty());
        // An echo request of the same size is answered.
        error[20] = 8;
        assert_eq!(run(&mut mtu, error).len(), 1);
        // An IPv6 packet to a multicast group: the box would have to answer from it.
        let mut multicast = ipv6(1500);
        multicast[24] = 0xff;
        assert!(run(&mut mtu, multicast).is_empty());
        assert_eq!(mtu.stats().dropped_too_big, 3);
        assert_eq!(mtu.stats().icmp_sent, 1);
    }

    #[test]
    fn non_ip_and_malformed_packets_pass_unchanged() {
        let mut mtu = path_mtu(576, true);
        let mut truncated = ipv4(1500, true);
        truncated.truncate(1000);
        for packet in [
            vec![],
            vec![0x45],
            vec![0x70; 2000],
            truncated,
            vec![0x60; 39],
        ] {
            let out = run(&mut mtu, packet.clone());
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].packet, packet);
        }
        assert_eq!(mtu.stats().passed, 5);
    }

    proptest! {
        /// Any bytes: passed unchanged, or dropped with at most one valid error, never a panic.
        #[test]
        fn any_bytes_never_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..1600),
            version in prop_oneof![Just(0x45u8), Just(0x60u8), any::<u8>()],
            mtu in 0u16..1600,
        ) {
            if let Some(first) = bytes.first_mut() {
                *first = version;
            }
            let mut mtu = path_mtu(mtu, true);
            let out = run(&mut mtu, bytes.clone());
            prop_assert!(out.len() <= 1);
            if let Some(emit) = out.first() {
                if emit.dir == Direction::LeftToRight {
                    prop_assert_eq!(&emit.packet, &bytes);
                } else {
                    let ip = parse_ip(&emit.packet).expect("the error is IP");
                    prop_assert_eq!(ip.total_len, emit.packet.len());
                    prop_assert!(emit.packet.len() <= 1280);
                }
            }
        }

        /// Packets of any size, mutated or not: passed byte-identical when they fit, otherwise
        /// answered with an error that quotes them and whose checksums verify.
        #[test]
        fn errors_are_valid_and_quote_the_packet(
            v6 in any::<bool>(),
            size in 80usize..3000,
            mtu in 576u16..2000,
            mutations in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        ) {
            let mut packet = if v6 { ipv6(size) } else { ipv4(size, true) };
            // Anything after the IP header may be anything.
            for (at, byte) in mutations {
                let len = packet.len();
                packet[40 + at % (len - 40)] = byte;
            }
            let mut path = path_mtu(mtu, true);
            let out = run(&mut path, packet.clone());
            prop_assert_eq!(out.len(), 1);
            let emit = &out[0];
            if size <= usize::from(mtu) {
                prop_assert_eq!(emit.dir, Direction::LeftToRight);
                prop_assert_eq!(&emit.packet, &packet);
            } else {
                prop_assert_eq!(emit.dir, Direction::RightToLeft);
                let error = &emit.packet;
                let (header, limit) = if v6 { (48, 1280) } else { (28, 576) };
                prop_assert_eq!(error.len(), limit.min(header + size));
                prop_assert_eq!(&error[header..], &packet[..error.len() - header]);
                if v6 {
                    prop_assert!(checksum::verify_transport(
                        V6_SERVER.into(), V6_CLIENT.into(), PROTO_ICMPV6, &error[40..]
                    ));
                    prop_assert_eq!(&error[44..48], &u32::from(mtu).to_be_bytes());
                } else {
                    prop_assert_eq!(checksum::checksum(&error[..20]), 0);
                    prop_assert_eq!(checksum::checksum(&error[20..]), 0);
                    prop_assert_eq!(&error[26..28], &mtu.to_be_bytes());
                }
            }
        }
    }
}
