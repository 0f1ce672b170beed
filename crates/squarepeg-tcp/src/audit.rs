//! Wire invariants of TCP conversations, checked on captures.
//!
//! Hollywood §4.5 and §5.3: what keeps inconsistent retransmissions deployable is that on the
//! wire they look exactly like ordinary retransmissions. [`WireAudit`] is fed the packets of
//! one or more conversations (as captured at one point: a simulator tap, a pcap) and checks,
//! per direction:
//!
//! - **no sequence holes**: a segment never starts beyond the highest sequence number sent
//!   before it (new data always continues the stream);
//! - **retransmissions keep the original layout**: a segment that starts below the highest
//!   sequence number sent lies within one earlier transmission (never across two, never
//!   extending past what was sent) and starts at a boundary of it or at a point the receiver
//!   acknowledged or SACKed; one that ends early (other than at such a point) is counted as
//!   *shortened* — the same length as the original range unless the receiver already has
//!   part of it;
//! - **acknowledgments are never ahead of the data**: an ACK number never exceeds the highest
//!   sequence number the other side has sent (SYN and FIN included);
//! - the packets parse as TCP (with checksums, if asked).
//!
//! A capture taken behind a re-segmenting middlebox sees transmissions it split or merged;
//! audit the sender's side of such a path.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use crate::seq::{SndPos, SndSeq};
use crate::wire::parse_packet;

/// Counters of an audit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditStats {
    pub packets: u64,
    pub data_segments: u64,
    pub retransmissions: u64,
    /// Retransmissions covering exactly an earlier transmission's range.
    pub exact_retransmissions: u64,
    /// Retransmissions ending inside an earlier transmission, not at a point the receiver
    /// acknowledged or SACKed.
    pub shortened_retransmissions: u64,
    /// Retransmissions whose bytes differ from the first transmission of the range
    /// (inconsistent retransmissions, Hollywood §4.2).
    pub inconsistent_retransmissions: u64,
    pub acks: u64,
}

#[derive(Debug, Default)]
struct Flow {
    /// Wire ISN, from the SYN.
    isn: Option<u32>,
    /// Highest relative sequence number sent + 1 (0 = ISN).
    high: u64,
    /// First transmissions: start -> end (relative), and their bytes.
    originals: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Points the receiver acknowledged or SACKed (relative).
    acked: BTreeSet<u64>,
}

impl Flow {
    /// Unwraps a wire sequence number near `high` (in the sending side's space).
    fn rel(&self, wire: u32) -> Option<u64> {
        let isn = SndSeq::new(self.isn?);
        let pos = SndSeq::new(wire).unwrap(isn, SndPos::new(self.high));
        (!pos.is_negative()).then(|| pos.get())
    }
}

/// Checks the wire invariants of the conversations fed to it (module docs).
#[derive(Debug, Default)]
pub struct WireAudit {
    flows: HashMap<(SocketAddr, SocketAddr), Flow>,
    verify_checksums: bool,
    stats: AuditStats,
    violations: Vec<String>,
}

/// Violations kept in full (more are counted).
const MAX_REPORTED: usize = 20;

impl WireAudit {
    /// An audit; `verify_checksums` makes a bad checksum a violation.
    pub fn new(verify_checksums: bool) -> Self {
        WireAudit {
            verify_checksums,
            ..Default::default()
        }
    }

    pub fn stats(&self) -> AuditStats {
        self.stats
    }

    /// What was found wrong (the first few, described).
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// `Ok` with the counters if nothing was wrong.
    pub fn result(&self) -> Result<AuditStats, String> {
        if self.violations.is_empty() {
            Ok(self.stats)
        } else {
            Err(self.violations.join("\n"))
        }
    }

    fn violation(&mut self, what: String) {
        if self.violations.len() < MAX_REPORTED {
            self.violations.push(what);
        } else if self.violations.len() == MAX_REPORTED {
            self.violations.push("(more violations not shown)".into());
        }
    }

