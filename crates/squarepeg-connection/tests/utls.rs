//! TLS over the userspace TCP's uTCP interface (Minion §6): two connection cores on
//! simulated TCP endpoints with packet loss. Records behind a lost segment are opened and
//! delivered before the hole is filled; messages arrive once each, byte for byte, whatever
//! their priorities and lifetimes; no (key, nonce) is ever used twice; the close is clean.
//! With inconsistent retransmissions (Hollywood §4.2) whole records replace whole records,
//! padding records fill the rest, and a late original spliced with its replacement is
//! skipped, never delivered (docs/wire.md §5.1).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use squarepeg_connection::{Config, Connection, EndpointLink, Event, Role, Substrate, tcp_config};
use squarepeg_session::{ConnectionError, MessageProps, MessageStatus, Priority, TransportError};
use squarepeg_tcp::{ConnectionConfig, Event as TcpEvent};

fn payload(i: u32) -> Vec<u8> {
    let len = 40 + (i as usize * 37) % 300;
    let mut p = i.to_be_bytes().to_vec();
    p.extend((0..len).map(|k| (i as usize + k) as u8));
    p
}

struct Outcome {
    received: HashMap<u32, u32>,
    statuses: BTreeMap<u64, MessageStatus>,
    client: Connection,
    server: Connection,
}

/// The simulated path. Client packets: for the first few hundred, every `drop_every`-th is
/// lost; with `splice_originals` the lost packets are kept, and when the retransmission of
/// the same sequence range carries other bytes (replacements), what arrives is a splice: the
/// original's first half, the retransmission's second half (a middlebox mixing a cached
/// copy with the new one, Hollywood §4.5).
#[derive(Clone, Default)]
struct Path {
    /// Messages sent per millisecond.
    per_ms: u32,
    drop_every: u64,
    one_way_ms: u64,
    inconsistent: bool,
    splice_originals: bool,
    /// The client's records per key (a KeyUpdate before each limit).
    records_per_key: Option<u64>,
    /// A forger flips a payload bit in every retransmitted client segment after the first
    /// hundred packets (the handshake and PARAMS are through; checksum fixed).
    corrupt_retransmissions: bool,
}

impl Path {
    fn lossy(drop_every: u64) -> Self {
        Path {
            per_ms: 8,
            drop_every,
            ..Path::default()
        }
    }
}

