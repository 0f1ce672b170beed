//! IPv4/IPv6 + TCP packet parsing and building, hand-written.
//!
//! Hand-written rather than `etherparse` because the core needs zero-copy parsing straight into
//! its own option struct, a typed reason for every way a packet can be malformed, and packet
//! building that copies the payload once, directly from the send queue into the caller's buffer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::DropReason;

/// TCP header flags (RFC 9293 §3.1).
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    pub const FIN: TcpFlags = TcpFlags(0x01);
    pub const SYN: TcpFlags = TcpFlags(0x02);
    pub const RST: TcpFlags = TcpFlags(0x04);
    pub const PSH: TcpFlags = TcpFlags(0x08);
    pub const ACK: TcpFlags = TcpFlags(0x10);
    pub const URG: TcpFlags = TcpFlags(0x20);
    pub const ECE: TcpFlags = TcpFlags(0x40);
    pub const CWR: TcpFlags = TcpFlags(0x80);

    pub fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn fin(self) -> bool {
        self.contains(Self::FIN)
    }
    pub fn syn(self) -> bool {
        self.contains(Self::SYN)
    }
    pub fn rst(self) -> bool {
        self.contains(Self::RST)
    }
    pub fn psh(self) -> bool {
        self.contains(Self::PSH)
    }
    pub fn ack(self) -> bool {
        self.contains(Self::ACK)
    }
}

impl std::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl std::fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [(u8, &str); 8] = [
            (0x02, "S"),
            (0x10, "."),
            (0x01, "F"),
            (0x04, "R"),
            (0x08, "P"),
            (0x20, "U"),
            (0x40, "E"),
            (0x80, "W"),
        ];
        let mut s = String::new();
        for (bit, name) in NAMES {
            if self.0 & bit != 0 {
                s.push_str(name);
            }
        }
        if s.is_empty() {
            s.push('-');
        }
        f.write_str(&s)
    }
}

/// Option kinds (IANA "TCP Option Kind Numbers").
pub(crate) mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WSCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMPS: u8 = 8;
    /// TCP Fast Open cookie (RFC 7413 §4.1.1).
    pub const FAST_OPEN: u8 = 34;
    /// Shared experimental option (RFC 6994); with the magic 0xF989 the pre-RFC form of the
    /// Fast Open cookie option that older Linux clients send.
    pub const EXPERIMENTAL: u8 = 254;
}

/// Magic of the experimental Fast Open option (RFC 7413 §4.1.1 mentions the form; Linux sent
/// it before kind 34 was assigned).
const FAST_OPEN_EXP_MAGIC: [u8; 2] = [0xf9, 0x89];

/// A TCP Fast Open cookie (RFC 7413 §4.1.1): 4 to 16 bytes, an even number. The empty cookie
/// is a cookie request (§4.1.2: an option with no cookie).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FastOpenCookie {
    len: u8,
    bytes: [u8; FastOpenCookie::MAX_LEN],
}

impl FastOpenCookie {
    /// Longest cookie (RFC 7413 §4.1.1).
    pub const MAX_LEN: usize = 16;
    /// Shortest non-empty cookie (RFC 7413 §4.1.1).
    pub const MIN_LEN: usize = 4;

    /// The empty cookie: a cookie request.
    pub const REQUEST: FastOpenCookie = FastOpenCookie {
        len: 0,
        bytes: [0; FastOpenCookie::MAX_LEN],
    };

    /// A cookie from its bytes: `None` unless empty or 4 to 16 bytes (RFC 7413 §4.1.1; an odd
    /// length is accepted, as Linux does, though the RFC's cookies are even).
    pub fn new(bytes: &[u8]) -> Option<FastOpenCookie> {
        if !(bytes.is_empty() || (Self::MIN_LEN..=Self::MAX_LEN).contains(&bytes.len())) {
            return None;
        }
        let mut c = FastOpenCookie {
            len: bytes.len() as u8,
            bytes: [0; Self::MAX_LEN],
        };
        c.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(c)
    }

    /// The cookie's bytes (empty for a request).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// An empty option: a cookie request.
    pub fn is_request(&self) -> bool {
        self.len == 0
    }

