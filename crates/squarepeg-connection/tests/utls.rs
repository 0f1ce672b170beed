//! TLS over the userspace TCP's uTCP interface (Minion §6): two connection cores on
//! simulated TCP endpoints with packet loss. Records behind a lost segment are opened and
//! delivered before the hole is filled; messages arrive once each, byte for byte, whatever
//! their priorities and lifetimes; no (key, nonce) is ever used twice; the close is clean.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use squarepeg_connection::{
    Config, Connection, EndpointLink, Event, Role, Substrate, TlsSetup, tcp_config,
};
use squarepeg_session::{MessageProps, MessageStatus, Priority};
use squarepeg_tcp::{ConnectionConfig, Event as TcpEvent};
use squarepeg_tls::config::{self, Trust};

fn setups() -> (TlsSetup, TlsSetup) {
    let cert = config::self_signed(&["peg.test".into()]).unwrap();
    let server = TlsSetup::Server {
        config: config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
    };
    let client = TlsSetup::Client {
        config: config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap(),
        server_name: "peg.test".into(),
    };
    (client, server)
}

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

/// Runs a client sending `count` messages (urgency and lifetime from `props`) over a path
/// that drops every `drop_every`-th client packet for a while; returns what happened.
fn run(count: u32, drop_every: u64, props: impl Fn(u32) -> MessageProps) -> Outcome {
    let start = Instant::now();
    let mut now = start;
    let window = ConnectionConfig::default().recv_buffer;
    let substrate = Substrate::utcp(window);
    // No inconsistent retransmissions: the TCP's padder writes uCOBS padding, not records.
    let tcp = tcp_config(ConnectionConfig::default(), substrate, false);
    let (client_addr, server_addr): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    let (client_tls, server_tls) = setups();
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
    let mut client_link = EndpointLink::new(h);
    let mut server: Option<(Connection, EndpointLink)> = None;
    let mut statuses = BTreeMap::new();
    let mut received: HashMap<u32, u32> = HashMap::new();
    let mut sent = 0u32;
    let mut closed = false;
    let mut packets = 0u64;
    let mut packet = vec![0u8; 2048];
    for _ in 0..60_000 {
        while let Some(n) = client_ep.poll_transmit(now, &mut packet) {
            packets += 1;
            // Lossy for the first few hundred packets, then clean (so that the run ends).
            if packets < 600 && packets % drop_every == drop_every / 2 {
                continue;
            }
            let _ = server_ep.handle_packet(now, &packet[..n]);
        }
        while let Some(n) = server_ep.poll_transmit(now, &mut packet) {
            let _ = client_ep.handle_packet(now, &packet[..n]);
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
            for _ in 0..8 {
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
            if let Event::MessageStatus { number, status } = ev {
                assert!(
                    statuses.insert(number, status).is_none(),
                    "two statuses for {number}"
                );
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
    let out = run(400, 13, |_| MessageProps::default());
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
    no_nonce_twice(&out.client);
}

#[test]
fn priorities_and_lifetimes_work_inside_records() {
    let out = run(600, 7, |i| MessageProps {
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
    no_nonce_twice(&out.client);
}