/// Runs a client sending `count` messages (urgency and lifetime from `props`) over `path`;
/// returns what happened.
fn run(count: u32, path: &Path, props: impl Fn(u32) -> MessageProps) -> Outcome {
    let start = Instant::now();
    let mut now = start;
    let window = ConnectionConfig::default().recv_buffer;
    let substrate = Substrate::utcp(window);
    // With inconsistent retransmissions the link swaps the uCOBS padder for the connection's
    // own, which seals padding records.
    let tcp = tcp_config(ConnectionConfig::default(), substrate, path.inconsistent);
    let (client_addr, server_addr): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    let (client_tls, server_tls) = common::tls_setups();
    let mut client_ep = common::endpoint("10.0.0.1", 1, now);
    let mut server_ep = common::endpoint("10.0.0.2", 2, now);
    server_ep.listen(server_addr, 4, tcp.clone()).unwrap();
    let h = client_ep
        .connect(now, client_addr, server_addr, tcp)
        .unwrap();
    let mut config = Config::default();
    config.tls = Some(client_tls);
    let mut client = Connection::new(Role::Client, config, substrate).unwrap();
    client.tls_mut().unwrap().record_nonces(true);
    if let Some(records) = path.records_per_key {
        client.tls_mut().unwrap().set_key_update_threshold(records);
    }
    let mut client_link = EndpointLink::new(h);
    let mut server: Option<(Connection, EndpointLink)> = None;
    let mut statuses = BTreeMap::new();
    let mut received: HashMap<u32, u32> = HashMap::new();
    let mut sent = 0u32;
    let mut closed = false;
    let (mut packets, mut acks) = (0u64, 0u64);
    let mut packet = vec![0u8; 2048];
    let one_way = Duration::from_millis(path.one_way_ms);
    // In flight: (arrival, packet number) -> bytes, each direction.
    let mut to_server: BTreeMap<(Instant, u64), Vec<u8>> = BTreeMap::new();
    let mut to_client: BTreeMap<(Instant, u64), Vec<u8>> = BTreeMap::new();
    // Lost packets kept for `splice_originals`, by TCP sequence number.
    let mut kept: HashMap<u32, Vec<u8>> = HashMap::new();
    // Sequence numbers of client segments seen, for `corrupt_retransmissions`.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..60_000 {
        while let Some(n) = client_ep.poll_transmit(now, &mut packet) {
            packets += 1;
            // Lossy for the first few hundred packets, then clean (so that the run ends).
            let lossy = packets < 600;
            let phase = packets % path.drop_every;
            let seq = tcp_sequence(&packet[..n]);
            let retransmitted = seq.is_some_and(|seq| !seen.insert(seq));
            if lossy && phase == path.drop_every / 2 {
                if path.splice_originals
                    && let Some(seq) = seq
                {
                    kept.entry(seq).or_insert_with(|| packet[..n].to_vec());
                }
                continue;
            }
            let mut bytes = packet[..n].to_vec();
            if let Some(original) = seq.and_then(|seq| kept.remove(&seq)) {
                splice(&original, &mut bytes);
            }
            if retransmitted && path.corrupt_retransmissions && packets > 100 {
                let middle = bytes.len() - 1;
                bytes[middle] ^= 0x40;
                fix_tcp_checksum(&mut bytes);
            }
            to_server.insert((now + one_way, packets), bytes);
        }
        while let Some(n) = server_ep.poll_transmit(now, &mut packet) {
            acks += 1;
            to_client.insert((now + one_way, acks), packet[..n].to_vec());
        }
        while let Some(entry) = to_server.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let _ = server_ep.handle_packet(now, &entry.remove());
        }
        while let Some(entry) = to_client.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let _ = client_ep.handle_packet(now, &entry.remove());
        }
        while let Some(ev) = server_ep.poll_event() {
            if let TcpEvent::Incoming(l) = ev
                && let Some(h) = server_ep.accept(l)
            {
                let mut config = Config::default();
                config.tls = Some(server_tls.clone());
                server = Some((
                    Connection::new(Role::Server, config, substrate).unwrap(),
                    EndpointLink::new(h),
                ));
            }
        }
        while client_ep.poll_event().is_some() {}
        if client.is_established() && sent < count {
            // A burst every millisecond.
            for _ in 0..path.per_ms {
                if sent == count {
                    break;
                }
                client
                    .session_mut()
                    .send_message(now, payload(sent), props(sent))
                    .unwrap();
                sent += 1;
            }
        }
        if sent == count && !closed {
            client.session_mut().close(0, b"done");
            closed = true;
        }
        client_link.drive(now, &mut client, &mut client_ep);
        if let Some((conn, link)) = server.as_mut() {
            link.drive(now, conn, &mut server_ep);
            while let Some(m) = conn.session_mut().poll_message() {
                let id = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
                assert_eq!(m.payload[..], payload(id)[..], "message {id} altered");
                *received.entry(id).or_default() += 1;
            }
            while conn.poll_event().is_some() {}
        }
        while let Some(ev) = client.poll_event() {
            if let Event::MessageStatus { numbers, status } = ev {
                for number in numbers {
                    assert!(
                        statuses.insert(number, status).is_none(),
                        "two statuses for {number}"
                    );
                }
            }
        }
        let server_done = server.as_ref().is_some_and(|(c, _)| c.is_drained());
        if client.is_drained() && server_done {
            break;
        }
        now += Duration::from_millis(1);
        client_ep.handle_timeout(now);
        server_ep.handle_timeout(now);
        client.handle_timeout(now);
        if let Some((conn, _)) = server.as_mut() {
            conn.handle_timeout(now);
        }
    }
    let (server, _) = server.expect("the server accepted");
    assert!(client.is_drained(), "the client finished");
    assert!(server.is_drained(), "the server finished");
    Outcome {
        received,
        statuses,
        client,
        server,
    }
}

/// The TCP sequence number of an IPv4 packet carrying data.
fn tcp_sequence(packet: &[u8]) -> Option<u32> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let tcp = packet.get(ihl..)?;
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    if tcp.len() <= data_offset {
        return None;
    }
    Some(u32::from_be_bytes(tcp.get(4..8)?.try_into().ok()?))
}

