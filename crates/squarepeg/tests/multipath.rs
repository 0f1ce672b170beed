//! One session over several kernel-TCP connections through the tokio API, on loopback: the
//! client's second path joins by TLS resumption, both carry the session, and every message
//! and stream byte arrives once. (Failover under blackholes and resets is in the lab:
//! `squarepeg-experiments`'s failover test, and in virtual time in
//! `squarepeg-connection`'s multipath tests.)

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use squarepeg::tls::config::{self, Trust};
use squarepeg::{
    Connection, ConnectionConfig, MessageProps, MultipathEndpoint, MultipathOptions, PathAddress,
    PathPolicy,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "peg.test";

fn configs() -> (ConnectionConfig, ConnectionConfig) {
    let cert = config::self_signed(&[NAME.to_string()]).unwrap();
    let server = ConnectionConfig::default().with_tls_server(
        config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
    );
    let client = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap(),
        NAME,
    );
    (server, client)
}

/// A multipath endpoint on 127.0.0.1 and `second` (any port each), with the server's
/// configuration; the client's to connect with.
async fn endpoint_on(second: &str) -> (MultipathEndpoint, ConnectionConfig) {
    let (server_config, client_config) = configs();
    let addrs: [SocketAddr; 2] = [
        "127.0.0.1:0".parse().unwrap(),
        format!("{second}:0").parse().unwrap(),
    ];
    let endpoint = MultipathEndpoint::bind(&addrs, server_config, MultipathOptions::default())
        .await
        .unwrap();
    (endpoint, client_config)
}

/// A multipath session to `addr` alone, with the default options (further paths come from
/// the server's announcements).
async fn connect_to(addr: SocketAddr, client_config: ConnectionConfig) -> Connection {
    Connection::connect_multipath(
        &[PathAddress::to(addr)],
        client_config,
        MultipathOptions::default(),
    )
    .await
    .unwrap()
}

/// Waits (at most 3 s) until `conn` has `n` usable paths.
async fn wait_for_usable_paths(conn: &Connection, n: usize) {
    for _ in 0..300 {
        if conn.paths().iter().filter(|p| p.usable).count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not {n} usable paths: {:?}", conn.paths());
}

fn stream_byte(i: usize) -> u8 {
    (i.wrapping_mul(2654435761) >> 11) as u8
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_loopback_paths_carry_one_session() {
    let (mut endpoint, client_config) = endpoint_on("127.0.0.2").await;
    let local = endpoint.local_addrs().to_vec();
    let server = tokio::spawn(async move {
        let conn = endpoint.accept().await.unwrap();
        let mut numbers = BTreeSet::new();
        for _ in 0..500 {
            let m = conn.recv_message().await.unwrap();
            let n = u64::from_be_bytes(m.payload[..8].try_into().unwrap());
            assert!(numbers.insert(n), "message {n} twice");
        }
        let mut stream = conn.accept_stream().await.unwrap();
        let mut data = Vec::new();
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        let paths = conn.paths();
        conn.close().await;
        (numbers, data, paths, endpoint.join_stats())
    });
    let paths = [PathAddress::to(local[0]), PathAddress::to(local[1])];
    let conn = Connection::connect_multipath(&paths, client_config, MultipathOptions::default())
        .await
        .unwrap();
    // The second path joins once the first connection has brought tickets.
    wait_for_usable_paths(&conn, 2).await;
    for n in 0..500u64 {
        let mut payload = vec![7u8; 200];
        payload[..8].copy_from_slice(&n.to_be_bytes());
        let props = MessageProps {
            path: Some(if n % 2 == 0 {
                PathPolicy::RoundRobin
            } else {
                PathPolicy::Redundant
            }),
            ..MessageProps::default()
        };
        conn.send_message(payload, props).await.unwrap();
    }
    let mut stream = conn.open_stream().await.unwrap();
    let data: Vec<u8> = (0..4 << 20).map(stream_byte).collect();
    stream.write_all(&data).await.unwrap();
    stream.finish().unwrap();
    let (numbers, received, server_paths, joins) =
        tokio::time::timeout(Duration::from_secs(60), server)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(numbers.len(), 500);
    assert_eq!(received.len(), data.len());
    assert!(received == data, "stream bytes differ");
    assert_eq!(joins.joins_accepted, 1, "{joins:?}");
    assert_eq!(server_paths.len(), 2, "{server_paths:?}");
    // Both carry the session: each gets half the round-robin messages and a copy of every
    // redundant one (about 80 kB; how the stream spreads depends on which socket drains
    // first, on loopback often one).
    assert!(
        server_paths.iter().all(|p| p.received > 60_000),
        "both paths carry the session: {server_paths:?}"
    );
    conn.closed().await;
}

/// A refused certificate on the first path fails the connect at once with its reason (no
/// session to wait for joins to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_certificate_fails_the_connect() {
    let (server_config, _) = configs();
    let other = config::self_signed(&[NAME.to_string()]).unwrap();
    let client_config = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(other.fingerprint)).unwrap(),
        NAME,
    );
    let addrs: [SocketAddr; 1] = ["127.0.0.1:0".parse().unwrap()];
    let endpoint = MultipathEndpoint::bind(&addrs, server_config, MultipathOptions::default())
        .await
        .unwrap();
    let paths = [PathAddress::to(endpoint.local_addrs()[0])];
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        Connection::connect_multipath(&paths, client_config, MultipathOptions::default()),
    )
    .await
    .expect("the connect ends at once");
    match result {
        Err(squarepeg::ConnectError::Transport(squarepeg::TransportError::Tls(
            squarepeg::TlsFailure::Certificate,
        ))) => {}
        other => panic!("{other:?}"),
    }
}