    /// Bytes the option takes on the wire, with the NOPs that align it to 32 bits.
    fn wire_len(&self) -> usize {
        (2 + self.len as usize).div_ceil(4) * 4
    }
}

impl std::fmt::Debug for FastOpenCookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FastOpenCookie(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

/// Largest SACK block count an option can carry (RFC 2018 §3: 40 bytes of option space).
pub const MAX_SACK_BLOCKS: usize = 4;

/// The TCP options of one segment that this stack understands; unknown options are skipped
/// (RFC 9293 §3.1, MUST-6/MUST-68: ignore options not implemented).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpOptions {
    /// Maximum segment size (RFC 9293 §3.7.1), only meaningful on SYN segments.
    pub mss: Option<u16>,
    /// Window scale shift as sent, not yet clamped (RFC 7323 §2).
    pub window_scale: Option<u8>,
    /// SACK-permitted (RFC 2018 §2).
    pub sack_permitted: bool,
    /// Timestamps (TSval, TSecr) (RFC 7323 §3).
    pub timestamps: Option<(u32, u32)>,
    /// SACK blocks (left, right) as on the wire (RFC 2018 §3).
    pub sack_blocks: [(u32, u32); MAX_SACK_BLOCKS],
    /// How many entries of `sack_blocks` are valid.
    pub sack_block_count: u8,
    /// TCP Fast Open option (RFC 7413 §4.1.1), kind 34 or the experimental 254/0xF989; the
    /// empty cookie is a cookie request. A malformed one (length outside 0 or 4..=16) is
    /// ignored.
    pub fast_open: Option<FastOpenCookie>,
}

impl TcpOptions {
    /// The valid SACK blocks.
    pub fn sack(&self) -> &[(u32, u32)] {
        &self.sack_blocks[..self.sack_block_count as usize]
    }

    /// Parses the option bytes of a TCP header. Unknown options with a sane length are skipped;
    /// an option whose length field is below 2 or runs past the header makes the whole segment
    /// malformed (RFC 9293 §3.1 asks implementations to handle illegal lengths without crashing).
    pub fn parse(mut bytes: &[u8]) -> Result<TcpOptions, DropReason> {
        let mut options = TcpOptions::default();
        while let Some((&k, rest)) = bytes.split_first() {
            match k {
                kind::EOL => break,
                kind::NOP => {
                    bytes = rest;
                    continue;
                }
                _ => {}
            }
            let Some(&len) = rest.first() else {
                return Err(DropReason::BadOptionLength);
            };
            let len = len as usize;
            if len < 2 || len > bytes.len() {
                return Err(DropReason::BadOptionLength);
            }
            let body = &bytes[2..len];
            // A known option with a wrong length is ignored, as Linux does, rather than
            // poisoning the segment.
            match (k, body.len()) {
                (kind::MSS, 2) => options.mss = Some(u16::from_be_bytes([body[0], body[1]])),
                (kind::WSCALE, 1) => options.window_scale = Some(body[0]),
                (kind::SACK_PERMITTED, 0) => options.sack_permitted = true,
                (kind::TIMESTAMPS, 8) => {
                    options.timestamps = Some((
                        u32::from_be_bytes([body[0], body[1], body[2], body[3]]),
                        u32::from_be_bytes([body[4], body[5], body[6], body[7]]),
                    ))
                }
                (kind::FAST_OPEN, _) => {
                    if let Some(c) = FastOpenCookie::new(body) {
                        options.fast_open = Some(c);
                    }
                }
                (kind::EXPERIMENTAL, n) if n >= 2 && body[..2] == FAST_OPEN_EXP_MAGIC => {
                    if let Some(c) = FastOpenCookie::new(&body[2..]) {
                        options.fast_open = Some(c);
                    }
                }
                (kind::SACK, n) if n > 0 && n % 8 == 0 => {
                    for (i, block) in body.chunks_exact(8).take(MAX_SACK_BLOCKS).enumerate() {
                        options.sack_blocks[i] = (
                            u32::from_be_bytes([block[0], block[1], block[2], block[3]]),
                            u32::from_be_bytes([block[4], block[5], block[6], block[7]]),
                        );
                        options.sack_block_count = i as u8 + 1;
                    }
                }
                _ => {}
            }
            bytes = &bytes[len..];
        }
        Ok(options)
    }
}

