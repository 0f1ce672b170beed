//! SYN cookies (RFC 4987 §3.6).
//!
//! Layout of the cookie (our ISN), as RFC 4987 §3.6 describes: the top 5 bits are a 64-second
//! counter `t mod 32`, the next 3 bits index the MSS table, and the low 24 bits are a keyed MAC
//! over the 4-tuple, `t`, the client's ISN and the MSS index. As Linux does, the peer's window
//! scale and SACK-permitted are carried in the low 6 bits of our timestamp value, which the
//! client echoes in TSecr of its ACK.

use std::net::SocketAddr;
use std::time::Duration;

use crate::secret::Secret;

/// MSS values a cookie can carry (3 bits).
pub(crate) const COOKIE_MSS: [u16; 8] = [536, 1220, 1300, 1360, 1400, 1440, 1460, 8960];

/// Cookies older than this many counter periods (64 s each) are refused.
const MAX_AGE_PERIODS: u32 = 2;

const TS_OPTION_BITS: u32 = 6;
const TS_WSCALE_MASK: u32 = 0x0f;
const TS_SACK_BIT: u32 = 0x10;

pub(crate) fn counter(since_epoch: Duration) -> u32 {
    (since_epoch.as_secs() / 64) as u32
}

/// Largest table entry not above the peer's MSS (RFC 4987 §3.6: the encoding may lower the MSS).
pub(crate) fn mss_index(peer_mss: u16) -> u32 {
    COOKIE_MSS.iter().rposition(|&m| m <= peer_mss).unwrap_or(0) as u32
}

pub(crate) fn make(
    secret: &Secret,
    local: &SocketAddr,
    remote: &SocketAddr,
    counter: u32,
    client_isn: u32,
    peer_mss: u16,
) -> u32 {
    let idx = mss_index(peer_mss);
    let mac = secret.cookie_mac(local, remote, counter, client_isn, idx) & 0x00ff_ffff;
    ((counter & 0x1f) << 27) | (idx << 24) | mac
}

/// Validates a cookie returned in an ACK (`cookie = SEG.ACK - 1`, `client_isn = SEG.SEQ - 1`);
/// returns the MSS it encodes.
pub(crate) fn check(
    secret: &Secret,
    local: &SocketAddr,
    remote: &SocketAddr,
    counter_now: u32,
    client_isn: u32,
    cookie: u32,
) -> Option<u16> {
    let t5 = cookie >> 27;
    let idx = (cookie >> 24) & 0x7;
    (0..=MAX_AGE_PERIODS).find_map(|age| {
        let t = counter_now.checked_sub(age)?;
        if t & 0x1f != t5 {
            return None;
        }
        let mac = secret.cookie_mac(local, remote, t, client_isn, idx) & 0x00ff_ffff;
        (mac == cookie & 0x00ff_ffff).then(|| COOKIE_MSS[idx as usize])
    })
}

/// Our TSval for a cookie SYN-ACK: the clock with the peer's options in the low bits, never
/// ahead of the clock.
pub(crate) fn encode_ts(ts_now: u32, peer_wscale: Option<u8>, peer_sack: bool) -> u32 {
    let mut bits = peer_wscale.map_or(TS_WSCALE_MASK, |w| w.min(14) as u32);
    if peer_sack {
        bits |= TS_SACK_BIT;
    }
    let mut ts = (ts_now & !((1 << TS_OPTION_BITS) - 1)) | bits;
    if ts.wrapping_sub(ts_now) as i32 > 0 {
        ts = ts.wrapping_sub(1 << TS_OPTION_BITS);
    }
    ts
}

/// Peer's window scale and SACK-permitted from the echoed TSecr.
pub(crate) fn decode_ts(tsecr: u32) -> (Option<u8>, bool) {
    let ws = tsecr & TS_WSCALE_MASK;
    let wscale = if ws == TS_WSCALE_MASK || ws > 14 {
        None
    } else {
        Some(ws as u8)
    };
    (wscale, tsecr & TS_SACK_BIT != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_roundtrip_and_expiry() {
        let s = Secret::new([7; 32]);
        let l: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let r: SocketAddr = "10.0.0.2:5555".parse().unwrap();
        let c = make(&s, &l, &r, 1000, 42, 1460);
        assert_eq!(check(&s, &l, &r, 1000, 42, c), Some(1460));
        assert_eq!(check(&s, &l, &r, 1002, 42, c), Some(1460));
        assert_eq!(check(&s, &l, &r, 1003, 42, c), None);
        assert_eq!(check(&s, &l, &r, 1000, 43, c), None);
        assert_eq!(check(&s, &r, &l, 1000, 42, c), None);
        assert_eq!(check(&s, &l, &r, 1000, 42, c ^ 1), None);
        assert_eq!(mss_index(1459), 5);
        assert_eq!(mss_index(100), 0);
    }

    #[test]
    fn ts_option_bits() {
        let ts = encode_ts(0x1234_5678, Some(7), true);
        assert!(ts.wrapping_sub(0x1234_5678) as i32 <= 0);
        assert_eq!(decode_ts(ts), (Some(7), true));
        assert_eq!(decode_ts(encode_ts(99, None, false)), (None, false));
    }
}
