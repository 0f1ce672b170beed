//! The driver's side of TUN offloads (IFF_VNET_HDR): every read and write starts with a
//! virtio-net header (`include/uapi/linux/virtio_net.h`).
//!
//! Reads: the kernel hands over TCP super-packets of up to 64 KB (its TSO output, `gso_type`
//! TCPV4/TCPV6, `gso_size` = its MSS) with a partial checksum (`NEEDS_CSUM`: the field holds
//! the pseudo-header sum only). [`unpack_read`] splits them at `gso_size` with tun-rs's
//! `gso_split`, which rebuilds each segment's IP header (length, IPv4 ID and header checksum)
//! and TCP header (sequence number; FIN and PSH on the last segment only, CWR on the first)
//! and computes each segment's full TCP checksum. A single packet marked `NEEDS_CSUM` gets its
//! checksum completed; one marked `DATA_VALID` was verified by the kernel. Segments of either
//! kind carry correct checksums that nobody needs to verify again (the TCP core is told so:
//! `EndpointConfig::verify_checksums` off); only packets with neither flag (the kernel did not
//! vouch for them, e.g. forwarded ones) are verified by the driver before the core sees them.
//! So the core, the capture and the impairment shim all see ordinary MSS-sized packets.
//!
//! Writes: tun-rs's GRO (`send_multiple` with a `GROTable`, after wireguard-go) coalesces
//! consecutive segments of a flow in one batch into one packet with a `NEEDS_CSUM` header and
//! a GSO type, which the kernel receives in one pass of its TCP receive path, without
//! verifying or computing a checksum.

use tun_rs::{
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6, VIRTIO_NET_HDR_LEN, VirtioNetHdr,
};

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum field holds the pseudo-header sum; the rest is
/// the receiver's job (CHECKSUM_PARTIAL).
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the kernel verified the checksum (CHECKSUM_UNNECESSARY).
const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE`.
const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_ECN`: a flag on a TCP GSO type (CWR set on the first segment).
const GSO_ECN: u8 = 0x80;

/// Largest IP packet on a TUN device.
pub(crate) const MAX_PACKET: usize = 65535;
/// Most segments one super-packet may split into. Linux never sends segments below 48 bytes
/// of payload (`tcp_min_snd_mss`), so 64 KB make at most 1366; more means a broken header.
pub(crate) const MAX_SEGMENTS: usize = 2048;
/// Longest IP + TCP header of a super-packet the driver splits (IPv6 extension headers
/// included); longer ones are dropped as malformed.
const MAX_HEADERS: usize = 192;
/// Bytes of arena one read may need: the raw read (header and packet) followed by its split.
pub(crate) const READ_RESERVE: usize =
    VIRTIO_NET_HDR_LEN + MAX_PACKET + 1 + 2 * MAX_PACKET + MAX_SEGMENTS * MAX_HEADERS;

/// One packet ready for the core: `len` bytes at `start` of the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxPacket {
    pub(crate) start: usize,
    pub(crate) len: usize,
    /// The checksums are known good (computed by the split or the driver, or verified by the
    /// kernel); false: nobody checked them yet.
    pub(crate) checked: bool,
}

/// What one read held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unpacked {
    /// One packet, in place.
    Single,
    /// A super-packet split into this many segments.
    Split(usize),
}

/// Why a read was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

