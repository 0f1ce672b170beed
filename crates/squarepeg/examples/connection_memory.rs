//! Memory an idle connection holds, with and without the idle release
//! (`ConnectionConfig::release_idle_after`), side by side in one run:
//! `cargo run --release -p squarepeg --example connection_memory -- [PAIRS] [BURST_MIB]`.
//!
//! For cleartext and TLS, and for connections that exchanged one message each way or also
//! carried a burst of BURST_MIB MiB (1 KiB messages, client to server): PAIRS connection
//! pairs in this process, then 1.5 s idle. Prints, per connection (both ends counted), the
//! process's resident memory growth after `malloc_trim` (what the connections hold; freed
//! heap memory is given back to the system first) and `ConnectionStats::buffer_bytes`.

use std::time::Duration;

use bytes::Bytes;
use squarepeg::tls::config::{self, Trust};
use squarepeg::{Connection, ConnectionConfig, Endpoint, MessageProps};

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// Gives freed heap memory back to the system, so that resident memory shows what is held.
fn trim() {
    // SAFETY: malloc_trim only releases free heap memory; no pointer is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn measure(pairs: usize, burst: usize, tls: bool, release: bool) -> (f64, f64) {
    let (mut server_config, mut client_config) =
        (ConnectionConfig::default(), ConnectionConfig::default());
    if tls {
        let cert = config::self_signed(&["peg.test".into()]).expect("certificate");
        server_config = server_config.with_tls_server(
            config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes())
                .expect("server config"),
        );
        client_config = client_config.with_tls_client(
            config::client_config(Trust::PinnedSha256(cert.fingerprint)).expect("client config"),
            "peg.test",
        );
    }
    if !release {
        server_config.release_idle_after = None;
        client_config.release_idle_after = None;
    }
    let ep = Endpoint::bind("127.0.0.1:0", server_config)
        .await
        .expect("bind");
    let addr = ep.local_addr().expect("address");
    trim();
    let before = rss_kib();
    let mut connections = Vec::new();
    let payload = Bytes::from(vec![0x5a; 1024]);
    for _ in 0..pairs {
        let (c, s) = tokio::join!(
            Connection::connect(addr, client_config.clone()),
            ep.accept()
        );
        let (c, s) = (c.expect("connect"), s.expect("accept"));
        for (from, to) in [(&c, &s), (&s, &c)] {
            from.send_message(Bytes::from_static(b"hello"), MessageProps::default())
                .await
                .expect("send");
            to.recv_message().await.expect("receive");
        }
        let count = burst / 1024;
        let sender = c.clone();
        let p = payload.clone();
        let send = tokio::spawn(async move {
            for _ in 0..count {
                sender
                    .send_message(p.clone(), MessageProps::default())
                    .await
                    .expect("send");
            }
        });
        for _ in 0..count {
            s.recv_message().await.expect("receive");
        }
        send.await.expect("sender");
        connections.push((c, s));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    trim();
    let per_connection = |kib: f64| kib / (2 * pairs) as f64;
    let rss = per_connection(rss_kib().saturating_sub(before) as f64);
    let buffers: usize = connections
        .iter()
        .map(|(c, s)| c.stats().buffer_bytes + s.stats().buffer_bytes)
        .sum();
    for (c, _) in &connections {
        c.close().await;
    }
    drop(connections);
    // The drivers finish their closes before the next measurement starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (rss, per_connection(buffers as f64 / 1024.0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let burst_mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    println!(
        "{pairs} connection pairs, idle 1.5 s; KiB per connection (both ends counted): resident after malloc_trim / ConnectionStats::buffer_bytes"
    );
    println!(
        "{:<10} {:<22} {:>24} {:>24}",
        "transport", "traffic", "release_idle_after None", "release_idle_after 1 s"
    );
    for tls in [false, true] {
        for burst in [0, burst_mib << 20] {
            let (rss_off, buf_off) = measure(pairs, burst, tls, false).await;
            let (rss_on, buf_on) = measure(pairs, burst, tls, true).await;
            let traffic = if burst == 0 {
                "one message each way".to_string()
            } else {
                format!("and {burst_mib} MiB up")
            };
            println!(
                "{:<10} {:<22} {:>12.1} / {:>9.1} {:>12.1} / {:>9.1}",
                if tls { "TLS" } else { "cleartext" },
                traffic,
                rss_off,
                buf_off,
                rss_on,
                buf_on
            );
        }
    }
}
