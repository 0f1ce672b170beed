//! TCP Fast Open (RFC 7413) between two endpoints in a small deterministic world, with the
//! lab's middleboxes (option stripping, SYN-data dropping) on the path; and the short
//! TIME-WAIT (NGTCP §3.3.3, RFC 6191).
//!
//! Every test checks the bytes the server application read (exactly once) and the counters
//! of both ends, and looks at the SYNs on the wire.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use squarepeg_lab::Direction;
use squarepeg_lab::middlebox::{
    DirectionFilter, DropSynDataConfig, Emit, Middlebox, OptionStripper, StripOptionsConfig,
    SynDataDropper,
};
use squarepeg_tcp::wire::parse_packet;
use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Event, FastOpenCookie,
    FastOpenEntry, State,
};

const SERVER: &str = "10.0.0.2:80";
const DELAY: Duration = Duration::from_millis(10);

/// A packet as it crossed the path.
#[derive(Clone, Debug)]
struct Seen {
    to_server: bool,
    syn: bool,
    ack: bool,
    rst: bool,
    seq: u32,
    ack_no: u32,
    payload: Vec<u8>,
    fast_open: Option<FastOpenCookie>,
    /// When it was sent (virtual time).
    at: Option<Instant>,
}

/// What the server's application did on one connection.
#[derive(Default, Debug, Clone)]
struct ServerConn {
    data: Vec<u8>,
    /// State of the connection when the application first read data.
    state_at_first_read: Option<State>,
    /// Whether the application wrote `World::answer` (after the first read).
    answered: bool,
}

/// Decides which packets (as sent) the path drops.
type Loss = Box<dyn FnMut(&Seen) -> bool>;

struct World {
    client: Endpoint,
    server: Endpoint,
    now: Instant,
    /// (arrival, order, to_server, packet)
    wire: Vec<(Instant, u64, bool, Vec<u8>)>,
    order: u64,
    boxes: Vec<Box<dyn Middlebox>>,
    /// Packets as sent by either end, before the middleboxes.
    sent: Vec<Seen>,
    /// Packets as delivered to the server (after the middleboxes).
    at_server: Vec<Vec<u8>>,
    server_conns: HashMap<ConnectionHandle, ServerConn>,
    /// Server connections in accept order.
    accepted: Vec<ConnectionHandle>,
    /// What the server application writes once it has read a connection's first data.
    answer: Option<Vec<u8>>,
    /// Loss on the path: packets (as sent) for which this returns true are dropped.
    loss: Option<Loss>,
}

fn seen(to_server: bool, p: &[u8]) -> Seen {
    let s = parse_packet(p, true).expect("valid packet");
    Seen {
        to_server,
        syn: s.flags.syn(),
        ack: s.flags.ack(),
        rst: s.flags.rst(),
        seq: s.seq,
        ack_no: s.ack,
        payload: s.payload.to_vec(),
        fast_open: s.options.fast_open,
        at: None,
    }
}

fn tfo_config() -> ConnectionConfig {
    let mut c = ConnectionConfig::default();
    c.fast_open = true;
    c
}

impl World {
    fn new(server_cfg: ConnectionConfig) -> World {
        World::with_server_endpoint(server_cfg, EndpointConfig::default())
    }

    /// [`World::new`] with the server endpoint configured as `sc` (its secret set here).
    fn with_server_endpoint(server_cfg: ConnectionConfig, mut sc: EndpointConfig) -> World {
        let t0 = Instant::now();
        let mut cc = EndpointConfig::default();
        cc.secret = [1; 32];
        sc.secret = [2; 32];
        let client = Endpoint::new(cc, t0);
        let mut server = Endpoint::new(sc, t0);
        server
            .listen(SERVER.parse().unwrap(), 64, server_cfg)
            .unwrap();
        World {
            client,
            server,
            now: t0,
            wire: Vec::new(),
            order: 0,
            boxes: Vec::new(),
            sent: Vec::new(),
            at_server: Vec::new(),
            server_conns: HashMap::new(),
            accepted: Vec::new(),
            answer: None,
            loss: None,
        }
    }

    fn server_addr(&self) -> SocketAddr {
        SERVER.parse().unwrap()
    }

    /// Opens a connection from `port` and writes `data` before the SYN goes out.
    fn connect(&mut self, port: u16, cfg: ConnectionConfig, data: &[u8]) -> ConnectionHandle {
        let local: SocketAddr = format!("10.0.0.1:{port}").parse().unwrap();
        let c = self
            .client
            .connect(self.now, local, self.server_addr(), cfg)
            .unwrap();
        if !data.is_empty() {
            assert_eq!(self.client.write(c, data).unwrap(), data.len());
        }
        c
    }

    fn send_through(&mut self, to_server: bool, packet: Vec<u8>) {
        let mut s = seen(to_server, &packet);
        s.at = Some(self.now);
        let lost = self.loss.as_mut().is_some_and(|f| f(&s));
        self.sent.push(s);
        if lost {
            return;
        }
        let dir = if to_server {
            Direction::LeftToRight
        } else {
            Direction::RightToLeft
        };
        let mut packets = vec![packet];
        for b in &mut self.boxes {
            let mut out: Vec<Emit> = Vec::new();
            for p in packets {
                b.process(self.now, dir, p, &mut out);
            }
            packets = out.into_iter().map(|e| e.packet).collect();
        }
        for p in packets {
            self.order += 1;
            self.wire.push((self.now + DELAY, self.order, to_server, p));
        }
    }

