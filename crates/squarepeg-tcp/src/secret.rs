//! Keyed hashing for initial sequence numbers (RFC 6528), per-connection timestamp offsets
//! (RFC 7323 §5.4) and SYN cookies (RFC 4987 §3.6).
//!
//! The PRF is SHA-256 over the secret key, a domain label and the inputs, truncated to 32 bits;
//! RFC 6528 §3 asks for a cryptographic hash keyed with a secret, and SHA-256 is well kept.

use std::net::SocketAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};

#[derive(Clone)]
pub(crate) struct Secret {
    key: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn put_ip(h: &mut Sha256, ip: &std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(a) => h.update(a.octets()),
        std::net::IpAddr::V6(a) => h.update(a.octets()),
    }
}

fn put_addr(h: &mut Sha256, a: &SocketAddr) {
    put_ip(h, &a.ip());
    h.update(a.port().to_be_bytes());
}

impl Secret {
    pub fn new(key: [u8; 32]) -> Self {
        Secret { key }
    }

    fn hash(&self, label: &[u8], local: &SocketAddr, remote: &SocketAddr, extra: &[u32]) -> u32 {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(label);
        put_addr(&mut h, local);
        put_addr(&mut h, remote);
        for x in extra {
            h.update(x.to_be_bytes());
        }
        let d = h.finalize();
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
    }

    /// ISN = M + F(localip, localport, remoteip, remoteport, secretkey), where M is a timer
    /// ticking every 4 microseconds (RFC 6528 §3), here derived from the caller's time since
    /// the endpoint's epoch.
    pub fn isn(&self, local: &SocketAddr, remote: &SocketAddr, since_epoch: Duration) -> u32 {
        let m = (since_epoch.as_micros() / 4) as u32;
        m.wrapping_add(self.hash(b"isn", local, remote, &[]))
    }

    /// Random-looking per-connection offset of the timestamp clock (RFC 7323 §5.4).
    pub fn ts_offset(&self, local: &SocketAddr, remote: &SocketAddr) -> u32 {
        self.hash(b"tsoff", local, remote, &[])
    }

    /// IPv4 identification start / IPv6 flow label for a connection.
    pub fn ip_id(&self, local: &SocketAddr, remote: &SocketAddr) -> u32 {
        self.hash(b"ipid", local, remote, &[])
    }

    /// TCP Fast Open cookie (RFC 7413 §4.1.2): a MAC of the client's IP address (and ours, so
    /// that a cookie from one of our addresses is no good at another) and of the key period
    /// `epoch` (§4.1.2: the server changes its key from time to time), 8 bytes of
    /// SHA-256(key ‖ label ‖ epoch ‖ addresses). Ports are left out: the cookie belongs to
    /// the host (§4.1.2), whatever port it connects from.
    pub fn fast_open_cookie(
        &self,
        epoch: u64,
        client: &std::net::IpAddr,
        server: &std::net::IpAddr,
    ) -> [u8; 8] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(b"tfo");
        h.update(epoch.to_be_bytes());
        for ip in [client, server] {
            put_ip(&mut h, ip);
        }
        let d = h.finalize();
        let mut out = [0u8; 8];
        out.copy_from_slice(&d[..8]);
        out
    }

    /// MAC for SYN cookies.
    pub fn cookie_mac(
        &self,
        local: &SocketAddr,
        remote: &SocketAddr,
        counter: u32,
        client_isn: u32,
        mss_index: u32,
    ) -> u32 {
        self.hash(b"cookie", local, remote, &[counter, client_isn, mss_index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isn_is_keyed_per_tuple_and_ticks_every_4us() {
        let s = Secret::new([9; 32]);
        let l: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let r: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let r2: SocketAddr = "10.0.0.2:81".parse().unwrap();
        let t = Duration::from_secs(5);
        let a = s.isn(&l, &r, t);
        assert_ne!(a, s.isn(&l, &r2, t));
        assert_ne!(a, Secret::new([8; 32]).isn(&l, &r, t));
        // M advances by one every 4 microseconds (RFC 6528 §3).
        assert_eq!(
            s.isn(&l, &r, t + Duration::from_micros(4000)),
            a.wrapping_add(1000)
        );
    }
}
