//! The Internet checksum (RFC 1071): full computation over a buffer and a pseudo-header, and
//! incremental update for rewritten bytes at any alignment (RFC 1624 eq. 3).

use std::net::IpAddr;

/// Adds `data` as big-endian 16-bit words to the running (unfolded) sum; an odd final byte is
/// padded with zero (RFC 1071 §4.1). `data` must start at an even offset of the checksummed
/// region.
pub fn add_bytes(mut sum: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for word in &mut chunks {
        sum += u64::from(u16::from_be_bytes([word[0], word[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a running sum to 16 bits with end-around carry.
pub fn fold(mut sum: u64) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// The checksum of `data` alone (as for the IPv4 header, with its checksum field zeroed).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add_bytes(0, data))
}

/// The pseudo-header sum for TCP/UDP (RFC 9293 §3.1; RFC 8200 §8.1 for IPv6).
pub fn pseudo_header_sum(src: IpAddr, dst: IpAddr, protocol: u8, length: u32) -> u64 {
    let mut sum = 0;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            sum = add_bytes(sum, &s.octets());
            sum = add_bytes(sum, &d.octets());
        }
        (s, d) => {
            sum = add_bytes(sum, &to_v6_octets(s));
            sum = add_bytes(sum, &to_v6_octets(d));
        }
    }
    sum + u64::from(protocol) + u64::from(length >> 16) + u64::from(length & 0xFFFF)
}

fn to_v6_octets(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The TCP/UDP checksum of `segment` (header and payload, with its checksum field zeroed).
pub fn transport_checksum(src: IpAddr, dst: IpAddr, protocol: u8, segment: &[u8]) -> u16 {
    let length = u32::try_from(segment.len()).unwrap_or(u32::MAX);
    !fold(add_bytes(
        pseudo_header_sum(src, dst, protocol, length),
        segment,
    ))
}

/// True if `segment` (checksum field included) sums to all ones with its pseudo-header, the
/// receiver's check (RFC 1071 §2).
pub fn verify_transport(src: IpAddr, dst: IpAddr, protocol: u8, segment: &[u8]) -> bool {
    let length = u32::try_from(segment.len()).unwrap_or(u32::MAX);
    fold(add_bytes(
        pseudo_header_sum(src, dst, protocol, length),
        segment,
    )) == 0xFFFF
}

/// The sum of `bytes` as they sit at byte `offset` of the checksummed region (an odd offset
/// puts the first byte in the low half of its word).
fn sum_at(offset: usize, bytes: &[u8]) -> u64 {
    if offset % 2 == 1 {
        // A leading zero byte realigns the words; zero adds nothing.
        let Some((first, rest)) = bytes.split_first() else {
            return 0;
        };
        add_bytes(u64::from(*first), rest)
    } else {
        add_bytes(0, bytes)
    }
}

/// The checksum after the bytes at `offset` of the covered region change from `old` to `new`
/// (same length): RFC 1624 eq. 3, `HC' = ~(~HC + ~m + m')`, generalised to byte strings at
/// any alignment. The result is normalised to the form a full computation gives (never 0xFFFF
/// for a region with a non-zero pseudo-header).
pub fn update(checksum: u16, offset: usize, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let old_sum = fold(sum_at(offset, old));
    let new_sum = fold(sum_at(offset, new));
    let sum = u64::from(!checksum) + u64::from(!old_sum) + u64::from(new_sum);
    let updated = !fold(sum);
    // -0 and +0 are the same in ones' complement; a full computation never yields 0xFFFF.
    if updated == 0xFFFF { 0 } else { updated }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add_bytes(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn ipv4_header_checksum_known_value() {
        // A textbook IPv4 header whose checksum is 0xb861.
        let mut header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&header), 0xb861);
        header[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(fold(add_bytes(0, &header)), 0xFFFF);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(add_bytes(0, &[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    fn full(src: IpAddr, dst: IpAddr, segment: &[u8], checksum_at: usize) -> u16 {
        let mut copy = segment.to_vec();
        copy[checksum_at..checksum_at + 2].fill(0);
        transport_checksum(src, dst, 6, &copy)
    }

    proptest! {
        #[test]
        fn incremental_update_matches_full(
            mut segment in proptest::collection::vec(any::<u8>(), 20..200),
            start in 0usize..200,
            new_bytes in proptest::collection::vec(any::<u8>(), 1..12),
            v6 in any::<bool>(),
        ) {
            let (src, dst): (IpAddr, IpAddr) = if v6 {
                (Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(), Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into())
            } else {
                (Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::new(10, 0, 0, 2).into())
            };
            // TCP's checksum lives at bytes 16..18 of the segment; rewrite elsewhere.
            let before = full(src, dst, &segment, 16);
            segment[16..18].copy_from_slice(&before.to_be_bytes());
            prop_assert!(verify_transport(src, dst, 6, &segment));
            let start = 18 + start % (segment.len() - 18);
            let end = (start + new_bytes.len()).min(segment.len());
            let old = segment[start..end].to_vec();
            segment[start..end].copy_from_slice(&new_bytes[..end - start]);
            let updated = update(before, start, &old, &segment[start..end]);
            prop_assert_eq!(updated, full(src, dst, &segment, 16));
            segment[16..18].copy_from_slice(&updated.to_be_bytes());
            prop_assert!(verify_transport(src, dst, 6, &segment));
        }
    }
}
