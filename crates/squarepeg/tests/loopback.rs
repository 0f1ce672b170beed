//! The transport API over kernel TCP on loopback: messages and streams,
//! priorities, expiry, close, abort and peer misbehaviour. Tests assert
//! outcomes and orders, never durations.

use std::collections::HashMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
use squarepeg::*;
use squarepeg_framing::{DEFAULT_MAX_BODY, FrameHeader, StreamDecoder, encode_frame};
use squarepeg_session::control::ControlFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn pair_with(
    addr: &str,
    client: ConnectionConfig,
    server: ConnectionConfig,
) -> (Connection, Connection) {
    let ep = Endpoint::bind(addr, server).await.unwrap();
    let a = ep.local_addr().unwrap();
    let (c, s) = tokio::join!(Connection::connect(a, client), ep.accept());
    (c.unwrap(), s.unwrap())
}

async fn pair(addr: &str) -> (Connection, Connection) {
    pair_with(
        addr,
        ConnectionConfig::default(),
        ConnectionConfig::default(),
    )
    .await
}

/// Fails a test that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("test stalled")
}

fn props(substream: u64, urgency: u8) -> MessageProps {
    MessageProps {
        substream,
        priority: Priority::new(urgency).unwrap(),
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}

async fn exchange_mixed(client: Connection, server: Connection) {
    // Four streams at different urgencies, each with 2 MiB, and 2000
    // messages on three sub-streams, all at once.
    let mut tasks = Vec::new();
    let blobs: Vec<Vec<u8>> = (0..4u8).map(|k| pattern(2 << 20, k)).collect();
    for (k, blob) in blobs.iter().cloned().enumerate() {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = c.open_stream().await.unwrap();
            s.set_priority(Priority::new(k as u8 * 2).unwrap()).unwrap();
            s.write_all(&[k as u8]).await.unwrap();
            s.write_all(&blob).await.unwrap();
            s.shutdown().await.unwrap();
        }));
    }
    let c = client.clone();
    let sender = tokio::spawn(async move {
        for i in 0..2000u32 {
            let p = props(u64::from(i % 3), (i % 8) as u8);
            c.send_message(format!("msg {i}").into_bytes(), p)
                .await
                .unwrap();
        }
    });
    let mut readers = Vec::new();
    for _ in 0..4 {
        let mut s = server.accept_stream().await.unwrap();
        readers.push(tokio::spawn(async move {
            let mut data = Vec::new();
            s.read_to_end(&mut data).await.unwrap();
            data
        }));
    }
    let mut got = HashMap::new();
    for _ in 0..2000 {
        let m = no_hang(server.recv_message()).await.unwrap();
        let text = String::from_utf8(m.payload.to_vec()).unwrap();
        assert_eq!(text, format!("msg {}", m.number));
        assert_eq!(m.substream, m.number % 3);
        assert!(got.insert(m.number, ()).is_none());
    }
    for r in readers {
        let data = r.await.unwrap();
        let k = data[0] as usize;
        assert_eq!(
            Sha256::digest(&data[1..]),
            Sha256::digest(&blobs[k]),
            "stream {k}"
        );
    }
    for t in tasks {
        t.await.unwrap();
    }
    sender.await.unwrap();
    client.close().await;
    assert!(matches!(
        no_hang(server.closed()).await,
        ConnectionError::ApplicationClosed { code: 0, .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_messages_interleaved_ipv4() {
    let (c, s) = pair("127.0.0.1:0").await;
    exchange_mixed(c, s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_messages_interleaved_ipv6() {
    let (c, s) = pair("[::1]:0").await;
    assert!(c.remote_address().is_ipv6());
    exchange_mixed(c, s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_64_mib_sha256_matches() {
    let (client, server) = pair("127.0.0.1:0").await;
    const LEN: usize = 64 << 20;
    let writer = tokio::spawn(async move {
        let mut s = client.open_stream().await.unwrap();
        let mut hasher = Sha256::new();
        let mut block = vec![0u8; 256 * 1024];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..LEN / block.len() {
            for b in block.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                b.copy_from_slice(&state.to_le_bytes());
            }
            hasher.update(&block);
            s.write_all(&block).await.unwrap();
        }
        s.shutdown().await.unwrap();
        drop(s);
        client.close().await;
        hasher.finalize()
    });
    let mut s = server.accept_stream().await.unwrap();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 100_000];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n;
    }
    assert_eq!(total, LEN);
    assert_eq!(hasher.finalize(), writer.await.unwrap());
}

/// Received payloads are slices of shared receive chunks. An application
/// that keeps every payload pins the chunks; past the pinning limit the
/// driver copies payloads out instead. Either way every payload must stay
/// intact and in order: compare a digest of all of them, held to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_payloads_stay_intact_past_the_pinning_limit() {
    let mut config = ConnectionConfig::default();
    // A small receive queue makes a small pinning limit (queue + 4 reads):
    // the 6 MiB held here pass it several times over.
    config.session.message_receive_queue = 512 * 1024;
    config.read_buffer = 32 * 1024;
    let (client, server) = pair_with("127.0.0.1:0", config.clone(), config).await;
    const COUNT: u32 = 6000;
    let message = |i: u32| pattern(1000 + (i as usize * 7) % 100, i as u8);
    let sender = tokio::spawn(async move {
        let mut hasher = Sha256::new();
        for i in 0..COUNT {
            let m = message(i);
            hasher.update(&m);
            client.send_message(m, props(0, 3)).await.unwrap();
        }
        client.close().await;
        hasher.finalize()
    });
    let mut held = Vec::new();
    for i in 0..COUNT {
        let m = no_hang(server.recv_message()).await.unwrap();
        assert_eq!(m.number, u64::from(i));
        held.push(m.payload);
    }
    let mut hasher = Sha256::new();
    for p in &held {
        hasher.update(p);
    }
    assert_eq!(hasher.finalize(), sender.await.unwrap());
}

/// Fills the sender's session queue behind a receiver that does not read,
/// so later messages wait in the scheduler.
fn backlog_configs() -> (ConnectionConfig, ConnectionConfig) {
    let mut client = ConnectionConfig::default();
    client.session.message_send_queue = 64 << 20;
    let mut server = ConnectionConfig::default();
    server.session.message_receive_queue = 256 * 1024;
    (client, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_never_delivered_and_reported() {
    let (cc, sc) = backlog_configs();
    let (client, server) = pair_with("127.0.0.1:0", cc, sc).await;
    // 16 MiB of filler the receiver does not read yet: most of it waits in
    // the sender's session.
    // 24 MiB of filler, more urgent than the messages under test, that the
    // receiver does not read yet: the kernel takes a few MiB, the rest waits
    // in the sender's session, and so do the messages queued after it.
    let filler = 24 * 1024;
    for _ in 0..filler {
        client
            .try_send_message(vec![1u8; 1024], props(1, 2))
            .unwrap();
    }
    let short = MessageProps {
        substream: 2,
        lifetime: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    let mut expiring = Vec::new();
    for _ in 0..50 {
        expiring.push(
            client
                .try_send_message(b"late".to_vec(), short.clone())
                .unwrap(),
        );
    }
    // One short-lived message that a long-lived one depends on: kept.
    let kept = client
        .try_send_message(b"kept".to_vec(), short.clone())
        .unwrap();
    let dependent = client
        .try_send_message(
            b"dependent".to_vec(),
            MessageProps {
                substream: 2,
                depends_on: Some(kept),
                ..Default::default()
            },
        )
        .unwrap();
    // Wait for the Expired statuses (the receiver reads nothing meanwhile,
    // so the messages cannot have been sent).
    let mut expired = Vec::new();
    while expired.len() < expiring.len() {
        let (n, status) = no_hang(client.next_message_status()).await.unwrap();
        assert!(!expiring.contains(&n) || status == MessageStatus::Expired);
        if status == MessageStatus::Expired {
            expired.push(n);
        }
    }
    expired.sort();
    assert_eq!(expired, expiring);
    // Now read everything.
    let mut on_substream_2 = Vec::new();
    let mut filler_got = 0;
    while filler_got < filler || on_substream_2.len() < 2 {
        let m = no_hang(server.recv_message()).await.unwrap();
        match m.substream {
            1 => filler_got += 1,
            _ => on_substream_2.push(m.number),
        }
    }
    assert_eq!(on_substream_2, vec![kept, dependent]);
    client.close().await;
    assert!(server.try_recv_message().unwrap_or(None).is_none());
    assert_eq!(client.stats().session.messages_expired, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_message_overtakes_queued_bulk() {
    let (cc, sc) = backlog_configs();
    let (client, server) = pair_with("127.0.0.1:0", cc, sc).await;
    let bulk = 32 * 1024; // 32 MiB of 1 KiB messages at the lowest urgency
    for _ in 0..bulk {
        client
            .try_send_message(vec![0u8; 1024], props(1, 7))
            .unwrap();
    }
    let urgent = client
        .try_send_message(b"urgent".to_vec(), props(9, 0))
        .unwrap();
    // Every bulk message handed to the kernel before the urgent one was
    // queued has status Sent by now; the urgent one may be too.
    let sent_when_queued = client.stats().session.messages_sent;
    assert!(
        sent_when_queued < bulk / 2,
        "bulk must be queued behind a receiver that does not read: {sent_when_queued} sent"
    );
    let mut bulk_before = 0u64;
    loop {
        let m = no_hang(server.recv_message()).await.unwrap();
        if m.number == urgent {
            break;
        }
        bulk_before += 1;
    }
    // The urgent message overtook everything still queued in the session:
    // only what the kernel already had went before it.
    assert!(
        bulk_before <= sent_when_queued,
        "{bulk_before} bulk messages arrived first, {sent_when_queued} were in the kernel"
    );
    assert!(bulk_before < bulk / 2);
    for _ in bulk_before..bulk {
        assert_eq!(no_hang(server.recv_message()).await.unwrap().substream, 1);
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_close_delivers_everything() {
    let (client, server) = pair("127.0.0.1:0").await;
    let data = pattern(3 << 20, 7);
    // More than the peer's window: the writes wait for the reader, so they
    // run in their own task, and close() comes after them.
    let closer = tokio::spawn({
        let c = client.clone();
        let data = data.clone();
        async move {
            let mut s = c.open_stream().await.unwrap();
            s.write_all(&data).await.unwrap();
            drop(s); // finishes the stream
            for i in 0..5000u32 {
                c.send_message(i.to_be_bytes().to_vec(), props(0, 3))
                    .await
                    .unwrap();
            }
            c.close().await
        }
    });
    let mut st = server.accept_stream().await.unwrap();
    let mut got = Vec::new();
    st.read_to_end(&mut got).await.unwrap();
    assert_eq!(Sha256::digest(&got), Sha256::digest(&data));
    for i in 0..5000u32 {
        let m = no_hang(server.recv_message()).await.unwrap();
        assert_eq!(m.payload, &i.to_be_bytes()[..]);
    }
    assert!(matches!(
        no_hang(server.recv_message()).await,
        Err(ConnectionError::ApplicationClosed { code: 0, .. })
    ));
    closer.await.unwrap();
    assert_eq!(
        no_hang(client.closed()).await,
        ConnectionError::LocallyClosed
    );
    assert!(matches!(
        client.send_message(vec![1], MessageProps::default()).await,
        Err(SendError::Connection(ConnectionError::LocallyClosed))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_gives_typed_errors_on_both_ends() {
    let (client, server) = pair("[::1]:0").await;
    let mut s = client.open_stream().await.unwrap();
    s.write_all(b"partial").await.unwrap();
    client
        .send_message(b"first".to_vec(), MessageProps::default())
        .await
        .unwrap();
    assert_eq!(
        no_hang(server.recv_message()).await.unwrap().payload,
        &b"first"[..]
    );
    let mut peer_stream = server.accept_stream().await.unwrap();
    client.abort(77, b"user cancelled");
    assert_eq!(
        no_hang(server.closed()).await,
        ConnectionError::ApplicationClosed {
            code: 77,
            reason: "user cancelled".into()
        }
    );
    assert_eq!(
        no_hang(client.closed()).await,
        ConnectionError::LocallyAborted(77)
    );
    let mut buf = Vec::new();
    let err = peer_stream.read_to_end(&mut buf).await;
    // Bytes that arrived before the abort may be read; then the error.
    let err = err.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionAborted);
    let inner = err
        .get_ref()
        .unwrap()
        .downcast_ref::<StreamError>()
        .unwrap();
    assert!(matches!(
        inner,
        StreamError::Connection(ConnectionError::ApplicationClosed { code: 77, .. })
    ));
    assert!(matches!(
        s.write_all(b"more").await.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionAborted
    ));
}

/// Raw peers never answer a CLOSE: do not wait the default 3 s for them.
fn quick_drain() -> ConnectionConfig {
    let mut c = ConnectionConfig::default();
    c.session.drain_timeout = Duration::from_millis(200);
    c
}

/// Reads frames from a raw TCP peer until a CLOSE arrives; returns its code.
async fn read_close(raw: &mut TcpStream) -> u64 {
    let mut dec = StreamDecoder::new(DEFAULT_MAX_BODY);
    let mut buf = vec![0u8; 65536];
    loop {
        let n = raw.read(&mut buf).await.unwrap();
        assert!(n > 0, "EOF before CLOSE");
        dec.push(&buf[..n]);
        while let Some(f) = dec.next_frame() {
            let f = f.unwrap();
            if f.header == FrameHeader::Control
                && let ControlFrame::Close { code, .. } = ControlFrame::decode(&f.payload).unwrap()
            {
                return code;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_misbehaviour_closes_with_typed_errors() {
    // A raw peer sends a frame with a bad checksum.
    let ep = Endpoint::bind("127.0.0.1:0", quick_drain()).await.unwrap();
    let mut raw = TcpStream::connect(ep.local_addr().unwrap()).await.unwrap();
    let server = ep.accept().await.unwrap();
    let mut wire = Vec::new();
    encode_frame(
        &FrameHeader::Message {
            substream: 0,
            number: 0,
        },
        b"some payload",
        &mut wire,
    )
    .unwrap();
    let k = wire.len() - 3;
    wire[k] ^= 0x10;
    raw.write_all(&wire).await.unwrap();
    assert_eq!(read_close(&mut raw).await, transport_code::FRAME_ERROR);
    assert!(matches!(
        no_hang(server.recv_message()).await,
        Err(ConnectionError::ProtocolViolation(
            squarepeg_session::ProtocolError::Frame(
                squarepeg_framing::FrameError::ChecksumMismatch { .. }
            )
        ))
    ));

    // A raw peer sends stream data beyond the credit it was given.
    let mut raw = TcpStream::connect(ep.local_addr().unwrap()).await.unwrap();
    let server = ep.accept().await.unwrap();
    let mut wire = Vec::new();
    let window = SessionConfig::default().stream_receive_window;
    encode_frame(
        &FrameHeader::StreamChunk {
            stream: 0,
            offset: window,
            fin: false,
        },
        b"x",
        &mut wire,
    )
    .unwrap();
    raw.write_all(&wire).await.unwrap();
    assert_eq!(
        read_close(&mut raw).await,
        transport_code::FLOW_CONTROL_ERROR
    );
    assert!(matches!(
        no_hang(server.closed()).await,
        ConnectionError::ProtocolViolation(
            squarepeg_session::ProtocolError::StreamFlowControl { .. }
        )
    ));

    // A squarepeg client facing a server that speaks garbage, then one
    // that closes the TCP connection without a CLOSE frame.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let garbage = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"\0HTTP/1.1 400 Bad Request\r\n\r\n\0")
            .await
            .unwrap();
        let code = read_close(&mut s).await;
        let (s2, _) = listener.accept().await.unwrap();
        drop(s2);
        code
    });
    let client = Connection::connect(addr, quick_drain()).await.unwrap();
    assert!(matches!(
        no_hang(client.closed()).await,
        ConnectionError::ProtocolViolation(squarepeg_session::ProtocolError::Frame(_))
    ));
    let client2 = Connection::connect(addr, quick_drain()).await.unwrap();
    assert!(matches!(
        client2.recv_message().await,
        // Dropped with our PARAMS unread: a FIN or an RST, depending on timing.
        Err(ConnectionError::Transport(
            squarepeg::TransportError::PeerClosed | squarepeg::TransportError::Reset
        ))
    ));
    assert_eq!(garbage.await.unwrap(), transport_code::FRAME_ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_and_status_reporting() {
    let (cc, sc) = backlog_configs();
    let (client, server) = pair_with("127.0.0.1:0", cc, sc).await;
    // More urgent filler the receiver does not read yet keeps the updates
    // queued in the session.
    for _ in 0..24 * 1024 {
        client
            .try_send_message(vec![0u8; 1024], props(1, 2))
            .unwrap();
    }
    // Position updates: each squashes the previous one still queued.
    let updates: Vec<u64> = (0..100u32)
        .map(|i| {
            let p = MessageProps {
                substream: 5,
                squash_key: Some(1),
                ..Default::default()
            };
            client
                .try_send_message(i.to_be_bytes().to_vec(), p)
                .unwrap()
        })
        .collect();
    let mut last = None;
    let mut n = 0;
    while n < 24 * 1024 + 1 {
        let m = no_hang(server.recv_message()).await.unwrap();
        n += 1;
        if m.substream == 5 {
            assert!(last.is_none(), "two position updates delivered");
            last = Some(m.number);
        }
    }
    assert_eq!(last, updates.last().copied());
    let mut squashed = 0;
    while let Some((num, status)) = client.try_next_message_status() {
        if status == MessageStatus::Squashed {
            assert!(updates.contains(&num));
            squashed += 1;
        }
    }
    assert_eq!(squashed, 99);
    client.close().await;
}

/// Messages and a stream both ways; returns each side's stats before the close.
async fn exchange_both_ways(
    client: &Connection,
    server: &Connection,
) -> (ConnectionStats, ConnectionStats) {
    for (from, to, seed) in [(client, server, 1u8), (server, client, 2u8)] {
        let blob = pattern(300_000, seed);
        let mut s = from.open_stream().await.unwrap();
        for i in 0..300u32 {
            from.send_message(pattern(1 + (i as usize * 37) % 3000, seed), props(0, 3))
                .await
                .unwrap();
        }
        s.write_all(&blob).await.unwrap();
        s.shutdown().await.unwrap();
        for i in 0..300u64 {
            let m = no_hang(to.recv_message()).await.unwrap();
            assert_eq!(m.number, i);
            assert_eq!(m.payload, pattern(1 + (i as usize * 37) % 3000, seed));
        }
        let mut r = no_hang(to.accept_stream()).await.unwrap();
        let mut data = Vec::new();
        no_hang(r.read_to_end(&mut data)).await.unwrap();
        assert_eq!(Sha256::digest(&data), Sha256::digest(&blob));
    }
    (client.stats(), server.stats())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_format_is_negotiated_and_falls_back_to_ucobs() {
    use squarepeg_framing::FrameFormat::{Plain, Ucobs};
    for (client_plain, server_plain) in [(true, true), (true, false), (false, true), (false, false)]
    {
        let (mut cc, mut sc) = (ConnectionConfig::default(), ConnectionConfig::default());
        cc.plain_frames = client_plain;
        sc.plain_frames = server_plain;
        let (client, server) = pair_with("127.0.0.1:0", cc, sc).await;
        let (c, s) = exchange_both_ways(&client, &server).await;
        // Over kernel TCP both sides read in order and write a byte stream: a direction is
        // plain exactly when both sides allow it (one announces, the other switches).
        let want = if client_plain && server_plain {
            Plain
        } else {
            Ucobs
        };
        let case = format!("client {client_plain}, server {server_plain}");
        assert_eq!(c.session.send_format, want, "{case}");
        assert_eq!(s.session.receive_format, want, "{case}");
        assert_eq!(s.session.send_format, want, "{case}");
        assert_eq!(c.session.receive_format, want, "{case}");
        client.close().await;
        assert!(matches!(
            no_hang(server.closed()).await,
            ConnectionError::ApplicationClosed { code: 0, .. }
        ));
    }
}

/// A peer written from docs/wire.md §3 alone: PARAMS announcing nothing, a Switch to plain
/// frames, a plain message; then a second Switch, which the session must reject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_encoded_switch_is_followed_and_a_second_one_rejected() {
    use squarepeg_framing::encode_plain_frame;
    let ep = Endpoint::bind("127.0.0.1:0", quick_drain()).await.unwrap();
    let mut raw = TcpStream::connect(ep.local_addr().unwrap()).await.unwrap();
    let server = ep.accept().await.unwrap();
    let mut wire = Vec::new();
    // PARAMS (empty): the raw peer reads uCOBS only, so the server never switches to it.
    encode_frame(&FrameHeader::Control, &[0x01], &mut wire).unwrap();
    encode_frame(&FrameHeader::Switch { format: 1 }, &[], &mut wire).unwrap();
    let hello = FrameHeader::Message {
        substream: 2,
        number: 0,
    };
    encode_plain_frame(&hello, b"plain hello", &mut wire).unwrap();
    raw.write_all(&wire).await.unwrap();
    let m = no_hang(server.recv_message()).await.unwrap();
    assert_eq!((m.substream, &m.payload[..]), (2, &b"plain hello"[..]));
    assert_eq!(
        server.stats().session.receive_format,
        squarepeg_framing::FrameFormat::Plain
    );
    wire.clear();
    encode_plain_frame(&FrameHeader::Switch { format: 1 }, &[], &mut wire).unwrap();
    raw.write_all(&wire).await.unwrap();
    assert_eq!(
        no_hang(read_close(&mut raw)).await,
        transport_code::PROTOCOL_VIOLATION
    );
    assert!(matches!(
        no_hang(server.closed()).await,
        ConnectionError::ProtocolViolation(ProtocolError::UnexpectedSwitch { format: 1 })
    ));
}

/// Segments the raw socket has received (`TCP_INFO`'s `tcpi_segs_in`).
#[cfg(target_os = "linux")]
fn segments_in(socket: &TcpStream) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid tcp_info; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        assert_eq!(r, 0, "TCP_INFO");
        info.tcpi_segs_in
    }
}

/// A side that only receives still sends its own frames in answer to the peer's (its
/// format switch right after the peer's PARAMS), which would put its socket in Linux's
/// delayed-ACK "ping-pong" mode for good: one ACK per two small segments instead of one per
/// read, so the peer's RTT samples grow by its send interval and its loss detection waits
/// longer (`peg lab voip`). A raw server answers the client's PARAMS with the same PARAMS,
/// then sends one small message every 20 ms and counts the segments that come back: the
/// squarepeg client acknowledges each (about half without `KernelWire::wrote_batch`).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_only_receives_acknowledges_each_small_message() {
    const COUNT: u32 = 30;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, raw) = tokio::join!(
        Connection::connect(addr, ConnectionConfig::default()),
        listener.accept()
    );
    let (client, mut raw) = (client.unwrap(), raw.unwrap().0);
    raw.set_nodelay(true).unwrap();
    // The client's PARAMS, echoed as the server's: the client learns the server reads plain
    // frames and answers with its switch at once.
    let mut dec = StreamDecoder::new(DEFAULT_MAX_BODY);
    let mut buf = vec![0u8; 4096];
    let params = loop {
        let n = no_hang(raw.read(&mut buf)).await.unwrap();
        assert!(n > 0, "EOF before PARAMS");
        dec.push(&buf[..n]);
        if let Some(f) = dec.next_frame() {
            let f = f.unwrap();
            assert_eq!(f.header, FrameHeader::Control);
            break f.payload;
        }
    };
    let mut wire = Vec::new();
    encode_frame(&FrameHeader::Control, &params, &mut wire).unwrap();
    raw.write_all(&wire).await.unwrap();
    assert!(no_hang(raw.read(&mut buf)).await.unwrap() > 0, "no switch");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = segments_in(&raw);
    for number in 0..u64::from(COUNT) {
        wire.clear();
        let header = FrameHeader::Message {
            substream: 0,
            number,
        };
        encode_frame(&header, b"160 bytes of voice", &mut wire).unwrap();
        raw.write_all(&wire).await.unwrap();
        let m = no_hang(client.recv_message()).await.unwrap();
        assert_eq!(m.number, number);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acks = segments_in(&raw) - before;
    assert!(
        acks >= COUNT * 9 / 10,
        "{acks} segments came back for {COUNT} messages"
    );
}

/// A Switch to a format the receiver did not announce is a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_to_an_unannounced_format_is_rejected() {
    let mut config = quick_drain();
    config.plain_frames = false;
    for (format, cfg) in [(1u64, config.clone()), (9, quick_drain())] {
        let ep = Endpoint::bind("127.0.0.1:0", cfg).await.unwrap();
        let mut raw = TcpStream::connect(ep.local_addr().unwrap()).await.unwrap();
        let server = ep.accept().await.unwrap();
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Switch { format }, &[], &mut wire).unwrap();
        raw.write_all(&wire).await.unwrap();
        assert_eq!(
            no_hang(read_close(&mut raw)).await,
            transport_code::PROTOCOL_VIOLATION
        );
        assert!(matches!(
            no_hang(server.closed()).await,
            ConnectionError::ProtocolViolation(ProtocolError::UnexpectedSwitch { .. })
        ));
    }
}

/// Several tasks send at once through one connection, mixing messages the application's
/// outbox numbers (plain ones) with messages the session must number itself (a dependency,
/// a squash key) and `try_send_message` against a small send queue: every message arrives
/// once, under the number its send returned, and each task's messages in the order sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_senders_keep_numbers_and_order() {
    const TASKS: u32 = 3;
    const PER_TASK: u32 = 3000;
    let mut cc = ConnectionConfig::default();
    // Small: the outbox's room check and the session's both come into play.
    cc.session.message_send_queue = 16 * 1024;
    let (client, server) = pair_with("127.0.0.1:0", cc, ConnectionConfig::default()).await;
    let mut senders = Vec::new();
    for task in 0..TASKS {
        let client = client.clone();
        senders.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut previous = None;
            for seq in 0..PER_TASK {
                let mut payload = pattern(40 + (seq as usize * 7) % 300, seq as u8);
                payload[..4].copy_from_slice(&task.to_be_bytes());
                payload[4..8].copy_from_slice(&seq.to_be_bytes());
                let props = match seq % 5 {
                    // The session numbers these itself.
                    1 => MessageProps {
                        depends_on: previous,
                        ..Default::default()
                    },
                    2 => MessageProps {
                        squash_key: Some(u64::from(task) << 32 | u64::from(seq)),
                        ..Default::default()
                    },
                    _ => MessageProps::default(),
                };
                let number = if seq % 7 == 3 {
                    loop {
                        match client.try_send_message(payload.clone(), props.clone()) {
                            Ok(n) => break n,
                            Err(SendError::QueueFull { .. }) => tokio::task::yield_now().await,
                            Err(e) => panic!("try_send_message: {e}"),
                        }
                    }
                } else {
                    client.send_message(payload.clone(), props).await.unwrap()
                };
                previous = Some(number);
                sent.push((number, payload));
            }
            sent
        }));
    }
    let mut expected = HashMap::new();
    for s in senders {
        for (number, payload) in no_hang(s).await.unwrap() {
            assert!(
                expected.insert(number, payload).is_none(),
                "number {number} handed out twice"
            );
        }
    }
    assert_eq!(expected.len(), (TASKS * PER_TASK) as usize);
    let mut next_seq = [0u32; TASKS as usize];
    for _ in 0..TASKS * PER_TASK {
        let m = no_hang(server.recv_message()).await.unwrap();
        let want = expected
            .remove(&m.number)
            .unwrap_or_else(|| panic!("message {} unknown or delivered twice", m.number));
        assert_eq!(&m.payload[..], &want[..], "message {}", m.number);
        let task = u32::from_be_bytes(want[..4].try_into().unwrap()) as usize;
        let seq = u32::from_be_bytes(want[4..8].try_into().unwrap());
        assert_eq!(seq, next_seq[task], "task {task}'s messages out of order");
        next_seq[task] += 1;
    }
    assert!(expected.is_empty());
    client.close().await;
}

/// Every message a send accepted ends with exactly one status, also when the peer goes
/// away while messages wait to be sent (they are discarded then), and nothing is accepted
/// once the connection closed. A few rounds: where the abort lands among the sends varies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_message_gets_one_status_when_the_peer_aborts() {
    for _ in 0..6 {
        accepted_messages_get_one_status_each().await;
    }
}

async fn accepted_messages_get_one_status_each() {
    let mut cc = ConnectionConfig::default();
    // Room for a status per message the loop below may send (runs of them, in memory).
    cc.status_queue = 4_000_000;
    let (client, server) = pair_with("127.0.0.1:0", cc, ConnectionConfig::default()).await;
    let sender = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            // Bounded: the abort below usually ends it before (if not, every message was
            // accepted, which the checks below cover as well).
            for i in 0..500_000u32 {
                if i % 64 == 0 {
                    // Let the receiving side run: the abort should land among the sends.
                    tokio::task::yield_now().await;
                }
                match client
                    .send_message(i.to_be_bytes().to_vec(), MessageProps::default())
                    .await
                {
                    Ok(n) => accepted.push(n),
                    Err(SendError::Connection(_) | SendError::Closing) => return accepted,
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            accepted
        })
    };
    // Let the sender get going, then end the connection from the other side.
    for _ in 0..1000 {
        no_hang(server.recv_message()).await.unwrap();
    }
    server.abort(7, b"enough");
    let accepted = no_hang(sender).await.unwrap();
    assert!(accepted.len() >= 1000);
    let _ = no_hang(client.closed()).await;
    let mut statuses = HashMap::new();
    while let Some((number, status)) = client.try_next_message_status() {
        assert!(
            statuses.insert(number, status).is_none(),
            "two statuses for message {number}"
        );
    }
    assert_eq!(client.stats().statuses_lagged, 0);
    for n in &accepted {
        let status = statuses.remove(n);
        assert!(
            matches!(status, Some(MessageStatus::Sent | MessageStatus::Discarded)),
            "message {n}: {status:?}"
        );
    }
    assert!(statuses.is_empty(), "statuses for messages never accepted");
    assert!(matches!(
        client.send_message(vec![1], MessageProps::default()).await,
        Err(SendError::Connection(_))
    ));
}

/// After `close`, sends fail at once (the outbox learns it with the session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_after_close_fail() {
    let (client, server) = pair("127.0.0.1:0").await;
    let n = client
        .send_message(vec![1, 2, 3], MessageProps::default())
        .await
        .unwrap();
    let closing = {
        let client = client.clone();
        tokio::spawn(async move { client.close().await })
    };
    let m = no_hang(server.recv_message()).await.unwrap();
    assert_eq!(m.number, n);
    no_hang(closing).await.unwrap();
    for _ in 0..3 {
        assert!(
            client
                .send_message(vec![4], MessageProps::default())
                .await
                .is_err()
        );
        assert!(
            client
                .try_send_message(vec![5], MessageProps::default())
                .is_err()
        );
    }
    assert!(no_hang(server.recv_message()).await.is_err());
}

/// `recv_message` is cancel-safe: a call dropped before it completed (here whenever it is
/// not ready at its first poll, as when tokio's cooperative budget runs out) has taken no
/// message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_receive_takes_no_message() {
    const COUNT: u64 = 20_000;
    let (client, server) = pair("127.0.0.1:0").await;
    let sender = tokio::spawn(async move {
        for _ in 0..COUNT {
            client
                .send_message(vec![7u8; 100], MessageProps::default())
                .await
                .unwrap();
        }
        client
    });
    // Everything sent before the receiving starts: the loop below then takes messages for
    // long stretches without waiting, and runs out of budget in the middle of them.
    let client = no_hang(sender).await.unwrap();
    // In a task of the runtime (whose polls carry tokio's budget). Each receive is polled
    // once and dropped if it is not ready (a combinator that, unlike `tokio::select!`, does
    // not check the budget itself).
    let receiver = tokio::spawn(async move {
        let mut next = 0;
        let mut dropped = 0u64;
        while next < COUNT {
            let polled_once = {
                let recv = server.recv_message();
                tokio::pin!(recv);
                std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(match recv.as_mut().poll(cx) {
                        std::task::Poll::Ready(m) => Some(m),
                        std::task::Poll::Pending => None,
                    })
                })
                .await
            };
            match polled_once {
                Some(m) => {
                    assert_eq!(m.unwrap().number, next, "a message went missing");
                    next += 1;
                }
                None => {
                    dropped += 1;
                    // Let the runtime run (and refill the task's budget).
                    tokio::task::yield_now().await;
                }
            }
        }
        dropped
    });
    let dropped = no_hang(receiver).await.unwrap();
    assert!(
        dropped > 0,
        "no receive was ever dropped: the test proves nothing"
    );
    client.close().await;
}

/// Sends the messages `numbers` from a task of its own, each `len` (≥ 4) bytes: its number,
/// then a filler byte that depends on it ([`check_numbered`]).
fn send_numbered(
    client: &std::sync::Arc<Connection>,
    numbers: std::ops::Range<u32>,
    len: usize,
) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        for i in numbers {
            let mut payload = vec![(i % 251) as u8; len];
            payload[..4].copy_from_slice(&i.to_be_bytes());
            client
                .send_message(payload, MessageProps::default())
                .await
                .unwrap();
        }
    })
}

