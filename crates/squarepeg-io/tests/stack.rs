//! The driver's behaviour around the data path, against the kernel in a namespace of the
//! test's own (needs root; skipped otherwise): errors a user sees, resets both ways, many
//! connections at once, the per-stack random secret, and what happens to the device.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use squarepeg_io::{Error, Offload, Stack, StackConfig, TunConfig, TunDevice};
use squarepeg_lab::net::NetNs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn device_errors_are_typed() {
    if !can_run() {
        return;
    }
    let ns = NetNs::create(&unique("dev")).unwrap();
    let first = ns
        .run(|| TunDevice::open(&TunConfig::named("sp0")))
        .unwrap()
        .unwrap();
    assert_eq!(first.name(), "sp0");
    assert_eq!(first.mtu(), 1500);
    let busy = ns
        .run(|| TunDevice::open(&TunConfig::named("sp0")))
        .unwrap();
    assert!(matches!(busy, Err(Error::DeviceBusy { .. })), "{busy:?}");
    let not_tun = ns.run(|| TunDevice::open(&TunConfig::named("lo"))).unwrap();
    assert!(matches!(not_tun, Err(Error::NotTun { .. })), "{not_tun:?}");
    let bad_name = TunDevice::open(&TunConfig::named("no/slash"));
    assert!(
        matches!(bad_name, Err(Error::InvalidDeviceName(_))),
        "{bad_name:?}"
    );
    let bad_mtu = TunDevice::open(&{
        let mut config = TunConfig::default();
        config.name = Some("sp1".into());
        config.mtu = Some(100);
        config
    });
    assert!(
        matches!(bad_mtu, Err(Error::InvalidMtu { .. })),
        "{bad_mtu:?}"
    );
    // A kernel-chosen name, MTU and queue length applied.
    let auto = ns
        .run(|| {
            TunDevice::open(&{
                let mut config = TunConfig::default();
                config.name = None;
                config.mtu = Some(9000);
                config.tx_queue_len = Some(2000);
                config
            })
        })
        .unwrap()
        .unwrap();
    assert!(auto.name().starts_with("tun"), "{}", auto.name());
    assert_eq!(auto.mtu(), 9000);
    let link = ns.ip(&["link", "show", "dev", auto.name()]).unwrap();
    assert!(
        link.contains("mtu 9000") && link.contains("qlen 2000"),
        "{link}"
    );
    // A stack refuses bad addresses. (A device of its own per case: the kernel unregisters a
    // closed device asynchronously, so reusing a name at once can find it still there.)
    for (i, addrs) in [
        vec![],
        vec!["127.0.0.2".parse().unwrap()],
        vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()],
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        let device = ns
            .run(|| TunDevice::open(&TunConfig::named(name.as_str())))
            .unwrap()
            .unwrap();
        let r = Stack::new(device, StackConfig::new(addrs));
        assert!(matches!(r, Err(Error::BadAddress { .. })), "{r:?}");
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn device_and_addresses_vanish_with_the_stack() {
    if !can_run() {
        return;
    }
    let lab = Lab::start("gone", LabOptions::default());
    let addrs = lab.ns.ip(&["addr", "show", "dev", DEVICE]).unwrap();
    assert!(
        addrs.contains("10.77.0.1/24") && addrs.contains("fd00:77::1/64"),
        "{addrs}"
    );
    let route = lab.ns.ip(&["route", "get", "10.77.0.2"]).unwrap();
    assert!(route.contains(&format!("dev {DEVICE}")), "{route}");
    let Lab { stack, ns, .. } = lab;
    let stats = runtime().block_on(stack.shutdown()).unwrap();
    assert_eq!(stats.endpoint.resets_sent, 0);
    let gone = ns.ip(&["link", "show", "dev", DEVICE]);
    assert!(gone.is_err(), "device still there: {gone:?}");
    let route = ns.ip(&["route", "get", "10.77.0.2"]);
    assert!(
        route.as_ref().map_or(true, |r| !r.contains(DEVICE)),
        "{route:?}"
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn refused_wrong_family_resets_and_aborts() {
    if !can_run() {
        return;
    }
    let lab = Lab::start("rst", LabOptions::default());
    let rt = runtime();
    rt.block_on(async {
        // Nobody listens: the kernel answers RST, connect fails with ConnectionRefused.
        let nobody = SocketAddr::new(lab.kernel_addr(false), 1);
        let e = lab.stack.connect(nobody).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    });

    // The kernel closes with data of ours unread: it sends RST, our read fails.
    let listener = lab.kernel_listen(false, 7100);
    let to = SocketAddr::new(lab.kernel_addr(false), 7100);
    std::thread::scope(|s| {
        let kernel = s.spawn(|| {
            let (mut c, _) = listener.accept().unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
            // Close with bytes still queued unread.
            std::thread::sleep(Duration::from_millis(50));
            drop(c);
        });
        rt.block_on(async {
            let mut c = lab.stack.connect(to).await.unwrap();
            c.write_all(&[7u8; 5000]).await.unwrap();
            let mut buf = [0u8; 16];
            let e = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
                .await
                .expect("reset in time")
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
            assert_eq!(
                c.wait_closed().await.unwrap(),
                squarepeg_io::CloseReason::Reset
            );
        });
        kernel.join().unwrap();
    });

    // We abort: the kernel's read fails with ECONNRESET.
    let listener = lab.kernel_listen(false, 7101);
    let to = SocketAddr::new(lab.kernel_addr(false), 7101);
    std::thread::scope(|s| {
        let kernel = s.spawn(|| {
            let (mut c, _) = listener.accept().unwrap();
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut b = [0u8; 16];
            let e = loop {
                match c.read(&mut b) {
                    Ok(0) => panic!("FIN instead of RST"),
                    Ok(_) => continue,
                    Err(e) => break e,
                }
            };
            assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
        });
        rt.block_on(async {
            let mut c = lab.stack.connect(to).await.unwrap();
            c.write_all(b"hello").await.unwrap();
            c.abort();
        });
        kernel.join().unwrap();
    });

    // A stack with only an IPv4 address cannot reach an IPv6 peer.
    let stats = lab.finish();
    assert!(stats.endpoint.resets_sent >= 1);
    let ns = NetNs::create(&unique("v4only")).unwrap();
    let device = ns
        .run(|| TunDevice::open(&TunConfig::named("sp0")))
        .unwrap()
        .unwrap();
    let stack = Stack::new(device, StackConfig::new(["10.9.0.2".parse().unwrap()])).unwrap();
    let e = rt
        .block_on(stack.connect("[fd00::1]:80".parse().unwrap()))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("no IPv6 address"), "{e}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn many_connections_at_once_each_get_their_own_bytes() {
    if !can_run() {
        return;
    }
    const CONNS: u64 = 24;
    const BYTES: u64 = 512 << 10;
    let lab = Lab::start(
        "many",
        LabOptions {
            tx_queue_len: Some(4096),
            ..Default::default()
        },
    );
    let listener = lab.stack.listen_port(7200).unwrap();
    let rt = runtime();
    std::thread::scope(|s| {
        let kernels: Vec<_> = (0..CONNS)
            .map(|i| {
                let lab = &lab;
                s.spawn(move || {
                    let v6 = i % 2 == 1;
                    let to = SocketAddr::new(lab.stack_addr(v6), 7200);
                    let mut c = lab.kernel_connect(to);
                    // Tell the server which stream to send back, then exchange.
                    c.write_all(&i.to_be_bytes()).unwrap();
                    kernel_exchange(c, BYTES, 1000 + i)
                })
            })
            .collect();
        let results = rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..CONNS {
                let (mut conn, _) = listener.accept().await.unwrap();
                tasks.spawn(async move {
                    let mut id = [0u8; 8];
                    conn.read_exact(&mut id).await.unwrap();
                    let i = u64::from_be_bytes(id);
                    let (ex, reason, _) = stack_exchange(conn, BYTES, 2000 + i).await;
                    (i, ex, reason)
                });
            }
            let mut out = Vec::new();
            while let Some(r) = tasks.join_next().await {
                out.push(r.unwrap());
            }
            out
        });
        assert_eq!(results.len() as u64, CONNS);
        let kernels: Vec<_> = kernels.into_iter().map(|k| k.join().unwrap()).collect();
        for (i, stack, reason) in results {
            let kernel = &kernels[i as usize];
            assert_eq!(reason, squarepeg_io::CloseReason::Normal);
            assert_eq!(stack.received, BYTES, "connection {i}");
            assert_eq!(stack.received_digest, kernel.sent_digest, "connection {i}");
            assert_eq!(kernel.received_digest, stack.sent_digest, "connection {i}");
            // Each stream is its own: the seeds differ, so the digests do.
            assert_ne!(
                stack.sent_digest,
                Pattern::digest_of(BYTES, 2000 + (i + 1) % CONNS)
            );
        }
    });
    let stats = lab.finish();
    assert_eq!(stats.endpoint.resets_sent, 0);
    assert_eq!(stats.endpoint.connections_opened, CONNS);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn every_stack_draws_its_own_secret() {
    if !can_run() {
        return;
    }
    // The ephemeral port (RFC 6056 §3.3.3) and the ISN (RFC 6528) are keyed hashes of the
    // secret and the 4-tuple; two stacks with the same tuple but the fixed default key would
    // pick the same port. With keys from the OS RNG they collide with probability 1/28232.
    let mut ports = Vec::new();
    for _ in 0..2 {
        let lab = Lab::start("key", LabOptions::default());
        let listener = lab.kernel_listen(false, 7300);
        let to = SocketAddr::new(lab.kernel_addr(false), 7300);
        let rt = runtime();
        let port = std::thread::scope(|s| {
            let k = s.spawn(|| {
                let (mut c, peer) = listener.accept().unwrap();
                let mut sink = Vec::new();
                c.read_to_end(&mut sink).unwrap();
                peer.port()
            });
            rt.block_on(async {
                let mut c = lab.stack.connect(to).await.unwrap();
                c.shutdown().await.unwrap();
                let mut rest = Vec::new();
                c.read_to_end(&mut rest).await.unwrap();
                c.wait_closed().await.unwrap();
                assert_eq!(k.join().unwrap(), c.local_addr().port());
                c.local_addr().port()
            })
        });
        ports.push(port);
        lab.finish();
    }
    assert_ne!(
        ports[0], ports[1],
        "two stacks chose the same port: same secret?"
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn driver_stops_with_an_error_when_the_device_is_deleted() {
    if !can_run() {
        return;
    }
    let lab = Lab::start("del", LabOptions::default());
    let listener = lab.kernel_listen(false, 7400);
    let to = SocketAddr::new(lab.kernel_addr(false), 7400);
    let rt = runtime();
    let mut conn = rt.block_on(lab.stack.connect(to)).unwrap();
    let (_kernel_side, _) = listener.accept().unwrap();
    lab.ns.ip(&["link", "del", "dev", DEVICE]).unwrap();
    let mut buf = [0u8; 8];
    let e = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await
        })
        .expect("the read fails instead of hanging")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotConnected, "{e}");
    assert!(e.to_string().contains("driver has stopped"), "{e}");
    assert!(lab.stack.stopped().is_some());
    drop(conn);
    let Lab { stack, ns, .. } = lab;
    assert!(
        rt.block_on(stack.shutdown()).is_err(),
        "shutdown reports the device error"
    );
    drop(ns);
}

/// Without offloads the driver reads into MTU-sized buffers, so a packet longer than the MTU it
/// started with arrives cut and is dropped, counted. With offloads every read has room for a
/// 64 KB packet: the packet arrives whole and goes to the endpoint (which drops the ICMP echo
/// as not TCP).
fn packet_longer_than_the_mtu(offload: Offload) {
    if !can_run() {
        return;
    }
    let lab = Lab::start(
        "big",
        LabOptions {
            offload,
            ..Default::default()
        },
    );
    // Raise the MTU under the driver, then have the kernel send one 5000-byte packet.
    lab.ns
        .ip(&["link", "set", "dev", DEVICE, "mtu", "9000"])
        .unwrap();
    let ping = lab
        .ns
        .command("ping")
        .args(["-c", "1", "-W", "1", "-s", "5000", "10.77.0.2"])
        .output()
        .expect("ping (iputils-ping, installed by .ci/run)");
    assert!(!ping.status.success(), "nobody answers ICMP behind the TUN");
    // The stack still works.
    let listener = lab.kernel_listen(false, 7500);
    let to = SocketAddr::new(lab.kernel_addr(false), 7500);
    let rt = runtime();
    std::thread::scope(|s| {
        let k = s.spawn(|| kernel_exchange(listener.accept().unwrap().0, 100_000, 5));
        let (ex, reason, _) = rt.block_on(async {
            let c = lab.stack.connect(to).await.unwrap();
            stack_exchange(c, 100_000, 6).await
        });
        assert_eq!(ex.received_digest, k.join().unwrap().sent_digest);
        assert_eq!(reason, squarepeg_io::CloseReason::Normal);
    });
    let stats = lab.finish();
    if offload == Offload::Off {
        assert_eq!(stats.device.truncated, 1, "{:?}", stats.device);
    } else {
        assert_eq!(stats.device.truncated, 0, "{:?}", stats.device);
        assert!(
            stats.endpoint.dropped(squarepeg_tcp::DropReason::NotTcp) >= 1,
            "{:?}",
            stats.endpoint
        );
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn packets_longer_than_the_mtu_are_dropped_and_counted() {
    packet_longer_than_the_mtu(Offload::Off);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn packets_longer_than_the_mtu_reach_the_endpoint_with_offloads() {
    packet_longer_than_the_mtu(Offload::On);
}
