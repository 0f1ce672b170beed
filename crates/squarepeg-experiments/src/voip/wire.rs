//! Which messages the network itself lost: the voice flow's packets as the sender sent them,
//! matched with those the receiver's side of the path delivered, mapped to messages.
//!
//! Both engines produce the same input — the sender-to-receiver packets of the voice flow in
//! the order the sender sent them, and those the path delivered — so one piece of code
//! decides for both: the simulator from its trace hooks, the real lab from the emulator's
//! captures on its server-facing interface (before the impairments) and client-facing
//! interface (after them). No scenario rewrites packets, so every delivered packet is a sent
//! one, byte for byte; the path may drop, reorder (jitter, explicit reordering) and
//! duplicate them, so [`match_delivered`] matches by content, not by position.
//!
//! A message is *lost by the network* when the first transmission of any of its bytes was
//! dropped. For a datagram transport every message is one datagram, sent once. For a TCP
//! byte stream the bytes of a data segment above the highest sequence number sent before it
//! are being sent for the first time (TCP sends new data in sequence order); the stream is
//! rebuilt from the sent segments and cut into messages by the transport's [`Framing`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Range;

use etherparse::{SlicedPacket, TransportSlice};
use squarepeg_framing::{FrameFormat, FrameHeader, decode_frame, varint};
use squarepeg_lab::sim::{KIND_DATA, decode_payload};
use squarepeg_session::MAX_FRAME_BODY;

use super::VoipError;

/// The largest voice stream rebuilt (the voice flow carries about 10 kB/s).
pub const MAX_STREAM_BYTES: u64 = 256 << 20;

/// How a transport lays messages on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One UDP datagram per message, its payload the message.
    Datagram,
    /// A TCP byte stream of records: a 4-byte big-endian length, then the message.
    LengthPrefixed,
    /// A TCP byte stream of squarepeg frames: uCOBS frames (message frames carry the
    /// message as their payload; control and padding frames carry none), and plain frames
    /// after a Switch frame (docs/wire.md §3).
    Ucobs,
    /// A TCP byte stream of TLS records (docs/wire.md §4-5): the messages are encrypted,
    /// so which message a dropped segment carried cannot be read off the wire, and no
    /// message is counted as lost by the network (see [`Framing::shows_messages`]).
    Tls,
}

impl Framing {
    /// Whether the wire shows which message each packet carries, so that the network's
    /// losses can be counted per message.
    pub fn shows_messages(self) -> bool {
        self != Framing::Tls
    }
}

/// Bytes of a record's length prefix in [`Framing::LengthPrefixed`].
pub const LENGTH_PREFIX: usize = 4;

/// Appends one length-prefixed record.
pub fn encode_record(message: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
}

/// Splits complete length-prefixed records off the front of `buf` (the receive side of
/// [`Framing::LengthPrefixed`]); records longer than `max` are an error.
pub fn take_records(buf: &mut Vec<u8>, max: usize) -> Result<Vec<Vec<u8>>, VoipError> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(prefix) = buf.get(at..at + LENGTH_PREFIX) {
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > max {
            return Err(VoipError::Wire(format!(
                "record of {len} bytes is longer than the largest message ({max})"
            )));
        }
        let Some(record) = buf.get(at + LENGTH_PREFIX..at + LENGTH_PREFIX + len) else {
            break;
        };
        out.push(record.to_vec());
        at += LENGTH_PREFIX + len;
    }
    buf.drain(..at);
    Ok(out)
}

/// One packet of the voice flow, sender to receiver, in sending order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WirePacket {
    /// The IP packet.
    pub bytes: Vec<u8>,
    /// Whether the path delivered it.
    pub delivered: bool,
}

/// Marks which sent packets were delivered, in any order: each delivered packet is the
/// earliest sent packet with the same bytes not matched yet (a path may reorder); a packet
/// delivered more often than it was sent is a duplicate the path made, and counts once. A
/// delivered packet that was never sent is an error (a path that rewrites packets, or an
/// incomplete capture): the mapping to messages would be a guess.
pub fn match_delivered(
    sent: Vec<Vec<u8>>,
    delivered: &[Vec<u8>],
) -> Result<Vec<WirePacket>, VoipError> {
    // Indices of the sent packets by content, earliest first.
    let mut by_bytes: HashMap<&[u8], VecDeque<usize>> = HashMap::new();
    for (i, bytes) in sent.iter().enumerate() {
        by_bytes.entry(bytes.as_slice()).or_default().push_back(i);
    }
    let mut hit = vec![false; sent.len()];
    let mut unknown = 0;
    for d in delivered {
        match by_bytes.get_mut(d.as_slice()) {
            Some(unmatched) => {
                if let Some(i) = unmatched.pop_front() {
                    hit[i] = true;
                }
                // Else: every copy sent was delivered already; the path duplicated it.
            }
            None => unknown += 1,
        }
    }
    if unknown > 0 {
        return Err(VoipError::Wire(format!(
            "{unknown} of {} delivered packets were never sent (a path that rewrites packets, \
             or an incomplete capture)",
            delivered.len()
        )));
    }
    Ok(sent
        .into_iter()
        .zip(hit)
        .map(|(bytes, delivered)| WirePacket { bytes, delivered })
        .collect())
}

