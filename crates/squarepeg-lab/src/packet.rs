//! Raw IP packets as a TUN device carries them (IPv4 or IPv6, no link-layer header): the header
//! fields the lab routes and rewrites by, and in-place TCP edits with correct checksums.
//!
//! Parsing for *reading* whole packets is etherparse's job; this module only finds offsets
//! and rewrites fields, which etherparse's owned headers would make a round trip through
//! re-serialisation.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

use crate::checksum;

/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// Why bytes are not a usable IP packet.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PacketError {
    /// Zero bytes.
    #[error("empty packet")]
    Empty,
    /// The version nibble is neither 4 nor 6.
    #[error("IP version {0} is neither 4 nor 6")]
    UnknownVersion(u8),
    /// Shorter than a header or length field says.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A header length field that cannot be right.
    #[error("bad {0} length")]
    BadLength(&'static str),
    /// IPv6 jumbograms (payload length 0) are not supported.
    #[error("IPv6 jumbogram")]
    Jumbogram,
}

/// IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// The IP-level facts of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpInfo {
    /// IPv4 or IPv6.
    pub version: IpVersion,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// The transport protocol (for IPv6, the next header after any extension headers).
    pub protocol: u8,
    /// Bytes of IP header, IPv6 extension headers included.
    pub header_len: usize,
    /// Bytes of the whole packet per its length field (trailing bytes beyond are ignored).
    pub total_len: usize,
    /// True for a fragment (IPv4 MF or offset, IPv6 fragment header); its transport header
    /// may be absent, so the lab's TCP transforms leave fragments alone.
    pub fragment: bool,
}

/// Reads the IP header of a raw packet.
pub fn parse_ip(packet: &[u8]) -> Result<IpInfo, PacketError> {
    let first = *packet.first().ok_or(PacketError::Empty)?;
    match first >> 4 {
        4 => parse_ipv4(packet),
        6 => parse_ipv6(packet),
        other => Err(PacketError::UnknownVersion(other)),
    }
}

fn parse_ipv4(p: &[u8]) -> Result<IpInfo, PacketError> {
    if p.len() < 20 {
        return Err(PacketError::Truncated("IPv4 header"));
    }
    let header_len = usize::from(p[0] & 0x0F) * 4;
    if header_len < 20 {
        return Err(PacketError::BadLength("IPv4 header"));
    }
    if p.len() < header_len {
        return Err(PacketError::Truncated("IPv4 options"));
    }
    let total_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if total_len < header_len {
        return Err(PacketError::BadLength("IPv4 total"));
    }
    if p.len() < total_len {
        return Err(PacketError::Truncated("IPv4 payload"));
    }
    let flags_fragment = u16::from_be_bytes([p[6], p[7]]);
    let more_fragments = flags_fragment & 0x2000 != 0;
    let offset = flags_fragment & 0x1FFF;
    Ok(IpInfo {
        version: IpVersion::V4,
        src: Ipv4Addr::new(p[12], p[13], p[14], p[15]).into(),
        dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]).into(),
        protocol: p[9],
        header_len,
        total_len,
        fragment: more_fragments || offset != 0,
    })
}

