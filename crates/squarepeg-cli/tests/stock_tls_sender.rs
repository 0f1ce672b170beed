//! A stock TLS 1.3 sender to squarepeg's userspace TCP through the lossy lab (issue 11).
//!
//! The sender is tokio-rustls (rustls's own record layer) on the kernel's TCP in the lab's
//! server namespace: it writes [`WRITES`] distinct application writes of 100–1400 bytes, one
//! TLS record each (a flush after every write), then close_notify. The receiver is squarepeg's
//! userspace TCP on a TUN device in the client namespace ([`LabStack`]) with the uTCP receive
//! interface on (every segment handed up at once, with its stream offset), and a
//! `squarepeg_tls::Tls` client over it: the handshake runs over that connection, then every
//! segment goes to [`Tls::push_segment`] (out-of-order receive, Minion §6). The stock sender's
//! records carry no numbers, so the receiver predicts them (Minion §6.1) and lets the AEAD
//! decide. Every packet crosses the lab's emulator with loss and delay both ways, so holes
//! happen.
//!
//! **What it shows:** records of an unmodified TLS 1.3 sender are opened and delivered ahead
//! of the holes before them (counted and printed, with how many could have been: records
//! wholly received while a hole before them was still open), and everything delivered, in
//! order or not, is byte-identical to the write at that position, each write exactly once.
//!
//! Asserts: TLS 1.3 on both ends; at least one record delivered out of order; every record
//! delivered out of order was complete ahead of a hole (the analysis agrees with the TLS
//! layer); each out-of-order record is one whole write, sits at that write's record offset in
//! the stream and authenticated under that write's sequence number; in-order plaintext is
//! whole writes in increasing order; all writes delivered, each exactly once; the stream's
//! records are the handshake, then exactly one record per write. Nothing about time.
//!
//! Needs root, /dev/net/tun and iproute2 (skipped with a message otherwise). Rerun with
//! `cargo test -p squarepeg-cli --test stock_tls_sender -- --nocapture` to see the counts;
//! `STOCK_TLS_PREDICTIONS=n` sets the sequence numbers tried per candidate (default 4,
//! `OutOfOrderConfig::new`). Figures in docs/results.md (TLS).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use squarepeg::tls::config::{self, Trust};
use squarepeg::tls::rustls;
use squarepeg::tls::{OutOfOrderConfig, Tls, TlsStats};
use squarepeg_io::StackConfig;
use squarepeg_lab::net::{Lab, LabConfig, Role};
use squarepeg_lab::stack::{LabStack, can_run};
use squarepeg_tcp::utcp::record::{self, ReadRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Application writes the stock sender makes (one record each).
const WRITES: u32 = 2000;
const PORT: u16 = 4460;
const SERVER_NAME: &str = "stock.sender.test";
/// Both directions: enough loss that holes happen, delay so that a hole stays open for a
/// round trip while later segments arrive.
const LINK: &str = "delay=10ms loss=2%";
/// TLS 1.3 record overhead of a stock sender's application record: header, content type
/// and a 16-byte tag (all of squarepeg's suites), no padding.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;

/// Length of write `i`: 100..=1400 bytes, varied.
fn write_len(i: u32) -> usize {
    100 + (i as usize * 7919) % 1301
}

/// Write `i`: its index and length, then bytes derived from the SHA-256 of the index.
fn write_bytes(i: u32) -> Vec<u8> {
    let len = write_len(i);
    let digest = Sha256::digest(i.to_be_bytes());
    let mut w = Vec::with_capacity(len);
    w.extend_from_slice(&i.to_be_bytes());
    w.extend_from_slice(&(len as u16).to_be_bytes());
    w.extend((6..len).map(|k| digest[k % 32] ^ k as u8));
    w
}

/// The index of `bytes` if it is exactly one of the writes (else panics with why).
fn whole_write(bytes: &[u8], what: &str) -> u32 {
    assert!(
        bytes.len() >= 6,
        "{what}: {} bytes is no write",
        bytes.len()
    );
    let i = u32::from_be_bytes(bytes[..4].try_into().unwrap());
    assert!(i < WRITES, "{what}: write {i} was never sent");
    assert!(
        bytes == write_bytes(i),
        "{what}: {} bytes claiming to be write {i} differ from it",
        bytes.len()
    );
    i
}

/// The stock sender: tokio-rustls, TLS 1.3 only, without the secret extraction squarepeg's
/// own record layer needs. Returns the protocol version it negotiated.
async fn stock_sender(
    listener: std::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> Option<rustls::ProtocolVersion> {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let (tcp, _) = listener.accept().await.expect("kernel accept");
    tcp.set_nodelay(true).expect("nodelay");
    let mut tls = tokio_rustls::TlsAcceptor::from(config)
        .accept(tcp)
        .await
        .expect("stock TLS handshake");
    let version = tls.get_ref().1.protocol_version();
    for i in 0..WRITES {
        tls.write_all(&write_bytes(i)).await.expect("stock write");
        // rustls seals each write as one record when its buffer is empty; the flush empties it.
        tls.flush().await.expect("stock flush");
    }
    tls.shutdown().await.expect("close_notify and FIN");
    // Until the receiver's close_notify (or its FIN): everything was delivered by then.
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "the receiver sends no application data");
    version
}

/// What the receiver saw.
#[derive(Default)]
struct Received {
    /// In-order plaintext not yet cut into writes.
    pending: Vec<u8>,
    /// Writes delivered in order, in delivery order.
    in_order: Vec<u32>,
    /// Writes delivered out of order: (index, stream offset, wire length, sequence number).
    out_of_order: Vec<(u32, u64, usize, u64)>,
    /// Deliveries per write.
    count: Vec<u32>,
    /// Every segment handed up: (offset, length, in-order offset after pushing it).
    events: Vec<(u64, usize, u64)>,
    /// The server's stream as received (first copy of each byte) and which bytes came.
    stream: Vec<u8>,
    have: Vec<bool>,
}

impl Received {
    fn segment(&mut self, offset: u64, data: &[u8]) {
        let start = offset as usize;
        let end = start + data.len();
        if self.stream.len() < end {
            self.stream.resize(end, 0);
            self.have.resize(end, false);
        }
        for (k, &b) in data.iter().enumerate() {
            if !self.have[start + k] {
                self.have[start + k] = true;
                self.stream[start + k] = b;
            }
        }
    }

    fn deliver(&mut self, i: u32) {
        self.count[i as usize] += 1;
    }

    /// Cuts the in-order plaintext into whole writes, which must come in increasing order.
    fn take_in_order(&mut self, plaintext: &[u8]) {
        self.pending.extend_from_slice(plaintext);
        let mut at = 0;
        while self.pending.len() - at >= 6 {
            let len = usize::from(u16::from_be_bytes([
                self.pending[at + 4],
                self.pending[at + 5],
            ]));
            assert!(len >= 6, "in-order write length {len}");
            if self.pending.len() - at < len {
                break;
            }
            let i = whole_write(&self.pending[at..at + len], "in-order plaintext");
            if let Some(&last) = self.in_order.last() {
                assert!(i > last, "in-order write {i} after {last}");
            }
            self.in_order.push(i);
            self.deliver(i);
            at += len;
        }
        self.pending.drain(..at);
    }
}

/// The receiver: a squarepeg TLS client over the userspace TCP's segments.
async fn squarepeg_receiver(
    stack: &squarepeg_io::Stack,
    server: SocketAddr,
    client_config: Arc<rustls::ClientConfig>,
) -> (Received, TlsStats, Tls) {
    let mut tcp_config = stack.connection_config();
    tcp_config.unordered_receive = true;
    let window = tcp_config.recv_buffer;
    let mut stream = stack
        .connect_with(server, tcp_config)
        .await
        .expect("uTCP connect through the lab");
    let mut tls = Tls::client(client_config, SERVER_NAME).expect("TLS client");
    // The TCP's receive window: what it can hold ahead of a hole.
    let mut ooo = OutOfOrderConfig::new(window);
    if let Ok(p) = std::env::var("STOCK_TLS_PREDICTIONS") {
        ooo.predictions = p.parse().expect("STOCK_TLS_PREDICTIONS: a number");
    }
    tls.enable_out_of_order(ooo);

    let mut got = Received {
        count: vec![0; WRITES as usize],
        ..Default::default()
    };
    let mut rbuf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    let mut in_order = Vec::new();
    let mut delivered: Vec<(u64, usize, u64, Vec<u8>)> = Vec::new();
    loop {
        out.clear();
        tls.poll_output(&mut out);
        if !out.is_empty() {
            stream.write_all(&out).await.expect("uTCP write");
        }
        if tls.peer_closed() {
            break;
        }
        let n = stream.read(&mut rbuf).await.expect("uTCP read");
        assert!(
            n > 0,
            "the stream ended before close_notify: {:?} {:?}",
            tls.stats(),
            got.count.iter().filter(|&&c| c == 0).count()
        );
        for r in record::decode_read(&rbuf[..n]) {
            let ReadRecord::Segment { offset, data } = r.expect("uTCP read record") else {
                continue;
            };
            got.segment(offset, data);
            in_order.clear();
            delivered.clear();
            tls.push_segment(offset, data, &mut in_order, &mut |r| {
                delivered.push((r.offset, r.wire_len, r.number, r.content.to_vec()))
            })
            .unwrap_or_else(|e| panic!("push_segment: {e} ({:?})", tls.stats()));
            got.events.push((offset, data.len(), tls.in_order_offset()));
            got.take_in_order(&in_order);
            for (offset, wire_len, number, content) in delivered.drain(..) {
                let i = whole_write(&content, "out-of-order record");
                got.out_of_order.push((i, offset, wire_len, number));
                got.deliver(i);
            }
        }
    }
    assert!(got.pending.is_empty(), "a partial write is left in order");
    tls.send_close_notify();
    out.clear();
    tls.poll_output(&mut out);
    stream
        .write_all(&out)
        .await
        .expect("uTCP write close_notify");
    stream.shutdown().await.expect("uTCP FIN");
    // The sender reads to its end: wait until the TCP connection has closed both ways.
    let _ = stream.wait_closed().await;
    let stats = tls.stats();
    (got, stats, tls)
}

/// A record of the server's stream: offset, wire length, content type.
fn records(stream: &[u8]) -> Vec<(u64, usize, u8)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= stream.len() {
        let len = usize::from(u16::from_be_bytes([stream[at + 3], stream[at + 4]]));
        out.push((at as u64, 5 + len, stream[at]));
        at += 5 + len;
    }
    assert_eq!(at, stream.len(), "the stream ends at a record boundary");
    out
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn stock_tls13_sender_records_arrive_out_of_order_through_the_lossy_lab() {
    if !can_run() {
        return;
    }
    let seed = 0x5eed_0011;
    let config = LabConfig::new(&format!("stk{}", std::process::id() % 10_000))
        .with_seed(seed)
        .with_up(LINK.parse().expect("link"))
        .with_down(LINK.parse().expect("link"));
    // Dropped (also when a panic unwinds): emulator stopped, namespaces and veths removed.
    let lab = Lab::start(config).expect("start lab");
    // Dropped before the lab: the stack's driver stops, its TUN device goes.
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach the userspace TCP");
    let server_ip: IpAddr = lab.addresses().server(false);
    let server = SocketAddr::new(server_ip, PORT);
    let listener = lab
        .server()
        .run(|| std::net::TcpListener::bind(server))
        .expect("enter the server namespace")
        .expect("kernel listen");
    listener.set_nonblocking(true).unwrap();

    let cert = config::self_signed(&[SERVER_NAME.into()]).unwrap();
    let mut stock = (*config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes())
        .unwrap())
    .clone();
    stock.enable_secret_extraction = false;
    let client_config = config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (version, (got, stats, tls)) = rt.block_on(async {
        // Fails a test that would otherwise hang; not a timing assertion.
        tokio::time::timeout(Duration::from_secs(180), async {
            let sender = tokio::spawn(stock_sender(listener, Arc::new(stock)));
            let received = squarepeg_receiver(stack.stack(), server, client_config).await;
            (sender.await.expect("stock sender"), received)
        })
        .await
        .expect("the transfer stalled")
    });
    let emulator = lab.stats().expect("emulator counters");
    drop(stack);

    // TLS 1.3 on both ends.
    assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert!(!tls.is_handshaking());
    let suite = tls.negotiated_suite().expect("a suite");
    assert_eq!(suite.version(), &rustls::version::TLS13);

    // The stream: the handshake's records, then one record per write, in order, then
    // close_notify (and any records of the server's before the writes, e.g. session tickets).
    let stream_records = records(&got.stream);
    assert!(got.have.iter().all(|&h| h), "every stream byte arrived");
    let first = (0..stream_records.len())
        .find(|&k| {
            k + WRITES as usize <= stream_records.len()
                && (0..WRITES as usize).all(|i| {
                    let (_, wire, kind) = stream_records[k + i];
                    kind == 0x17 && wire == write_len(i as u32) + RECORD_OVERHEAD
                })
        })
        .expect("one record per write, in order");
    let write_records = &stream_records[first..first + WRITES as usize];

    // Each out-of-order record: a whole write (checked on delivery), at that write's record,
    // opened under that write's sequence number (the same distance from the write's index
    // for all: the records the server sealed before the first write).
    let base = got
        .out_of_order
        .first()
        .map(|&(i, _, _, n)| n - u64::from(i));
    for &(i, offset, wire_len, number) in &got.out_of_order {
        let (at, wire, _) = write_records[i as usize];
        assert_eq!((offset, wire_len), (at, wire), "write {i}'s record");
        assert_eq!(
            Some(number - u64::from(i)),
            base,
            "write {i}'s sequence number"
        );
    }
    // Every write delivered exactly once.
    for (i, &c) in got.count.iter().enumerate() {
        assert_eq!(c, 1, "write {i} delivered {c} times");
    }
    assert_eq!(got.in_order.len() + got.out_of_order.len(), WRITES as usize);

    // Which records could have gone out of order: wholly received while the in-order stream
    // had not reached their start (a hole before them).
    let mut covered = vec![false; got.stream.len()];
    let mut eligible = vec![false; WRITES as usize];
    let mut complete = vec![false; WRITES as usize];
    for &(offset, len, in_order_after) in &got.events {
        let (start, end) = (offset as usize, offset as usize + len);
        covered[start..end].fill(true);
        let from = write_records.partition_point(|&(at, wire, _)| at as usize + wire <= start);
        for (i, &(at, wire, _)) in write_records.iter().enumerate().skip(from) {
            if at as usize >= end {
                break;
            }
            let (at, wire) = (at as usize, wire);
            if !complete[i] && covered[at..at + wire].iter().all(|&c| c) {
                complete[i] = true;
                eligible[i] = in_order_after < at as u64;
            }
        }
    }
    for &(i, ..) in &got.out_of_order {
        assert!(
            eligible[i as usize],
            "write {i} went out of order but was not complete ahead of a hole"
        );
    }
    let could = eligible.iter().filter(|&&e| e).count();
    let did = got.out_of_order.len();
    let down = &emulator.down.link;
    let up = &emulator.up.link;
    println!(
        "stock TLS 1.3 sender ({:?}), {WRITES} writes of 100-1400 B, link `{LINK}` both ways: \
         server->client {} of {} packets lost, client->server {} of {}; \
         {did} records delivered out of order of {could} that could have been \
         (complete ahead of a hole), {} in order; candidates rejected {}, left in order {}, \
         segment bytes refused {}, duplicates skipped {}; records before the first write {}",
        suite.suite(),
        down.dropped_random_loss,
        down.offered,
        up.dropped_random_loss,
        up.offered,
        got.in_order.len(),
        stats.candidates_rejected,
        stats.candidates_left_in_order,
        stats.segment_bytes_refused,
        stats.duplicates_skipped,
        base.map_or(-1, |b| b as i64),
    );
    assert!(
        down.dropped_random_loss > 0,
        "the emulator lost nothing towards the receiver: no hole to deliver ahead of"
    );
    assert!(
        did > 0,
        "no record delivered out of order ({could} could have been): {stats:?}"
    );
    assert_eq!(stats.records_out_of_order, did as u64);
    lab.teardown().expect("lab teardown");
}
