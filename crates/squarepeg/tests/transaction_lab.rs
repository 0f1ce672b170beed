//! Transactions on the real lab (client — emulator — server namespaces, 25 ms each way):
//! kernel TCP Fast Open and TLS 1.3 early data through [`squarepeg::Transactor`], checked on
//! the emulator's captures.
//!
//! - first contact: the request after the handshakes; the client takes a Fast Open cookie
//!   and TLS tickets;
//! - returning client: the SYN carries the ClientHello and the request (early data), the
//!   SYN-ACK acknowledges them, the server seals its answer before the client's Finished
//!   arrives and sends it in its first flight — the answer record is among the server's
//!   packets that precede the client's second flight on the wire;
//! - a copy of that SYN's bytes sent again on a new connection gets a full handshake and is
//!   never executed (the server counts every request it takes);
//! - fallbacks: a path that drops SYNs with data, a middlebox that strips the Fast Open
//!   option, a server whose cookie key changed: each request still answered, and executed
//!   once.
//!
//! Needs root and iproute2; skipped with a message otherwise. Asserts outcomes and the
//! order of packets, never durations.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use squarepeg::tls::config::{self, Trust};
use squarepeg::{ConnectionConfig, Endpoint, MessageProps, Transactor, TransportProperties};
use squarepeg_lab::middlebox::parse_middleboxes;
use squarepeg_lab::net::{CaptureSide, Lab, LabConfig, capture_path};
use squarepeg_lab::packet::tcp_flags;
use squarepeg_lab::pcap::read_pcap;

const PORT: u16 = 6200;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Fails a test that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test stalled")
}

/// One TCP packet of a capture.
#[derive(Debug, Clone)]
struct Segment {
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: Vec<u8>,
}

fn segments(path: &PathBuf) -> Vec<Segment> {
    let file = read_pcap(&std::fs::read(path).expect("capture")).expect("pcap");
    file.records
        .iter()
        .filter_map(|r| squarepeg_tcp::wire::parse_packet(&r.data, false).ok())
        .map(|s| Segment {
            src: s.src,
            dst: s.dst,
            seq: s.seq,
            ack: s.ack,
            flags: s.flags.0,
            payload: s.payload.to_vec(),
        })
        .collect()
}

/// The TLS records of `stream`: (content type, length of the protected content).
fn records(stream: &[u8]) -> Vec<(u8, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= stream.len() {
        let len = usize::from(u16::from_be_bytes([stream[at + 3], stream[at + 4]]));
        out.push((stream[at], len));
        at += 5 + len;
    }
    out
}

struct Server {
    requests: Arc<AtomicU32>,
    /// Per accepted connection: the 0.5-RTT bytes it sealed and the early data it took.
    half_rtt: Arc<std::sync::Mutex<Vec<(u64, u64)>>>,
}

/// Accepts connections and answers each message with "answer:" + the message.
async fn serve(endpoint: Endpoint, server: Server) {
    loop {
        let Ok(conn) = endpoint.accept().await else {
            return;
        };
        let requests = server.requests.clone();
        let half_rtt = server.half_rtt.clone();
        tokio::spawn(async move {
            while let Ok(m) = conn.recv_message().await {
                requests.fetch_add(1, Ordering::SeqCst);
                let mut answer = b"answer:".to_vec();
                answer.extend_from_slice(&m.payload);
                if conn
                    .send_message(answer, MessageProps::default())
                    .await
                    .is_err()
                {
                    break;
                }
            }
            // The client closed: what the record layer did, for the capture checks.
            if let Some(tls) = conn.stats().tls {
                half_rtt
                    .lock()
                    .unwrap()
                    .push((tls.half_rtt_sealed, tls.early_data_received));
            }
        });
    }
}

fn enable_fast_open(lab: &Lab) {
    for ns in [lab.client(), lab.server()] {
        let status = ns
            .command("sysctl")
            .args(["-qw", "net.ipv4.tcp_fastopen=3"])
            .status()
            .expect("sysctl");
        assert!(status.success(), "sysctl net.ipv4.tcp_fastopen=3");
    }
}

/// A lab with a squarepeg transaction server (TLS, early data, Fast Open) in the server
/// namespace; transactions run from the client namespace.
struct Scenario {
    lab: Lab,
    dir: PathBuf,
    server_addr: SocketAddr,
    client_config: ConnectionConfig,
    requests: Arc<AtomicU32>,
    half_rtt: Arc<std::sync::Mutex<Vec<(u64, u64)>>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
    server_thread: Option<std::thread::JoinHandle<()>>,
}