/// A client given one server address learns the server's other one inside the session and
/// opens a second path to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_joins_the_addresses_the_server_announces() {
    let (mut endpoint, client_config) = endpoint_on("127.0.0.3").await;
    let first = endpoint.local_addrs()[0];
    let second = endpoint.local_addrs()[1];
    let accepting = tokio::spawn(async move {
        let conn = endpoint.accept().await.unwrap();
        (conn, endpoint)
    });
    let conn = connect_to(first, client_config).await;
    let (server, endpoint) = accepting.await.unwrap();
    wait_for_usable_paths(&conn, 2).await;
    assert_eq!(endpoint.join_stats().joins_accepted, 1);
    // The second path carries the session: a message pinned to it arrives.
    let second_path = conn.paths()[1].id;
    let props = MessageProps {
        path: Some(PathPolicy::Pinned(second_path.0)),
        ..MessageProps::default()
    };
    conn.send_message(b"over the announced address".to_vec(), props)
        .await
        .unwrap();
    let m = server.recv_message().await.unwrap();
    assert_eq!(&m.payload[..], b"over the announced address");
    let _ = second;
    conn.close().await;
}

/// A server session admits at most `max_paths` connections: a client with three paths to
/// a server that allows two keeps two (the third join is closed, and retried with backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_to_the_servers_path_limit() {
    let (server_config, client_config) = configs();
    let addrs: [SocketAddr; 3] = [
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.4:0".parse().unwrap(),
        "127.0.0.5:0".parse().unwrap(),
    ];
    let mut options = MultipathOptions::default();
    options.max_paths = 2;
    let mut endpoint = MultipathEndpoint::bind(&addrs, server_config, options)
        .await
        .unwrap();
    let paths: Vec<PathAddress> = endpoint
        .local_addrs()
        .iter()
        .map(|&a| PathAddress::to(a))
        .collect();
    let accepting = tokio::spawn(async move {
        let conn = endpoint.accept().await.unwrap();
        (conn, endpoint)
    });
    let conn = Connection::connect_multipath(&paths, client_config, MultipathOptions::default())
        .await
        .unwrap();
    let (server, endpoint) = accepting.await.unwrap();
    // Every join is tried (tickets arrive, refused attempts back off): the server never
    // holds more than two connections, and holds two.
    let mut most = 0;
    for _ in 0..150 {
        let n = server.paths().len();
        assert!(n <= 2, "{:?}", server.paths());
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        most,
        2,
        "{:?} closed {:?}; joins {:?}; client {:?} {:?} {:?}",
        server.paths(),
        server.closed_paths(),
        endpoint.join_stats(),
        conn.paths(),
        conn.closed_paths(),
        conn.multipath_stats()
    );
    // The third path did join (the registry took its ticket) and was closed for the limit.
    assert!(conn.multipath_stats().unwrap().paths_added >= 3);
    let _ = endpoint.join_stats();
    // The session works over what it has.
    conn.send_message(b"still here".to_vec(), MessageProps::default())
        .await
        .unwrap();
    assert_eq!(
        &server.recv_message().await.unwrap().payload[..],
        b"still here"
    );
    conn.close().await;
}