fn parse_ipv6(p: &[u8]) -> Result<IpInfo, PacketError> {
    if p.len() < 40 {
        return Err(PacketError::Truncated("IPv6 header"));
    }
    let payload_len = usize::from(u16::from_be_bytes([p[4], p[5]]));
    if payload_len == 0 && p[6] == 0 {
        return Err(PacketError::Jumbogram);
    }
    let total_len = 40 + payload_len;
    if p.len() < total_len {
        return Err(PacketError::Truncated("IPv6 payload"));
    }
    let src_octets: [u8; 16] = p[8..24]
        .try_into()
        .map_err(|_| PacketError::Truncated("IPv6 header"))?;
    let dst_octets: [u8; 16] = p[24..40]
        .try_into()
        .map_err(|_| PacketError::Truncated("IPv6 header"))?;
    let mut next = p[6];
    let mut offset = 40;
    let mut fragment = false;
    // RFC 8200 §4: walk the extension headers the lab may meet; a bound keeps a hostile chain
    // from costing more than a few steps.
    for _ in 0..16 {
        let header_bytes = match next {
            0 | 43 | 60 => {
                let len = *p
                    .get(offset + 1)
                    .ok_or(PacketError::Truncated("IPv6 extension"))?;
                (usize::from(len) + 1) * 8
            }
            44 => {
                let field = p
                    .get(offset + 2..offset + 4)
                    .ok_or(PacketError::Truncated("IPv6 fragment header"))?;
                let value = u16::from_be_bytes([field[0], field[1]]);
                // Offset in the top 13 bits, M flag in bit 0 (RFC 8200 §4.5).
                fragment |= value >> 3 != 0 || value & 1 != 0;
                8
            }
            51 => {
                let len = *p.get(offset + 1).ok_or(PacketError::Truncated("IPv6 AH"))?;
                (usize::from(len) + 2) * 4
            }
            _ => break,
        };
        let nh = *p
            .get(offset)
            .ok_or(PacketError::Truncated("IPv6 extension"))?;
        if offset + header_bytes > total_len {
            return Err(PacketError::Truncated("IPv6 extension"));
        }
        next = nh;
        offset += header_bytes;
    }
    Ok(IpInfo {
        version: IpVersion::V6,
        src: Ipv6Addr::from(src_octets).into(),
        dst: Ipv6Addr::from(dst_octets).into(),
        protocol: next,
        header_len: offset,
        total_len,
        fragment,
    })
}

/// TCP flag bits (byte 13 of the header).
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
}

/// Where the TCP header and payload of a packet are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpView {
    pub ip: IpInfo,
    /// Offset of the TCP header in the packet.
    pub tcp: usize,
    /// Bytes of TCP header, options included.
    pub tcp_header_len: usize,
}

/// A directional TCP flow (source to destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FlowKey {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