/// The numbers of the messages whose first transmission the path dropped.
pub fn lost_by_network(log: &[WirePacket], framing: Framing) -> Result<BTreeSet<u64>, VoipError> {
    match framing {
        Framing::Datagram => Ok(log
            .iter()
            .filter(|p| !p.delivered)
            .filter_map(|p| datagram_number(&p.bytes))
            .collect()),
        Framing::LengthPrefixed | Framing::Ucobs => stream_losses(log, framing),
        // Encrypted: not measurable from the wire (reports mark the count as such).
        Framing::Tls => Ok(BTreeSet::new()),
    }
}

fn datagram_number(packet: &[u8]) -> Option<u64> {
    let sliced = SlicedPacket::from_ip(packet).ok()?;
    let TransportSlice::Udp(udp) = sliced.transport? else {
        return None;
    };
    match decode_payload(udp.payload())? {
        (KIND_DATA, number, _) => Some(number),
        _ => None,
    }
}

struct Segment {
    seq: u32,
    syn: bool,
    payload: Vec<u8>,
    delivered: bool,
}

fn tcp_segment(p: &WirePacket) -> Option<Segment> {
    let sliced = SlicedPacket::from_ip(&p.bytes).ok()?;
    let TransportSlice::Tcp(tcp) = sliced.transport? else {
        return None;
    };
    Some(Segment {
        seq: tcp.sequence_number(),
        syn: tcp.syn(),
        payload: tcp.payload().to_vec(),
        delivered: p.delivered,
    })
}

fn stream_losses(log: &[WirePacket], framing: Framing) -> Result<BTreeSet<u64>, VoipError> {
    let segments: Vec<Segment> = log.iter().filter_map(tcp_segment).collect();
    let isn = segments
        .iter()
        .find(|s| s.syn)
        .map(|s| s.seq)
        .ok_or_else(|| {
            VoipError::Wire("no SYN from the sender: the handshake is missing".into())
        })?;
    // Stream offset of each data segment (RFC 9293 §3.4: the SYN takes one sequence number).
    let ranges: Vec<(Range<u64>, &Segment)> = segments
        .iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| {
            let start = u64::from(s.seq.wrapping_sub(isn.wrapping_add(1)));
            (start..start + s.payload.len() as u64, s)
        })
        .collect();
    let end = ranges.iter().map(|(r, _)| r.end).max().unwrap_or(0);
    if end > MAX_STREAM_BYTES {
        return Err(VoipError::Wire(format!(
            "voice stream of {end} bytes is above the limit of {MAX_STREAM_BYTES}"
        )));
    }
    // The stream as first transmitted: only bytes above the high-water mark are written, so
    // an inconsistent retransmission (other bytes in the same range, Hollywood §4.2) does
    // not hide the messages first sent there.
    let mut stream = vec![0u8; end as usize];
    // First transmissions: range, packet index, delivered; ascending and disjoint.
    let mut fresh: Vec<(Range<u64>, usize, bool)> = Vec::new();
    // Segments that retransmit some range: packet index, payload, delivered.
    let mut resent: Vec<(usize, &[u8], bool)> = Vec::new();
    let mut highest = 0u64;
    for (index, (range, segment)) in ranges.iter().enumerate() {
        if range.start < highest {
            resent.push((index, &segment.payload, segment.delivered));
        }
        if range.end > highest {
            let from = range.start.max(highest);
            let skip = (from - range.start) as usize;
            stream[from as usize..range.end as usize].copy_from_slice(&segment.payload[skip..]);
            fresh.push((from..range.end, index, segment.delivered));
            highest = range.end;
        }
    }
    // Per message number: the index of the first segment that carried it, and whether that
    // first transmission (every fresh piece of it) was delivered.
    let mut first: BTreeMap<u64, (usize, bool)> = BTreeMap::new();
    let mut i = 0;
    for (number, range) in locate(&stream, framing)? {
        while i < fresh.len() && fresh[i].0.end <= range.start {
            i += 1;
        }
        let pieces = fresh[i..]
            .iter()
            .take_while(|(r, _, _)| r.start < range.end);
        let (mut index, mut lost) = (usize::MAX, false);
        for (_, at, delivered) in pieces {
            index = index.min(*at);
            lost |= !delivered;
        }
        first.entry(number).or_insert((index, lost));
    }
    if framing == Framing::Ucobs {
        // A message first sent as a replacement lies whole in a retransmitted segment
        // (consistent segmentation, Hollywood §4.2); it may also have gone out earlier or
        // later in its own place, so the earlier transmission counts.
        for (index, payload, delivered) in resent {
            for (number, _) in locate(payload, framing)? {
                let slot = first.entry(number).or_insert((usize::MAX, false));
                if index < slot.0 {
                    *slot = (index, !delivered);
                }
            }
        }
    }
    Ok(first
        .into_iter()
        .filter(|(_, (_, lost))| *lost)
        .map(|(number, _)| number)
        .collect())
}