/// A parsed TCP segment and the addresses of the IP packet that carried it.
#[derive(Clone, Debug)]
pub struct Segment<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub window: u16,
    pub urgent: u16,
    pub options: TcpOptions,
    pub payload: &'a [u8],
}

impl Segment<'_> {
    /// SEG.LEN: payload plus one for each of SYN and FIN (RFC 9293 §3.4).
    pub fn seg_len(&self) -> u32 {
        self.payload.len() as u32 + self.flags.syn() as u32 + self.flags.fin() as u32
    }
}

const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
pub(crate) const TCP_HEADER: usize = 20;
const PROTO_TCP: u8 = 6;

/// Parses a whole IPv4 or IPv6 packet carrying TCP, as a TUN device delivers it.
pub fn parse_packet(packet: &[u8], verify_checksum: bool) -> Result<Segment<'_>, DropReason> {
    let Some(&first) = packet.first() else {
        return Err(DropReason::Truncated);
    };
    match first >> 4 {
        4 => parse_ipv4(packet, verify_checksum),
        6 => parse_ipv6(packet, verify_checksum),
        _ => Err(DropReason::UnsupportedIpVersion),
    }
}

fn parse_ipv4(packet: &[u8], verify_checksum: bool) -> Result<Segment<'_>, DropReason> {
    if packet.len() < IPV4_HEADER {
        return Err(DropReason::Truncated);
    }
    let ihl = ((packet[0] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if ihl < IPV4_HEADER || total < ihl || total > packet.len() {
        return Err(DropReason::BadIpHeader);
    }
    if verify_checksum && checksum_fold(sum_bytes(0, &packet[..ihl])) != 0 {
        return Err(DropReason::BadIpChecksum);
    }
    let frag = u16::from_be_bytes([packet[6], packet[7]]);
    // More-fragments set or a non-zero offset: fragments are not reassembled here.
    if frag & 0x2000 != 0 || frag & 0x1fff != 0 {
        return Err(DropReason::Fragment);
    }
    if packet[9] != PROTO_TCP {
        return Err(DropReason::NotTcp);
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let tcp = &packet[ihl..total];
    let pseudo = if verify_checksum {
        pseudo_sum_v4(src, dst, tcp.len())
    } else {
        0
    };
    parse_tcp(
        IpAddr::V4(src),
        IpAddr::V4(dst),
        tcp,
        verify_checksum,
        pseudo,
    )
}

fn parse_ipv6(packet: &[u8], verify_checksum: bool) -> Result<Segment<'_>, DropReason> {
    if packet.len() < IPV6_HEADER {
        return Err(DropReason::Truncated);
    }
    let payload_len = u16::from_be_bytes([packet[4], packet[5]]) as usize;
    if IPV6_HEADER + payload_len > packet.len() {
        return Err(DropReason::BadIpHeader);
    }
    let mut next = packet[6];
    let mut src_bytes = [0u8; 16];
    src_bytes.copy_from_slice(&packet[8..24]);
    let mut dst_bytes = [0u8; 16];
    dst_bytes.copy_from_slice(&packet[24..40]);
    let src = Ipv6Addr::from(src_bytes);
    let dst = Ipv6Addr::from(dst_bytes);
    let mut rest = &packet[IPV6_HEADER..IPV6_HEADER + payload_len];
    // Walk extension headers (RFC 8200 §4); the chain is bounded by the packet length.
    loop {
        match next {
            PROTO_TCP => break,
            // Hop-by-hop, routing, destination options: skip (RFC 8200 §4.3, §4.4, §4.6).
            0 | 43 | 60 => {
                if rest.len() < 8 {
                    return Err(DropReason::BadIpHeader);
                }
                let len = (rest[1] as usize + 1) * 8;
                if len > rest.len() {
                    return Err(DropReason::BadIpHeader);
                }
                next = rest[0];
                rest = &rest[len..];
            }
            44 => return Err(DropReason::Fragment),
            _ => return Err(DropReason::NotTcp),
        }
    }
    let pseudo = if verify_checksum {
        pseudo_sum_v6(&src, &dst, rest.len())
    } else {
        0
    };
    parse_tcp(
        IpAddr::V6(src),
        IpAddr::V6(dst),
        rest,
        verify_checksum,
        pseudo,
    )
}

fn parse_tcp(
    src: IpAddr,
    dst: IpAddr,
    tcp: &[u8],
    verify_checksum: bool,
    pseudo: u64,
) -> Result<Segment<'_>, DropReason> {
    if tcp.len() < TCP_HEADER {
        return Err(DropReason::TruncatedTcpHeader);
    }
    let data_offset = ((tcp[12] >> 4) as usize) * 4;
    if data_offset < TCP_HEADER || data_offset > tcp.len() {
        return Err(DropReason::BadDataOffset);
    }
    if verify_checksum && checksum_fold(sum_bytes(pseudo, tcp)) != 0 {
        return Err(DropReason::BadTcpChecksum);
    }
    let src_port = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dst_port = u16::from_be_bytes([tcp[2], tcp[3]]);
    let options = TcpOptions::parse(&tcp[TCP_HEADER..data_offset])?;
    Ok(Segment {
        src: SocketAddr::new(src, src_port),
        dst: SocketAddr::new(dst, dst_port),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
        flags: TcpFlags(tcp[13]),
        window: u16::from_be_bytes([tcp[14], tcp[15]]),
        urgent: u16::from_be_bytes([tcp[18], tcp[19]]),
        options,
        payload: &tcp[data_offset..],
    })
}