impl FlowKey {
    pub fn reversed(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

impl TcpView {
    /// Finds the TCP segment of an unfragmented TCP packet; `None` for anything else.
    pub fn parse(packet: &[u8]) -> Option<Self> {
        let ip = parse_ip(packet).ok()?;
        if ip.protocol != PROTO_TCP || ip.fragment {
            return None;
        }
        let tcp = ip.header_len;
        if ip.total_len < tcp + 20 {
            return None;
        }
        let tcp_header_len = usize::from(packet[tcp + 12] >> 4) * 4;
        if tcp_header_len < 20 || tcp + tcp_header_len > ip.total_len {
            return None;
        }
        Some(Self {
            ip,
            tcp,
            tcp_header_len,
        })
    }

    pub fn key(&self, p: &[u8]) -> FlowKey {
        FlowKey {
            src: self.ip.src,
            dst: self.ip.dst,
            src_port: self.read_u16(p, 0),
            dst_port: self.read_u16(p, 2),
        }
    }

    fn read_u16(&self, p: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([p[self.tcp + at], p[self.tcp + at + 1]])
    }

    fn read_u32(&self, p: &[u8], at: usize) -> u32 {
        let o = self.tcp + at;
        u32::from_be_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]])
    }

    pub fn seq(&self, p: &[u8]) -> u32 {
        self.read_u32(p, 4)
    }

    pub fn ack(&self, p: &[u8]) -> u32 {
        self.read_u32(p, 8)
    }

    pub fn flags(&self, p: &[u8]) -> u8 {
        p[self.tcp + 13]
    }

    pub fn has(&self, p: &[u8], flag: u8) -> bool {
        self.flags(p) & flag != 0
    }

    pub fn window(&self, p: &[u8]) -> u16 {
        self.read_u16(p, 14)
    }

    pub fn options<'p>(&self, p: &'p [u8]) -> &'p [u8] {
        &p[self.tcp + 20..self.tcp + self.tcp_header_len]
    }

    pub fn payload_range(&self) -> std::ops::Range<usize> {
        self.tcp + self.tcp_header_len..self.ip.total_len
    }

    pub fn payload<'p>(&self, p: &'p [u8]) -> &'p [u8] {
        &p[self.payload_range()]
    }

    pub fn payload_len(&self) -> usize {
        self.ip.total_len - self.tcp - self.tcp_header_len
    }

    /// The segment (TCP header and payload).
    pub fn segment<'p>(&self, p: &'p [u8]) -> &'p [u8] {
        &p[self.tcp..self.ip.total_len]
    }

    pub fn checksum_valid(&self, p: &[u8]) -> bool {
        checksum::verify_transport(self.ip.src, self.ip.dst, PROTO_TCP, self.segment(p))
    }

    /// Overwrites bytes at `at` (offset into the TCP header) and updates the TCP checksum
    /// incrementally.
    pub fn write_bytes(&self, p: &mut [u8], at: usize, new: &[u8]) {
        let start = self.tcp + at;
        let old: Vec<u8> = p[start..start + new.len()].to_vec();
        if old == new {
            return;
        }
        p[start..start + new.len()].copy_from_slice(new);
        let sum_at = self.tcp + 16;
        let current = u16::from_be_bytes([p[sum_at], p[sum_at + 1]]);
        let updated = checksum::update(current, at, &old, new);
        p[sum_at..sum_at + 2].copy_from_slice(&updated.to_be_bytes());
    }

    pub fn set_seq(&self, p: &mut [u8], seq: u32) {
        self.write_bytes(p, 4, &seq.to_be_bytes());
    }

    pub fn set_ack(&self, p: &mut [u8], ack: u32) {
        self.write_bytes(p, 8, &ack.to_be_bytes());
    }

    pub fn set_window(&self, p: &mut [u8], window: u16) {
        self.write_bytes(p, 14, &window.to_be_bytes());
    }

    /// Builds a new packet from this one's IP and TCP headers with the given sequence number,
    /// flags, options (already a multiple of 4 bytes, at most 40) and payload, fixing every
    /// length and checksum. `ip_id` replaces the IPv4 identification when given.
    pub fn rebuild(
        &self,
        p: &[u8],
        seq: u32,
        flags: u8,
        options: &[u8],
        payload: &[u8],
        ip_id: Option<u16>,
    ) -> Vec<u8> {
        debug_assert!(options.len().is_multiple_of(4) && options.len() <= 40);
        let tcp_header_len = 20 + options.len();
        let total = self.tcp + tcp_header_len + payload.len();
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&p[..self.tcp + 20]);
        out.extend_from_slice(options);
        out.extend_from_slice(payload);
        let t = self.tcp;
        out[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
        // Data offset in the high nibble; keep the reserved bits and NS (RFC 3540) as sent.
        out[t + 12] = ((tcp_header_len / 4) as u8) << 4 | (p[t + 12] & 0x0F);
        out[t + 13] = flags;
        out[t + 16..t + 18].fill(0);
        match self.ip.version {
            IpVersion::V4 => {
                out[2..4].copy_from_slice(&(total as u16).to_be_bytes());
                if let Some(id) = ip_id {
                    out[4..6].copy_from_slice(&id.to_be_bytes());
                }
                let ihl = self.ip.header_len;
                out[10..12].fill(0);
                let header_sum = checksum::checksum(&out[..ihl]);
                out[10..12].copy_from_slice(&header_sum.to_be_bytes());
            }
            IpVersion::V6 => {
                out[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
            }
        }
        let sum = checksum::transport_checksum(self.ip.src, self.ip.dst, PROTO_TCP, &out[t..]);
        out[t + 16..t + 18].copy_from_slice(&sum.to_be_bytes());
        out
    }

    pub fn ipv4_id(&self, p: &[u8]) -> Option<u16> {
        (self.ip.version == IpVersion::V4).then(|| u16::from_be_bytes([p[4], p[5]]))
    }
}

