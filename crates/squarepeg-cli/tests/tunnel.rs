//! `peg tunnel` end to end in network namespaces: a server namespace and two client
//! namespaces, each client joined to the server by a veth pair of its own. Through the tunnel:
//! ping, a TCP transfer (SHA-256 equal on both ends) and UDP datagrams, over kernel TCP and
//! over the userspace TCP at both ends; a second client gets its own address; after SIGTERM
//! no device or route is left. Needs root (skipped otherwise). What bad packets from either
//! side do is checked without privileges in squarepeg-tunnel/tests/forward.rs.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use squarepeg_lab::net::NetNs;

mod common;
use common::{Peg, can_run, kernel_connect, kernel_listen, namespace, random, sha};

/// Sends SIGTERM to a `peg` child.
fn terminate(p: &Peg) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM) };
}

/// A server namespace and `clients` client namespaces, client `i` at 192.168.(60+i).1 and
/// the server at 192.168.(60+i).2 on their veth pair.
struct World {
    server: NetNs,
    clients: Vec<NetNs>,
}

impl World {
    fn new(tag: &str, clients: usize) -> World {
        let server = namespace(&format!("{tag}s"));
        let clients: Vec<NetNs> = (0..clients)
            .map(|i| {
                let c = namespace(&format!("{tag}c{i}"));
                let (near, far) = (format!("tc{i}"), format!("ts{i}"));
                common_ip(&[
                    "link",
                    "add",
                    &near,
                    "netns",
                    c.name(),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &far,
                    "netns",
                    server.name(),
                ]);
                c.ip(&[
                    "addr",
                    "add",
                    &format!("192.168.{}.1/24", 60 + i),
                    "dev",
                    &near,
                ])
                .unwrap();
                server
                    .ip(&[
                        "addr",
                        "add",
                        &format!("192.168.{}.2/24", 60 + i),
                        "dev",
                        &far,
                    ])
                    .unwrap();
                c.ip(&["link", "set", &near, "up"]).unwrap();
                c.ip(&["link", "set", "lo", "up"]).unwrap();
                server.ip(&["link", "set", &far, "up"]).unwrap();
                c
            })
            .collect();
        server.ip(&["link", "set", "lo", "up"]).unwrap();
        World { server, clients }
    }

    fn server_addr(i: usize) -> String {
        format!("192.168.{}.2", 60 + i)
    }
}

fn common_ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn in_ns(ns: &NetNs, args: &[&str]) -> Peg {
    let mut all = vec!["netns", "exec", ns.name(), common::PEG];
    all.extend_from_slice(args);
    Peg::spawn_program("ip", &all)
}

/// The fingerprint `peg tunnel server` printed.
fn fingerprint(p: &mut Peg) -> String {
    p.wait_for("fingerprint");
    let line = p.seen.iter().find(|l| l.contains("fingerprint")).unwrap();
    line.rsplit(' ').next().unwrap().to_string()
}

fn ping(ns: &NetNs, to: &str) {
    let out = ns
        .command("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "5", to])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ping {to}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// 4 MB from the server's side (a listener on its tunnel address) to a client, through the
/// tunnel; the digests must match.
fn transfer(server: &NetNs, client: &NetNs, seed: u8) {
    let at: SocketAddr = "10.99.0.1:5001".parse().unwrap();
    let listener = kernel_listen(server, at);
    let data = random(4 << 20, seed);
    let expect = sha(&data);
    let sender = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&data).unwrap();
    });
    let mut s = kernel_connect(client, at);
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    sender.join().unwrap();
    assert_eq!(got.len(), 4 << 20);
    assert_eq!(sha(&got), expect);
}