/// The messages in a rebuilt stream with the byte ranges they occupy (prefix or markers
/// included: every byte the receiver needs before it can deliver the message in order).
pub fn locate(stream: &[u8], framing: Framing) -> Result<Vec<(u64, Range<u64>)>, VoipError> {
    let number = |message: &[u8]| match decode_payload(message) {
        Some((KIND_DATA, number, _)) => Some(number),
        _ => None,
    };
    let mut out = Vec::new();
    match framing {
        Framing::Datagram => {
            return Err(VoipError::Wire("datagrams are not a stream".into()));
        }
        Framing::Tls => {
            return Err(VoipError::Wire(
                "TLS records do not show their messages".into(),
            ));
        }
        Framing::LengthPrefixed => {
            let mut at = 0usize;
            while let Some(prefix) = stream.get(at..at + LENGTH_PREFIX) {
                let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
                let Some(message) = stream.get(at + LENGTH_PREFIX..at + LENGTH_PREFIX + len) else {
                    break;
                };
                let n = number(message).ok_or_else(|| {
                    VoipError::Wire(format!("no voice message at stream offset {at}"))
                })?;
                let end = at + LENGTH_PREFIX + len;
                out.push((n, at as u64..end as u64));
                at = end;
            }
        }
        Framing::Ucobs => {
            let mut at = 0usize;
            while at < stream.len() {
                let Some(zero) = stream[at..].iter().position(|&b| b == 0) else {
                    break;
                };
                let start = at + zero + 1;
                let Some(len) = stream[start..].iter().position(|&b| b == 0) else {
                    break;
                };
                let end = start + len;
                let frame = (len > 0)
                    .then(|| decode_frame(&stream[start..end], MAX_FRAME_BODY).ok())
                    .flatten();
                match frame.map(|f| (f.header, f.payload)) {
                    Some((FrameHeader::Message { .. }, payload)) => {
                        if let Some(n) = number(&payload) {
                            out.push((n, (start - 1) as u64..(end + 1) as u64));
                        }
                    }
                    Some((FrameHeader::Switch { format }, _))
                        if FrameFormat::from_id(format) == Some(FrameFormat::Plain) =>
                    {
                        // The sender switched to plain frames after this one (docs/wire.md
                        // §3): the rest of the stream is length-prefixed.
                        locate_plain(&stream[end + 1..], (end + 1) as u64, &number, &mut out);
                        break;
                    }
                    _ => {}
                }
                // The closing marker may open the next frame only if the sender shares
                // markers; squarepeg writes two, so resume at the closing one.
                at = end;
            }
        }
    }
    Ok(out)
}