impl Scenario {
    fn start(tag: &str, client_side: &str) -> Scenario {
        let dir = std::env::temp_dir().join(format!("squarepeg-txn-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let lab = Lab::start(
            LabConfig::new(&format!("sqtx{tag}{}", std::process::id() % 10_000))
                .with_up("delay=25ms".parse().unwrap())
                .with_down("delay=25ms".parse().unwrap())
                .with_client_side(parse_middleboxes(client_side).unwrap())
                .with_capture_dir(&dir),
        )
        .expect("start lab");
        enable_fast_open(&lab);
        let server_ip: IpAddr = lab.addresses().server(false);
        let server_addr = SocketAddr::new(server_ip, PORT);
        let cert = config::self_signed(&[server_ip.to_string()]).unwrap();
        let server_tls = config::server_accepting_early_data(
            &config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
            16 * 1024,
        )
        .unwrap();
        let mut server_config = ConnectionConfig::default().with_tls_server(server_tls);
        server_config.fast_open = true;
        let client_config = ConnectionConfig::default().with_tls_client(
            config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap(),
            server_ip.to_string(),
        );
        let requests = Arc::new(AtomicU32::new(0));
        let half_rtt = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let server_ns = lab.server().try_clone().unwrap();
        let server_state = Server {
            requests: requests.clone(),
            half_rtt: half_rtt.clone(),
        };
        let server_thread = std::thread::spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(async move {
                        let endpoint = Endpoint::bind(server_addr, server_config)
                            .await
                            .expect("bind");
                        bound_tx.send(()).unwrap();
                        tokio::select! {
                            _ = serve(endpoint, server_state) => {}
                            _ = done_rx => {}
                        }
                    })
                })
                .expect("server namespace")
        });
        bound_rx.recv().unwrap();
        Scenario {
            lab,
            dir,
            server_addr,
            client_config,
            requests,
            half_rtt,
            done: Some(done_tx),
            server_thread: Some(server_thread),
        }
    }

    /// Runs one transaction per request, in order, with one transactor (a returning client
    /// from the second on), calling `before(i)` ahead of request `i`; returns the answers.
    fn transactions(&self, requests: &[&str], before: impl Fn(usize) + Send) -> Vec<Vec<u8>> {
        let (config, server) = (self.client_config.clone(), self.server_addr);
        let requests: Vec<String> = requests.iter().map(|r| (*r).to_owned()).collect();
        let client_ns = self.lab.client().try_clone().unwrap();
        client_ns
            .run(move || {
                runtime().block_on(no_hang(async move {
                    let transactor =
                        Transactor::new(config, TransportProperties::transaction()).unwrap();
                    let mut answers = Vec::new();
                    for (i, r) in requests.iter().enumerate() {
                        before(i);
                        let answer = transactor
                            .transact(server, r.clone().into_bytes())
                            .await
                            .expect("transaction");
                        answers.push(answer.to_vec());
                        // Let the connection close and its tickets arrive.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    answers
                }))
            })
            .expect("client namespace")
    }

    /// The TCP segments the server's side of the path saw (after the middleboxes).
    fn server_side_wire(&self) -> Vec<Segment> {
        self.lab.flush_captures().unwrap();
        segments(&capture_path(&self.dir, CaptureSide::Server))
    }

    /// The clients' SYNs that reached the server.
    fn syns(&self, wire: &[Segment]) -> Vec<Segment> {
        wire.iter()
            .filter(|s| {
                s.flags & tcp_flags::SYN != 0
                    && s.flags & tcp_flags::ACK == 0
                    && s.dst == self.server_addr
            })
            .cloned()
            .collect()
    }

    fn finish(mut self) {
        let _ = self.done.take().map(|d| d.send(()));
        if let Some(t) = self.server_thread.take() {
            t.join().unwrap();
        }
        let dir = self.dir.clone();
        self.lab.teardown().expect("teardown");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn answers_of(requests: &[&str]) -> Vec<Vec<u8>> {
    requests
        .iter()
        .map(|r| format!("answer:{r}").into_bytes())
        .collect()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn returning_client_transaction_takes_one_round_trip_and_replays_are_refused() {
    let sc = Scenario::start("rt", "");
    let server_addr = sc.server_addr;
    let requests = ["first", "second"];
    assert_eq!(sc.transactions(&requests, |_| {}), answers_of(&requests));
    assert_eq!(sc.requests.load(Ordering::SeqCst), 2);

    let wire = sc.server_side_wire();
    let syns = sc.syns(&wire);
    assert_eq!(syns.len(), 2, "one SYN per transaction: {syns:?}");
    // First contact: a cookie request, no data.
    assert!(syns[0].payload.is_empty());
    // Returning: the ClientHello and the request ride on the SYN...
    let syn = &syns[1];
    assert!(
        !syn.payload.is_empty(),
        "no data on the returning client's SYN"
    );
    assert_eq!(
        syn.payload[0], 0x16,
        "the SYN's data is a TLS handshake record"
    );
    let client = syn.src;
    let flow: Vec<&Segment> = wire
        .iter()
        .filter(|s| {
            (s.src == client && s.dst == server_addr) || (s.src == server_addr && s.dst == client)
        })
        .collect();
    // ...and the SYN-ACK acknowledges all of it (the kernel took the data with the cookie).
    let syn_ack = flow
        .iter()
        .find(|s| s.src == server_addr && s.flags & tcp_flags::SYN != 0)
        .expect("SYN-ACK");
    assert_eq!(
        syn_ack.ack,
        syn.seq
            .wrapping_add(1)
            .wrapping_add(syn.payload.len() as u32),
        "the SYN-ACK acknowledges the SYN's data"
    );
    // The server's bytes sent before the client's second flight (its Finished) reached the
    // server carry the answer: an application-data record of exactly the 0.5-RTT plaintext
    // the server sealed (PARAMS and the answer frame) plus inner type and tag.
    let (sealed, early) = *sc.half_rtt.lock().unwrap().last().expect("server stats");
    assert!(early > 0, "the server took no early data");
    assert!(
        sealed > 0,
        "the server sealed nothing before the client's Finished"
    );
    let second_flight = flow
        .iter()
        .position(|s| s.src == client && !s.payload.is_empty() && s.flags & tcp_flags::SYN == 0)
        .expect("client's second flight");
    let first_flight: Vec<u8> = flow[..second_flight]
        .iter()
        .filter(|s| s.src == server_addr)
        .flat_map(|s| s.payload.iter().copied())
        .collect();
    let recs = records(&first_flight);
    assert!(
        recs.contains(&(0x17, sealed as usize + 17)),
        "no answer record in the server's first flight: {recs:?} (0.5-RTT plaintext {sealed})"
    );
    // The client's last flight (Finished, its close, close_notify) leaves with its FIN.
    let last = &flow[second_flight];
    assert!(
        last.flags & tcp_flags::FIN != 0,
        "the client's Finished and close left without the FIN: {last:?}"
    );

    // A copy of the returning SYN's bytes on a new connection: a full handshake, never run.
    let replay = syn.payload.clone();
    let client_ns = sc.lab.client().try_clone().unwrap();
    client_ns
        .run(move || {
            runtime().block_on(no_hang(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(server_addr).await.unwrap();
                s.write_all(&replay).await.unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                // The server's flight comes back (a full handshake); then give up.
                let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
                    .await
                    .map(|r| r.unwrap_or(0))
                    .unwrap_or(0);
                assert!(n > 0, "the server did not answer the copy at all");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }))
        })
        .expect("client namespace");
    assert_eq!(
        sc.requests.load(Ordering::SeqCst),
        2,
        "a replayed request was executed"
    );
    sc.finish();
}

/// A path that drops SYNs carrying data (RFC 7413 §7.1): the kernel sends the SYN again
/// without data and the request after the handshake, once.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn dropped_syn_data_falls_back_and_delivers_once() {
    let sc = Scenario::start("dsd", "drop-syn-data");
    let requests = ["one", "two", "three"];
    assert_eq!(sc.transactions(&requests, |_| {}), answers_of(&requests));
    assert_eq!(sc.requests.load(Ordering::SeqCst), 3);
    let wire = sc.server_side_wire();
    assert!(
        sc.syns(&wire).iter().all(|s| s.payload.is_empty()),
        "a SYN with data crossed a box that drops them"
    );
    sc.finish();
}

/// A middlebox that strips the Fast Open option: no cookie is ever learnt, no data goes on
/// a SYN, every request is delivered once (TLS early data still goes, after the handshake).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn stripped_fast_open_option_falls_back_and_delivers_once() {
    let sc = Scenario::start("tfo", "strip-options");
    let requests = ["one", "two", "three"];
    assert_eq!(sc.transactions(&requests, |_| {}), answers_of(&requests));
    assert_eq!(sc.requests.load(Ordering::SeqCst), 3);
    let wire = sc.server_side_wire();
    let syns = sc.syns(&wire);
    assert_eq!(syns.len(), 3);
    assert!(syns.iter().all(|s| s.payload.is_empty()));
    sc.finish();
}