/// Where `retransmission` (an IPv4 TCP packet) carries other bytes than `original`, of the
/// same length: its payload's first half becomes the original's, the TCP checksum is fixed.
fn splice(original: &[u8], retransmission: &mut [u8]) {
    let ihl = usize::from(retransmission[0] & 0x0f) * 4;
    let data = ihl + usize::from(retransmission[ihl + 12] >> 4) * 4;
    if original.len() != retransmission.len() || original[data..] == retransmission[data..] {
        return;
    }
    let half = (retransmission.len() - data) / 2;
    retransmission[data..data + half].copy_from_slice(&original[data..data + half]);
    fix_tcp_checksum(retransmission);
}

/// Recomputes the TCP checksum of an IPv4 packet (RFC 793: one's complement sum of the
/// pseudo-header and the segment).
fn fix_tcp_checksum(packet: &mut [u8]) {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    packet[ihl + 16..ihl + 18].fill(0);
    let segment = &packet[ihl..];
    let mut sum: u64 = 6 + segment.len() as u64;
    for pair in packet[12..20].chunks(2).chain(segment.chunks(2)) {
        sum += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !(sum as u16);
    packet[ihl + 16..ihl + 18].copy_from_slice(&checksum.to_be_bytes());
}

fn no_nonce_twice(client: &Connection) {
    let nonces = client.tls().unwrap().sealed_nonces();
    let mut unique = nonces.to_vec();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), nonces.len(), "a (key, nonce) was used twice");
    assert!(nonces.len() > 100);
}

#[test]
fn records_behind_a_loss_are_delivered_before_the_hole_fills() {
    let out = run(400, &Path::lossy(13), |_| MessageProps::default());
    for id in 0..400 {
        assert_eq!(out.received.get(&id), Some(&1), "message {id}");
    }
    let client = out.client.stats().tls.unwrap();
    let server = out.server.stats().tls.unwrap();
    assert!(client.sending_numbered && server.receiving_numbered);
    assert!(
        server.records_out_of_order > 20,
        "records delivered out of order: {server:?}"
    );
    eprintln!("server record layer: {server:?}");
    assert!(out.statuses.values().all(|s| *s == MessageStatus::Sent));
    closed_at_its_offset(&out);
    no_nonce_twice(&out.client);
}

#[test]
fn priorities_and_lifetimes_work_inside_records() {
    let out = run(600, &Path::lossy(7), |i| MessageProps {
        priority: Priority::new((i % 4) as u8).unwrap(),
        lifetime: (i % 3 == 0).then(|| Duration::from_millis(5)),
        ..MessageProps::default()
    });
    // Messages with a lifetime may expire unsent; every other one arrives, all at most once.
    for (id, n) in &out.received {
        assert_eq!(*n, 1, "message {id} delivered {n} times");
    }
    for id in (0..600).filter(|i| i % 3 != 0) {
        assert_eq!(out.received.get(&id), Some(&1), "reliable message {id}");
    }
    let expired = out
        .statuses
        .values()
        .filter(|s| **s == MessageStatus::Expired)
        .count();
    let delivered_with_lifetime = (0..600)
        .filter(|i| i % 3 == 0 && out.received.contains_key(i))
        .count();
    assert_eq!(
        expired + delivered_with_lifetime,
        200,
        "every message with a lifetime is delivered or reported expired"
    );
    let server = out.server.stats().tls.unwrap();
    assert!(server.records_out_of_order > 0, "{server:?}");
    assert!(out.client.stats().utcp.unwrap().expired_in_tcp > 0);
    closed_at_its_offset(&out);
    no_nonce_twice(&out.client);
}

/// Voice-like traffic: most messages live 25 ms (a repair over the 20 ms round trip comes
/// too late for them), every fourth must arrive.
fn mostly_short_lived(i: u32) -> MessageProps {
    MessageProps {
        lifetime: (!i.is_multiple_of(4)).then(|| Duration::from_millis(25)),
        ..MessageProps::default()
    }
}