    /// Injects raw bytes into the server, as an attacker replaying a capture would.
    fn inject_to_server(&mut self, packet: &[u8]) {
        self.order += 1;
        self.wire
            .push((self.now, self.order, true, packet.to_vec()));
    }

    /// The server application: accepts and reads everything at once.
    fn server_app(&mut self) {
        while let Some(ev) = self.server.poll_event() {
            if let Event::Incoming(l) = ev {
                while let Some(c) = self.server.accept(l) {
                    self.accepted.push(c);
                    self.server_conns.entry(c).or_default();
                }
            }
        }
        let mut buf = vec![0u8; 65536];
        for &c in &self.accepted {
            loop {
                let state = self.server.connection(c).map(|x| x.state());
                match self.server.read(c, &mut buf) {
                    Ok(n) if n > 0 => {
                        let e = self.server_conns.get_mut(&c).unwrap();
                        if e.state_at_first_read.is_none() {
                            e.state_at_first_read = state;
                        }
                        e.data.extend_from_slice(&buf[..n]);
                        if let Some(a) = &self.answer
                            && !e.answered
                        {
                            e.answered = true;
                            assert_eq!(self.server.write(c, a).unwrap(), a.len());
                        }
                    }
                    Ok(_) => {
                        // End of stream: close our side and release the handle.
                        if state == Some(State::CloseWait) {
                            let _ = self.server.close(self.now, c);
                        }
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        while self.client.poll_event().is_some() {}
    }

    /// Moves packets and time until `done` or `limit` of virtual time.
    fn run(&mut self, limit: Duration, mut done: impl FnMut(&mut World) -> bool) -> bool {
        let deadline = self.now + limit;
        let mut buf = vec![0u8; 2000];
        loop {
            self.server_app();
            if done(self) {
                return true;
            }
            let mut progressed = false;
            while let Some(n) = self.client.poll_transmit(self.now, &mut buf) {
                self.send_through(true, buf[..n].to_vec());
                progressed = true;
            }
            while let Some(n) = self.server.poll_transmit(self.now, &mut buf) {
                self.send_through(false, buf[..n].to_vec());
                progressed = true;
            }
            if progressed {
                continue;
            }
            let next_packet = self.wire.iter().map(|w| (w.0, w.1)).min();
            let next_timer = [self.client.poll_timeout(), self.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let next = match (next_packet.map(|p| p.0), next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return done(self),
            };
            if next > deadline {
                self.now = deadline;
                return done(self);
            }
            self.now = self.now.max(next);
            if let Some((at, order)) = next_packet
                && at <= self.now
            {
                let i = self.wire.iter().position(|w| w.1 == order).unwrap();
                let (_, _, to_server, p) = self.wire.remove(i);
                if to_server {
                    self.at_server.push(p.clone());
                    let _ = self.server.handle_packet(self.now, &p);
                } else {
                    let _ = self.client.handle_packet(self.now, &p);
                }
            }
            self.client.handle_timeout(self.now);
            self.server.handle_timeout(self.now);
        }
    }

    /// Runs until the server application has read `want` on some connection after `from`
    /// accepted connections, and the client connection is established.
    fn deliver(&mut self, c: ConnectionHandle, from: usize, want: &[u8]) {
        let ok = self.run(Duration::from_secs(30), |w| {
            let established = w
                .client
                .connection(c)
                .is_some_and(|x| x.state() == State::Established);
            established
                && w.accepted[from.min(w.accepted.len())..]
                    .iter()
                    .any(|h| w.server_conns[h].data == want)
        });
        assert!(ok, "not delivered: {:?}", self.server_conns);
    }

    /// Closes the client connection and lets both sides finish.
    fn close(&mut self, c: ConnectionHandle) {
        self.client.close(self.now, c).unwrap();
        self.run(Duration::from_secs(2), |_| false);
    }

    /// Client SYNs sent since `from` (index into `sent`).
    fn client_syns(&self, from: usize) -> Vec<Seen> {
        self.sent[from..]
            .iter()
            .filter(|s| s.to_server && s.syn)
            .cloned()
            .collect()
    }

    /// The server's SYN-ACKs sent since `from`.
    fn syn_acks(&self, from: usize) -> Vec<Seen> {
        self.sent[from..]
            .iter()
            .filter(|s| !s.to_server && s.syn && s.ack)
            .cloned()
            .collect()
    }

    /// Everything the server application read, over all connections since `from`.
    fn server_read(&self, from: usize) -> Vec<Vec<u8>> {
        self.accepted[from..]
            .iter()
            .map(|h| self.server_conns[h].data.clone())
            .collect()
    }
}

/// First contact: a cookie request on the SYN, a cookie in the SYN-ACK, the data after the
/// handshake. Returns the world with the cookie cached.
fn first_contact(server_cfg: ConnectionConfig) -> World {
    let mut w = World::new(server_cfg);
    let c = w.connect(40000, tfo_config(), b"first request");
    w.deliver(c, 0, b"first request");
    let syns = w.client_syns(0);
    assert_eq!(syns.len(), 1);
    assert_eq!(syns[0].fast_open, Some(FastOpenCookie::REQUEST));
    assert!(syns[0].payload.is_empty(), "no data without a cookie");
    let synacks = w.syn_acks(0);
    let cookie = synacks[0].fast_open.expect("cookie in the SYN-ACK");
    assert_eq!(cookie.as_bytes().len(), 8);
    let cs = w.client.stats().fast_open.clone();
    assert_eq!(cs.cookie_requests_sent, 1);
    assert_eq!(cs.cookies_received, 1);
    assert_eq!(cs.syn_data_sent, 0);
    let ss = w.server.stats().fast_open.clone();
    assert_eq!(ss.cookie_requests_received, 1);
    assert_eq!(ss.cookies_sent, 1);
    assert_eq!(w.client.fast_open_cache().len(), 1);
    assert_eq!(w.client.fast_open_cache()[0].cookie, cookie);
    w.close(c);
    w
}

#[test]
fn returning_client_puts_data_on_the_syn_and_the_server_reads_it_before_the_handshake_ends() {
    let mut w = first_contact(tfo_config());
    let mark = w.sent.len();
    let accepted = w.accepted.len();
    let c = w.connect(40001, tfo_config(), b"GET /x");
    w.deliver(c, accepted, b"GET /x");
    let syns = w.client_syns(mark);
    assert_eq!(syns.len(), 1, "one SYN, no retransmission");
    assert_eq!(syns[0].payload, b"GET /x");
    assert!(syns[0].fast_open.is_some_and(|c| !c.is_request()));
    // The SYN-ACK acknowledges the data: ISN + 1 + 6.
    let synack = &w.syn_acks(mark)[0];
    assert_eq!(synack.ack_no, syns[0].seq.wrapping_add(7));
    // The data crossed the path once, on the SYN.
    let data_segments = w.sent[mark..]
        .iter()
        .filter(|s| s.to_server && !s.payload.is_empty())
        .count();
    assert_eq!(data_segments, 1);
    let h = w.accepted[accepted];
    assert_eq!(
        w.server_conns[&h].state_at_first_read,
        Some(State::SynReceived),
        "the server application read the SYN's data before the handshake completed"
    );
    assert_eq!(w.server_read(accepted), vec![b"GET /x".to_vec()]);
    let cs = w.client.stats().fast_open.clone();
    assert_eq!(
        (cs.syn_data_sent, cs.syn_data_bytes, cs.syn_data_acked),
        (1, 6, 1)
    );
    assert_eq!(cs.syn_data_not_acked, 0);
    let ss = w.server.stats().fast_open.clone();
    assert_eq!((ss.cookies_accepted, ss.syn_data_accepted), (1, 1));
    assert_eq!(w.client.stats_of(c).unwrap().packets_retransmitted, 0);
    // The connection carries on normally: an answer and more data both ways.
    w.server.write(h, b"200 OK").unwrap();
    w.client.write(c, b" and more").unwrap();
    let mut got = Vec::new();
    let ok = w.run(Duration::from_secs(5), |w| {
        let mut buf = [0u8; 100];
        while let Ok(n) = w.client.read(c, &mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got == b"200 OK" && w.server_conns[&h].data == b"GET /x and more"
    });
    assert!(ok, "{:?} {:?}", got, w.server_conns[&h]);
    w.server.check_invariants();
    w.client.check_invariants();
}

#[test]
fn forged_cookie_is_refused_and_the_data_is_sent_again_once() {
    let mut w = World::new(tfo_config());
    w.client.import_fast_open_cache([FastOpenEntry {
        server: w.server_addr().ip(),
        cookie: FastOpenCookie::new(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4]).unwrap(),
        mss: Some(1460),
    }]);
    let c = w.connect(40000, tfo_config(), b"forged");
    w.deliver(c, 0, b"forged");
    let syns = w.client_syns(0);
    assert_eq!(syns.len(), 1);
    assert_eq!(
        syns[0].payload, b"forged",
        "data on the SYN with the cached cookie"
    );
    let synack = &w.syn_acks(0)[0];
    assert_eq!(
        synack.ack_no,
        syns[0].seq.wrapping_add(1),
        "only the ISN acked"
    );
    let fresh = synack.fast_open.expect("a valid cookie for next time");
    assert_eq!(w.server_read(0), vec![b"forged".to_vec()]);
    let ss = w.server.stats().fast_open.clone();
    assert_eq!(
        (ss.cookies_refused, ss.cookies_sent, ss.syn_data_accepted),
        (1, 1, 0)
    );
    let cs = w.client.stats().fast_open.clone();
    assert_eq!((cs.syn_data_not_acked, cs.cookies_received), (1, 1));
    assert_eq!(w.client.fast_open_cache()[0].cookie, fresh);
    w.close(c);
    // The next connection uses the fresh cookie, accepted.
    let mark = w.sent.len();
    let c = w.connect(40001, tfo_config(), b"again");
    w.deliver(c, 1, b"again");
    assert_eq!(w.client_syns(mark)[0].fast_open, Some(fresh));
    assert_eq!(w.server.stats().fast_open.syn_data_accepted, 1);
    assert_eq!(w.server_read(1), vec![b"again".to_vec()]);
}

#[test]
fn cookies_expire_with_the_key_period_and_a_previous_period_cookie_is_renewed() {
    // Keys change every 10 s (RFC 7413 §4.1.2): a cookie of the current or the previous
    // period is good, an older one is refused.
    let mut sc = EndpointConfig::default();
    sc.fast_open_key_period = Some(Duration::from_secs(10));
    let mut w = World::with_server_endpoint(tfo_config(), sc);
    let c = w.connect(40000, tfo_config(), b"first");
    w.deliver(c, 0, b"first");
    w.close(c);
    let first = w.client.fast_open_cache()[0].cookie;
    // Period 1: the period-0 cookie still takes the data, and the SYN-ACK renews it.
    w.run(Duration::from_secs(12), |_| false);
    let mark = w.sent.len();
    let c = w.connect(40001, tfo_config(), b"second");
    w.deliver(c, 1, b"second");
    w.close(c);
    let synack = &w.syn_acks(mark)[0];
    let renewed = synack.fast_open.expect("the current period's cookie");
    assert_ne!(renewed, first);
    let ss = w.server.stats().fast_open.clone();
    assert_eq!(
        (ss.syn_data_accepted, ss.cookies_of_previous_key),
        (1, 1),
        "{ss:?}"
    );
    assert_eq!(w.client.fast_open_cache()[0].cookie, renewed);
    // Period 1 still: the renewed cookie is current and nothing is renewed.
    let mark = w.sent.len();
    let c = w.connect(40002, tfo_config(), b"third");
    w.deliver(c, 2, b"third");
    w.close(c);
    assert_eq!(w.syn_acks(mark)[0].fast_open, None);
    assert_eq!(w.server.stats().fast_open.syn_data_accepted, 2);
    // Period 3: the period-1 cookie is refused, the data arrives once after the handshake,
    // and the client learns the new cookie.
    w.run(Duration::from_secs(20), |_| false);
    let mark = w.sent.len();
    let c = w.connect(40003, tfo_config(), b"fourth");
    w.deliver(c, 3, b"fourth");
    let ss = w.server.stats().fast_open.clone();
    assert_eq!((ss.cookies_refused, ss.syn_data_accepted), (1, 2), "{ss:?}");
    assert_eq!(w.server_read(3), vec![b"fourth".to_vec()]);
    let fresh = w.syn_acks(mark)[0]
        .fast_open
        .expect("a cookie for next time");
    assert!(fresh != renewed && fresh != first);
    assert_eq!(w.client.fast_open_cache()[0].cookie, fresh);
    w.server.check_invariants();
}

/// The default option stripper keeps only MSS, window scale, SACK and timestamps.
fn stripper(directions: DirectionFilter) -> Box<dyn Middlebox> {
    Box::new(OptionStripper::new(StripOptionsConfig {
        directions,
        ..Default::default()
    }))
}

#[test]
fn option_stripped_towards_the_server_forgets_the_cookie_and_delivers_once() {
    let mut w = first_contact(tfo_config());
    w.boxes.push(stripper(DirectionFilter::LeftToRight));
    let mark = w.sent.len();
    let accepted = w.accepted.len();
    let c = w.connect(40001, tfo_config(), b"stripped");
    w.deliver(c, accepted, b"stripped");
    let syn = &w.client_syns(mark)[0];
    assert_eq!(syn.payload, b"stripped");
    assert!(syn.fast_open.is_some(), "sent with the cookie");
    // The server saw a SYN with data but no option: it took only the SYN.
    let synack = &w.syn_acks(mark)[0];
    assert_eq!(synack.ack_no, syn.seq.wrapping_add(1));
    assert_eq!(synack.fast_open, None);
    assert_eq!(w.server_read(accepted), vec![b"stripped".to_vec()]);
    let cs = w.client.stats().fast_open.clone();
    assert_eq!((cs.syn_data_not_acked, cs.cookies_forgotten), (1, 1));
    assert!(w.client.fast_open_cache().is_empty(), "cookie forgotten");
    assert_eq!(w.server.stats().fast_open.syn_data_accepted, 0);
    w.close(c);
    // Without a cookie the next SYN asks for one again, without data.
    let mark = w.sent.len();
    let c = w.connect(40002, tfo_config(), b"next");
    w.deliver(c, accepted + 1, b"next");
    let syn = &w.client_syns(mark)[0];
    assert!(syn.payload.is_empty());
    assert_eq!(w.server_read(accepted + 1), vec![b"next".to_vec()]);
}

#[test]
fn option_stripped_towards_the_client_never_yields_a_cookie() {
    let mut w = World::new(tfo_config());
    w.boxes.push(stripper(DirectionFilter::RightToLeft));
    for (i, req) in [b"one".as_slice(), b"two"].into_iter().enumerate() {
        let mark = w.sent.len();
        let c = w.connect(40000 + i as u16, tfo_config(), req);
        w.deliver(c, i, req);
        let syn = &w.client_syns(mark)[0];
        assert_eq!(syn.fast_open, Some(FastOpenCookie::REQUEST));
        assert!(syn.payload.is_empty());
        // The server did send a cookie, which the path removed.
        assert!(w.syn_acks(mark)[0].fast_open.is_some());
        w.close(c);
    }
    assert_eq!(w.server_read(0), vec![b"one".to_vec(), b"two".to_vec()]);
    let cs = w.client.stats().fast_open.clone();
    assert_eq!((cs.cookie_requests_sent, cs.cookies_received), (2, 0));
    assert_eq!(w.server.stats().fast_open.cookies_sent, 2);
    assert!(w.client.fast_open_cache().is_empty());
}

#[test]
fn dropped_syn_data_is_sent_again_without_data_and_the_server_is_blackholed() {
    let mut w = first_contact(tfo_config());
    w.boxes
        .push(Box::new(SynDataDropper::new(DropSynDataConfig {
            directions: DirectionFilter::LeftToRight,
        })));
    let mark = w.sent.len();
    let accepted = w.accepted.len();
    let c = w.connect(40001, tfo_config(), b"dropped");
    w.deliver(c, accepted, b"dropped");
    let syns = w.client_syns(mark);
    assert_eq!(syns.len(), 2, "{syns:?}");
    assert_eq!(syns[0].payload, b"dropped");
    assert!(
        syns[1].payload.is_empty(),
        "the retransmitted SYN carries no data"
    );
    assert_eq!(syns[1].fast_open, None, "nor the option");
    assert_eq!(w.server_read(accepted), vec![b"dropped".to_vec()]);
    let cs = w.client.stats().fast_open.clone();
    assert_eq!(
        (
            cs.syn_data_timeouts,
            cs.syn_data_not_acked,
            cs.blackholes_detected
        ),
        (1, 1, 1)
    );
    let server_ip = w.server_addr().ip();
    assert!(w.client.fast_open_blackholed(server_ip, w.now));
    w.close(c);
    // The next Fast Open connect is an ordinary one: no option, no data on the SYN, no
    // timeout.
    let mark = w.sent.len();
    let c = w.connect(40002, tfo_config(), b"plain");
    let t = w.now;
    w.deliver(c, accepted + 1, b"plain");
    assert!(w.now - t < Duration::from_millis(200), "no SYN timeout");
    let syns = w.client_syns(mark);
    assert_eq!(syns.len(), 1);
    assert_eq!(syns[0].fast_open, None);
    assert!(syns[0].payload.is_empty());
    assert_eq!(w.client.stats().fast_open.blackholed_connects, 1);
    assert_eq!(w.server_read(accepted + 1), vec![b"plain".to_vec()]);
    // An hour later (EndpointConfig::fast_open_blackhole) Fast Open is tried again.
    assert!(
        !w.client
            .fast_open_blackholed(server_ip, w.now + Duration::from_secs(3601))
    );
}

#[test]
fn pending_fast_open_connections_are_bounded() {
    let mut server_cfg = tfo_config();
    server_cfg.fast_open_max_pending = 0;
    let mut w = first_contact(server_cfg);
    let mark = w.sent.len();
    let accepted = w.accepted.len();
    let c = w.connect(40001, tfo_config(), b"over the limit");
    w.deliver(c, accepted, b"over the limit");
    let syn = &w.client_syns(mark)[0];
    assert_eq!(syn.payload, b"over the limit");
    assert_eq!(w.syn_acks(mark)[0].ack_no, syn.seq.wrapping_add(1));
    let ss = w.server.stats().fast_open.clone();
    assert_eq!(
        (
            ss.cookies_accepted,
            ss.pending_overflows,
            ss.syn_data_accepted
        ),
        (1, 1, 0)
    );
    assert_eq!(w.server_read(accepted), vec![b"over the limit".to_vec()]);
    // The cookie was valid, and came back in the SYN-ACK: the client keeps it.
    assert!(w.syn_acks(mark)[0].fast_open.is_some());
    assert_eq!(w.client.stats().fast_open.cookies_forgotten, 0);
    assert_eq!(w.client.fast_open_cache().len(), 1);
}

/// RFC 7413 §6 (and §6.1): TCP Fast Open does not stop duplicate SYN data. What this TCP
/// does with a captured SYN+data replayed into the server:
/// 1. while the original connection holds the 4-tuple (handshake, ESTABLISHED), the replay
///    is a duplicate SYN of that connection: the SYN-ACK is sent again, or a challenge ACK
///    (RFC 5961 §4); the data is not delivered again;
/// 2. once the server has forgotten the connection, the replay opens a new one: the cookie
///    is still valid, so its data is handed to the server application a second time, before
///    the handshake (which the real client then resets) completes.
///
/// At-most-once execution is the job of the layer above (TLS 1.3 single-use tickets).
#[test]
fn replayed_syn_data_reaches_the_application_again_once_the_connection_is_gone() {
    let mut w = first_contact(tfo_config());
    let mark = w.at_server.len();
    let accepted = w.accepted.len();
    let c = w.connect(40001, tfo_config(), b"PAY 100");
    w.deliver(c, accepted, b"PAY 100");
    let captured = w.at_server[mark].clone();
    let syn = seen(true, &captured);
    assert!(syn.syn && syn.payload == b"PAY 100");
    // (1) Replayed while the connection is established: no second delivery.
    w.inject_to_server(&captured);
    w.run(Duration::from_millis(100), |_| false);
    assert_eq!(w.accepted.len(), accepted + 1);
    assert_eq!(w.server_read(accepted), vec![b"PAY 100".to_vec()]);
    assert_eq!(w.server.stats().fast_open.syn_data_accepted, 2 - 1);
    // The client closes first; the server's side ends in LAST-ACK and is forgotten.
    w.close(c);
    w.run(Duration::from_secs(1), |_| false);
    assert_eq!(
        w.server.connection_count(),
        0,
        "the server forgot the connection"
    );
    // (2) Replayed now: a new connection, the data delivered to the application again.
    let mark_sent = w.sent.len();
    w.inject_to_server(&captured);
    w.run(Duration::from_secs(1), |_| false);
    assert_eq!(
        w.server_read(accepted),
        vec![b"PAY 100".to_vec(), b"PAY 100".to_vec()],
        "TCP Fast Open does not protect against duplicate SYN data (RFC 7413 §6)"
    );
    assert_eq!(w.server.stats().fast_open.syn_data_accepted, 2);
    // The real client, in TIME-WAIT for that 4-tuple, answered the SYN-ACK; the replayed
    // connection does not complete.
    let replay_conn = w.accepted[accepted + 1];
    let state = w.server.connection(replay_conn).map(|x| x.state());
    assert_ne!(state, Some(State::Established), "{state:?}");
    let client_answers: Vec<_> = w.sent[mark_sent..]
        .iter()
        .filter(|s| s.to_server)
        .map(|s| (s.rst, s.ack))
        .collect();
    assert!(
        !client_answers.is_empty(),
        "the client answered the stray SYN-ACK"
    );
}

#[test]
fn fast_open_off_changes_nothing_on_the_wire() {
    // Neither side enables it: no option in either direction, data after the handshake.
    let mut w = World::new(ConnectionConfig::default());
    let c = w.connect(40000, ConnectionConfig::default(), b"plain");
    w.deliver(c, 0, b"plain");
    assert!(w.sent.iter().all(|s| s.fast_open.is_none()));
    // A client's cookie request to a server without Fast Open gets no cookie.
    let mark = w.sent.len();
    let c2 = w.connect(40001, tfo_config(), b"req");
    w.deliver(c2, 1, b"req");
    assert_eq!(
        w.client_syns(mark)[0].fast_open,
        Some(FastOpenCookie::REQUEST)
    );
    assert_eq!(w.syn_acks(mark)[0].fast_open, None);
    assert_eq!(w.server.stats().fast_open, Default::default());
    assert!(w.client.fast_open_cache().is_empty());
}

#[test]
fn cache_export_import_and_bounds() {
    let w = first_contact(tfo_config());
    let exported = w.client.fast_open_cache();
    assert_eq!(exported.len(), 1);
    let line = exported[0].to_string();
    let back: FastOpenEntry = line.parse().unwrap();
    assert_eq!(back, exported[0]);
    assert!("10.0.0.2 00".parse::<FastOpenEntry>().is_err());
    assert!("nonsense".parse::<FastOpenEntry>().is_err());
    // A fresh client with the imported cookie puts data on its first SYN.
    let mut w2 = World::new(tfo_config());
    // Same server secret as in `first_contact`, so the exported cookie is good here.
    w2.client.import_fast_open_cache(exported.clone());
    let c = w2.connect(40000, tfo_config(), b"imported");
    w2.deliver(c, 0, b"imported");
    assert_eq!(w2.client_syns(0)[0].payload, b"imported");
    assert_eq!(w2.server.stats().fast_open.syn_data_accepted, 1);
    // The cache is bounded, least recently used out first.
    let mut config = EndpointConfig::default();
    config.fast_open_cache_size = 2;
    let mut ep = Endpoint::new(config, Instant::now());
    let cookie = exported[0].cookie;
    let entry = |ip: &str| FastOpenEntry {
        server: ip.parse().unwrap(),
        cookie,
        mss: None,
    };
    ep.import_fast_open_cache([entry("192.0.2.1"), entry("192.0.2.2"), entry("192.0.2.3")]);
    let servers: Vec<String> = ep
        .fast_open_cache()
        .iter()
        .map(|e| e.server.to_string())
        .collect();
    assert_eq!(servers, ["192.0.2.2", "192.0.2.3"]);
}

// ---------------------------------------------------------------- short TIME-WAIT

/// Opens `n` transactions in a row from the same client port: request, answer, the client
/// closes first (so the client holds TIME-WAIT), and the next one starts as soon as
/// `connect` accepts the 4-tuple again. Returns how long each TIME-WAIT lasted.
fn transactions_from_one_port(n: usize, client_cfg: ConnectionConfig) -> Vec<Duration> {
    let mut w = World::new(ConnectionConfig::default());
    let mut waits = Vec::new();
    for i in 0..n {
        let req = format!("request {i}");
        let c = w.connect(40000, client_cfg.clone(), req.as_bytes());
        w.deliver(c, i, req.as_bytes());
        w.client.close(w.now, c).unwrap();
        // Until the client's side is in TIME-WAIT.
        let ok = w.run(Duration::from_secs(5), |w| {
            w.client.connection_count() == 1 && w.server.connection_count() == 0
        });
        assert!(ok, "the server's side closed");
        let entered = w.now;
        let ok = w.run(Duration::from_secs(120), |w| {
            w.client.connection_count() == 0
        });
        assert!(ok, "TIME-WAIT ended");
        waits.push(w.now - entered);
    }
    assert_eq!(w.accepted.len(), n);
    for (i, h) in w.accepted.iter().enumerate() {
        assert_eq!(w.server_conns[h].data, format!("request {i}").as_bytes());
    }
    waits
}

#[test]
fn short_time_wait_lasts_a_few_rtos_with_timestamps() {
    let mut short = ConnectionConfig::default();
    short.short_time_wait = Some(Duration::from_millis(100));
    let waits = transactions_from_one_port(5, short.clone());
    eprintln!("short TIME-WAIT (RTT 20 ms, floor 100 ms): {waits:?}");
    // 20 ms RTT: RTO = min_rto = 200 ms, so 2 × RTO = 400 ms (above the floor).
    for w in &waits {
        assert!(
            *w >= Duration::from_millis(350) && *w <= Duration::from_millis(450),
            "{w:?}"
        );
    }
    // Without timestamps the short TIME-WAIT does not apply (nothing tells old duplicates
    // from new segments): the configured 2 MSL.
    let mut no_ts = short;
    no_ts.timestamps = false;
    no_ts.time_wait = Duration::from_secs(30);
    let waits = transactions_from_one_port(2, no_ts);
    eprintln!("without timestamps: {waits:?}");
    assert!(waits.iter().all(|w| *w >= Duration::from_secs(29)));
    // And the default stays 60 s.
    let waits = transactions_from_one_port(1, ConnectionConfig::default());
    eprintln!("default: {waits:?}");
    assert!(waits[0] >= Duration::from_secs(59));
}

/// When the server closes first it holds TIME-WAIT (60 s by default), and the client's next
/// SYN from the same port, stamped later, reopens the 4-tuple at once (RFC 6191).
#[test]
fn server_time_wait_reopened_by_a_newer_timestamp() {
    let mut w = World::new(ConnectionConfig::default());
    for i in 0..3 {
        let req = format!("request {i}");
        let c = w.connect(40000, ConnectionConfig::default(), req.as_bytes());
        w.deliver(c, i, req.as_bytes());
        let h = w.accepted[i];
        w.server.close(w.now, h).unwrap();
        let ok = w.run(Duration::from_secs(5), |w| {
            w.client
                .connection(c)
                .is_some_and(|x| x.state() == State::CloseWait)
        });
        assert!(ok);
        w.client.close(w.now, c).unwrap();
        let ok = w.run(Duration::from_secs(5), |w| w.client.connection_count() == 0);
        assert!(ok, "the client's side is gone (the server holds TIME-WAIT)");
        assert_eq!(w.server.connection_count(), 1);
    }
    assert_eq!(w.accepted.len(), 3);
}

// ------------------------------------------------ the server's answer in SYN-RECEIVED

/// A request from `port` to a server application that answers with `w.answer` once it has
/// read the request. Returns the client handle, what the client read, when it had read the
/// whole answer, and the index into `sent` where the exchange began.
fn exchange(
    w: &mut World,
    port: u16,
    cfg: ConnectionConfig,
    request: &[u8],
) -> (ConnectionHandle, Vec<u8>, Duration, usize) {
    let answer = w.answer.clone().expect("an answering server");
    let mark = w.sent.len();
    let start = w.now;
    let c = w.connect(port, cfg, request);
    let mut got = Vec::new();
    let mut done_at = None;
    let ok = w.run(Duration::from_secs(30), |w| {
        let mut buf = [0u8; 4096];
        while let Ok(n) = w.client.read(c, &mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got.len() >= answer.len() && done_at.is_none() {
            done_at = Some(w.now - start);
        }
        done_at.is_some()
    });
    assert!(
        ok,
        "answer not delivered: {} of {} bytes",
        got.len(),
        answer.len()
    );
    // Let stray retransmissions arrive (a duplicate would show in `got`).
    w.run(Duration::from_secs(5), |_| false);
    let mut buf = [0u8; 4096];
    while let Ok(n) = w.client.read(c, &mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    (c, got, done_at.unwrap(), mark)
}

/// The client's final ACK of the handshake (its first packet after the SYN-ACK it took),
/// since `from`.
fn handshake_ack(w: &World, from: usize) -> Seen {
    w.sent[from..]
        .iter()
        .find(|s| s.to_server && !s.syn && s.ack)
        .cloned()
        .expect("the handshake completed")
}

/// The server's data segments since `from`.
fn server_data(w: &World, from: usize) -> Vec<Seen> {
    w.sent[from..]
        .iter()
        .filter(|s| !s.to_server && !s.syn && !s.payload.is_empty())
        .cloned()
        .collect()
}

#[test]
fn fast_open_server_answer_leaves_before_the_handshake_ends_and_arrives_one_rtt_after_the_syn() {
    let mut w = first_contact(tfo_config());
    w.answer = Some(b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec());
    let accepted = w.accepted.len();
    let (c, got, t, mark) = exchange(&mut w, 40001, tfo_config(), b"GET /x");
    assert_eq!(got, w.answer.clone().unwrap(), "read exactly once");
    assert_eq!(w.server_read(accepted), vec![b"GET /x".to_vec()]);
    // One round trip after the SYN (2 × DELAY), not two: the answer is not held until the
    // client's ACK of the SYN-ACK arrives.
    assert_eq!(t, 2 * DELAY);
    // On the wire: SYN, SYN-ACK, the answer (from ISS + 1), then the client's final ACK;
    // the answer left before that ACK reached the server.
    let order: Vec<(bool, bool, usize)> = w.sent[mark..mark + 4]
        .iter()
        .map(|s| (s.to_server, s.syn, s.payload.len()))
        .collect();
    assert_eq!(
        order,
        vec![
            (true, true, 6),
            (false, true, 0),
            (false, false, 24),
            (true, false, 0)
        ]
    );
    let synack = &w.syn_acks(mark)[0];
    let data = server_data(&w, mark);
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].seq, synack.seq.wrapping_add(1));
    assert_eq!(data[0].ack_no, synack.ack_no);
    let ack = handshake_ack(&w, mark);
    assert!(data[0].at.unwrap() < ack.at.unwrap() + DELAY);
    assert_eq!(ack.ack_no, synack.seq.wrapping_add(1));
    assert!(
        w.sent[mark..]
            .iter()
            .any(|s| s.to_server && s.ack_no == synack.seq.wrapping_add(25)),
        "the client acknowledged the answer"
    );
    let h = w.accepted[accepted];
    assert_eq!(w.server.stats_of(h).unwrap().packets_retransmitted, 0);
    assert_eq!(w.client.stats_of(c).unwrap().packets_retransmitted, 0);
    assert_eq!(w.server.stats_of(h).unwrap().min_rtt, Some(2 * DELAY));
    w.server.check_invariants();
    w.client.check_invariants();
}

#[test]
fn fast_open_initial_window_of_answer_goes_before_the_handshake_ends() {
    let mut w = first_contact(tfo_config());
    let answer: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    w.answer = Some(answer.clone());
    let accepted = w.accepted.len();
    let (_, got, _, mark) = exchange(&mut w, 40001, tfo_config(), b"GET /big");
    assert_eq!(got, answer);
    assert_eq!(w.server_read(accepted), vec![b"GET /big".to_vec()]);
    let ack = handshake_ack(&w, mark);
    let arrived = ack.at.unwrap() + DELAY;
    let early: Vec<Seen> = server_data(&w, mark)
        .into_iter()
        .filter(|s| s.at.unwrap() < arrived)
        .collect();
    // IW10 counting the SYN-ACK: nine segments before the handshake's final ACK.
    assert_eq!(early.len(), 9);
    let h = w.accepted[accepted];
    // (A tail loss probe may repeat the last segment while the client delays its ACK.)
    assert_eq!(w.server.stats_of(h).unwrap().rto_timeouts, 0);
    w.server.check_invariants();
}

#[test]
fn fast_open_lost_syn_ack_recovers_and_delivers_everything_exactly_once() {
    let mut w = first_contact(tfo_config());
    let answer: Vec<u8> = (0..4000u32).map(|i| (i % 253) as u8).collect();
    w.answer = Some(answer.clone());
    let accepted = w.accepted.len();
    let mut dropped = false;
    w.loss = Some(Box::new(move |s| {
        let hit = !dropped && !s.to_server && s.syn;
        dropped |= hit;
        hit
    }));
    let (c, got, _, mark) = exchange(&mut w, 40001, tfo_config(), b"GET /x");
    assert_eq!(got, answer, "the answer exactly once");
    assert_eq!(w.server_read(accepted), vec![b"GET /x".to_vec()]);
    let synacks = w.syn_acks(mark);
    assert_eq!(synacks.len(), 2, "the SYN-ACK went again");
    assert!(synacks.iter().all(|s| s.payload.is_empty()));
    // The answer went once behind the lost SYN-ACK (the client, in SYN-SENT, dropped it),
    // and again only after the handshake completed.
    let ack = handshake_ack(&w, mark);
    let arrived = ack.at.unwrap() + DELAY;
    let data = server_data(&w, mark);
    let before: Vec<&Seen> = data.iter().filter(|s| s.at.unwrap() < arrived).collect();
    assert!(
        before
            .iter()
            .all(|s| s.at.unwrap() < synacks[1].at.unwrap())
    );
    assert_eq!(
        before.iter().map(|s| s.payload.len()).sum::<usize>(),
        answer.len()
    );
    let h = w.accepted[accepted];
    // No RTT sample from the ambiguous exchange inflated the estimate (Karn).
    let srtt = w.server.connection(h).unwrap().srtt().unwrap();
    assert!(srtt < Duration::from_millis(100), "{srtt:?}");
    assert_eq!(w.client.connection(c).unwrap().state(), State::Established);
    w.server.check_invariants();
    w.client.check_invariants();
}

#[test]
fn fast_open_answer_lost_in_syn_received_is_delivered_once() {
    let mut w = first_contact(tfo_config());
    let answer: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    w.answer = Some(answer.clone());
    let accepted = w.accepted.len();
    let mut dropped = false;
    w.loss = Some(Box::new(move |s| {
        let hit = !dropped && !s.to_server && !s.syn && !s.payload.is_empty();
        dropped |= hit;
        hit
    }));
    let (_, got, _, mark) = exchange(&mut w, 40001, tfo_config(), b"GET /x");
    assert_eq!(got, answer, "the answer exactly once");
    assert_eq!(w.server_read(accepted), vec![b"GET /x".to_vec()]);
    assert_eq!(w.syn_acks(mark).len(), 1);
    let h = w.accepted[accepted];
    let st = w.server.stats_of(h).unwrap();
    assert!(st.packets_retransmitted >= 1);
    assert_eq!(st.rto_timeouts, 0, "repaired by SACK/RACK, not a timeout");
    w.server.check_invariants();
    w.client.check_invariants();
}

#[test]
fn servers_without_fast_open_data_send_nothing_before_established() {
    let answer = b"answer".to_vec();
    // A cookie request (first contact), an ordinary SYN to a Fast Open server, and a Fast Open
    // client to a server without Fast Open.
    let cases: [(ConnectionConfig, ConnectionConfig); 3] = [
        (tfo_config(), tfo_config()),
        (tfo_config(), ConnectionConfig::default()),
        (ConnectionConfig::default(), tfo_config()),
    ];
    for (i, (server_cfg, client_cfg)) in cases.into_iter().enumerate() {
        let mut w = World::new(server_cfg);
        w.answer = Some(answer.clone());
        let (_, got, t, mark) = exchange(&mut w, 40000, client_cfg, b"request");
        assert_eq!(got, answer, "case {i}");
        let arrived = handshake_ack(&w, mark).at.unwrap() + DELAY;
        let data = server_data(&w, mark);
        assert!(
            data.iter().all(|s| s.at.unwrap() >= arrived),
            "case {i}: server data before ESTABLISHED"
        );
        // The request follows the handshake, the answer follows the request: two round trips.
        assert_eq!(t, 4 * DELAY, "case {i}");
        assert_eq!(w.server.stats().fast_open.syn_data_accepted, 0);
    }
}