/// `m` is message `i` of [`send_numbered`], `len` bytes, intact.
fn check_numbered(m: &Message, i: u32, len: usize) {
    assert_eq!(m.payload.len(), len, "message {i}");
    assert_eq!(m.payload[..4], i.to_be_bytes(), "message {i} out of order");
    assert!(m.payload[4..].iter().all(|&b| b == (i % 251) as u8));
}

/// A receiver that keeps up with the sender finds nothing received now and then and reads
/// the socket itself (`ConnectionStats::reads_by_application`) instead of waiting for the
/// driver to: every message still arrives once, in order, intact, whoever read it. Whether
/// the application or the driver gets to the socket first is up to the scheduler, so the
/// transfer goes on in rounds until the application has read (a round or two as a rule;
/// never, if its reads are broken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_keeps_up_reads_the_socket_itself() {
    const PER_ROUND: u32 = 20_000;
    const ROUNDS: u32 = 20;
    let (client, server) = pair("127.0.0.1:0").await;
    let client = std::sync::Arc::new(client);
    let mut next = 0u32;
    for _ in 0..ROUNDS {
        let sender = send_numbered(&client, next..next + PER_ROUND, 200);
        for i in next..next + PER_ROUND {
            let m = no_hang(server.recv_message()).await.unwrap();
            check_numbered(&m, i, 200);
        }
        sender.await.unwrap();
        next += PER_ROUND;
        if server.stats().reads_by_application > 0 {
            break;
        }
    }
    assert!(
        server.stats().reads_by_application > 0,
        "the receiving application never read the socket in {next} messages"
    );
    // Nothing more: the sender's close ends the stream cleanly for the receiver.
    client.close().await;
    assert!(matches!(
        no_hang(server.recv_message()).await,
        Err(ConnectionError::ApplicationClosed { .. } | ConnectionError::Transport(_))
    ));
}