const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;

/// An ICMP error saying one of our TCP segments was too big for a link on the path (RFC 1191
/// §4 "fragmentation needed and DF set", RFC 8201 §4 ICMPv6 Packet Too Big): the MTU it
/// reports and the fields of the segment it quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PacketTooBig {
    /// The next hop's MTU (for an old router that left the field zero, the RFC 1191 §7
    /// plateau below the quoted packet's length).
    pub mtu: u32,
    /// The quoted segment's source (this end) and destination (the peer).
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The quoted segment's sequence number (RFC 5927 §4.1: checked against what is in
    /// flight before the error is believed).
    pub seq: u32,
}

/// RFC 1191 §7's MTU plateaus, for errors without a next-hop MTU.
const MTU_PLATEAUS: [u32; 10] = [32000, 17914, 8166, 4352, 2002, 1492, 1006, 508, 296, 68];

/// Parses an ICMP or ICMPv6 "packet too big" error quoting a TCP segment sent from the
/// error's destination; `None` for anything else (other ICMP, malformed or truncated
/// quotes, bad checksums with `verify_checksum`).
pub(crate) fn parse_packet_too_big(packet: &[u8], verify_checksum: bool) -> Option<PacketTooBig> {
    match packet.first()? >> 4 {
        4 => parse_icmpv4_too_big(packet, verify_checksum),
        6 => parse_icmpv6_too_big(packet, verify_checksum),
        _ => None,
    }
}

fn parse_icmpv4_too_big(packet: &[u8], verify_checksum: bool) -> Option<PacketTooBig> {
    let ihl = ((packet.first()? & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]) as usize;
    if ihl < IPV4_HEADER || total < ihl || total > packet.len() || packet[9] != PROTO_ICMP {
        return None;
    }
    let frag = u16::from_be_bytes([packet[6], packet[7]]);
    if frag & 0x2000 != 0 || frag & 0x1fff != 0 {
        return None;
    }
    if verify_checksum && checksum_fold(sum_bytes(0, &packet[..ihl])) != 0 {
        return None;
    }
    let icmp = &packet[ihl..total];
    // Type 3 (destination unreachable), code 4 (fragmentation needed and DF set).
    if icmp.len() < 8 || icmp[0] != 3 || icmp[1] != 4 {
        return None;
    }
    if verify_checksum && checksum_fold(sum_bytes(0, icmp)) != 0 {
        return None;
    }
    let quoted = &icmp[8..];
    let inner_ihl = ((quoted.first()? & 0x0f) as usize) * 4;
    if quoted[0] >> 4 != 4
        || inner_ihl < IPV4_HEADER
        || quoted.len() < inner_ihl + 8
        || quoted[9] != PROTO_TCP
    {
        return None;
    }
    let inner_src = Ipv4Addr::new(quoted[12], quoted[13], quoted[14], quoted[15]);
    let inner_dst = Ipv4Addr::new(quoted[16], quoted[17], quoted[18], quoted[19]);
    let outer_dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    if outer_dst != inner_src {
        return None;
    }
    let mtu = match u16::from_be_bytes([icmp[6], icmp[7]]) {
        0 => {
            let quoted_len = u32::from(u16::from_be_bytes([quoted[2], quoted[3]]));
            *MTU_PLATEAUS.iter().find(|&&p| p < quoted_len)?
        }
        m => u32::from(m),
    };
    let tcp = &quoted[inner_ihl..];
    Some(PacketTooBig {
        mtu,
        local: SocketAddr::new(IpAddr::V4(inner_src), u16::from_be_bytes([tcp[0], tcp[1]])),
        remote: SocketAddr::new(IpAddr::V4(inner_dst), u16::from_be_bytes([tcp[2], tcp[3]])),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
    })
}

