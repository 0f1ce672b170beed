//! The tunnel's forwarding over real squarepeg connections (kernel TCP on loopback, TLS) with
//! channel devices: addresses, routing between clients, refusals, and what happens to bad
//! packets from either side. No privileges needed; the TUN devices and the host set-up are
//! tested by `peg tunnel`'s lab tests (squarepeg-cli/tests/tunnel.rs).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use etherparse::{PacketBuilder, TcpOptionElement};
use squarepeg::{Connection, ConnectionConfig, Endpoint, MessageProps, Priority};
use squarepeg_tunnel::control::{CONTROL_SUBSTREAM, PACKET_SUBSTREAM, VERSION};
use squarepeg_tunnel::memory::{MemoryHost, memory_device};
use squarepeg_tunnel::{
    AddressPool, Assignment, Control, Server, TunnelConfig, TunnelError, TunnelStats,
    client_handshake, run_client,
};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

fn tls_configs() -> (ConnectionConfig, ConnectionConfig) {
    use squarepeg::tls::config;
    let made = config::self_signed(&["localhost".to_string()]).unwrap();
    let server = config::server_config(made.cert_pem.as_bytes(), made.key_pem.as_bytes()).unwrap();
    let client = config::client_config(config::Trust::PinnedSha256(made.fingerprint)).unwrap();
    (
        ConnectionConfig::default().with_tls_server(server),
        ConnectionConfig::default().with_tls_client(client, "localhost"),
    )
}

fn udp(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    let src: std::net::Ipv4Addr = src.parse().unwrap();
    let dst: std::net::Ipv4Addr = dst.parse().unwrap();
    let mut out = Vec::new();
    PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .udp(40000, 5004)
        .write(&mut out, payload)
        .unwrap();
    out
}

fn syn(src: &str, dst: &str, mss: u16) -> Vec<u8> {
    let src: std::net::Ipv4Addr = src.parse().unwrap();
    let dst: std::net::Ipv4Addr = dst.parse().unwrap();
    let mut out = Vec::new();
    PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .tcp(40000, 80, 1, 65535)
        .syn()
        .options(&[TcpOptionElement::MaximumSegmentSize(mss)])
        .unwrap()
        .write(&mut out, &[])
        .unwrap();
    out
}

/// A server on loopback with a channel device; returns its address, the server and the
/// host side of its device.
async fn server(
    subnet: &str,
    config: TunnelConfig,
    conn_config: ConnectionConfig,
) -> (
    SocketAddr,
    Arc<Server<squarepeg_tunnel::memory::MemoryDevice>>,
    MemoryHost,
) {
    let (device, host) = memory_device(64);
    let pool = AddressPool::new(&[subnet.parse().unwrap()]).unwrap();
    let server = Server::new(Arc::new(device), pool, config, None);
    let ep = Endpoint::bind("127.0.0.1:0", conn_config).await.unwrap();
    let addr = ep.local_addr().unwrap();
    tokio::spawn(server.clone().run_device());
    let s = server.clone();
    tokio::spawn(async move {
        while let Ok(conn) = ep.accept().await {
            tokio::spawn(s.clone().serve(conn, |_| {}));
        }
    });
    (addr, server, host)
}

struct Client {
    conn: Connection,
    host: MemoryHost,
    assignment: Assignment,
    stats: Arc<TunnelStats>,
    run: tokio::task::JoinHandle<Result<(), TunnelError>>,
}

async fn client(addr: SocketAddr, conn_config: ConnectionConfig) -> Result<Client, TunnelError> {
    let conn = Connection::connect(addr, conn_config).await.unwrap();
    let assignment = timeout(WAIT, client_handshake(&conn, b"")).await.unwrap()?;
    let (device, host) = memory_device(64);
    let stats = Arc::new(TunnelStats::default());
    let run = {
        let (conn, assignment, stats) = (conn.clone(), assignment.clone(), stats.clone());
        tokio::spawn(async move {
            run_client(
                conn,
                Arc::new(device),
                &assignment,
                &TunnelConfig::default(),
                stats,
            )
            .await
        })
    };
    Ok(Client {
        conn,
        host,
        assignment,
        stats,
        run,
    })
}

