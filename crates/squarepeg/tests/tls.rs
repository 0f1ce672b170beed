//! The transport API over TLS 1.3 on kernel TCP (loopback): messages with priorities and
//! lifetimes, a stream, statuses and close inside TLS records, as in cleartext; the wire
//! carries only TLS records; a refused certificate fails the connect with a typed error.
//! A relay in the middle records (and can corrupt) the bytes. Tests assert outcomes, never
//! durations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use squarepeg::tls::config::{self, Trust};
use squarepeg::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Fails a test that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("test stalled")
}

/// A server configuration with a fresh self-signed certificate, and a client configuration
/// that pins it (or another certificate).
fn configs(pin_the_right_one: bool) -> (ConnectionConfig, ConnectionConfig) {
    let cert = config::self_signed(&["peg.test".into()]).unwrap();
    let pin = if pin_the_right_one {
        cert.fingerprint
    } else {
        config::self_signed(&["peg.test".into()])
            .unwrap()
            .fingerprint
    };
    let server = ConnectionConfig::default().with_tls_server(
        config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
    );
    let client = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(pin)).unwrap(),
        "peg.test",
    );
    (client, server)
}

/// Relays one TCP connection between `listener` and `to`, recording each direction's bytes.
async fn relay(listener: TcpListener, to: std::net::SocketAddr, up: Arc<Mutex<Vec<u8>>>) {
    let (mut a, _) = listener.accept().await.unwrap();
    let mut b = TcpStream::connect(to).await.unwrap();
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let upward = async {
        let mut buf = vec![0; 65536];
        loop {
            let n = ar.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                let _ = bw.shutdown().await;
                return;
            }
            up.lock().unwrap().extend_from_slice(&buf[..n]);
            if bw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let downward = async {
        let _ = tokio::io::copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
    };
    tokio::join!(upward, downward);
}

#[tokio::test]
async fn messages_streams_and_close_inside_tls() {
    no_hang(async {
        let (client_config, server_config) = configs(true);
        let ep = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
        let server_addr = ep.local_addr().unwrap();
        let relay_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay_listener.local_addr().unwrap();
        let up = Arc::new(Mutex::new(Vec::new()));
        let relay_task = tokio::spawn(relay(relay_listener, server_addr, up.clone()));
        let (client, server) =
            tokio::join!(Connection::connect(relay_addr, client_config), ep.accept());
        let (client, server) = (client.unwrap(), server.unwrap());
        server.established().await.unwrap();
        let info = client.tls_info().unwrap();
        assert!(info.cipher_suite.starts_with("TLS13_"), "{info:?}");
        assert!(info.peer_certificate_sha256.is_some());

        // Messages of every size class, with priorities and lifetimes; a stream alongside.
        let mut sent = Vec::new();
        for i in 0..200u32 {
            let payload: Vec<u8> = (0..(i * 97) % 20_000).map(|k| (k ^ i) as u8).collect();
            let props = MessageProps {
                substream: u64::from(i % 3),
                priority: Priority::new((i % 4) as u8).unwrap(),
                lifetime: (i % 5 == 0).then_some(Duration::from_secs(60)),
                ..Default::default()
            };
            client.send_message(payload.clone(), props).await.unwrap();
            sent.push(payload);
        }
        let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
        let mut stream = client.open_stream().await.unwrap();
        let writer = {
            let data = data.clone();
            tokio::spawn(async move {
                stream.write_all(&data).await.unwrap();
                stream.shutdown().await.unwrap();
            })
        };
        let mut got = Vec::new();
        for _ in 0..sent.len() {
            got.push(server.recv_message().await.unwrap().payload.to_vec());
        }
        // Priorities may reorder messages queued together: compare as sets of payloads.
        let mut a = got.clone();
        let mut b = sent.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        let mut incoming = server.accept_stream().await.unwrap();
        let mut read = Vec::new();
        incoming.read_to_end(&mut read).await.unwrap();
        writer.await.unwrap();
        assert_eq!(Sha256::digest(&read), Sha256::digest(&data));
        let mut sent_statuses = 0;
        while let Ok(Some((_, status))) =
            tokio::time::timeout(Duration::from_millis(200), client.next_message_status())
                .await
                .map(|r| r.ok())
        {
            assert_eq!(status, MessageStatus::Sent);
            sent_statuses += 1;
            if sent_statuses == sent.len() {
                break;
            }
        }
        assert_eq!(sent_statuses, sent.len());
        // Answers back.
        server
            .send_message(b"reply".to_vec(), MessageProps::default())
            .await
            .unwrap();
        assert_eq!(&client.recv_message().await.unwrap().payload[..], b"reply");
        assert!(client.update_tls_keys(true));
        server
            .send_message(b"after the key update".to_vec(), MessageProps::default())
            .await
            .unwrap();
        assert_eq!(
            &client.recv_message().await.unwrap().payload[..],
            b"after the key update"
        );

        client.close().await;
        assert!(matches!(
            server.closed().await,
            ConnectionError::ApplicationClosed { code: 0, .. }
        ));
        relay_task.await.unwrap();
        let stats = client.stats().tls.unwrap();
        assert!(
            stats.records_sealed > 0 && stats.key_updates_sent >= 1,
            "{stats:?}"
        );

        // The wire: a ClientHello, then records only, that tile the stream; no plaintext.
        let wire = up.lock().unwrap().clone();
        assert_eq!(&wire[..3], &[0x16, 0x03, 0x01]);
        let mut at = 0;
        let mut application_records = 0;
        while at + 5 <= wire.len() {
            let len = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
            assert!(len <= 16384 + 256, "record of {len} bytes");
            if wire[at] == 0x17 {
                assert_eq!(&wire[at + 1..at + 3], &[3, 3]);
                application_records += 1;
            }
            at += 5 + len;
        }
        assert_eq!(at, wire.len(), "records do not tile the stream");
        assert!(application_records > 90, "{application_records}");
        let marker = &data[1000..1040];
        assert!(!wire.windows(marker.len()).any(|w| w == marker));
    })
    .await;
}

#[tokio::test]
async fn a_refused_certificate_fails_the_connect_with_a_typed_error() {
    no_hang(async {
        let (client_config, server_config) = configs(false);
        let ep = Endpoint::bind("[::1]:0", server_config).await.unwrap();
        let addr = ep.local_addr().unwrap();
        let (client, server) = tokio::join!(Connection::connect(addr, client_config), ep.accept());
        match client {
            Err(ConnectError::Transport(TransportError::Tls(TlsFailure::Certificate))) => {}
            other => panic!("{other:?}"),
        }
        let server = server.unwrap();
        assert!(matches!(
            server.established().await,
            Err(ConnectionError::Transport(TransportError::Tls(
                TlsFailure::AlertReceived(_)
            )))
        ));
    })
    .await;
}

/// A stock TLS 1.2-only client (`openssl s_client -tls1_2`): the server refuses it with
/// protocol_version and the application learns why (`TlsFailure::Incompatible`), not just
/// that the handshake failed.
#[tokio::test]
async fn a_tls12_only_client_is_refused_as_incompatible() {
    no_hang(async {
        let (_, server_config) = configs(false);
        let ep = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
        let addr = ep.local_addr().unwrap();
        let client = tokio::task::spawn_blocking(move || {
            std::process::Command::new("openssl")
                .args(["s_client", "-tls1_2", "-connect", &addr.to_string()])
                .stdin(std::process::Stdio::null())
                .output()
                .expect("openssl runs")
        });
        let server = ep.accept().await.unwrap();
        assert_eq!(
            server.established().await,
            Err(ConnectionError::Transport(TransportError::Tls(
                TlsFailure::Incompatible
            )))
        );
        let out = client.await.unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("protocol version"),
            "openssl did not get protocol_version: {stderr}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_tls_side_that_does_not_fit_is_refused() {
    let (client_config, server_config) = configs(true);
    assert!(matches!(
        Endpoint::bind("127.0.0.1:0", client_config).await,
        Err(ConnectError::Config(_))
    ));
    assert!(matches!(
        Connection::connect("127.0.0.1:9", server_config).await,
        Err(ConnectError::Config(_))
    ));
}

#[tokio::test]
async fn a_tls_side_and_a_cleartext_side_tell_why_they_cannot_talk() {
    // A TLS client to a cleartext server: the server's first frame is not a TLS record (the
    // client fails the connect with `NotTls`), and the server sees a TLS record where its
    // first frame was due.
    no_hang(async {
        let (client_config, _) = configs(true);
        let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
            .await
            .unwrap();
        let addr = ep.local_addr().unwrap();
        let (client, server) = tokio::join!(Connection::connect(addr, client_config), ep.accept());
        match client {
            Err(ConnectError::Transport(TransportError::Tls(TlsFailure::NotTls))) => {}
            other => panic!("{other:?}"),
        }
        let server = server.unwrap();
        match server.closed().await {
            ConnectionError::ProtocolViolation(ProtocolError::Frame(FrameError::TlsRecord)) => {}
            other => panic!("{other:?}"),
        }
    })
    .await;
    // A cleartext client to a TLS server: the server fails with `NotTls` and answers with an
    // alert in the clear; the client sends a message and closes gracefully, and learns that
    // nothing it sent reached a session — from the alert (a TLS record where the first frame
    // was due), or, if its close came first, from the server's end without a single frame.
    // Never a clean close.
    no_hang(async {
        let (_, server_config) = configs(true);
        let ep = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
        let addr = ep.local_addr().unwrap();
        let (client, server) = tokio::join!(
            Connection::connect(addr, ConnectionConfig::default()),
            ep.accept()
        );
        let client = client.unwrap();
        client
            .send_message(b"hello".to_vec(), MessageProps::default())
            .await
            .unwrap();
        client.close().await;
        match client.close_reason() {
            Some(
                ConnectionError::ProtocolViolation(ProtocolError::Frame(FrameError::TlsRecord))
                | ConnectionError::Transport(TransportError::NothingReceived),
            ) => {}
            other => panic!("{other:?}"),
        }
        let server = server.unwrap();
        match server.established().await {
            Err(ConnectionError::Transport(TransportError::Tls(TlsFailure::NotTls))) => {}
            other => panic!("{other:?}"),
        }
    })
    .await;
}

/// A connection idle for `ConnectionConfig::release_idle_after` gives back the memory its
/// burst grew (read and write buffers, receive chunks, TLS buffers: `ConnectionStats::
/// buffer_bytes`), in cleartext and inside TLS, and carries the next messages both ways as
/// before. The waits are bounded polls of the figure, not timing assertions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_gives_back_its_buffers() {
    for tls in [false, true] {
        let (mut client_config, mut server_config) = if tls {
            configs(true)
        } else {
            (ConnectionConfig::default(), ConnectionConfig::default())
        };
        for c in [&mut client_config, &mut server_config] {
            c.release_idle_after = Some(Duration::from_millis(100));
        }
        let ep = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
        let addr = ep.local_addr().unwrap();
        let (client, server) = tokio::join!(Connection::connect(addr, client_config), ep.accept());
        let (client, server) = (client.unwrap(), server.unwrap());
        // A burst: 8 MiB of 4 KiB messages, each checked.
        let sender = client.clone();
        let send = tokio::spawn(async move {
            for i in 0..2048u32 {
                let payload = Bytes::from(i.to_be_bytes().repeat(1024));
                sender
                    .send_message(payload, MessageProps::default())
                    .await
                    .unwrap();
            }
        });
        let held = |c: &Connection| c.stats().buffer_bytes;
        // What the receiver's buffers held during the burst, sampled (a pause of the test's
        // thread may let the release run in between, so the largest sample counts).
        let mut most = 0;
        no_hang(async {
            for i in 0..2048u32 {
                let m = server.recv_message().await.unwrap();
                assert_eq!(
                    &m.payload[..],
                    &i.to_be_bytes().repeat(1024)[..],
                    "tls {tls}"
                );
                if i % 64 == 0 {
                    most = most.max(held(&server));
                }
            }
        })
        .await;
        send.await.unwrap();
        assert!(
            most >= 64 * 1024,
            "tls {tls}: at most {most} B in the burst"
        );
        // Idle: both ends come down to a few KiB (bounded wait).
        let mut polls = 0;
        while held(&client) > 8 * 1024 || held(&server) > 8 * 1024 {
            polls += 1;
            assert!(
                polls < 500,
                "tls {tls}: still {} and {} B",
                held(&client),
                held(&server)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Traffic again, both ways.
        no_hang(async {
            client
                .send_message(Bytes::from(vec![7; 50_000]), MessageProps::default())
                .await
                .unwrap();
            assert_eq!(
                server.recv_message().await.unwrap().payload,
                vec![7; 50_000]
            );
            server
                .send_message(Bytes::from_static(b"back"), MessageProps::default())
                .await
                .unwrap();
            assert_eq!(&client.recv_message().await.unwrap().payload[..], b"back");
        })
        .await;
        client.close().await;
    }
}

/// A client that begins a TLS handshake and says no more holds a few KiB of the server's
/// buffers until the handshake times out, not a whole read buffer: the first reads are
/// small, and grow only once traffic fills them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_holds_little_of_the_servers_memory() {
    let (_, server_config) = configs(true);
    let ep = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
    let addr = ep.local_addr().unwrap();
    let (raw, conn) = tokio::join!(TcpStream::connect(addr), ep.accept());
    let (mut raw, conn) = (raw.unwrap(), conn.unwrap());
    // The start of a handshake record of 512 bytes, then nothing.
    raw.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    // Bounded wait for the server's read (its buffers are counted once it read).
    let mut polls = 0;
    while conn.stats().buffer_bytes == 0 {
        polls += 1;
        assert!(polls < 500, "the server never read");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = conn.stats().buffer_bytes;
    assert!(held <= 8 * 1024, "{held} B held for 6 bytes");
}
