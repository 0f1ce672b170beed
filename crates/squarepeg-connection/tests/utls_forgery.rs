//! uTLS against an attacker on the path: two connection cores talk TLS over the userspace
//! TCP (records opened out of order, Minion §6) through the lab's forging middlebox, which
//! injects segments that begin with fake record headers, flips bits in retransmissions and
//! puts genuine records from elsewhere in the flow in place of segments, after which a lossy
//! link drops packets (so that the retransmissions it corrupts are the only copies). The
//! forged packets are valid TCP; only TLS can tell them apart.
//!
//! Always: every message the application receives is byte for byte one that was sent, none
//! twice; and the connection either completes (every message delivered) or ends with a TLS
//! error — it never stalls, and never hands out forged data.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use squarepeg_connection::{
    Config, Connection, ConnectionError, EndpointLink, Event, Role, Substrate, TransportError,
    tcp_config,
};
use squarepeg_lab::Direction;
use squarepeg_lab::middlebox::{DirectionFilter, ForgeConfig, Forger, Middlebox};
use squarepeg_session::MessageProps;
use squarepeg_tcp::{ConnectionConfig, Event as TcpEvent};

const MESSAGES: u32 = 150;

fn payload(i: u32) -> Vec<u8> {
    let len = 40 + (i as usize * 37) % 300;
    let mut p = i.to_be_bytes().to_vec();
    p.extend((0..len).map(|k| (i as usize * 3 + k) as u8));
    p
}