/// What a run with replacements must show whatever the path did: every message arrived at
/// most once (checked byte for byte in `run`), the reliable ones all arrived, the record
/// layer never failed, and no (key, nonce) was sealed twice, padding included. (A message
/// with a lifetime may be lost: a replacement may not arrive, Hollywood §4.2.)
fn check_replacement_run(out: &Outcome, count: u32) {
    for (id, n) in &out.received {
        assert_eq!(*n, 1, "message {id} delivered {n} times");
    }
    for id in (0..count).filter(|i| i.is_multiple_of(4)) {
        assert_eq!(out.received.get(&id), Some(&1), "reliable message {id}");
    }
    // The clean end: the client closed, the server read its CLOSE.
    let (client, server) = (out.client.session().error(), out.server.session().error());
    assert!(
        matches!(client, Some(ConnectionError::LocallyClosed))
            && matches!(
                server,
                Some(ConnectionError::ApplicationClosed { code: 0, .. })
            ),
        "client {client:?}, server {server:?}"
    );
    closed_at_its_offset(out);
    no_nonce_twice(&out.client);
}

/// The client's close_notify said where in the stream it starts, and the server read it
/// there: the TCP queue's reports accounted for every message it dropped or sent in place of
/// expired ones (docs/wire.md §5).
fn closed_at_its_offset(out: &Outcome) {
    let (client, server) = (
        out.client.stats().tls.unwrap(),
        out.server.stats().tls.unwrap(),
    );
    assert!(client.close_sent_at_offset, "{client:?}");
    assert!(server.close_received_at_offset, "{server:?}");
    assert!(out.server.tls().unwrap().peer_closed());
}

#[test]
fn inconsistent_retransmissions_replace_whole_records_with_padding_records() {
    let path = Path {
        per_ms: 1,
        drop_every: 9,
        one_way_ms: 10,
        inconsistent: true,
        splice_originals: false,
        records_per_key: None,
        corrupt_retransmissions: false,
    };
    let out = run(1500, &path, mostly_short_lived);
    check_replacement_run(&out, 1500);
    let client = out.client.stats().tls.unwrap();
    let server = out.server.stats().tls.unwrap();
    eprintln!("client: {client:?}\nserver: {server:?}");
    let replaced = out
        .statuses
        .values()
        .filter(|s| **s == MessageStatus::Replaced)
        .count();
    assert!(replaced > 0, "no message was replaced");
    assert!(client.padding_records > 0, "{client:?}");
    assert!(server.records_out_of_order > 0, "{server:?}");
}

#[test]
fn a_late_original_spliced_with_its_replacement_is_skipped_never_delivered() {
    let mut held = 0;
    let mut skipped = 0;
    for drop_every in [9, 11, 13, 17] {
        let path = Path {
            per_ms: 1,
            drop_every,
            one_way_ms: 10,
            inconsistent: true,
            splice_originals: true,
            records_per_key: None,
            corrupt_retransmissions: false,
        };
        let out = run(1500, &path, mostly_short_lived);
        check_replacement_run(&out, 1500);
        let server = out.server.stats().tls.unwrap();
        eprintln!("losses 2 in {drop_every}: server {server:?}");
        held += server.records_held;
        skipped += server.spliced_bytes_skipped;
    }
    assert!(
        held > 0 && skipped > 0,
        "no splice happened: held {held}, skipped {skipped}"
    );
}

#[test]
fn padding_across_key_updates_opens_and_never_repeats_a_nonce() {
    let path = Path {
        per_ms: 1,
        drop_every: 9,
        one_way_ms: 10,
        inconsistent: true,
        splice_originals: true,
        records_per_key: Some(300),
        corrupt_retransmissions: false,
    };
    let out = run(1500, &path, mostly_short_lived);
    check_replacement_run(&out, 1500);
    let client = out.client.stats().tls.unwrap();
    let server = out.server.stats().tls.unwrap();
    eprintln!("client: {client:?}\nserver: {server:?}");
    assert!(client.key_updates_sent >= 3, "{client:?}");
    assert_eq!(server.key_updates_received, client.key_updates_sent);
    assert!(client.padding_records > 0, "{client:?}");
    // Padding sealed under a key of its own epoch: no (epoch, nonce) twice.
    let nonces = out.client.tls().unwrap().sealed_nonces();
    let epochs: std::collections::HashSet<u64> = nonces.iter().map(|(e, _)| *e).collect();
    assert!(epochs.len() >= 4, "{epochs:?}");
}