/// One TCP option as found in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcpOption {
    /// End of option list (kind 0) and everything after it.
    End { at: usize },
    /// No-operation (kind 1).
    Nop { at: usize },
    /// A kind-length-value option occupying `at..at + len`.
    Option { kind: u8, at: usize, len: usize },
    /// Bytes from `at` that do not form a valid option (length missing, below 2 or past the
    /// header).
    Malformed { at: usize },
}

/// Splits an option area into its options (RFC 9293 §3.1).
pub(crate) fn tcp_options(options: &[u8]) -> Vec<TcpOption> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            0 => {
                out.push(TcpOption::End { at });
                break;
            }
            1 => {
                out.push(TcpOption::Nop { at });
                at += 1;
            }
            kind => match options.get(at + 1) {
                Some(&len) if len >= 2 && at + usize::from(len) <= options.len() => {
                    let len = usize::from(len);
                    out.push(TcpOption::Option { kind, at, len });
                    at += len;
                }
                _ => {
                    out.push(TcpOption::Malformed { at });
                    break;
                }
            },
        }
    }
    out
}

/// Sequence-number unwrapping: maps 32-bit sequence numbers to a 64-bit space, choosing the
/// value nearest to the highest seen (RFC 9293 §3.4 comparisons are modulo 2^32).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SeqUnwrapper {
    highest: Option<u64>,
}

impl SeqUnwrapper {
    /// Unwraps without moving the reference point.
    pub fn peek(&self, seq: u32) -> u64 {
        match self.highest {
            // Start 2^32 up so sequence numbers before the first one seen stay positive.
            None => (1u64 << 32) + u64::from(seq),
            Some(highest) => {
                let delta = seq.wrapping_sub(highest as u32) as i32;
                highest.wrapping_add_signed(i64::from(delta))
            }
        }
    }

    /// Unwraps and raises the reference point to `value` if it is newer.
    pub fn unwrap(&mut self, seq: u32) -> u64 {
        let value = self.peek(seq);
        self.raise(value);
        value
    }