/// 200 datagrams from a client to the server's tunnel address, 2 ms apart: the path
/// loses nothing, so all arrive.
fn datagrams(server: &NetNs, client: &NetNs) {
    let rx = server
        .run(|| UdpSocket::bind("10.99.0.1:5004"))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let tx = client
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    for i in 0u32..200 {
        tx.send_to(&i.to_be_bytes(), "10.99.0.1:5004").unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut buf = [0u8; 64];
    while seen.len() < 200 {
        let Ok(n) = rx.recv(&mut buf) else { break };
        assert_eq!(n, 4);
        seen.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
    }
    assert_eq!(seen.len(), 200, "datagrams lost in a lossless tunnel");
}

/// What must be gone from `ns` once the tunnel ends.
fn nothing_left(ns: &NetNs) {
    let links = ns.ip(&["link"]).unwrap();
    assert!(!links.contains("peg0"), "device left behind: {links}");
    let routes = ns.ip(&["route"]).unwrap();
    for line in routes.lines() {
        let dst = line.split_whitespace().next().unwrap_or_default();
        // The tunnel's subnet, the default route's halves, the host route to the server.
        let ours = dst.starts_with("10.99.")
            || dst.starts_with("fd00:99:")
            || ["::/1", "8000::/1"].contains(&dst)
            || ["0.0.0.0/1", "128.0.0.0/1", "192.168.60.2"].contains(&dst);
        assert!(!ours, "route left behind: {line}");
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn tunnel_over_kernel_tcp_with_two_clients() {
    if !can_run() {
        return;
    }
    let w = World::new("tk", 2);
    let mut server = in_ns(
        &w.server,
        &[
            "tunnel",
            "server",
            "0.0.0.0:4443",
            "--nat",
            "--subnet",
            "10.99.0.0/24",
            "--subnet",
            "fd00:99::/64",
        ],
    );
    let fp = fingerprint(&mut server);
    server.wait_for("tunnel server on");
    let mut first = in_ns(
        &w.clients[0],
        &[
            "tunnel",
            "client",
            &format!("{}:4443", World::server_addr(0)),
            "--pin",
            &fp,
            "--default-route",
        ],
    );
    first.wait_for("tunnel up");
    assert!(
        first.seen.iter().any(|l| l.contains("10.99.0.2/24")),
        "{:?}",
        first.seen
    );
    let mut second = in_ns(
        &w.clients[1],
        &[
            "tunnel",
            "client",
            &format!("{}:4443", World::server_addr(1)),
            "--pin",
            &fp,
        ],
    );
    second.wait_for("tunnel up");
    assert!(
        second.seen.iter().any(|l| l.contains("10.99.0.3/24")),
        "{:?}",
        second.seen
    );

    ping(&w.clients[0], "10.99.0.1");
    ping(&w.clients[1], "10.99.0.1");
    ping(&w.clients[1], "fd00:99::1");
    // The default route goes through the tunnel: the server's other address too, and with
    // --nat a host beyond the server (the second client's veth address: its answer goes to
    // the masqueraded source, back through the server; without the NAT it would go to
    // 10.99.0.2 through the second client's own tunnel, and the server would drop it as
    // not that client's address).
    ping(&w.clients[0], &World::server_addr(1));
    ping(&w.clients[0], "192.168.61.1");
    transfer(&w.server, &w.clients[0], 1);
    datagrams(&w.server, &w.clients[1]);

    // A wrong pin is refused before any device is made.
    let mut wrong = in_ns(
        &w.clients[1],
        &[
            "tunnel",
            "client",
            &format!("{}:4443", World::server_addr(1)),
            "--pin",
            &"00".repeat(32),
            "--tun",
            "peg9",
        ],
    );
    wrong.wait_for("certificate");
    let (ok, _, err) = wrong.finish();
    assert!(!ok, "{err}");

    // The first client leaves; then the server stops under the second, which learns it
    // (a graceful close, not a reset) and ends on its own.
    terminate(&first);
    let (ok, _, err) = first.finish();
    assert!(ok, "{err}");
    assert!(err.contains("tunnel: sent"), "{err}");
    terminate(&server);
    let (ok, _, err) = server.finish();
    assert!(ok, "{err}");
    assert!(err.contains("client 192.168.60.1"), "{err}");
    let (ok, _, err) = second.finish();
    assert!(ok, "{err}");
    assert!(err.contains("the server closed the tunnel"), "{err}");
    for ns in w.clients.iter().chain([&w.server]) {
        nothing_left(ns);
    }
    // The NAT table is gone and forwarding is off again.
    let tables = w
        .server
        .command("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&tables.stdout).contains("peg_tunnel"));
    let forward = w
        .server
        .run(|| std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward"))
        .unwrap()
        .unwrap();
    assert_eq!(forward.trim(), "0");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn without_root_it_says_so() {
    if !can_run() {
        return;
    }
    // The same binary as an unprivileged user (setpriv drops root for the one command).
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            common::PEG,
        ])
        .args(["tunnel", "client", "127.0.0.1:4443", "--cleartext"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs root"), "{err}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn tunnel_over_the_userspace_tcp() {
    if !can_run() {
        return;
    }
    // Both ends on squarepeg's TCP: the client's stack at 10.77.0.2 behind its namespace's
    // kernel, the server's at 10.78.0.2 behind its own; each kernel forwards, and each side
    // routes the other's stack subnet over the veth.
    let w = World::new("tu", 1);
    let (c, s) = (&w.clients[0], &w.server);
    for ns in [c, s] {
        ns.run(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1"))
            .unwrap()
            .unwrap();
    }
    c.ip(&["route", "add", "10.78.0.0/24", "via", "192.168.60.2"])
        .unwrap();
    s.ip(&["route", "add", "10.77.0.0/24", "via", "192.168.60.1"])
        .unwrap();
    let mut server = in_ns(
        s,
        &[
            "tunnel",
            "server",
            "10.78.0.2:4443",
            "--substrate",
            "utcp",
            "--setup",
            "--dev",
            "sp1",
            "--addr",
            "10.78.0.2",
            "--kernel-addr",
            "10.78.0.1/24",
            "--quiet",
        ],
    );
    let fp = fingerprint(&mut server);
    server.wait_for("tunnel server on");
    let mut client = in_ns(
        c,
        &[
            "tunnel",
            "client",
            "10.78.0.2:4443",
            "--pin",
            &fp,
            "--substrate",
            "utcp",
            "--setup",
            "--addr",
            "10.77.0.2",
            "--kernel-addr",
            "10.77.0.1/24",
            "--quiet",
        ],
    );
    client.wait_for("tunnel up");
    ping(c, "10.99.0.1");
    transfer(s, c, 2);
    datagrams(s, c);
    terminate(&client);
    let (ok, _, err) = client.finish();
    assert!(ok, "{err}");
    terminate(&server);
    let (ok, _, err) = server.finish();
    assert!(ok, "{err}");
    for ns in [c, s] {
        nothing_left(ns);
        let links = ns.ip(&["link"]).unwrap();
        assert!(!links.contains("sp0") && !links.contains("sp1"), "{links}");
    }
}

/// The local port of the client's TCP connection(s) to the tunnel server.
fn tunnel_ports(ns: &NetNs) -> Vec<String> {
    let out = ns
        .command("ss")
        .args(["-tnH", "state", "established", "dst", "192.168.60.2"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

/// A multipath tunnel outlives its TCP connection: the connection is reset under the
/// running tunnel (`ss -K`), the client joins the session again over a new connection, and
/// the tunnel goes on with the same address — pings and a transfer after it.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn a_multipath_tunnel_survives_its_connection_being_reset() {
    if !can_run() {
        return;
    }
    let w = World::new("tm", 1);
    let c = &w.clients[0];
    let mut server = in_ns(
        &w.server,
        &["tunnel", "server", "0.0.0.0:4443", "--multipath"],
    );
    let fp = fingerprint(&mut server);
    server.wait_for("tunnel server on");
    let mut client = in_ns(
        c,
        &[
            "tunnel",
            "client",
            "192.168.60.2:4443",
            "--pin",
            &fp,
            "--multipath",
        ],
    );
    client.wait_for("tunnel up");
    ping(c, "10.99.0.1");
    let before = tunnel_ports(c);
    assert_eq!(before.len(), 1, "{before:?}");
    // The kernel resets the connection (both ends learn it).
    let killed = c
        .command("ss")
        .args(["-K", "dst", "192.168.60.2", "dport", "=", "4443"])
        .output()
        .unwrap();
    let mut after = Vec::new();
    for _ in 0..100 {
        after = tunnel_ports(c);
        if after.len() == 1 && after != before {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        after.len() == 1 && after != before,
        "no new connection: before {before:?}, after {after:?} ({})",
        String::from_utf8_lossy(&killed.stderr)
    );
    ping(c, "10.99.0.1");
    transfer(&w.server, c, 3);
    terminate(&client);
    let (ok, _, err) = client.finish();
    assert!(ok, "{err}");
    assert!(!err.contains("the server closed the tunnel"), "{err}");
    terminate(&server);
    let (ok, _, err) = server.finish();
    assert!(ok, "{err}");
    // One session throughout: the server saw one client arrive.
    assert_eq!(err.matches("client 192.168.60.1").count(), 2, "{err}");
    for ns in [c, &w.server] {
        nothing_left(ns);
    }
}
