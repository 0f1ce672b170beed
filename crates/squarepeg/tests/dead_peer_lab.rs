//! A peer that stops answering, on the real lab (client — emulator — server namespaces): the
//! path is blackholed under a connection, and the connection fails with
//! `TransportError::TimedOut` (`ConnectionConfig::dead_peer_timeout`) — idle (keepalive
//! probes go unanswered) and with a message waiting to be acknowledged (the user timeout) —
//! while an idle connection whose peer answers stays open for longer than that.
//!
//! The same over the userspace TCP (a `LabStack` in the client's namespace talking to the
//! kernel-TCP server), where the timeout is the TCP's user timeout and keepalive, and also a
//! closed window: a server that stops reading keeps its connection however long it pauses
//! (its TCP answers the zero-window probes), and one whose path goes silent while the
//! window is closed is found.
//!
//! Needs root and iproute2 (and /dev/net/tun for the userspace TCP); ignored otherwise.
//! Asserts outcomes, never durations (the waits are bounds).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use squarepeg::{
    Bytes, Connection, ConnectionConfig, ConnectionError, Endpoint, MessageProps, TransportError,
};
use squarepeg_lab::net::{Lab, LabConfig};

const PORT: u16 = 6300;
const TIMEOUT: Duration = Duration::from_secs(3);

/// Fails a test that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test stalled")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn config() -> ConnectionConfig {
    let mut c = ConnectionConfig::default();
    c.dead_peer_timeout = Some(TIMEOUT);
    c
}

/// The client's substrate (the server is always kernel TCP).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    Kernel,
    #[cfg(feature = "utcp")]
    Utcp,
}

fn lab(tag: &str) -> Lab {
    Lab::start(
        LabConfig::new(&format!("sqdp{tag}{}", std::process::id() % 10_000))
            .with_up("delay=5ms".parse().unwrap())
            .with_down("delay=5ms".parse().unwrap()),
    )
    .expect("start lab")
}

/// The client's connection to `addr`, over `client`'s substrate (`stack`: the userspace
/// TCP's, attached to the lab's client end).
async fn connect(
    client: Client,
    #[cfg(feature = "utcp")] stack: Option<&squarepeg_lab::stack::LabStack>,
    addr: SocketAddr,
) -> Connection {
    match client {
        Client::Kernel => no_hang(Connection::connect(addr, config()))
            .await
            .expect("connect"),
        #[cfg(feature = "utcp")]
        Client::Utcp => no_hang(Connection::connect_utcp(
            stack.expect("a stack").stack(),
            addr,
            config(),
        ))
        .await
        .expect("uTCP connect"),
    }
}

/// The userspace TCP on the lab's client end, for `client`.
#[cfg(feature = "utcp")]
fn stack_for(lab: &Lab, client: Client) -> Option<squarepeg_lab::stack::LabStack> {
    (client == Client::Utcp).then(|| {
        squarepeg_lab::stack::LabStack::attach(
            lab,
            squarepeg_lab::net::Role::Client,
            squarepeg_io::StackConfig::new([]),
            Some(1500),
        )
        .expect("attach stack")
    })
}