/// Unpacks one read with a virtio-net header: `region[..n]` holds what `read` returned (header
/// and packet); segments of a super-packet are written after it, in `region[n..]`. Pushes the
/// packets (offsets relative to the arena, of which `region` starts at `base`) and returns the
/// bytes of `region` used.
pub(crate) fn unpack_read(
    region: &mut [u8],
    n: usize,
    base: usize,
    out: &mut Vec<RxPacket>,
    sizes: &mut [usize],
) -> Result<(usize, Unpacked), Malformed> {
    let bad = |why: &str| Err(Malformed(why.to_string()));
    if n <= VIRTIO_NET_HDR_LEN || n > region.len() {
        return bad("read shorter than the virtio-net header");
    }
    let mut hdr = VirtioNetHdr::decode(&region[..VIRTIO_NET_HDR_LEN])
        .map_err(|e| Malformed(e.to_string()))?;
    let plen = n - VIRTIO_NET_HDR_LEN;
    let (head, tail) = region.split_at_mut(n);
    let packet = &mut head[VIRTIO_NET_HDR_LEN..];
    let csum_start = usize::from(hdr.csum_start);
    let csum_at = csum_start + usize::from(hdr.csum_offset);
    if hdr.gso_type == GSO_NONE {
        let checked = if hdr.flags & F_NEEDS_CSUM != 0 {
            // CHECKSUM_PARTIAL: complete the sum from csum_start to the end (RFC 1071), as
            // a NIC would.
            if csum_start < 20 || csum_at + 2 > plen {
                return bad("checksum offsets outside the packet");
            }
            complete_partial_checksum(packet, csum_start, csum_at);
            true
        } else {
            hdr.flags & F_DATA_VALID != 0
        };
        out.push(RxPacket {
            start: base + VIRTIO_NET_HDR_LEN,
            len: plen,
            checked,
        });
        return Ok((n, Unpacked::Single));
    }
    let is_v6 = match packet[0] >> 4 {
        4 => false,
        6 => true,
        _ => return bad("super-packet is neither IPv4 nor IPv6"),
    };
    let expected = if is_v6 {
        VIRTIO_NET_HDR_GSO_TCPV6
    } else {
        VIRTIO_NET_HDR_GSO_TCPV4
    };
    if hdr.gso_type & !GSO_ECN != expected {
        // UDP segmentation offload (the stack has no UDP) or a type that does not match.
        return bad("super-packet is not TCP of its IP version");
    }
    // The kernel's hdr_len may cover the whole first segment on a forwarding path; derive it
    // from the TCP header as wireguard-go does.
    if csum_start < if is_v6 { 40 } else { 20 } || csum_start + 20 > plen {
        return bad("TCP header outside the super-packet");
    }
    let tcp_header = usize::from(packet[csum_start + 12] >> 4) * 4;
    let hdr_len = csum_start + tcp_header;
    if tcp_header < 20 || hdr_len > plen || hdr_len > MAX_HEADERS {
        return bad("bad TCP header length in a super-packet");
    }
    hdr.hdr_len = hdr_len as u16;
    let gso_size = usize::from(hdr.gso_size);
    if gso_size == 0 {
        return bad("super-packet with gso_size 0");
    }
    let payload = plen - hdr_len;
    let count = payload.div_ceil(gso_size);
    if count > MAX_SEGMENTS || count > sizes.len() {
        return bad("super-packet of too many segments");
    }
    let stride = hdr_len + gso_size;
    if count * stride > tail.len() {
        return bad("super-packet larger than the split buffer");
    }
    let mut chunks: Vec<&mut [u8]> = tail[..count * stride].chunks_mut(stride).collect();
    let made = tun_rs::gso_split(packet, hdr, &mut chunks, &mut sizes[..count], 0, is_v6)
        .map_err(|e| Malformed(e.to_string()))?;
    for (i, &len) in sizes[..made].iter().enumerate() {
        out.push(RxPacket {
            start: base + n + i * stride,
            len,
            checked: true,
        });
    }
    Ok((n + count * stride, Unpacked::Split(made)))
}

/// Completes a CHECKSUM_PARTIAL packet: the field at `csum_at` holds the pseudo-header sum;
/// the checksum covers everything from `csum_start` with that sum folded in (RFC 1071).
fn complete_partial_checksum(packet: &mut [u8], csum_start: usize, csum_at: usize) {
    let pseudo = u16::from_be_bytes([packet[csum_at], packet[csum_at + 1]]);
    packet[csum_at..csum_at + 2].fill(0);
    let folded = tun_rs::checksum(&packet[csum_start..], u64::from(pseudo));
    packet[csum_at..csum_at + 2].copy_from_slice(&(!folded).to_be_bytes());
}