/// The messages among plain frames (`varint(length) ‖ header ‖ payload`, docs/wire.md §3) that
/// start at stream offset `base`, up to the first incomplete frame.
fn locate_plain(
    stream: &[u8],
    base: u64,
    number: &dyn Fn(&[u8]) -> Option<u64>,
    out: &mut Vec<(u64, Range<u64>)>,
) {
    let mut at = 0usize;
    while let Ok((len, len_len)) = varint::decode(&stream[at..]) {
        let body_at = at + len_len;
        let Some(body) = usize::try_from(len)
            .ok()
            .and_then(|len| stream.get(body_at..body_at + len))
        else {
            break;
        };
        if let Ok((FrameHeader::Message { .. }, head_len)) = FrameHeader::decode(body)
            && let Some(n) = number(&body[head_len..])
        {
            out.push((n, base + at as u64..base + (body_at + body.len()) as u64));
        }
        at = body_at + body.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use squarepeg_lab::sim::encode_payload;
    use std::time::Duration;

    fn message(n: u64) -> Vec<u8> {
        encode_payload(KIND_DATA, n, Duration::from_millis(20 * n), 160)
    }

    fn tcp(seq: u32, syn: bool, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ipv4([10, 0, 1, 1], [10, 0, 0, 1], 64).tcp(5000, 40000, seq, 1000);
        let b = if syn { b.syn() } else { b };
        let mut out = Vec::new();
        b.write(&mut out, payload).expect("build");
        out
    }

    fn udp(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ipv4([10, 0, 1, 1], [10, 0, 0, 1], 64)
            .udp(5000, 4000)
            .write(&mut out, payload)
            .expect("build");
        out
    }

    #[test]
    fn records_round_trip() {
        let mut buf = Vec::new();
        encode_record(&message(0), &mut buf);
        encode_record(&message(1), &mut buf);
        buf.truncate(buf.len() - 3);
        let got = take_records(&mut buf, 1400).expect("records");
        assert_eq!(got, vec![message(0)]);
        assert_eq!(buf.len(), 4 + 157);
        let mut huge = vec![0xff; 8];
        assert!(take_records(&mut huge, 1400).is_err());
    }

    #[test]
    fn matching_by_content_in_any_order() {
        let marks =
            |log: Vec<WirePacket>| -> Vec<bool> { log.iter().map(|p| p.delivered).collect() };
        let sent = vec![vec![1], vec![2], vec![3]];
        let log = match_delivered(sent.clone(), &[vec![1], vec![3]]).expect("fifo");
        assert_eq!(marks(log), [true, false, true]);
        // Reordered.
        let log = match_delivered(sent.clone(), &[vec![3], vec![1]]).expect("reordered");
        assert_eq!(marks(log), [true, false, true]);
        // Duplicated by the path: counts once.
        let log = match_delivered(sent.clone(), &[vec![2], vec![2]]).expect("duplicated");
        assert_eq!(marks(log), [false, true, false]);
        // The same bytes sent twice, delivered once: the earliest copy.
        let twice = vec![vec![7], vec![8], vec![7]];
        let log = match_delivered(twice, &[vec![7], vec![8]]).expect("same bytes");
        assert_eq!(marks(log), [true, true, false]);
        // Never sent: an error.
        assert!(match_delivered(sent, &[vec![4]]).is_err());
    }

    #[test]
    fn datagram_losses() {
        let sent: Vec<Vec<u8>> = (0..4).map(|n| udp(&message(n))).collect();
        let delivered = vec![sent[0].clone(), sent[2].clone()];
        let log = match_delivered(sent, &delivered).expect("fifo");
        let lost = lost_by_network(&log, Framing::Datagram).expect("map");
        assert_eq!(lost, [1, 3].into_iter().collect());
    }

    #[test]
    fn first_transmissions_of_a_stream() {
        // Records of 164 bytes; the sequence space wraps. Messages 1 and 3 lose their first
        // transmission; message 1's first retransmission is lost too (not a first
        // transmission, so nothing new), then both are retransmitted together with a part
        // of message 2 that was delivered the first time (coalesced retransmission).
        let isn = 0xffff_ff00u32;
        let mut stream = Vec::new();
        for n in 0..4 {
            encode_record(&message(n), &mut stream);
        }
        let seg = |from: usize, to: usize| {
            tcp(isn.wrapping_add(1 + from as u32), false, &stream[from..to])
        };
        let sent = vec![
            tcp(isn, true, &[]),
            seg(0, 164),
            seg(164, 328),
            seg(328, 492),
            seg(492, 656),
            seg(164, 328),
            seg(164, 656),
        ];
        let delivered: Vec<Vec<u8>> = [0, 1, 3, 6].iter().map(|&i| sent[i].clone()).collect();
        let log = match_delivered(sent, &delivered).expect("fifo");
        let lost = lost_by_network(&log, Framing::LengthPrefixed).expect("map");
        assert_eq!(lost, [1, 3].into_iter().collect());
        // Without a SYN the stream cannot be placed.
        assert!(lost_by_network(&log[1..], Framing::LengthPrefixed).is_err());
    }

    #[test]
    fn ucobs_frames_are_found() {
        let mut stream = Vec::new();
        // A control frame, then two message frames.
        squarepeg_framing::encode_frame(&FrameHeader::Control, &[1, 2, 3], &mut stream)
            .expect("frame");
        let first = stream.len();
        for n in 0..2 {
            squarepeg_framing::encode_frame(
                &FrameHeader::Message {
                    substream: 0,
                    number: n,
                },
                &message(n),
                &mut stream,
            )
            .expect("frame");
        }
        let found = locate(&stream, Framing::Ucobs).expect("locate");
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].0, 0);
        assert_eq!(found[0].1.start, first as u64);
        assert_eq!(found[1].1.end, stream.len() as u64);
        assert_eq!(found[0].1.end, found[1].1.start);
    }

    #[test]
    fn plain_frames_after_a_switch_are_found() {
        let mut stream = Vec::new();
        let header = |n| FrameHeader::Message {
            substream: 0,
            number: n,
        };
        squarepeg_framing::encode_frame(&header(0), &message(0), &mut stream).expect("frame");
        squarepeg_framing::encode_frame(&FrameHeader::Switch { format: 1 }, &[], &mut stream)
            .expect("frame");
        let plain_at = stream.len();
        for n in 1..3 {
            squarepeg_framing::encode_plain_frame(&header(n), &message(n), &mut stream)
                .expect("frame");
        }
        squarepeg_framing::encode_plain_frame(&FrameHeader::Control, &[1], &mut stream)
            .expect("frame");
        let found = locate(&stream, Framing::Ucobs).expect("locate");
        let numbers: Vec<u64> = found.iter().map(|(n, _)| *n).collect();
        assert_eq!(numbers, [0, 1, 2]);
        assert_eq!(found[1].1.start, plain_at as u64);
        assert_eq!(found[1].1.end, found[2].1.start);
        // A stream cut inside the last message frame yields only the complete ones.
        let cut = found[2].1.end as usize - 1;
        assert_eq!(
            locate(&stream[..cut], Framing::Ucobs)
                .expect("locate")
                .len(),
            2
        );
    }

    fn message_frame(n: u64, bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        squarepeg_framing::encode_frame(
            &FrameHeader::Message {
                substream: 0,
                number: n,
            },
            &encode_payload(KIND_DATA, n, Duration::from_millis(20 * n), bytes),
            &mut out,
        )
        .expect("frame");
        out
    }

    #[test]
    fn inconsistent_retransmissions_are_accounted() {
        // Messages 0, 1, 2 in one segment each; message 1's segment is lost and its
        // retransmission carries message 3 (shorter) and padding to the same length
        // (Hollywood §4.2). Message 1 was lost by the network (the analysis counts it as
        // replaced by the sender); message 3's first transmission is that retransmission.
        let isn = 1000u32;
        let frames: Vec<Vec<u8>> = (0..3).map(|n| message_frame(n, 160)).collect();
        let mut replacement = message_frame(3, 100);
        let pad = frames[1].len() - replacement.len();
        squarepeg_framing::encode_padding(pad, &mut replacement);
        assert_eq!(replacement.len(), frames[1].len());
        let mut at = 0u32;
        let mut sent = vec![tcp(isn, true, &[])];
        let mut starts = Vec::new();
        for f in &frames {
            starts.push(at);
            sent.push(tcp(isn + 1 + at, false, f));
            at += f.len() as u32;
        }
        sent.push(tcp(isn + 1 + starts[1], false, &replacement));
        for (retransmission_delivered, expected) in [(true, vec![1]), (false, vec![1, 3])] {
            let mut delivered = vec![sent[0].clone(), sent[1].clone(), sent[3].clone()];
            if retransmission_delivered {
                delivered.push(sent[4].clone());
            }
            let log = match_delivered(sent.clone(), &delivered).expect("fifo");
            let lost = lost_by_network(&log, Framing::Ucobs).expect("map");
            assert_eq!(lost, expected.into_iter().collect());
        }
        // Message 3 sent again later in its own place: its first transmission still counts.
        let mut later = sent.clone();
        later.push(tcp(isn + 1 + at, false, &message_frame(3, 100)));
        let delivered = vec![
            later[0].clone(),
            later[1].clone(),
            later[3].clone(),
            later[5].clone(),
        ];
        let log = match_delivered(later, &delivered).expect("fifo");
        let lost = lost_by_network(&log, Framing::Ucobs).expect("map");
        assert_eq!(lost, [1, 3].into_iter().collect());
    }
}