fn parse_icmpv6_too_big(packet: &[u8], verify_checksum: bool) -> Option<PacketTooBig> {
    if packet.len() < IPV6_HEADER || packet[6] != PROTO_ICMPV6 {
        return None;
    }
    let payload_len = u16::from_be_bytes([packet[4], packet[5]]) as usize;
    let icmp = packet.get(IPV6_HEADER..IPV6_HEADER + payload_len)?;
    // Type 2 (packet too big), code 0.
    if icmp.len() < 8 || icmp[0] != 2 || icmp[1] != 0 {
        return None;
    }
    let addr = |b: &[u8]| -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[..16]);
        Ipv6Addr::from(a)
    };
    let (outer_src, outer_dst) = (addr(&packet[8..24]), addr(&packet[24..40]));
    if verify_checksum {
        // RFC 4443 §2.3: over the IPv6 pseudo-header with next header 58.
        let mut acc = sum_bytes(0, &outer_src.octets());
        acc = sum_bytes(acc, &outer_dst.octets());
        acc += PROTO_ICMPV6 as u64 + icmp.len() as u64;
        if checksum_fold(sum_bytes(acc, icmp)) != 0 {
            return None;
        }
    }
    let quoted = &icmp[8..];
    if quoted.len() < IPV6_HEADER + 8 || quoted[0] >> 4 != 6 || quoted[6] != PROTO_TCP {
        return None;
    }
    let (inner_src, inner_dst) = (addr(&quoted[8..24]), addr(&quoted[24..40]));
    if outer_dst != inner_src {
        return None;
    }
    let tcp = &quoted[IPV6_HEADER..];
    Some(PacketTooBig {
        mtu: u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]),
        local: SocketAddr::new(IpAddr::V6(inner_src), u16::from_be_bytes([tcp[0], tcp[1]])),
        remote: SocketAddr::new(IpAddr::V6(inner_dst), u16::from_be_bytes([tcp[2], tcp[3]])),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
    })
}

/// Adds big-endian 16-bit words of `data` (a last odd byte padded with zero) to a
/// ones-complement accumulator; `data` must start at an even offset of the checksummed
/// region. Eight bytes at a time in native (little-endian) order, both 32-bit halves into a
/// 64-bit sum (no carry lost below 2^31 words), folded and byte-swapped at the end: the
/// ones-complement sum is independent of byte order (RFC 1071 §2 (B)), and 2^16 ≡ 1 modulo
/// 2^16 − 1, so a 32-bit half counts as the sum of its two 16-bit words.
pub(crate) fn sum_bytes(acc: u64, data: &[u8]) -> u64 {
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        sum += (w & 0xffff_ffff) + (w >> 32);
    }
    let mut pairs = words.remainder().chunks_exact(2);
    for p in &mut pairs {
        sum += u64::from(u16::from_le_bytes([p[0], p[1]]));
    }
    if let [last] = pairs.remainder() {
        // Little-endian [last, 0]: big-endian [last, 0] after the swap.
        sum += u64::from(*last);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    acc + u64::from((sum as u16).swap_bytes())
}

/// Folds an accumulator to the 16-bit ones-complement checksum (RFC 1071).
pub(crate) fn checksum_fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