async fn next(host: &mut MemoryHost) -> Vec<u8> {
    timeout(WAIT, host.from_tunnel.recv())
        .await
        .expect("a packet in time")
        .unwrap()
}

/// Waits until `cond` holds (the counters are updated by other tasks).
async fn until(mut cond: impl FnMut() -> bool) {
    timeout(WAIT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("condition in time");
}

#[tokio::test]
async fn clients_get_addresses_and_packets_are_routed() {
    let (server_conf, client_conf) = tls_configs();
    let (addr, server, mut server_host) =
        server("10.99.0.0/24", TunnelConfig::default(), server_conf).await;
    let a = client(addr, client_conf.clone()).await.unwrap();
    let mut b = client(addr, client_conf).await.unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(a.assignment.addresses[0].client, ip("10.99.0.2"));
    assert_eq!(b.assignment.addresses[0].client, ip("10.99.0.3"));
    assert_eq!(a.assignment.addresses[0].server, ip("10.99.0.1"));
    assert_eq!(a.assignment.mtu, 1380);
    assert_eq!(server.clients(), 2);

    // Client → server's host, unchanged.
    let p = udp("10.99.0.2", "10.99.0.1", b"to the server");
    a.host.to_tunnel.send(p.clone()).await.unwrap();
    assert_eq!(next(&mut server_host).await, p);
    // Server's host → the client that has the destination.
    let p = udp("10.99.0.1", "10.99.0.3", b"to b");
    server_host.to_tunnel.send(p.clone()).await.unwrap();
    assert_eq!(next(&mut b.host).await, p);
    // Nobody has .77.
    server_host
        .to_tunnel
        .send(udp("10.99.0.1", "10.99.0.77", b"x"))
        .await
        .unwrap();
    until(|| server.stats().snapshot().no_route == 1).await;

    // Tunneled SYNs get an MSS that fits the tunnel (1380 - 40), both ways.
    a.host
        .to_tunnel
        .send(syn("10.99.0.2", "10.99.0.1", 1460))
        .await
        .unwrap();
    let got = next(&mut server_host).await;
    assert_eq!(got, {
        let mut expect = syn("10.99.0.2", "10.99.0.1", 1340);
        // Same packet but for the MSS and the checksum: compare with a fresh build.
        expect.truncate(got.len());
        expect
    });
    assert_eq!(a.stats.snapshot().mss_clamped, 1);

    // Bad packets from the device are dropped and counted; the tunnel goes on.
    a.host.to_tunnel.send(vec![0x45, 0, 0]).await.unwrap();
    a.host
        .to_tunnel
        .send(udp("10.99.0.2", "10.99.0.1", &[0; 2000]))
        .await
        .unwrap();
    let p = udp("10.99.0.2", "10.99.0.1", b"still here");
    a.host.to_tunnel.send(p.clone()).await.unwrap();
    assert_eq!(next(&mut server_host).await, p);
    let s = a.stats.snapshot();
    assert_eq!((s.malformed_from_device, s.oversize_from_device), (1, 1));

    // A client that leaves gives its address back (a_full_pool_refuses_with_a_reason
    // checks that the next client gets it).
    a.conn.close().await;
    a.run.await.unwrap().unwrap();
    until(|| server.clients() == 1).await;
    b.conn.close().await;
    until(|| server.clients() == 0).await;
}

#[tokio::test]
async fn a_full_pool_refuses_with_a_reason() {
    let (addr, server, _host) = server(
        "10.98.0.0/30",
        TunnelConfig::default(),
        ConnectionConfig::default(),
    )
    .await;
    let first = client(addr, ConnectionConfig::default()).await.unwrap();
    match client(addr, ConnectionConfig::default()).await {
        Err(TunnelError::Refused(reason)) => assert!(reason.contains("no free"), "{reason}"),
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a /30 has room for one client"),
    }
    assert_eq!(server.stats().snapshot().clients_refused, 1);
    first.conn.close().await;
    until(|| server.clients() == 0).await;
    // The address is free again.
    let again = client(addr, ConnectionConfig::default()).await.unwrap();
    assert_eq!(
        again.assignment.addresses[0].client,
        "10.98.0.2".parse::<IpAddr>().unwrap()
    );
}

fn packet_props() -> MessageProps {
    MessageProps {
        substream: PACKET_SUBSTREAM,
        ..MessageProps::default()
    }
}

#[tokio::test]
async fn a_peer_sending_garbage_is_counted_and_survived() {
    // A hand-made client: the hello, then malformed, oversize and spoofed packets.
    let (addr, server, mut server_host) = server(
        "10.97.0.0/24",
        TunnelConfig::default(),
        ConnectionConfig::default(),
    )
    .await;
    let raw = Connection::connect(addr, ConnectionConfig::default())
        .await
        .unwrap();
    let hello = MessageProps {
        substream: CONTROL_SUBSTREAM,
        priority: Priority::HIGHEST,
        ..MessageProps::default()
    };
    raw.send_message(
        Control::Hello {
            version: VERSION,
            token: vec![],
        }
        .encode(),
        hello,
    )
    .await
    .unwrap();
    let assign = timeout(WAIT, raw.recv_message()).await.unwrap().unwrap();
    assert!(matches!(
        Control::decode(&assign.payload).unwrap(),
        Control::Assign { .. }
    ));
    for bad in [
        vec![],
        vec![0x60; 10],
        vec![0xff; 100],
        udp("10.97.0.2", "10.97.0.1", &[0; 1400]), // beyond the MTU
        udp("10.97.0.9", "10.97.0.1", b"spoofed"), // not its address
        udp("10.97.0.2", "10.97.0.1", b"x")[..25].to_vec(), // cut short
    ] {
        raw.send_message(bad, packet_props()).await.unwrap();
    }
    let good = udp("10.97.0.2", "10.97.0.1", b"good");
    raw.send_message(good.clone(), packet_props())
        .await
        .unwrap();
    assert_eq!(next(&mut server_host).await, good);
    let s = server.stats().snapshot();
    assert_eq!(s.malformed_from_peer, 4, "{s}");
    assert_eq!(s.oversize_from_peer, 1, "{s}");
    assert_eq!(s.misaddressed_from_peer, 1, "{s}");
    assert_eq!(s.packets_received, 1, "{s}");

    // A hand-made server does the same to a client.
    let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
        .await
        .unwrap();
    let fake = ep.local_addr().unwrap();
    let fake_server = tokio::spawn(async move {
        let conn = ep.accept().await.unwrap();
        let hello = conn.recv_message().await.unwrap();
        assert_eq!(
            Control::decode(&hello.payload).unwrap(),
            Control::Hello {
                version: VERSION,
                token: vec![]
            }
        );
        let assign = Control::Assign {
            version: VERSION,
            mtu: 1000,
            addresses: vec![squarepeg_tunnel::Assigned {
                client: "10.96.0.2".parse().unwrap(),
                prefix_len: 24,
                server: "10.96.0.1".parse().unwrap(),
            }],
        };
        conn.send_message(assign.encode(), MessageProps::default())
            .await
            .unwrap();
        for bad in [
            vec![0x45; 3],
            udp("10.96.0.1", "10.96.0.2", &[0; 1000]), // beyond the assigned MTU
            udp("10.96.0.1", "10.96.0.5", b"for someone else"),
            vec![0x30; 40],
        ] {
            conn.send_message(bad, packet_props()).await.unwrap();
        }
        conn.send_message(udp("10.96.0.1", "10.96.0.2", b"good"), packet_props())
            .await
            .unwrap();
        conn.closed().await;
    });
    let mut c = client(fake, ConnectionConfig::default()).await.unwrap();
    assert_eq!(c.assignment.mtu, 1000);
    assert_eq!(
        next(&mut c.host).await,
        udp("10.96.0.1", "10.96.0.2", b"good")
    );
    let s = c.stats.snapshot();
    assert_eq!(
        (
            s.malformed_from_peer,
            s.oversize_from_peer,
            s.misaddressed_from_peer
        ),
        (2, 1, 1),
        "{s}"
    );
    c.conn.close().await;
    c.run.await.unwrap().unwrap();
    fake_server.await.unwrap();
}

#[tokio::test]
async fn a_server_refuses_a_client_without_a_hello() {
    let mut config = TunnelConfig::default();
    config.hello_timeout = Duration::from_millis(300);
    let (addr, server, _host) = server("10.95.0.0/24", config, ConnectionConfig::default()).await;
    // A packet instead of a hello.
    let raw = Connection::connect(addr, ConnectionConfig::default())
        .await
        .unwrap();
    raw.send_message(udp("10.95.0.2", "10.95.0.1", b"x"), packet_props())
        .await
        .unwrap();
    let refusal = timeout(WAIT, raw.recv_message()).await.unwrap().unwrap();
    assert!(matches!(
        Control::decode(&refusal.payload).unwrap(),
        Control::Refuse { .. }
    ));
    // Silence.
    let silent = Connection::connect(addr, ConnectionConfig::default())
        .await
        .unwrap();
    let refusal = timeout(WAIT, silent.recv_message()).await.unwrap().unwrap();
    assert_eq!(
        Control::decode(&refusal.payload).unwrap(),
        Control::Refuse {
            reason: "no hello in time".into()
        }
    );
    assert_eq!(server.stats().snapshot().clients_refused, 2);
    assert_eq!(server.clients(), 0);
}

#[tokio::test]
async fn a_client_refuses_addresses_that_would_take_over_its_routing() {
    for (client, prefix, server) in [
        ("10.0.0.2", 4, "10.0.0.1"), // /4 routes a sixteenth of IPv4 into the tunnel
        ("10.0.0.2", 24, "10.0.0.2"), // both ends the same
        ("10.0.0.2", 24, "10.0.1.1"), // not one subnet
        ("10.0.0.0", 24, "10.0.0.1"), // the network address
        ("fd00::2", 16, "fd00::1"),  // too wide for IPv6
    ] {
        let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
            .await
            .unwrap();
        let addr = ep.local_addr().unwrap();
        let (client, server): (IpAddr, IpAddr) = (client.parse().unwrap(), server.parse().unwrap());
        tokio::spawn(async move {
            let conn = ep.accept().await.unwrap();
            let _hello = conn.recv_message().await.unwrap();
            let assign = Control::Assign {
                version: VERSION,
                mtu: 1380,
                addresses: vec![squarepeg_tunnel::Assigned {
                    client,
                    prefix_len: prefix,
                    server,
                }],
            };
            conn.send_message(assign.encode(), MessageProps::default())
                .await
                .unwrap();
            conn.closed().await;
        });
        match client_side_handshake(addr).await {
            Err(TunnelError::Protocol(why)) => assert!(why.contains("assigned"), "{why}"),
            other => panic!("{client}/{prefix} server {server}: accepted ({other:?})"),
        }
    }
}

async fn client_side_handshake(addr: SocketAddr) -> Result<Assignment, TunnelError> {
    let conn = Connection::connect(addr, ConnectionConfig::default())
        .await
        .unwrap();
    let r = timeout(WAIT, client_handshake(&conn, b"")).await.unwrap();
    conn.close().await;
    r
}

#[tokio::test]
async fn a_server_with_a_token_serves_only_clients_that_have_it() {
    let (device, _host) = memory_device(8);
    let pool = AddressPool::new(&["10.94.0.0/24".parse().unwrap()]).unwrap();
    let server = Server::new(
        Arc::new(device),
        pool,
        TunnelConfig::default(),
        Some(b"s3cret".to_vec()),
    );
    let (server_conf, client_conf) = tls_configs();
    let ep = Endpoint::bind("127.0.0.1:0", server_conf).await.unwrap();
    let addr = ep.local_addr().unwrap();
    let s = server.clone();
    tokio::spawn(async move {
        while let Ok(conn) = ep.accept().await {
            tokio::spawn(s.clone().serve(conn, |_| {}));
        }
    });
    for (token, ok) in [
        (&b""[..], false),
        (b"s3cre", false),
        (b"s3creT", false),
        (b"s3cret", true),
    ] {
        let conn = Connection::connect(addr, client_conf.clone())
            .await
            .unwrap();
        let r = timeout(WAIT, client_handshake(&conn, token)).await.unwrap();
        match (r, ok) {
            (Ok(a), true) => assert_eq!(
                a.addresses[0].client,
                "10.94.0.2".parse::<IpAddr>().unwrap()
            ),
            (Err(TunnelError::Refused(why)), false) => assert!(why.contains("token"), "{why}"),
            (other, _) => panic!("token {token:?}: {other:?}"),
        }
    }
    assert_eq!(server.stats().snapshot().clients_refused, 3);
}
