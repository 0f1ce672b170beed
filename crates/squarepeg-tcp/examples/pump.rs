//! Moves a bulk transfer between two in-memory endpoints (no network, virtual time) and prints
//! the CPU throughput of the two TCP cores together: a rough figure for the data path, not a
//! benchmark of any link.
//!
//! `cargo run --release -p squarepeg-tcp --example pump -- [MiB]`

use std::time::{Duration, Instant};

use squarepeg_tcp::{ConnectionConfig, Endpoint, EndpointConfig, Event};

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let total = mib << 20;
    let t0 = Instant::now();
    let mut now = t0;
    let mut a = Endpoint::new(
        {
            let mut config = EndpointConfig::default();
            config.secret = [1; 32];
            config
        },
        now,
    );
    let mut b = Endpoint::new(
        {
            let mut config = EndpointConfig::default();
            config.secret = [2; 32];
            config
        },
        now,
    );
    let server = "10.0.0.2:80".parse().unwrap();
    let l = b.listen(server, 8, ConnectionConfig::default()).unwrap();
    let c = a
        .connect(
            now,
            "10.0.0.1:0".parse().unwrap(),
            server,
            ConnectionConfig::default(),
        )
        .unwrap();
    let chunk = vec![0x5au8; 1 << 16];
    let mut sent = 0;
    let mut received = 0;
    let mut s = None;
    let mut buf = vec![0u8; 1500];
    let mut rbuf = vec![0u8; 1 << 16];
    let mut packets = 0u64;
    let wall = Instant::now();
    while received < total {
        while sent < total {
            match a.write(c, &chunk[..(total - sent).min(chunk.len())]) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        let mut moved = false;
        while let Some(n) = a.poll_transmit(now, &mut buf) {
            let _ = b.handle_packet(now, &buf[..n]);
            packets += 1;
            moved = true;
            while let Some(n) = b.poll_transmit(now, &mut buf) {
                let _ = a.handle_packet(now, &buf[..n]);
                packets += 1;
            }
        }
        while let Some(n) = b.poll_transmit(now, &mut buf) {
            let _ = a.handle_packet(now, &buf[..n]);
            packets += 1;
            moved = true;
        }
        while let Some(ev) = b.poll_event() {
            if let Event::Incoming(l2) = ev {
                s = b.accept(l2);
            }
        }
        let _ = l;
        if let Some(h) = s {
            while let Ok(n) = b.read(h, &mut rbuf) {
                if n == 0 {
                    break;
                }
                received += n;
                moved = true;
            }
        }
        if !moved {
            let next = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            now = next.unwrap_or(now + Duration::from_millis(1)).max(now);
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
    }
    let secs = wall.elapsed().as_secs_f64();
    println!(
        "{mib} MiB in {secs:.3} s wall: {:.0} MB/s through both cores, {packets} packets ({:.2} Mpps)",
        total as f64 / secs / 1e6,
        packets as f64 / secs / 1e6
    );
}