fn pseudo_sum_v4(src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize) -> u64 {
    let mut acc = sum_bytes(0, &src.octets());
    acc = sum_bytes(acc, &dst.octets());
    acc + PROTO_TCP as u64 + tcp_len as u64
}

fn pseudo_sum_v6(src: &Ipv6Addr, dst: &Ipv6Addr, tcp_len: usize) -> u64 {
    let mut acc = sum_bytes(0, &src.octets());
    acc = sum_bytes(acc, &dst.octets());
    acc + PROTO_TCP as u64 + tcp_len as u64
}

/// The fields of an outgoing TCP segment, before options and payload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutHeader {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub window: u16,
    pub ttl: u8,
    /// IPv4 identification or IPv6 flow label.
    pub ip_id: u32,
}

/// Outgoing options, laid out exactly as Linux lays them out so that a peer (or a middlebox)
/// sees the familiar byte patterns.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OutOptions {
    pub mss: Option<u16>,
    pub sack_permitted: bool,
    pub timestamps: Option<(u32, u32)>,
    pub window_scale: Option<u8>,
    pub sack_blocks: [(u32, u32); MAX_SACK_BLOCKS],
    pub sack_block_count: u8,
    /// Fast Open option (RFC 7413 §4.1.1), laid out as Linux does: NOPs first so that the
    /// option ends on a 32-bit boundary.
    pub fast_open: Option<FastOpenCookie>,
}

impl OutOptions {
    /// Encoded length in bytes (always a multiple of 4).
    pub fn len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.timestamps.is_some() {
            n += 12; // SACK_PERM folds into the first two bytes when both are present.
        } else if self.sack_permitted {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4;
        }
        if self.sack_block_count > 0 {
            n += 4 + 8 * self.sack_block_count as usize;
        }
        if let Some(c) = &self.fast_open {
            n += c.wire_len();
        }
        n
    }

    fn write(&self, out: &mut [u8]) -> usize {
        let mut i = 0;
        if let Some(mss) = self.mss {
            out[i..i + 4].copy_from_slice(&[kind::MSS, 4, (mss >> 8) as u8, mss as u8]);
            i += 4;
        }
        if let Some((val, ecr)) = self.timestamps {
            if self.sack_permitted {
                out[i..i + 2].copy_from_slice(&[kind::SACK_PERMITTED, 2]);
            } else {
                out[i..i + 2].copy_from_slice(&[kind::NOP, kind::NOP]);
            }
            out[i + 2..i + 4].copy_from_slice(&[kind::TIMESTAMPS, 10]);
            out[i + 4..i + 8].copy_from_slice(&val.to_be_bytes());
            out[i + 8..i + 12].copy_from_slice(&ecr.to_be_bytes());
            i += 12;
        } else if self.sack_permitted {
            out[i..i + 4].copy_from_slice(&[kind::NOP, kind::NOP, kind::SACK_PERMITTED, 2]);
            i += 4;
        }
        if let Some(ws) = self.window_scale {
            out[i..i + 4].copy_from_slice(&[kind::NOP, kind::WSCALE, 3, ws]);
            i += 4;
        }
        if self.sack_block_count > 0 {
            let n = self.sack_block_count as usize;
            out[i..i + 4].copy_from_slice(&[kind::NOP, kind::NOP, kind::SACK, 2 + 8 * n as u8]);
            i += 4;
            for &(l, r) in &self.sack_blocks[..n] {
                out[i..i + 4].copy_from_slice(&l.to_be_bytes());
                out[i + 4..i + 8].copy_from_slice(&r.to_be_bytes());
                i += 8;
            }
        }
        if let Some(c) = &self.fast_open {
            let pad = c.wire_len() - 2 - c.len as usize;
            out[i..i + pad].fill(kind::NOP);
            i += pad;
            out[i..i + 2].copy_from_slice(&[kind::FAST_OPEN, 2 + c.len]);
            out[i + 2..i + 2 + c.len as usize].copy_from_slice(c.as_bytes());
            i += 2 + c.len as usize;
        }
        i
    }
}

/// IP header length for the address family of `addr`.
pub(crate) fn ip_header_len(addr: &SocketAddr) -> usize {
    if addr.is_ipv4() {
        IPV4_HEADER
    } else {
        IPV6_HEADER
    }
}