#[test]
fn corrupted_bytes_no_announcement_covers_fail_the_connection_not_stall_it() {
    // Replacements are on, so the receiver holds on bytes that do not authenticate; a forger
    // corrupting every retransmission makes holds no RECORDS_REPLACED covers. They must end in
    // a TLS failure (within MAX_HOLD, or when the stream ends), never in delivering them.
    let path = Path {
        per_ms: 1,
        drop_every: 9,
        one_way_ms: 10,
        inconsistent: true,
        corrupt_retransmissions: true,
        ..Path::default()
    };
    let out = run(1500, &path, mostly_short_lived);
    let server = out.server.stats().tls.unwrap();
    assert!(server.records_held > 0, "{server:?}");
    let error = out.server.session().error();
    assert!(
        matches!(
            error,
            Some(ConnectionError::Transport(TransportError::Tls(_)))
        ),
        "{error:?}"
    );
}

/// A client on tagged writes whose writes the test carries to a server reading one byte
/// stream, in the order handed out; the TCP queue's reports (`Sent` for every message) are
/// given to the client only with `reports`. What the client writes from its close on reaches
/// the server with its FIN (a slow path: the server cannot answer the CLOSE before). Returns
/// both ends after the close and the time the client's close_notify took to go.
fn close_over_tagged_writes(reports: bool) -> (Connection, Connection, Duration) {
    let start = Instant::now();
    let mut now = start;
    let (client_tls, server_tls) = common::tls_setups();
    let mut config = Config::default();
    config.tls = Some(client_tls);
    let window = ConnectionConfig::default().recv_buffer;
    let mut client = Connection::new(Role::Client, config, Substrate::utcp(window)).unwrap();
    let mut config = Config::default();
    config.tls = Some(server_tls);
    let mut server = Connection::new(Role::Server, config, Substrate::byte_stream()).unwrap();
    let (mut down_offset, mut sent, mut closed_at, mut close_out) = (0u64, 0u32, None, None);
    let mut on_the_path = Vec::new();
    for _ in 0..30_000 {
        while let Some(w) = client.poll_write(now) {
            let (bytes, id) = (w.frame.to_vec(), w.tag.message_id);
            client.write_done();
            if closed_at.is_some() {
                on_the_path.extend_from_slice(&bytes);
            } else {
                server.handle_bytes(now, &bytes);
            }
            if let (Some(id), true) = (id, reports) {
                client.handle_report(squarepeg_tcp::MessageReport::Sent {
                    id,
                    replacement: false,
                });
            }
        }
        if client.poll_shutdown() {
            close_out.get_or_insert(now);
            server.handle_bytes(now, &on_the_path);
            server.handle_transport_closed(now, TransportError::PeerClosed);
        }
        let mut down = Vec::new();
        server.poll_transmit(now, &mut down, 64 * 1024);
        if !down.is_empty() {
            client.handle_segment(now, down_offset, &down);
            down_offset += down.len() as u64;
        }
        if server.poll_shutdown() {
            client.handle_transport_closed(now, TransportError::PeerClosed);
        }
        while server.session_mut().poll_message().is_some() {}
        while server.poll_event().is_some() {}
        while client.poll_event().is_some() {}
        if client.is_established() && sent < 50 {
            client
                .session_mut()
                .send_message(now, payload(sent), MessageProps::default())
                .unwrap();
            sent += 1;
        } else if sent == 50 && closed_at.is_none() {
            client.session_mut().close(0, b"done");
            closed_at = Some(now);
        }
        if client.is_drained() && server.is_drained() {
            break;
        }
        now += Duration::from_millis(1);
        client.handle_timeout(now);
        server.handle_timeout(now);
    }
    let took = close_out.expect("the client ended its stream") - closed_at.unwrap();
    (client, server, took)
}

