//! A peer that stops answering, on the real lab (client — emulator — server namespaces): the
//! path is blackholed under a connection, and the connection fails with
//! `TransportError::TimedOut` (`ConnectionConfig::dead_peer_timeout`) — idle (keepalive
//! probes go unanswered) and with a message waiting to be acknowledged (the user timeout) —
//! while an idle connection whose peer answers stays open for longer than that.
//!
//! Needs root and iproute2; ignored otherwise. Asserts outcomes, never durations (the waits
//! are bounds).

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

/// What the client's connection ended with, if it ended within `wait`: it connects to a
/// server in the other namespace and exchanges a message each way; then the path is
/// blackholed (if `blackhole`), and the client sends a message (if `send`) or stays idle.
fn scenario(tag: &str, blackhole: bool, send: bool, wait: Duration) -> Option<ConnectionError> {
    let lab = Lab::start(
        LabConfig::new(&format!("sqdp{tag}{}", std::process::id() % 10_000))
            .with_up("delay=5ms".parse().unwrap())
            .with_down("delay=5ms".parse().unwrap()),
    )
    .expect("start lab");
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
    let client = std::thread::spawn(move || {
        client_ns
            .run(move || {
                runtime().block_on(async move {
                    let conn = no_hang(Connection::connect(addr, config()))
                        .await
                        .expect("connect");
                    no_hang(
                        conn.send_message(Bytes::from_static(b"hello"), MessageProps::default()),
                    )
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
            })
            .expect("client namespace")
    });
    exchanged_rx.recv().unwrap();
    if blackhole {
        lab.path(0).unwrap().blackhole().expect("blackhole");
    }
    go_tx.send(()).unwrap();
    let ended = client.join().unwrap();
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
    let ended = scenario("idle", true, false, Duration::from_secs(30));
    assert!(timed_out(&ended), "{ended:?}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn a_message_never_acknowledged_times_the_connection_out() {
    let ended = scenario("send", true, true, Duration::from_secs(30));
    assert!(timed_out(&ended), "{ended:?}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root and iproute2")]
fn an_idle_connection_whose_peer_answers_stays_open() {
    // Three times the timeout with nothing sent but the kernel's probes, which the peer
    // answers.
    let ended = scenario("alive", false, false, 3 * TIMEOUT);
    assert!(ended.is_none(), "{ended:?}");
}