/// What the client's connection ended with, if it ended within `wait`: it connects to a
/// server in the other namespace and exchanges a message each way; then the path is
/// blackholed (if `blackhole`), and the client sends a message (if `send`) or stays idle.
fn scenario(
    tag: &str,
    client: Client,
    blackhole: bool,
    send: bool,
    wait: Duration,
) -> Option<ConnectionError> {
    let lab = lab(tag);
    #[cfg(feature = "utcp")]
    let stack = stack_for(&lab, client);
    let server_ip: IpAddr = lab.addresses().server(false);
    let addr = SocketAddr::new(server_ip, PORT);
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let server_ns = lab.server().try_clone().unwrap();
    let server = std::thread::spawn(move || {
        server_ns
            .run(move || {
                runtime().block_on(async move {
                    let ep = Endpoint::bind(addr, config()).await.expect("bind");
                    bound_tx.send(()).unwrap();
                    let conn = no_hang(ep.accept()).await.expect("accept");
                    let m = no_hang(conn.recv_message()).await.expect("message");
                    no_hang(conn.send_message(m.payload, MessageProps::default()))
                        .await
                        .expect("answer");
                    // Held open (and answering) until the client's side is done.
                    let _ = done_rx.await;
                })
            })
            .expect("server namespace")
    });
    bound_rx.recv().unwrap();
    let (exchanged_tx, exchanged_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let client_ns = lab.client().try_clone().unwrap();
    #[cfg(feature = "utcp")]
    let stack_ref = stack.as_ref();
    let client = std::thread::scope(|scope| {
        let run = move || {
            runtime().block_on(async move {
                let conn = connect(
                    client,
                    #[cfg(feature = "utcp")]
                    stack_ref,
                    addr,
                )
                .await;
                no_hang(conn.send_message(Bytes::from_static(b"hello"), MessageProps::default()))
                    .await
                    .unwrap();
                let answer = no_hang(conn.recv_message()).await.unwrap();
                assert_eq!(&answer.payload[..], b"hello");
                // Everything acknowledged (what the session says after a read included):
                // an idle connection, where only keepalive probes can tell.
                tokio::time::sleep(Duration::from_millis(500)).await;
                exchanged_tx.send(()).unwrap();
                go_rx.await.unwrap();
                if send {
                    // Queued and handed to the kernel, which never gets it acknowledged.
                    let _ = conn
                        .send_message(Bytes::from(vec![7; 2000]), MessageProps::default())
                        .await;
                }
                tokio::time::timeout(wait, conn.closed()).await.ok()
            })
        };
        // A kernel client runs in the client's namespace; the userspace TCP's stack is
        // attached there already and runs in this process.
        let client_thread = if client == Client::Kernel {
            scope.spawn(move || client_ns.run(run).expect("client namespace"))
        } else {
            scope.spawn(run)
        };
        exchanged_rx.recv().unwrap();
        if blackhole {
            lab.path(0).unwrap().blackhole().expect("blackhole");
        }
        go_tx.send(()).unwrap();
        client_thread.join().unwrap()
    });
    let ended = client;
    let _ = done_tx.send(());
    server.join().unwrap();
    ended
}

fn timed_out(e: &Option<ConnectionError>) -> bool {
    matches!(
        e,
        Some(ConnectionError::Transport(TransportError::TimedOut))
    )
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn an_idle_connection_whose_peer_stops_answering_times_out() {
    // Keepalive probes go unanswered.
    let ended = scenario("idle", Client::Kernel, true, false, Duration::from_secs(30));
    assert!(timed_out(&ended), "{ended:?}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn a_message_never_acknowledged_times_the_connection_out() {
    let ended = scenario("send", Client::Kernel, true, true, Duration::from_secs(30));
    assert!(timed_out(&ended), "{ended:?}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn an_idle_connection_whose_peer_answers_stays_open() {
    // Three times the timeout with nothing sent but the kernel's probes, which the peer
    // answers.
    let ended = scenario("alive", Client::Kernel, false, false, 3 * TIMEOUT);
    assert!(ended.is_none(), "{ended:?}");
}

/// A link on the path drops full-sized segments without an ICMP error (an ICMP black hole;
/// Linux finds a size that passes only with `net.ipv4.tcp_mtu_probing`, off by default): the
/// client's large message never gets through while the server keeps sending small ones. The
/// connection does not hang: nothing new acknowledged for the timeout ends it (the unit test
/// `kernel::tests::acknowledgements_of_nothing_new_do_not_keep_a_stuck_connection_alive`
/// covers ACKs that keep coming without progress, which Linux's fast path does not even
/// count here).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn data_that_never_gets_through_times_out_while_the_peer_talks() {
    use squarepeg_lab::middlebox::{MiddleboxConfig, PathMtuConfig};
    let lab = Lab::start(
        LabConfig::new(&format!("sqdpmtu{}", std::process::id() % 10_000))
            .with_up("delay=5ms".parse().unwrap())
            .with_down("delay=5ms".parse().unwrap())
            .with_client_side(vec![MiddleboxConfig::PathMtu(PathMtuConfig {
                mtu: 1400,
                icmp: false,
            })]),
    )
    .expect("start lab");
    let addr = SocketAddr::new(lab.addresses().server(false), PORT);
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let server_ns = lab.server().try_clone().unwrap();
    let server = std::thread::spawn(move || {
        server_ns
            .run(move || {
                runtime().block_on(async move {
                    let ep = Endpoint::bind(addr, config()).await.expect("bind");
                    bound_tx.send(()).unwrap();
                    let conn = no_hang(ep.accept()).await.expect("accept");
                    // Small messages every 200 ms, which pass the link, until told.
                    let talk = async {
                        for i in 0u32.. {
                            if conn
                                .send_message(
                                    Bytes::from(vec![i as u8; 100]),
                                    MessageProps::default(),
                                )
                                .await
                                .is_err()
                            {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    };
                    tokio::select! {
                        _ = talk => {}
                        _ = done_rx => {}
                    }
                })
            })
            .expect("server namespace")
    });
    bound_rx.recv().unwrap();
    let client_ns = lab.client().try_clone().unwrap();
    let ended = client_ns
        .run(move || {
            runtime().block_on(async move {
                let conn = no_hang(Connection::connect(addr, config()))
                    .await
                    .expect("connect");
                // The server's first small message arrived: the path works for them.
                no_hang(conn.recv_message()).await.expect("a small message");
                no_hang(conn.send_message(Bytes::from(vec![9; 20_000]), MessageProps::default()))
                    .await
                    .expect("queued");
                // Keeps reading the server's messages (its ACKs keep coming).
                let read = async { while conn.recv_message().await.is_ok() {} };
                tokio::select! {
                    e = conn.closed() => Some(e),
                    _ = read => conn.close_reason(),
                    _ = tokio::time::sleep(Duration::from_secs(40)) => None,
                }
            })
        })
        .expect("client namespace");
    let _ = done_tx.send(());
    server.join().unwrap();
    let stats = lab.stats().expect("emulator stats");
    let boxes = &stats.client_side_middleboxes;
    assert!(boxes["mtu_dropped_too_big"] > 0, "{boxes:?}");
    assert!(timed_out(&ended), "{ended:?}");
}

#[cfg(feature = "utcp")]
mod userspace_tcp {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
    fn an_idle_connection_whose_peer_stops_answering_times_out() {
        if !squarepeg_lab::stack::can_run() {
            return;
        }
        let ended = scenario("uidle", Client::Utcp, true, false, Duration::from_secs(30));
        assert!(timed_out(&ended), "{ended:?}");
    }

    #[test]
    #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
    fn a_message_never_acknowledged_times_the_connection_out() {
        if !squarepeg_lab::stack::can_run() {
            return;
        }
        let ended = scenario("usend", Client::Utcp, true, true, Duration::from_secs(30));
        assert!(timed_out(&ended), "{ended:?}");
    }

    #[test]
    #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
    fn an_idle_connection_whose_peer_answers_stays_open() {
        if !squarepeg_lab::stack::can_run() {
            return;
        }
        let ended = scenario("ualive", Client::Utcp, false, false, 3 * TIMEOUT);
        assert!(ended.is_none(), "{ended:?}");
    }

    const MESSAGES: usize = 4000;
    const SIZE: usize = 16 * 1024;

    fn payload(i: usize) -> Vec<u8> {
        let mut p = vec![(i % 251) as u8; SIZE];
        p[..8].copy_from_slice(&(i as u64).to_be_bytes());
        p
    }

    /// The uTCP client sends more than the server's buffers hold while the server does not
    /// read, until its sending stops (the server's window closed); then the path is
    /// blackholed (`blackhole`), or the server pauses three timeouts more and reads
    /// everything. Returns what the client's connection ended with (within 30 s of the
    /// blackhole, or by the end of the transfer) and the messages the server received
    /// intact and in order.
    fn closed_window(tag: &str, blackhole: bool) -> (Option<ConnectionError>, usize) {
        let lab = lab(tag);
        let stack = stack_for(&lab, Client::Utcp);
        let addr = SocketAddr::new(lab.addresses().server(false), PORT);
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (read_tx, read_rx) = tokio::sync::oneshot::channel::<bool>();
        let server_ns = lab.server().try_clone().unwrap();
        let server = std::thread::spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(async move {
                        let ep = Endpoint::bind(addr, config()).await.expect("bind");
                        bound_tx.send(()).unwrap();
                        let conn = no_hang(ep.accept()).await.expect("accept");
                        // Not a byte read until told.
                        if !read_rx.await.unwrap_or(false) {
                            return 0;
                        }
                        let mut intact = 0;
                        for i in 0..MESSAGES {
                            let m = no_hang(conn.recv_message()).await.expect("message");
                            assert_eq!(m.payload[..], payload(i)[..], "message {i}");
                            intact += 1;
                        }
                        no_hang(conn.closed()).await;
                        intact
                    })
                })
                .expect("server namespace")
        });
        bound_rx.recv().unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let ended = runtime().block_on(async {
            let conn = connect(Client::Utcp, stack.as_ref(), addr).await;
            let sender = {
                let (conn, sent) = (conn.clone(), sent.clone());
                tokio::spawn(async move {
                    for i in 0..MESSAGES {
                        if conn
                            .send_message(payload(i), MessageProps::default())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            // Until the sends stop for a second: the server's buffers and then its window
            // are full, the client's queues too.
            let mut last = usize::MAX;
            for _ in 0..60 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = sent.load(Ordering::Relaxed);
                if now == last {
                    break;
                }
                last = now;
            }
            assert!(
                last < MESSAGES,
                "every message sent: the window never closed"
            );
            if blackhole {
                lab.path(0).unwrap().blackhole().expect("blackhole");
                let ended = tokio::time::timeout(Duration::from_secs(30), conn.closed())
                    .await
                    .ok();
                let _ = read_tx.send(false);
                sender.abort();
                return ended;
            }
            // The server's application pauses for three timeouts more; its TCP answers the
            // probes of the closed window.
            tokio::time::sleep(3 * TIMEOUT).await;
            read_tx.send(true).unwrap();
            no_hang(sender).await.unwrap();
            let ended = conn.close_reason();
            conn.close().await;
            ended
        });
        (ended, server.join().unwrap())
    }

    #[test]
    #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
    fn a_receiver_that_pauses_longer_than_the_timeout_keeps_its_connection() {
        if !squarepeg_lab::stack::can_run() {
            return;
        }
        let (ended, intact) = closed_window("uzwa", false);
        assert!(ended.is_none(), "{ended:?}");
        assert_eq!(intact, MESSAGES);
    }

    #[test]
    #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
    fn a_peer_that_goes_silent_behind_a_closed_window_times_out() {
        if !squarepeg_lab::stack::can_run() {
            return;
        }
        let (ended, _) = closed_window("uzwb", true);
        assert!(timed_out(&ended), "{ended:?}");
    }
}