fn next(rng: &mut u64) -> u64 {
    // xorshift64*
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// How a run ended.
#[derive(Debug)]
struct Outcome {
    /// Messages received, by id: how often.
    received: HashMap<u32, u32>,
    /// The connection-level errors each side saw (client, server).
    lost: Vec<(&'static str, ConnectionError)>,
    drained: bool,
    forger: String,
    server_tls: Option<squarepeg_tls::TlsStats>,
}

impl Outcome {
    fn tls_failure(&self) -> bool {
        self.lost.iter().any(|(_, e)| {
            matches!(
                e,
                ConnectionError::Transport(TransportError::Tls(_))
                    | ConnectionError::PeerError { .. }
            )
        })
    }
}

/// A client sends [`MESSAGES`] messages to a server through `forge` and a link that drops
/// each client packet with 1 in `drop_one_in` chance (for the first 600 packets).
fn run(forge: ForgeConfig, loss_seed: u64, drop_one_in: u64) -> Outcome {
    let mut now = Instant::now();
    let window = ConnectionConfig::default().recv_buffer;
    let substrate = Substrate::utcp(window);
    let tcp = tcp_config(ConnectionConfig::default(), substrate, false);
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
    let mut client_link = EndpointLink::new(h);
    let mut server: Option<(Connection, EndpointLink)> = None;
    let mut forger = Forger::new(forge);
    let mut rng = loss_seed | 1;
    let mut received: HashMap<u32, u32> = HashMap::new();
    let mut lost = Vec::new();
    let mut sent = 0u32;
    let mut closed = false;
    let mut packets = 0u64;
    let mut packet = vec![0u8; 2048];
    let mut emits = Vec::new();
    let mut drained = false;
    for _ in 0..30_000 {
        while let Some(n) = client_ep.poll_transmit(now, &mut packet) {
            forger.process(
                now,
                Direction::LeftToRight,
                packet[..n].to_vec(),
                &mut emits,
            );
            for emit in emits.drain(..) {
                packets += 1;
                if packets < 600 && next(&mut rng).is_multiple_of(drop_one_in) {
                    continue;
                }
                let _ = server_ep.handle_packet(now, &emit.packet);
            }
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
        if client.is_established() && sent < MESSAGES && lost.is_empty() {
            for _ in 0..8 {
                if sent == MESSAGES {
                    break;
                }
                if client
                    .session_mut()
                    .send_message(now, payload(sent), MessageProps::default())
                    .is_err()
                {
                    break;
                }
                sent += 1;
            }
        }
        if sent == MESSAGES && !closed {
            client.session_mut().close(0, b"done");
            closed = true;
        }
        client_link.drive(now, &mut client, &mut client_ep);
        if let Some((conn, link)) = server.as_mut() {
            link.drive(now, conn, &mut server_ep);
            while let Some(m) = conn.session_mut().poll_message() {
                assert!(m.payload.len() >= 4, "a forged message: {:?}", m.payload);
                let id = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
                assert!(id < MESSAGES, "message {id} was never sent");
                assert_eq!(m.payload[..], payload(id)[..], "message {id} altered");
                let n = received.entry(id).or_default();
                *n += 1;
                assert_eq!(*n, 1, "message {id} delivered twice");
            }
            while let Some(ev) = conn.poll_event() {
                if let Event::ConnectionLost(e) = ev {
                    lost.push(("server", e));
                }
            }
        }
        while let Some(ev) = client.poll_event() {
            if let Event::ConnectionLost(e) = ev {
                lost.push(("client", e));
            }
        }
        let server_done = server.as_ref().is_some_and(|(c, _)| c.is_drained());
        if client.is_drained() && server_done {
            drained = true;
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
    Outcome {
        received,
        lost,
        drained,
        forger: format!("{:?}", forger.counters()),
        server_tls: server.and_then(|(c, _)| c.stats().tls),
    }
}

/// Complete (every message, once; the close was the client's) or failed with a TLS error.
fn completes_or_fails_on_tls(out: &Outcome) {
    if out.tls_failure() {
        return;
    }
    assert!(out.drained, "neither completed nor failed on TLS: {out:?}");
    for id in 0..MESSAGES {
        assert_eq!(out.received.get(&id), Some(&1), "message {id}: {out:?}");
    }
}

#[test]
fn without_forgery_every_message_arrives() {
    let forge = ForgeConfig {
        inject: 0.0,
        flip: 0.0,
        splice: 0.0,
        ..ForgeConfig::default()
    };
    let out = run(forge, 7, 13);
    assert!(!out.tls_failure(), "{out:?}");
    completes_or_fails_on_tls(&out);
    assert!(out.server_tls.unwrap().records_out_of_order > 0, "{out:?}");
}

#[test]
fn a_flipped_retransmission_fails_the_connection_never_the_data() {
    // Every retransmission corrupted: the ones that carry a lost range are the only copy,
    // so TLS must refuse the stream.
    let forge = ForgeConfig {
        directions: DirectionFilter::LeftToRight,
        inject: 0.0,
        flip: 1.0,
        splice: 0.0,
        seed: 1,
        ..ForgeConfig::default()
    };
    let out = run(forge, 11, 10);
    assert!(!out.forger.contains("(\"forge_flipped\", 0)"), "{out:?}");
    assert!(out.tls_failure(), "{out:?}");
    completes_or_fails_on_tls(&out);
}

/// A case the property test below found: the forger put a genuine record from earlier in
/// the flow where another belonged, and the in-order reader skipped it as a copy already
/// delivered — the connection completed with the displaced message missing.
#[test]
fn a_genuine_record_spliced_over_another_fails_the_connection() {
    let forge = ForgeConfig {
        seed: 11_785_770_023_359_564_623,
        directions: DirectionFilter::LeftToRight,
        inject: 0.01,
        flip: 0.0,
        splice: 0.01,
        span: 45_624,
        ..ForgeConfig::default()
    };
    let out = run(forge, 11_641_635_665_923_847_200, 34);
    assert!(!out.forger.contains("(\"forge_spliced\", 0)"), "{out:?}");
    completes_or_fails_on_tls(&out);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    /// Whatever the forger does, nothing it touched reaches the application, and the
    /// connection completes or fails on TLS.
    #[test]
    fn forged_segments_are_never_delivered(
        seed in any::<u64>(),
        loss_seed in any::<u64>(),
        drop_one_in in 8u64..40,
        inject in prop::sample::select(vec![0.0, 0.01, 0.05, 0.2]),
        flip in prop::sample::select(vec![0.0, 0.3, 1.0]),
        splice in prop::sample::select(vec![0.0, 0.01, 0.05]),
        span in 100u32..64 * 1024,
    ) {
        let forge = ForgeConfig {
            seed,
            directions: DirectionFilter::LeftToRight,
            inject,
            flip,
            splice,
            span,
            ..ForgeConfig::default()
        };
        let out = run(forge, loss_seed, drop_one_in);
        eprintln!(
            "inject {inject} flip {flip} splice {splice}: {} received, lost {:?}, {}, out of order {:?}",
            out.received.len(),
            out.lost,
            out.forger,
            out.server_tls.map(|s| s.records_out_of_order)
        );
        completes_or_fails_on_tls(&out);
    }
}
