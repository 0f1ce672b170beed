//! The same traffic through the sans-IO connection core in the simulator and through the
//! tokio driver on real sockets gives the same deliveries and statuses.
//!
//! A trace (seeded at random by proptest) is a plan per side: messages of random sizes,
//! sub-streams and priorities, then one stream; each side closes once it has sent its plan
//! and received the peer's. It runs (a) in the deterministic simulator, both ends being the
//! library's `squarepeg_connection::Connection` driven by its `EndpointLink` (`utcp_world`),
//! and (b) over the `squarepeg` crate's tokio driver: kernel TCP on loopback for the
//! byte-stream substrate, and, where the network tests can run, the userspace TCP on a TUN
//! stack in a lab namespace for the uTCP substrate (its peer is kernel TCP, as in the
//! simulator run). Only outcomes the protocol decides are compared — which messages arrive,
//! byte for byte, each message's final status, the stream's digest, a clean end — so the
//! plans carry no lifetimes and no squash keys: whether a message expires or is squashed
//! depends on timing, which the two runs do not share.
//!
//! `cargo test -p squarepeg --test equivalence`

mod utcp_world;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use squarepeg::{Connection, ConnectionConfig, ConnectionError, Endpoint, MessageStatus};
use squarepeg_lab::Side;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::sim::{SimConfig, Simulator};
use squarepeg_session::Role;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use utcp_world::{PegHost, SendPlan, pattern};

/// What one side saw, in the terms both runs share.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// Message numbers received (each checked against the peer's plan, byte for byte).
    received: BTreeSet<u64>,
    /// Final status of each message sent.
    statuses: BTreeMap<u64, MessageStatus>,
    /// SHA-256 of the peer's stream as received.
    stream: Option<[u8; 32]>,
    /// The connection ended cleanly (a graceful close by either side).
    clean_end: bool,
    /// Problems found on the way (wrong payload, duplicate, ...): must be empty.
    errors: Vec<String>,
}

fn plans(seed: u64, messages: usize, stream_bytes: u64) -> (SendPlan, SendPlan) {
    let span = Duration::from_millis(500);
    let no_lifetime = Duration::ZERO;
    // timed = 0: no message has a lifetime.
    let client = SendPlan::seeded(seed, messages, span, 3000, 0.0, no_lifetime, stream_bytes);
    let server = SendPlan::seeded(
        seed ^ 0x5eed,
        messages / 2,
        span,
        1200,
        0.0,
        no_lifetime,
        20_000,
    );
    (client, server)
}

/// (a) Both ends in the simulator, each the connection core on `utcp` or the in-order
/// substrate.
fn in_simulator(
    seed: u64,
    client_plan: &SendPlan,
    server_plan: &SendPlan,
    client_utcp: bool,
) -> (Seen, Seen) {
    let start = Instant::now();
    let link = LinkConfig::new()
        .with_delay(Duration::from_millis(5))
        .with_rate(50_000_000);
    let mut sim = Simulator::with_start(SimConfig::new(seed, Bottleneck::symmetric(link)), start)
        .expect("simulator");
    let tcp = squarepeg_tcp::ConnectionConfig::default();
    let server = PegHost::new(
        Role::Server,
        false,
        tcp.clone(),
        server_plan.clone(),
        client_plan.clone(),
        start,
    );
    let server = sim.add_host(Side::Right, server).expect("server");
    let client = PegHost::new(
        Role::Client,
        client_utcp,
        tcp,
        client_plan.clone(),
        server_plan.clone(),
        start,
    );
    let client = sim.add_host(Side::Left, client).expect("client");
    let deadline = start + Duration::from_secs(120);
    loop {
        let c = sim.host::<PegHost>(client).expect("client");
        let s = sim.host::<PegHost>(server).expect("server");
        if c.complete() && s.complete() && c.drained() && s.drained() {
            break;
        }
        match sim.step().expect("simulator") {
            Some(t) if t < deadline => {}
            other => panic!("seed {seed}: the simulated run did not finish ({other:?})"),
        }
    }
    let seen = |h: &PegHost| Seen {
        received: h.app.received.keys().copied().collect(),
        statuses: h.app.statuses.clone(),
        stream: h.app.stream_digest,
        clean_end: h.app.lost.as_deref().is_none_or(|e| {
            e == ConnectionError::LocallyClosed.to_string() || e.contains("application code 0")
        }),
        errors: h.app.errors.clone(),
    };
    let c = seen(sim.host::<PegHost>(client).expect("client"));
    let s = seen(sim.host::<PegHost>(server).expect("server"));
    (c, s)
}