#[test]
fn over_tagged_writes_close_notify_waits_for_the_queue_to_place_what_is_before_it() {
    // With the reports, every message before the close has its place at once: close_notify
    // carries its stream offset and the server reads it there.
    let (client, server, took) = close_over_tagged_writes(true);
    let (c, s) = (client.stats().tls.unwrap(), server.stats().tls.unwrap());
    assert!(
        c.close_sent_at_offset && s.close_received_at_offset,
        "{c:?} {s:?}"
    );
    assert!(server.tls().unwrap().peer_closed());
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Without them (a report queue that overflowed) the offset is not known: close_notify
    // waits, and once the session's drain timeout settles the messages without a report, it
    // goes without the offset (never with one that may be wrong). The close is still clean.
    let (client, server, took) = close_over_tagged_writes(false);
    let (c, s) = (client.stats().tls.unwrap(), server.stats().tls.unwrap());
    assert!(
        !c.close_sent_at_offset && !s.close_received_at_offset,
        "{c:?} {s:?}"
    );
    assert!(server.tls().unwrap().peer_closed());
    let drain = squarepeg_session::Config::default().drain_timeout;
    assert!(took >= drain, "{took:?}");
    assert!(
        matches!(
            server.session().error(),
            Some(ConnectionError::ApplicationClosed { code: 0, .. })
        ),
        "{:?}",
        server.session().error()
    );
}

#[test]
fn records_sealed_in_place_are_delivered_out_of_order_only_whole() {
    // A byte-stream (kernel-TCP) sender seals frames where it writes them, cutting a frame
    // that overflows a record into the next and flagging both (docs/wire.md §5); a receiver
    // reading segments out of order delivers a record at once only if it holds whole frames.
    // Segments reordered in groups: every message arrives once and intact, some early.
    let mut now = Instant::now();
    let (client_tls, server_tls) = common::tls_setups();
    let mut config = Config::default();
    config.tls = Some(client_tls);
    let mut client = Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap();
    let mut config = Config::default();
    config.tls = Some(server_tls);
    let window = ConnectionConfig::default().recv_buffer;
    let mut server = Connection::new(Role::Server, config, Substrate::utcp(window)).unwrap();
    let (mut up_offset, mut sent) = (0u64, 0u32);
    let mut received: HashMap<u32, u32> = HashMap::new();
    // Client bytes cut into segments, delivered with each group of four reversed.
    let mut segments: Vec<(u64, Vec<u8>)> = Vec::new();
    let deliver = |server: &mut Connection, segments: &mut Vec<(u64, Vec<u8>)>, now, all| {
        while segments.len() >= 4 || (all && !segments.is_empty()) {
            let group: Vec<_> = segments.drain(..segments.len().min(4)).collect();
            for (offset, bytes) in group.into_iter().rev() {
                server.handle_segment(now, offset, &bytes);
            }
        }
    };
    // Sizes around a record's room and beyond it: frames cut across records.
    let size = |i: u32| [100usize, 16_370, 16_390, 40_000, 3, 9_000][i as usize % 6];
    let message = |i: u32| {
        let mut m = i.to_be_bytes().to_vec();
        m.extend((0..size(i)).map(|k| (k as u32 ^ i) as u8));
        m
    };
    for _ in 0..5_000 {
        let mut up = Vec::new();
        client.poll_transmit(now, &mut up, 64 * 1024);
        for piece in up.chunks(1448) {
            segments.push((up_offset, piece.to_vec()));
            up_offset += piece.len() as u64;
        }
        deliver(
            &mut server,
            &mut segments,
            now,
            !client.is_established() || sent == 120,
        );
        while let Some(w) = server.poll_write(now) {
            let bytes = w.frame.to_vec();
            server.write_done();
            client.handle_bytes(now, &bytes);
        }
        while let Some(m) = server.session_mut().poll_message() {
            let id = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
            assert_eq!(m.payload[..], message(id)[..], "message {id} altered");
            *received.entry(id).or_default() += 1;
        }
        while server.poll_event().is_some() {}
        while client.poll_event().is_some() {}
        assert!(
            server.session().error().is_none(),
            "{:?}",
            server.session().error()
        );
        if client.is_established() && sent < 120 {
            for _ in 0..6 {
                client
                    .session_mut()
                    .send_message(now, message(sent), MessageProps::default())
                    .unwrap();
                sent += 1;
            }
        }
        if sent == 120 && received.len() == 120 {
            break;
        }
        now += Duration::from_millis(1);
        client.handle_timeout(now);
        server.handle_timeout(now);
    }
    for id in 0..120 {
        assert_eq!(received.get(&id), Some(&1), "message {id}");
    }
    let tls = server.stats().tls.unwrap();
    assert!(tls.records_out_of_order > 0, "{tls:?}");
}