/// An interactive session: a message, a second of nothing, another… (as `peg connect`
/// sends lines). Idle paths stay up (probes keep them), every message arrives, and the
/// close ends both sides cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_keeps_its_paths_and_closes_cleanly() {
    let (mut endpoint, client_config) = endpoint_on("127.0.0.4").await;
    let first = endpoint.local_addrs()[0];
    let server = tokio::spawn(async move {
        let conn = endpoint.accept().await.unwrap();
        let mut got = Vec::new();
        while let Ok(m) = conn.recv_message().await {
            got.push(m.payload.to_vec());
        }
        (got, conn.close_reason(), endpoint)
    });
    let conn = connect_to(first, client_config).await;
    wait_for_usable_paths(&conn, 2).await;
    for i in 0..3u8 {
        conn.send_message(vec![i; 10], MessageProps::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(
            conn.paths().iter().filter(|p| p.usable).count(),
            2,
            "after message {i}: {:?} closed {:?}",
            conn.paths(),
            conn.closed_paths()
        );
    }
    conn.close().await;
    let (got, reason, _endpoint) = server.await.unwrap();
    assert_eq!(got, [vec![0; 10], vec![1; 10], vec![2; 10]], "{reason:?}");
}

/// The single-connection side's view: the peer closed with PROTOCOL_VIOLATION and said why.
fn told_not_multipath(seen: squarepeg::ConnectionError) {
    assert!(
        matches!(&seen, squarepeg::ConnectionError::PeerError { code: 0x08, reason } if reason.contains("multipath")),
        "{seen:?}"
    );
}

/// A single-connection client at a multipath endpoint, and a multipath client at a
/// single-connection endpoint: the multipath side sees the peer's first frame is not its
/// PATH_PROBE and closes with a protocol violation (not a path timeout) that the other side
/// is told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_and_multipath_ends_refuse_each_other_at_once() {
    use squarepeg::{ConnectionError, Endpoint, ProtocolError};
    // A plain client, a multipath server.
    let (server_config, client_config) = configs();
    let mut endpoint = MultipathEndpoint::bind(
        &["127.0.0.1:0".parse().unwrap()],
        server_config,
        MultipathOptions::default(),
    )
    .await
    .unwrap();
    let addr = endpoint.local_addrs()[0];
    let plain = Connection::connect(addr, client_config).await.unwrap();
    let server = endpoint.accept().await.unwrap();
    // The plain client's session speaks first (its flow-control frames), so the server may
    // have closed before this message goes: only the endings below are the test.
    let _ = plain
        .send_message(b"hello".to_vec(), MessageProps::default())
        .await;
    assert_eq!(
        server.closed().await,
        ConnectionError::ProtocolViolation(ProtocolError::NotMultipath)
    );
    told_not_multipath(plain.closed().await);
    // A multipath client, a plain server.
    let (server_config, client_config) = configs();
    let plain_server = Endpoint::bind("127.0.0.1:0", server_config).await.unwrap();
    let addr = plain_server.local_addr().unwrap();
    let accepting = tokio::spawn(async move { plain_server.accept().await.unwrap() });
    // The server's session speaks first (its flow-control frames): the client may find out
    // before its connect returns.
    let connected = Connection::connect_multipath(
        &[PathAddress::to(addr)],
        client_config,
        MultipathOptions::default(),
    )
    .await;
    let server = accepting.await.unwrap();
    let not_multipath = ConnectionError::ProtocolViolation(ProtocolError::NotMultipath);
    match connected {
        Ok(client) => {
            let _ = server
                .send_message(b"hello".to_vec(), MessageProps::default())
                .await;
            assert_eq!(client.closed().await, not_multipath);
        }
        Err(e) => assert!(
            matches!(&e, squarepeg::ConnectError::Closed(c) if *c == not_multipath),
            "{e:?}"
        ),
    }
    told_not_multipath(server.closed().await);
}