    pub fn raise(&mut self, value: u64) {
        if self.highest.is_none_or(|h| value > h) {
            self.highest = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use etherparse::PacketBuilder;

    use super::*;

    fn tcp_packet_v4(payload: &[u8]) -> Vec<u8> {
        let builder = PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .tcp(1000, 2000, 0xFFFF_FFF0, 5000)
            .ack(77)
            .options(&[etherparse::TcpOptionElement::MaximumSegmentSize(1460)])
            .expect("options fit");
        let mut out = Vec::new();
        builder.write(&mut out, payload).expect("build");
        out
    }

    #[test]
    fn parses_ipv4_tcp() {
        let p = tcp_packet_v4(b"hello");
        let v = TcpView::parse(&p).expect("tcp");
        assert_eq!(v.ip.version, IpVersion::V4);
        assert_eq!(v.ip.dst, IpAddr::from([10, 0, 0, 2]));
        assert_eq!(v.tcp, 20);
        assert_eq!(v.tcp_header_len, 24);
        assert_eq!(v.payload(&p), b"hello");
        assert_eq!(v.seq(&p), 0xFFFF_FFF0);
        assert_eq!(v.ack(&p), 77);
        assert!(v.checksum_valid(&p));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_ip(&[]), Err(PacketError::Empty));
        assert_eq!(parse_ip(&[0x50; 30]), Err(PacketError::UnknownVersion(5)));
        assert_eq!(
            parse_ip(&[0x45; 10]),
            Err(PacketError::Truncated("IPv4 header"))
        );
        let mut p = tcp_packet_v4(b"x");
        p[3] = 200; // total length beyond the buffer
        assert_eq!(parse_ip(&p), Err(PacketError::Truncated("IPv4 payload")));
        let mut p = tcp_packet_v4(b"x");
        p[0] = 0x44;
        assert_eq!(parse_ip(&p), Err(PacketError::BadLength("IPv4 header")));
        assert!(TcpView::parse(&[0x60; 39]).is_none());
    }

    #[test]
    fn parses_ipv6_with_extension_header() {
        // Build a TCP/IPv6 packet and splice in an 8-byte destination-options header.
        let builder = PacketBuilder::ipv6([0xfd; 16], [0xfe; 16], 64).tcp(1, 2, 3, 4);
        let mut p = Vec::new();
        builder.write(&mut p, b"abc").expect("build");
        let mut with_ext = p[..40].to_vec();
        with_ext[6] = 60;
        let payload_len = u16::from_be_bytes([p[4], p[5]]) + 8;
        with_ext[4..6].copy_from_slice(&payload_len.to_be_bytes());
        with_ext.extend_from_slice(&[PROTO_TCP, 0, 1, 4, 0, 0, 0, 0]);
        with_ext.extend_from_slice(&p[40..]);
        let v = TcpView::parse(&with_ext).expect("tcp after extension");
        assert_eq!(v.tcp, 48);
        assert_eq!(v.payload(&with_ext), b"abc");
        // The checksum does not cover extension headers.
        assert!(v.checksum_valid(&with_ext));
    }

    #[test]
    fn field_rewrites_keep_checksum_valid() {
        let mut p = tcp_packet_v4(b"payload bytes");
        let v = TcpView::parse(&p).expect("tcp");
        v.set_seq(&mut p, 12345);
        v.set_ack(&mut p, 0xDEAD_BEEF);
        v.set_window(&mut p, 1);
        assert!(v.checksum_valid(&p));
        assert_eq!(v.seq(&p), 12345);
        assert_eq!(v.window(&p), 1);
    }

    #[test]
    fn rebuild_fixes_lengths_and_checksums() {
        let p = tcp_packet_v4(b"0123456789");
        let v = TcpView::parse(&p).expect("tcp");
        let q = v.rebuild(&p, 99, tcp_flags::ACK | tcp_flags::FIN, &[], b"45", Some(7));
        let w = TcpView::parse(&q).expect("tcp");
        assert_eq!(w.ip.total_len, 20 + 20 + 2);
        assert_eq!(w.payload(&q), b"45");
        assert_eq!(w.seq(&q), 99);
        assert_eq!(w.ipv4_id(&q), Some(7));
        assert!(w.checksum_valid(&q));
        assert_eq!(checksum::checksum(&q[..20]), 0);
    }

    #[test]
    fn options_walk() {
        let opts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 2, 4, 5, 0xb4, 0, 0];
        let parsed = tcp_options(&opts);
        assert_eq!(
            parsed,
            vec![
                TcpOption::Nop { at: 0 },
                TcpOption::Nop { at: 1 },
                TcpOption::Option {
                    kind: 8,
                    at: 2,
                    len: 10
                },
                TcpOption::Option {
                    kind: 2,
                    at: 12,
                    len: 4
                },
                TcpOption::End { at: 16 },
            ]
        );
        assert_eq!(
            tcp_options(&[30, 1, 0, 0]),
            vec![TcpOption::Malformed { at: 0 }]
        );
        assert_eq!(
            tcp_options(&[30, 9, 0, 0]),
            vec![TcpOption::Malformed { at: 0 }]
        );
    }

    #[test]
    fn unwrapping_across_the_wrap() {
        let mut u = SeqUnwrapper::default();
        let a = u.unwrap(0xFFFF_FF00);
        let b = u.unwrap(0x0000_0100);
        assert_eq!(b - a, 0x200);
        assert_eq!(u.peek(0xFFFF_FE00), a - 0x100);
    }
}
