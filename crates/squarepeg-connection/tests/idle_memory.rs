//! An idle connection gives back the memory of its empty buffers (`Config::release_idle_after`):
//! two connection cores joined by in-memory byte streams, in virtual time, cleartext and TLS.
//! The timer runs only after traffic, fires once, frees the read buffers, chunks and TLS
//! buffers a burst grew, and nothing sent before or after is lost.

mod common;

use std::time::{Duration, Instant};

use squarepeg_connection::{Config, Connection, Role, Substrate};
use squarepeg_session::MessageProps;

const IDLE: Duration = Duration::from_millis(50);

struct Pair {
    client: Connection,
    server: Connection,
    now: Instant,
    /// When bytes last moved.
    moved_at: Instant,
}

impl Pair {
    fn new(tls: bool) -> Self {
        let config = |tls_setup| {
            let mut c = Config::default();
            c.tls = tls_setup;
            c.release_idle_after = Some(IDLE);
            c
        };
        let (client_tls, server_tls) = if tls {
            let (c, s) = common::tls_setups();
            (Some(c), Some(s))
        } else {
            (None, None)
        };
        let now = Instant::now();
        Self {
            client: Connection::new(Role::Client, config(client_tls), Substrate::byte_stream())
                .unwrap(),
            server: Connection::new(Role::Server, config(server_tls), Substrate::byte_stream())
                .unwrap(),
            now,
            moved_at: now,
        }
    }

    /// Moves bytes both ways, 1 ms a step, until nothing moves; runs the timers due.
    fn pump(&mut self) {
        for _ in 0..100_000 {
            self.now += Duration::from_millis(1);
            let mut moved = false;
            let mut up = Vec::new();
            self.client.poll_transmit(self.now, &mut up, 64 * 1024);
            if !up.is_empty() {
                moved = true;
                self.server.handle_bytes(self.now, &up);
            }
            let mut down = Vec::new();
            self.server.poll_transmit(self.now, &mut down, 64 * 1024);
            if !down.is_empty() {
                moved = true;
                self.client.handle_bytes(self.now, &down);
            }
            for c in [&mut self.client, &mut self.server] {
                if c.poll_timeout().is_some_and(|t| t <= self.now) {
                    c.handle_timeout(self.now);
                }
                while c.poll_event().is_some() {}
            }
            if !moved {
                return;
            }
            self.moved_at = self.now;
        }
        panic!("the pair never settled");
    }
}

fn received(c: &mut Connection) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| c.session_mut().poll_message())
        .map(|m| m.payload.to_vec())
        .collect()
}

#[test]
fn an_idle_connection_gives_back_its_buffers_and_loses_nothing() {
    for tls in [false, true] {
        let mut p = Pair::new(tls);
        p.pump();
        // A burst: 4 MiB of 1 KiB messages up, read as they come.
        let mut got = 0;
        for round in 0..64u32 {
            for i in 0..64u32 {
                let payload = (round * 64 + i).to_be_bytes().repeat(256);
                p.client
                    .session_mut()
                    .send_message(p.now, payload, MessageProps::default())
                    .unwrap();
            }
            p.pump();
            for (k, m) in received(&mut p.server).into_iter().enumerate() {
                assert_eq!(
                    m,
                    (round * 64 + k as u32).to_be_bytes().repeat(256),
                    "tls {tls}"
                );
                got += 1;
            }
        }
        assert_eq!(got, 64 * 64, "tls {tls}");
        let held = p.server.buffer_capacity();
        assert!(
            held >= 64 * 1024,
            "tls {tls}: the burst's buffers ({held} B)"
        );
        // The idle timer: due one idle period after the last bytes, on both sides.
        let due = p.moved_at + IDLE;
        for c in [&mut p.client, &mut p.server] {
            assert_eq!(c.poll_timeout(), Some(due), "tls {tls}");
            c.handle_timeout(due - Duration::from_millis(1));
            assert!(!c.take_idle_released(), "tls {tls}: not before");
            c.handle_timeout(due);
            assert!(c.take_idle_released(), "tls {tls}");
            assert!(!c.take_idle_released(), "tls {tls}: told once");
            assert!(
                c.buffer_capacity() <= 1024,
                "tls {tls}: {} B held",
                c.buffer_capacity()
            );
            // Not again until there is traffic again.
            assert_eq!(c.poll_timeout(), None, "tls {tls}");
        }
        // Traffic again, both ways: nothing lost, and the timer is armed again.
        p.now = due + Duration::from_secs(5);
        for n in 0..3u8 {
            p.client
                .session_mut()
                .send_message(p.now, vec![n; 3000], MessageProps::default())
                .unwrap();
        }
        p.server
            .session_mut()
            .send_message(p.now, vec![9; 20_000], MessageProps::default())
            .unwrap();
        p.pump();
        assert_eq!(
            received(&mut p.server),
            vec![vec![0; 3000], vec![1; 3000], vec![2; 3000]],
            "tls {tls}"
        );
        assert_eq!(received(&mut p.client), vec![vec![9; 20_000]], "tls {tls}");
        assert_eq!(
            p.server.poll_timeout(),
            Some(p.moved_at + IDLE),
            "tls {tls}"
        );
    }
}

#[test]
fn a_connection_without_the_release_has_no_idle_timer() {
    let mut config = Config::default();
    config.release_idle_after = None;
    let mut c = Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap();
    let now = Instant::now();
    c.handle_bytes(now, &[]);
    let mut out = Vec::new();
    c.poll_transmit(now, &mut out, 64 * 1024);
    assert!(!out.is_empty(), "PARAMS");
    assert_eq!(c.poll_timeout(), None);
    // Zero is refused: it would fire at every step.
    let mut zero = Config::default();
    zero.release_idle_after = Some(Duration::ZERO);
    assert!(Connection::new(Role::Client, zero, Substrate::byte_stream()).is_err());
}