/// Writes a whole IP packet into `buf`: IP header, TCP header, options, then `payload_len` bytes
/// produced by `fill` directly into the buffer. Returns the packet length, or `None` if `buf`
/// is too small. Both checksums are computed here.
pub(crate) fn write_packet(
    buf: &mut [u8],
    hdr: &OutHeader,
    opts: &OutOptions,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let ip_len = ip_header_len(&hdr.src);
    let tcp_hdr_len = TCP_HEADER + opts.len();
    let tcp_len = tcp_hdr_len + payload_len;
    let total = ip_len + tcp_len;
    if buf.len() < total || tcp_hdr_len > 60 || total > u16::MAX as usize + ip_len {
        return None;
    }
    let buf = &mut buf[..total];
    let (ip, tcp) = buf.split_at_mut(ip_len);
    let pseudo = match (hdr.src.ip(), hdr.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&(hdr.ip_id as u16).to_be_bytes());
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
            ip[8] = hdr.ttl;
            ip[9] = PROTO_TCP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = checksum_fold(sum_bytes(0, ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            pseudo_sum_v4(s, d, tcp_len)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let label = hdr.ip_id & 0x000f_ffff;
            ip[0..4].copy_from_slice(&((6u32 << 28) | label).to_be_bytes());
            ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            ip[6] = PROTO_TCP;
            ip[7] = hdr.ttl;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            pseudo_sum_v6(&s, &d, tcp_len)
        }
        _ => return None,
    };
    tcp[0..2].copy_from_slice(&hdr.src.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&hdr.dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&hdr.seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&hdr.ack.to_be_bytes());
    tcp[12] = ((tcp_hdr_len / 4) as u8) << 4;
    tcp[13] = hdr.flags.0;
    tcp[14..16].copy_from_slice(&hdr.window.to_be_bytes());
    tcp[16..20].copy_from_slice(&[0, 0, 0, 0]);
    let written = opts.write(&mut tcp[TCP_HEADER..tcp_hdr_len]);
    debug_assert_eq!(written, opts.len());
    fill(&mut tcp[tcp_hdr_len..]);
    let c = checksum_fold(sum_bytes(pseudo, tcp));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    Some(total)
}