/// (b) One side of the same plans over the tokio driver: sends its plan (messages, then its
/// stream), receives the peer's, collects its statuses, then closes.
async fn over_tokio(conn: Connection, plan: SendPlan, peer: SendPlan) -> Seen {
    let mut errors = Vec::new();
    let sender = {
        let conn = conn.clone();
        let plan = plan.clone();
        tokio::spawn(async move {
            let mut numbers = Vec::new();
            for (i, m) in plan.messages.iter().enumerate() {
                numbers.push(
                    conn.send_message(plan.payload(i), m.props.clone())
                        .await
                        .expect("send"),
                );
            }
            let mut s = conn.open_stream().await.expect("open stream");
            let data = pattern(plan.seed, 0, plan.stream_bytes as usize);
            s.write_all(&data).await.expect("stream write");
            s.shutdown().await.expect("stream finish");
            numbers
        })
    };
    let mut received = BTreeSet::new();
    while received.len() < peer.messages.len() {
        let m = conn.recv_message().await.expect("receive");
        let i = m.number as usize;
        if i >= peer.messages.len() || m.payload[..] != peer.payload(i)[..] {
            errors.push(format!("message {i}: payload differs"));
        }
        if !received.insert(m.number) {
            errors.push(format!("message {i} twice"));
        }
    }
    let mut stream = conn.accept_stream().await.expect("accept stream");
    let mut data = Vec::new();
    stream.read_to_end(&mut data).await.expect("stream read");
    let numbers = sender.await.expect("sender");
    let mut statuses = BTreeMap::new();
    while statuses.len() < numbers.len() {
        let (n, status) = conn.next_message_status().await.expect("status");
        if statuses.insert(n, status).is_some() {
            errors.push(format!("message {n}: two statuses"));
        }
    }
    conn.close().await;
    let end = conn.closed().await;
    Seen {
        received,
        statuses,
        stream: Some(Sha256::digest(&data).into()),
        clean_end: matches!(
            end,
            ConnectionError::LocallyClosed | ConnectionError::ApplicationClosed { code: 0, .. }
        ),
        errors,
    }
}

/// Fails a run that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("stalled")
}

fn over_loopback(client_plan: &SendPlan, server_plan: &SendPlan) -> (Seen, Seen) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(no_hang(async {
        let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
            .await
            .expect("bind");
        let addr = ep.local_addr().expect("address");
        let (c, s) = tokio::join!(
            Connection::connect(addr, ConnectionConfig::default()),
            ep.accept()
        );
        let (c, s) = (c.expect("connect"), s.expect("accept"));
        tokio::join!(
            over_tokio(c, client_plan.clone(), server_plan.clone()),
            over_tokio(s, server_plan.clone(), client_plan.clone())
        )
    }))
}

fn assert_same(substrate: &str, seed: u64, sim: (Seen, Seen), real: (Seen, Seen)) {
    for (side, a, b) in [("client", &sim.0, &real.0), ("server", &sim.1, &real.1)] {
        assert!(
            a.errors.is_empty(),
            "{substrate} seed {seed}: simulator {side}: {:?}",
            a.errors
        );
        assert!(
            b.errors.is_empty(),
            "{substrate} seed {seed}: tokio {side}: {:?}",
            b.errors
        );
        assert_eq!(
            a, b,
            "{substrate} seed {seed}: the {side} saw different outcomes"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// The byte-stream substrate: the core in the simulator against kernel TCP on loopback.
    #[test]
    fn byte_stream_sim_and_tokio_agree(
        seed in any::<u64>(),
        messages in 0usize..300,
        stream_bytes in 0u64..400_000,
    ) {
        let (c, s) = plans(seed, messages, stream_bytes);
        let sim = in_simulator(seed, &c, &s, false);
        let real = over_loopback(&c, &s);
        assert_same("byte stream", seed, sim, real);
    }
}

/// The uTCP substrate: the core in the simulator (uTCP client, in-order server) against the
/// tokio driver over the userspace TCP on a TUN stack in a lab namespace (uTCP client, kernel
/// server).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_sim_and_tokio_agree() {
    use squarepeg_io::StackConfig;
    use squarepeg_io::lab::LabStack;
    use squarepeg_lab::net::{Lab, LabConfig};

    for seed in [1u64, 0xfeed] {
        let (client_plan, server_plan) = plans(seed, 200, 150_000);
        let sim = in_simulator(seed, &client_plan, &server_plan, true);
        let lab = Lab::start(
            LabConfig::new(&format!("sqeq{}", std::process::id() % 10_000))
                .with_seed(seed)
                .with_up("delay=5ms".parse().expect("link"))
                .with_down("delay=5ms".parse().expect("link")),
        )
        .expect("start lab");
        let stack = LabStack::attach(
            &lab,
            squarepeg_lab::net::Role::Client,
            StackConfig::new([]),
            Some(1500),
        )
        .expect("attach stack");
        let server_addr = SocketAddr::new(lab.addresses().server(false), 6200);
        let (cp, sp) = (client_plan.clone(), server_plan.clone());
        let real = std::thread::scope(|scope| {
            let (bound_tx, bound_rx) = std::sync::mpsc::channel();
            let server_ns = lab.server();
            let server = scope.spawn(move || {
                server_ns
                    .run(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("runtime");
                        rt.block_on(no_hang(async move {
                            let ep = Endpoint::bind(server_addr, ConnectionConfig::default())
                                .await
                                .expect("kernel bind");
                            bound_tx.send(()).expect("signal");
                            let conn = ep.accept().await.expect("kernel accept");
                            over_tokio(conn, sp, cp).await
                        }))
                    })
                    .expect("enter the server namespace")
            });
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let client = rt.block_on(no_hang(async {
                bound_rx.recv().expect("kernel bound");
                let conn = Connection::connect_utcp(
                    stack.stack(),
                    server_addr,
                    ConnectionConfig::default(),
                )
                .await
                .expect("uTCP connect");
                let seen = over_tokio(conn.clone(), client_plan.clone(), server_plan.clone()).await;
                assert!(
                    conn.stats().utcp.is_some(),
                    "the client ran over the uTCP substrate"
                );
                seen
            }));
            (client, server.join().expect("server side"))
        });
        assert_same("uTCP", seed, sim, real);
    }
}