/// The server's Fast Open key changes between two transactions (a restarted server, a key
/// rotation): the returning client's cookie is refused, the SYN-ACK acknowledges only the
/// SYN, and the kernel sends the data again after the handshake, delivered once.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn refused_cookie_falls_back_and_delivers_once() {
    let sc = Scenario::start("key", "");
    let server_ns = sc.lab.server().name().to_owned();
    let requests = ["one", "two"];
    let answers = sc.transactions(&requests, |i| {
        if i == 1 {
            let status = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &server_ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.tcp_fastopen_key=00000001-00000002-00000003-00000004",
                ])
                .status()
                .expect("sysctl");
            assert!(status.success(), "setting the server's Fast Open key");
        }
    });
    assert_eq!(answers, answers_of(&requests));
    assert_eq!(sc.requests.load(Ordering::SeqCst), 2);
    let wire = sc.server_side_wire();
    let syns = sc.syns(&wire);
    assert_eq!(syns.len(), 2);
    let syn = &syns[1];
    assert!(
        !syn.payload.is_empty(),
        "the returning client sent no data on its SYN"
    );
    let syn_ack = wire
        .iter()
        .find(|s| s.src == sc.server_addr && s.dst == syn.src && s.flags & tcp_flags::SYN != 0)
        .expect("SYN-ACK");
    assert_eq!(
        syn_ack.ack,
        syn.seq.wrapping_add(1),
        "the refused cookie's data was acknowledged"
    );
    sc.finish();
}