/// Whether an address may never be a TCP peer: multicast, broadcast or unspecified
/// (RFC 9293 §3.9.1 / MUST-57: SYNs to or from such addresses are discarded, no RST is sent).
pub(crate) fn is_non_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_multicast() || a.is_broadcast() || a.is_unspecified(),
        IpAddr::V6(a) => a.is_multicast() || a.is_unspecified(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain big-endian word sum of RFC 1071 §4.1, as the oracle.
    fn sum_words_reference(data: &[u8]) -> u16 {
        let mut acc: u64 = 0;
        for pair in data.chunks(2) {
            acc += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
        checksum_fold(acc)
    }

    proptest::proptest! {
        #[test]
        fn checksum_equals_the_plain_word_sum(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            acc in 0u64..0x1_0000_0000,
        ) {
            proptest::prop_assert_eq!(checksum_fold(sum_bytes(0, &data)), sum_words_reference(&data));
            // Sums continue across calls at even offsets, and onto any accumulator.
            let cut = data.len() / 4 * 2;
            let split = sum_bytes(sum_bytes(acc, &data[..cut]), &data[cut..]);
            let mut whole = acc;
            for pair in data.chunks(2) {
                whole += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
            }
            proptest::prop_assert_eq!(checksum_fold(split), checksum_fold(whole));
        }
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 §3 example words: 0x0001 0xf203 0xf4f5 0xf6f7 -> sum 0xddf2 (before complement).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum_fold(sum_bytes(0, &data)), !0xddf2);
        // Odd length pads with a zero byte.
        assert_eq!(
            checksum_fold(sum_bytes(0, &[0x12, 0x34, 0x56])),
            checksum_fold(sum_bytes(0, &[0x12, 0x34, 0x56, 0x00]))
        );
    }

    #[test]
    fn build_then_parse_roundtrip_v4_and_v6() {
        for (src, dst) in [
            ("10.0.0.1:1000", "10.0.0.2:80"),
            ("[fd00::1]:1000", "[fd00::2]:80"),
        ] {
            let hdr = OutHeader {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                seq: 7,
                ack: 9,
                flags: TcpFlags::SYN | TcpFlags::ACK,
                window: 1000,
                ttl: 64,
                ip_id: 3,
            };
            let opts = OutOptions {
                mss: Some(1460),
                sack_permitted: true,
                timestamps: Some((1, 2)),
                window_scale: Some(7),
                ..Default::default()
            };
            let mut buf = [0u8; 200];
            let n = write_packet(&mut buf, &hdr, &opts, 3, |p| p.copy_from_slice(b"abc")).unwrap();
            let seg = parse_packet(&buf[..n], true).unwrap();
            assert_eq!(seg.src, hdr.src);
            assert_eq!(seg.dst, hdr.dst);
            assert_eq!((seg.seq, seg.ack, seg.window), (7, 9, 1000));
            assert_eq!(seg.options.mss, Some(1460));
            assert_eq!(seg.options.window_scale, Some(7));
            assert!(seg.options.sack_permitted);
            assert_eq!(seg.options.timestamps, Some((1, 2)));
            assert_eq!(seg.payload, b"abc");
            // Flip a payload bit: the TCP checksum must catch it.
            buf[n - 1] ^= 1;
            assert_eq!(
                parse_packet(&buf[..n], true).unwrap_err(),
                DropReason::BadTcpChecksum
            );
            assert!(parse_packet(&buf[..n], false).is_ok());
        }
    }

    #[test]
    fn fast_open_option_roundtrip_and_forms() {
        let cookie = FastOpenCookie::new(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        for fo in [FastOpenCookie::REQUEST, cookie] {
            let opts = OutOptions {
                mss: Some(1460),
                sack_permitted: true,
                timestamps: Some((1, 2)),
                window_scale: Some(7),
                fast_open: Some(fo),
                ..Default::default()
            };
            let mut bytes = [0u8; 40];
            let n = opts.write(&mut bytes);
            assert_eq!(n, opts.len());
            assert_eq!(n % 4, 0);
            let parsed = TcpOptions::parse(&bytes[..n]).unwrap();
            assert_eq!(parsed.fast_open, Some(fo));
            assert_eq!(parsed.mss, Some(1460));
        }
        // The experimental form (kind 254, magic 0xF989).
        let o = TcpOptions::parse(&[254, 8, 0xf9, 0x89, 9, 9, 9, 9]).unwrap();
        assert_eq!(o.fast_open.unwrap().as_bytes(), &[9, 9, 9, 9]);
        // Another experiment's magic, and cookie lengths out of range, are ignored.
        assert_eq!(
            TcpOptions::parse(&[254, 4, 0x12, 0x34]).unwrap().fast_open,
            None
        );
        assert_eq!(TcpOptions::parse(&[34, 4, 1, 2]).unwrap().fast_open, None);
        let long = [[34u8, 20].as_slice(), &[0; 18]].concat();
        assert_eq!(TcpOptions::parse(&long).unwrap().fast_open, None);
        assert!(FastOpenCookie::new(&[0; 17]).is_none());
    }

    #[test]
    fn option_lengths_are_checked() {
        assert_eq!(
            TcpOptions::parse(&[2, 0, 0, 0]).unwrap_err(),
            DropReason::BadOptionLength
        );
        assert_eq!(
            TcpOptions::parse(&[8, 12, 0]).unwrap_err(),
            DropReason::BadOptionLength
        );
        assert_eq!(
            TcpOptions::parse(&[2]).unwrap_err(),
            DropReason::BadOptionLength
        );
        // Unknown option skipped, EOL stops parsing.
        let o = TcpOptions::parse(&[99, 3, 0, 2, 4, 5, 180, 0, 3, 3, 9]).unwrap();
        assert_eq!(o.mss, Some(1460));
        assert_eq!(o.window_scale, None);
        // MSS with the wrong length is ignored, not fatal.
        let o = TcpOptions::parse(&[2, 3, 1, 1, 1, 1]).unwrap();
        assert_eq!(o.mss, None);
    }
}