    /// Feeds one IPv4/IPv6 packet (non-TCP packets are ignored).
    pub fn packet(&mut self, packet: &[u8]) {
        let seg = match parse_packet(packet, self.verify_checksums) {
            Ok(s) => s,
            Err(crate::DropReason::NotTcp) => return,
            Err(e) => {
                self.violation(format!(
                    "packet {}: does not parse: {e}",
                    self.stats.packets
                ));
                return;
            }
        };
        let n = self.stats.packets;
        self.stats.packets += 1;
        let key = (seg.src, seg.dst);
        let back = (seg.dst, seg.src);
        let flags = seg.flags;
        if flags.syn() {
            let f = self.flows.entry(key).or_default();
            if f.isn.is_none() {
                f.isn = Some(seg.seq);
                f.high = 1;
            }
        }
        // The ACK field against what the other side sent.
        if flags.ack() && !flags.rst() {
            self.stats.acks += 1;
            let mut problems = Vec::new();
            if let Some(other) = self.flows.get_mut(&back) {
                match other.rel(seg.ack) {
                    Some(a) if a > other.high => problems.push(format!(
                        "packet {n} {} -> {}: ACK {a} ahead of the {} sent",
                        seg.src, seg.dst, other.high
                    )),
                    Some(a) => {
                        other.acked.insert(a);
                    }
                    None => {}
                }
                for &(l, r) in seg.options.sack() {
                    if let (Some(l), Some(r)) = (other.rel(l), other.rel(r)) {
                        if r > other.high {
                            problems.push(format!(
                                "packet {n} {} -> {}: SACK block {l}..{r} ahead of the {} sent",
                                seg.src, seg.dst, other.high
                            ));
                        }
                        other.acked.insert(l);
                        other.acked.insert(r);
                    }
                }
            }
            for p in problems {
                self.violation(p);
            }
        }
        if seg.payload.is_empty() && !flags.fin() {
            return;
        }
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Some(start) = flow.rel(seg.seq) else {
            return;
        };
        let start = start + u64::from(flags.syn());
        let end = start + seg.payload.len() as u64 + u64::from(flags.fin());
        let mut problems = Vec::new();
        if !seg.payload.is_empty() {
            self.stats.data_segments += 1;
        }
        if start > flow.high {
            problems.push(format!(
                "packet {n} {} -> {}: hole: segment at {start} beyond the {} sent",
                seg.src, seg.dst, flow.high
            ));
        } else if start < flow.high && !seg.payload.is_empty() {
            self.stats.retransmissions += 1;
            let orig = flow
                .originals
                .range(..=start)
                .next_back()
                .map(|(&s, (e, bytes))| (s, *e, bytes));
            match orig {
                Some((os, oe, bytes)) if end <= oe => {
                    let data_end = start + seg.payload.len() as u64;
                    if start != os && !flow.acked.contains(&start) {
                        problems.push(format!(
                            "packet {n} {} -> {}: retransmission {start}..{end} starts inside \
                             the transmission {os}..{oe}",
                            seg.src, seg.dst
                        ));
                    }
                    if start == os && end == oe {
                        self.stats.exact_retransmissions += 1;
                    } else if end != oe && !flow.acked.contains(&end) {
                        self.stats.shortened_retransmissions += 1;
                    }
                    let a = (start - os) as usize;
                    let b = (data_end - os) as usize;
                    if bytes.get(a..b) != Some(seg.payload) {
                        self.stats.inconsistent_retransmissions += 1;
                    }
                }
                _ => problems.push(format!(
                    "packet {n} {} -> {}: retransmission {start}..{end} is not within one \
                     earlier transmission",
                    seg.src, seg.dst
                )),
            }
        }
        if end > flow.high {
            if start == flow.high {
                flow.originals.insert(start, (end, seg.payload.to_vec()));
            }
            flow.high = end;
        }
        for p in problems {
            self.violation(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{OutHeader, OutOptions, TcpFlags, write_packet};

    fn pkt(src: &str, dst: &str, seq: u32, ack: u32, flags: TcpFlags, payload: &[u8]) -> Vec<u8> {
        let hdr = OutHeader {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            seq,
            ack,
            flags,
            window: 1000,
            ttl: 64,
            ip_id: 1,
        };
        let mut buf = vec![0u8; 1500];
        let n = write_packet(&mut buf, &hdr, &OutOptions::default(), payload.len(), |o| {
            o.copy_from_slice(payload)
        })
        .unwrap();
        buf.truncate(n);
        buf
    }

    const A: &str = "10.0.0.1:1000";
    const B: &str = "10.0.0.2:80";

    fn handshake(a: &mut WireAudit) {
        a.packet(&pkt(A, B, 100, 0, TcpFlags::SYN, b""));
        a.packet(&pkt(B, A, 500, 101, TcpFlags::SYN | TcpFlags::ACK, b""));
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b""));
    }

    #[test]
    fn ordinary_and_inconsistent_retransmissions_pass() {
        let mut a = WireAudit::new(true);
        handshake(&mut a);
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b"aaaa"));
        a.packet(&pkt(A, B, 105, 501, TcpFlags::ACK, b"bbbb"));
        a.packet(&pkt(B, A, 501, 105, TcpFlags::ACK, b""));
        a.packet(&pkt(A, B, 105, 501, TcpFlags::ACK, b"xxxx"));
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b"aaaa"));
        let s = a.result().unwrap();
        assert_eq!(s.retransmissions, 2);
        assert_eq!(s.exact_retransmissions, 2);
        assert_eq!(s.inconsistent_retransmissions, 1);
    }

    #[test]
    fn holes_merged_retransmissions_and_early_acks_are_violations() {
        let mut a = WireAudit::new(true);
        handshake(&mut a);
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b"aaaa"));
        a.packet(&pkt(A, B, 105, 501, TcpFlags::ACK, b"bbbb"));
        // Across two transmissions.
        a.packet(&pkt(A, B, 103, 501, TcpFlags::ACK, b"aabb"));
        // A hole.
        a.packet(&pkt(A, B, 120, 501, TcpFlags::ACK, b"zz"));
        // An ACK for data not sent.
        a.packet(&pkt(B, A, 501, 200, TcpFlags::ACK, b""));
        let v = a.violations().join("\n");
        assert!(v.contains("not within one"), "{v}");
        assert!(v.contains("hole"), "{v}");
        assert!(v.contains("ahead"), "{v}");
        // A shortened retransmission (not at an acknowledged point) is counted.
        let mut a = WireAudit::new(true);
        handshake(&mut a);
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b"aaaa"));
        a.packet(&pkt(A, B, 101, 501, TcpFlags::ACK, b"aa"));
        assert_eq!(a.result().unwrap().shortened_retransmissions, 1);
    }
}