/// An application that only polls (`try_recv_message` in a loop, yielding when it finds
/// nothing, as a game loop would) reads the socket itself too and gets every message once,
/// in order, intact. As above, in rounds until its calls have read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_receiver_reads_the_socket_itself() {
    const PER_ROUND: u32 = 20_000;
    const ROUNDS: u32 = 20;
    let (client, server) = pair("127.0.0.1:0").await;
    let client = std::sync::Arc::new(client);
    let mut next = 0u32;
    for _ in 0..ROUNDS {
        let sender = send_numbered(&client, next..next + PER_ROUND, 100);
        let receiver = async {
            let mut i = next;
            while i < next + PER_ROUND {
                match server.try_recv_message().unwrap() {
                    Some(m) => {
                        check_numbered(&m, i, 100);
                        i += 1;
                    }
                    None => tokio::task::yield_now().await,
                }
            }
        };
        no_hang(receiver).await;
        sender.await.unwrap();
        next += PER_ROUND;
        if server.stats().reads_by_application > 0 {
            break;
        }
    }
    assert!(
        server.stats().reads_by_application > 0,
        "the polling application never read the socket in {next} messages"
    );
    assert_eq!(server.try_recv_message().unwrap(), None);
    client.close().await;
}

/// A receiving application that read the socket itself and then stops receiving leaves the
/// reading to the driver again (`ConnectionStats::reads_taken_back`): what it does next needs
/// frames that no receive call takes — a stream's flow credit (4 MiB through a 1 MiB window)
/// and the peer's close. Were the reading not taken back, the write would wait for credit
/// forever. As above, the transfer goes on in rounds until one ended with the application
/// reading (so that the stream's write is what made the driver take the reading back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_reads_again_when_the_application_stops_receiving() {
    const PER_ROUND: u32 = 20_000;
    const ROUNDS: u32 = 20;
    const STREAM: usize = 4 << 20;
    let (client, server) = pair("127.0.0.1:0").await;
    let client = std::sync::Arc::new(client);
    let mut taken_back_by_a_write = false;
    for round in 0..ROUNDS {
        let sender = {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..PER_ROUND {
                    client
                        .send_message(vec![round as u8; 200], MessageProps::default())
                        .await
                        .unwrap();
                }
            })
        };
        for _ in 0..PER_ROUND {
            let m = no_hang(server.recv_message()).await.unwrap();
            assert_eq!(m.payload, vec![round as u8; 200]);
        }
        sender.await.unwrap();
        let before = server.stats().reads_taken_back;
        // From here the server only writes: a stream the client reads whole.
        let data = pattern(STREAM, round as u8);
        let reader = {
            let client = client.clone();
            tokio::spawn(async move {
                let mut s = client.accept_stream().await.unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.unwrap();
                got
            })
        };
        let mut s = no_hang(server.open_stream()).await.unwrap();
        no_hang(s.write_all(&data)).await.unwrap();
        no_hang(s.shutdown()).await.unwrap();
        assert!(no_hang(reader).await.unwrap() == data, "round {round}");
        if server.stats().reads_taken_back > before {
            taken_back_by_a_write = true;
            break;
        }
    }
    assert!(server.stats().reads_by_application > 0);
    assert!(
        taken_back_by_a_write,
        "no round ended with the application reading the socket"
    );
    // The client's close reaches a server that does not receive.
    client.close().await;
    assert!(matches!(
        no_hang(server.closed()).await,
        ConnectionError::ApplicationClosed { .. }
    ));
}