/// Marks a transmit buffer's header room before GRO: GRO writes a header into every buffer it
/// sends and leaves those it merged into another untouched, so the mark tells them apart.
pub(crate) fn mark_unsent(buf: &mut [u8]) {
    buf[..VIRTIO_NET_HDR_LEN].fill(0xff);
}

/// What GRO did with one transmit buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Merged into an earlier buffer of its flow.
    Merged,
    /// Written as it was.
    Plain,
    /// Written as a super-packet of this many segments.
    Coalesced(u64),
}

/// Reads what GRO did with `buf` (header room first).
pub(crate) fn sent_as(buf: &[u8]) -> Sent {
    if buf[..VIRTIO_NET_HDR_LEN].iter().all(|&b| b == 0xff) {
        return Sent::Merged;
    }
    let Ok(hdr) = VirtioNetHdr::decode(&buf[..VIRTIO_NET_HDR_LEN]) else {
        return Sent::Plain;
    };
    if hdr.gso_type == GSO_NONE || hdr.gso_size == 0 {
        return Sent::Plain;
    }
    let payload = (buf.len() - VIRTIO_NET_HDR_LEN).saturating_sub(usize::from(hdr.hdr_len));
    Sent::Coalesced(payload.div_ceil(usize::from(hdr.gso_size)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use squarepeg_tcp::wire::parse_packet;

    /// Ones-complement sum of big-endian words (RFC 1071), unfolded.
    fn sum(mut acc: u32, data: &[u8]) -> u32 {
        for c in data.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        acc
    }
    fn fold(mut acc: u32) -> u16 {
        while acc >> 16 != 0 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    /// An IPv4 TCP super-packet as the kernel's TSO hands it over: one header, `payload`
    /// bytes, the IP length of the whole, the pseudo-header sum in the checksum field, FIN and
    /// PSH set; timestamps option (32-byte TCP header).
    fn super_packet_v4(payload: usize, gso_size: u16) -> Vec<u8> {
        let mut p = vec![0u8; VIRTIO_NET_HDR_LEN];
        let hdr = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 52,
            gso_size,
            csum_start: 20,
            csum_offset: 16,
        };
        hdr.encode(&mut p).unwrap();
        let total = 52 + payload;
        let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip.extend_from_slice(&[10, 77, 0, 1, 10, 77, 0, 2]);
        let c = !fold(sum(0, &ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        p.extend_from_slice(&ip);
        let mut tcp = vec![0u8; 32];
        tcp[0..2].copy_from_slice(&5001u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&40000u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&1_000_000u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&7u32.to_be_bytes());
        tcp[12] = 8 << 4;
        tcp[13] = 0x19; // FIN PSH ACK
        tcp[14..16].copy_from_slice(&512u16.to_be_bytes());
        tcp[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]);
        // Pseudo-header sum (not complemented), as CHECKSUM_PARTIAL leaves it.
        let mut pseudo = sum(0, &[10, 77, 0, 1, 10, 77, 0, 2]);
        pseudo += 6 + (32 + payload) as u32;
        tcp[16..18].copy_from_slice(&fold(pseudo).to_be_bytes());
        p.extend_from_slice(&tcp);
        p.extend((0..payload).map(|i| (i * 7 + 3) as u8));
        p
    }

    #[test]
    fn super_packets_split_into_checksummed_segments() {
        let raw = super_packet_v4(3000, 1400);
        let mut region = vec![0u8; READ_RESERVE];
        region[..raw.len()].copy_from_slice(&raw);
        let mut out = Vec::new();
        let mut sizes = vec![0; MAX_SEGMENTS];
        let (used, what) = unpack_read(&mut region, raw.len(), 100, &mut out, &mut sizes).unwrap();
        assert_eq!(what, Unpacked::Split(3));
        assert!(used > raw.len());
        let lens: Vec<usize> = out.iter().map(|p| p.len).collect();
        assert_eq!(lens, [52 + 1400, 52 + 1400, 52 + 200]);
        let mut payload = Vec::new();
        for (i, p) in out.iter().enumerate() {
            assert!(p.checked);
            let seg = &region[p.start - 100..p.start - 100 + p.len];
            let parsed = parse_packet(seg, true).expect("valid IP and TCP checksums");
            assert_eq!(parsed.seq, 1_000_000 + 1400 * i as u32);
            let flags = seg[20 + 13];
            // FIN and PSH only on the last segment.
            assert_eq!(flags & 0x09 != 0, i == 2, "segment {i} flags {flags:#x}");
            payload.extend_from_slice(&seg[52..]);
        }
        assert_eq!(payload, raw[VIRTIO_NET_HDR_LEN + 52..]);
    }

    #[test]
    fn partial_checksums_of_single_packets_are_completed() {
        let mut raw = super_packet_v4(300, 1400);
        let mut hdr = VirtioNetHdr::decode(&raw).unwrap();
        hdr.gso_type = GSO_NONE;
        hdr.gso_size = 0;
        hdr.encode(&mut raw).unwrap();
        assert!(parse_packet(&raw[VIRTIO_NET_HDR_LEN..], true).is_err());
        let mut region = vec![0u8; READ_RESERVE];
        region[..raw.len()].copy_from_slice(&raw);
        let mut out = Vec::new();
        let mut sizes = vec![0; MAX_SEGMENTS];
        let (used, what) = unpack_read(&mut region, raw.len(), 0, &mut out, &mut sizes).unwrap();
        assert_eq!((used, what), (raw.len(), Unpacked::Single));
        let p = out[0];
        assert!(p.checked);
        parse_packet(&region[p.start..p.start + p.len], true).expect("completed checksum");

        // Neither NEEDS_CSUM nor DATA_VALID: passed on unchecked.
        hdr.flags = 0;
        hdr.encode(&mut region).unwrap();
        out.clear();
        unpack_read(&mut region, raw.len(), 0, &mut out, &mut sizes).unwrap();
        assert!(!out[0].checked);
    }

    #[test]
    fn malformed_headers_are_refused_not_panicked_on() {
        let raw = super_packet_v4(3000, 1400);
        let mut sizes = vec![0; MAX_SEGMENTS];
        type Edit = fn(&mut VirtioNetHdr);
        let cases: [(&str, Edit); 5] = [
            ("gso_size 0", |h| h.gso_size = 0),
            ("tiny gso_size", |h| h.gso_size = 1),
            ("csum_start past the end", |h| h.csum_start = 60000),
            ("wrong gso type", |h| h.gso_type = VIRTIO_NET_HDR_GSO_TCPV6),
            ("partial csum out of range", |h| {
                h.gso_type = GSO_NONE;
                h.csum_offset = 60000;
            }),
        ];
        for (what, edit) in cases {
            let mut region = vec![0u8; READ_RESERVE];
            region[..raw.len()].copy_from_slice(&raw);
            let mut hdr = VirtioNetHdr::decode(&region).unwrap();
            edit(&mut hdr);
            hdr.encode(&mut region).unwrap();
            let mut out = Vec::new();
            assert!(
                unpack_read(&mut region, raw.len(), 0, &mut out, &mut sizes).is_err(),
                "{what}"
            );
            assert!(out.is_empty(), "{what}");
        }
        let mut region = vec![0u8; 64];
        assert!(unpack_read(&mut region, 5, 0, &mut Vec::new(), &mut sizes).is_err());
    }

    #[test]
    fn gro_outcomes_are_read_from_the_header_room() {
        let mut buf = vec![0u8; VIRTIO_NET_HDR_LEN + 52 + 2800];
        mark_unsent(&mut buf);
        assert_eq!(sent_as(&buf), Sent::Merged);
        VirtioNetHdr::default().encode(&mut buf).unwrap();
        assert_eq!(sent_as(&buf), Sent::Plain);
        let hdr = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1400,
            csum_start: 20,
            csum_offset: 16,
        };
        hdr.encode(&mut buf).unwrap();
        assert_eq!(sent_as(&buf), Sent::Coalesced(2));
    }
}