/// A reset arriving while the receiving application reads the socket itself, or while the
/// driver does, ends the connection as `TransportError::Reset` either way (the kernel reports
/// the reset to one read only; the next sees the end of the stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_under_a_busy_receiver_is_a_reset() {
    let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
        .await
        .unwrap();
    let server_addr = ep.local_addr().unwrap();
    // A relay between client and server that resets its server side on request.
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let (reset_tx, reset_rx) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        let (mut down, _) = relay.accept().await.unwrap();
        let mut up = TcpStream::connect(server_addr).await.unwrap();
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            _ = reset_rx => {}
        }
        // SO_LINGER 0: the close sends an RST (zero linger never blocks).
        socket2::SockRef::from(&up)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(up);
        down
    });
    let (client, server) = tokio::join!(
        Connection::connect(relay_addr, ConnectionConfig::default()),
        ep.accept()
    );
    let (client, server) = (client.unwrap(), server.unwrap());
    let sender = tokio::spawn(async move {
        let mut i = 0u32;
        // Until the connection fails under it.
        while client
            .send_message(vec![7u8; 300], MessageProps::default())
            .await
            .is_ok()
            && i < 1_000_000
        {
            i += 1;
        }
        client
    });
    let mut received = 0u32;
    let mut reset_tx = Some(reset_tx);
    let err = loop {
        match no_hang(server.recv_message()).await {
            Ok(m) => {
                assert_eq!(m.payload, vec![7u8; 300]);
                received += 1;
                if received == 5_000
                    && let Some(tx) = reset_tx.take()
                {
                    tx.send(()).unwrap();
                }
            }
            Err(e) => break e,
        }
    };
    assert!(received >= 5_000);
    assert_eq!(
        err,
        ConnectionError::Transport(squarepeg::TransportError::Reset),
        "after {received} messages"
    );
    drop(relay_task.await.unwrap());
    sender.abort();
}

/// A receiver that stops reading for longer than `ConnectionConfig::dead_peer_timeout` does
/// not get its connection timed out: its session stops reading the socket once its receive
/// queue is full, the kernel's window closes, and the sender's zero-window probes are still
/// answered; once it reads again, every message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_pauses_longer_than_the_dead_peer_timeout_keeps_its_connection() {
    let mut config = ConnectionConfig::default();
    config.dead_peer_timeout = Some(Duration::from_secs(2));
    let (client, server) = pair_with("127.0.0.1:0", config.clone(), config).await;
    let count = 8192u32;
    let sender = tokio::spawn(async move {
        for i in 0..count {
            let payload = Bytes::from(i.to_be_bytes().repeat(2048));
            client
                .send_message(payload, MessageProps::default())
                .await
                .unwrap();
        }
        client
    });
    // Three timeouts without reading: the receive queue fills, then the kernel's window.
    tokio::time::sleep(Duration::from_secs(6)).await;
    no_hang(async {
        for i in 0..count {
            let m = server.recv_message().await.unwrap();
            assert_eq!(&m.payload[..], &i.to_be_bytes().repeat(2048)[..]);
        }
    })
    .await;
    let client = sender.await.unwrap();
    assert!(client.stats().session.messages_sent >= u64::from(count));
}
