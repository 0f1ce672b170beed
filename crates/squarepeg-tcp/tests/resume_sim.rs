//! Careful Resume from cached path state (RFC 9040 temporal sharing, RFC 9959) in the
//! simulator, in virtual time: McTiny appendix A's transfer (1 MiB, 100 Mbit/s, RTT 117 ms)
//! a second time from the same server endpoint, which kept what the first connection
//! measured; the same when the path's RTT or its rate changed in between, or the state is
//! older than its lifetime; and the cache's export and import at the endpoint.

mod simnet;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use simnet::*;
use squarepeg_lab::Direction;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_tcp::{ConnectionConfig, ConnectionStats, ResumePhase};

const MIB: u64 = 1 << 20;
const RTT: Duration = Duration::from_millis(117);
const RATE: u64 = 100_000_000;
/// When the returning client connects (the first transfer is long over, its state saved).
const SECOND_AT: Duration = Duration::from_secs(3);

fn link(one_way: Duration, rate: u64, queue_bytes: u64) -> LinkConfig {
    LinkConfig::new()
        .with_delay(one_way)
        .with_rate(rate)
        .with_queue(Some(queue_bytes), None)
}

/// The outcome of one connection, seen by the client.
#[derive(Debug)]
struct Run {
    /// From the client's connect() to its last byte (EOF), in virtual time.
    done: Duration,
    server: ConnectionStats,
}

impl Run {
    fn rtts(&self, rtt: Duration) -> f64 {
        self.done.as_secs_f64() / rtt.as_secs_f64()
    }
}

/// Two transfers of `size` bytes from the server to a client (the client sends a 1-byte
/// request and the server answers after it): one at 0, one at [`SECOND_AT`] from another
/// port of the same client host. `second_path` replaces the path (both directions) before
/// the second connection.
fn two_transfers(
    seed: u64,
    size: u64,
    resume: bool,
    first_path: LinkConfig,
    second_path: Option<LinkConfig>,
) -> (Run, Run, World) {
    two_transfers_at(seed, [size; 2], resume, first_path, second_path, SECOND_AT)
}

/// [`two_transfers`] of `sizes` (first, returning) with the returning client connecting at
/// `second_at`.
fn two_transfers_at(
    seed: u64,
    sizes: [u64; 2],
    resume: bool,
    first_path: LinkConfig,
    second_path: Option<LinkConfig>,
    second_at: Duration,
) -> (Run, Run, World) {
    let start = Instant::now();
    let (ca, sa): (SocketAddr, SocketAddr) = (
        CLIENT.parse().expect("address"),
        SERVER.parse().expect("address"),
    );
    let ca2 = SocketAddr::new(ca.ip(), ca.port() + 1);
    let mut client = TcpHost::new("client", ca.ip(), 1, start);
    let mut server = TcpHost::new("server", sa.ip(), 2, start);
    let mut server_cfg = ConnectionConfig::default();
    server_cfg.careful_resume = resume;
    server.listen(sa.port(), server_cfg);
    for (i, (port, after)) in [(ca.port(), Duration::ZERO), (ca2.port(), second_at)]
        .into_iter()
        .enumerate()
    {
        let seed = 10 + 2 * i as u64;
        let size = sizes[i];
        let mut answer = Plan::new(size, seed + 1, 1, seed);
        answer.respond_after_eof = true;
        server.expect_client(sa.port(), SocketAddr::new(ca.ip(), port), answer);
        client.add_client(
            port,
            sa,
            ConnectionConfig::default(),
            after,
            Plan::new(1, seed, size, seed + 1),
        );
    }
    let mut w = World::new(
        seed,
        Bottleneck::symmetric(first_path),
        start,
        client,
        server,
    );
    let limits = Limits {
        deadline: second_at + Duration::from_secs(120),
        watchdog: second_at + Duration::from_secs(60),
    };
    if let Some(path) = second_path {
        w.sim
            .run_until(start + second_at - Duration::from_millis(500))
            .expect("run");
        for dir in [Direction::LeftToRight, Direction::RightToLeft] {
            w.sim
                .link_mut(dir)
                .reconfigure(path.clone())
                .expect("valid path");
        }
    }
    w.run(&limits)
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
    w.check_connections()
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
    w.server_mut().snapshot_stats();
    let run = |i: usize, w: &World| {
        let c = &w.client().conns[i];
        let begun = w.start + if i == 0 { Duration::ZERO } else { second_at };
        Run {
            done: c.eof_at.expect("EOF") - begun,
            server: w.server().conns[i].stats.clone().expect("server stats"),
        }
    };
    let (a, b) = (run(0, &w), run(1, &w));
    (a, b, w)
}

#[test]
fn a_returning_client_gets_the_megabyte_in_far_fewer_round_trips() {
    // A queue of one BDP (1.46 MB): slow start never overflows it.
    let path = link(RTT / 2, RATE, 1_500_000);
    let (cold, warm, w) = two_transfers(1, MIB, true, path.clone(), None);
    let (cold_rtts, warm_rtts) = (cold.rtts(RTT), warm.rtts(RTT));
    eprintln!(
        "cold {:?} = {cold_rtts:.2} RTT, returning {:?} = {warm_rtts:.2} RTT, resume {:?}",
        cold.done, warm.done, warm.server.resume
    );
    // Cold: handshake, request, seven slow-start rounds (10, 20, ... 320, 95 segments).
    assert!(cold_rtts > 8.0, "cold {cold_rtts:.2} RTT");
    assert_eq!(cold.server.resume.phase, ResumePhase::Normal);
    assert_eq!(cold.server.resume.reconnaissance, 0, "nothing saved yet");
    // Returning: handshake, request, the IW round (Reconnaissance), the paced jump and one
    // round of validation.
    let r = warm.server.resume;
    assert_eq!(
        (
            r.reconnaissance,
            r.unvalidated,
            r.validating,
            r.safe_retreats
        ),
        (1, 1, 1, 0)
    );
    assert!(r.jump_cwnd >= 200_000, "jump {}", r.jump_cwnd);
    // About 5.3 RTT against 8.1: handshake (1) and request (0.5), the IW round (1), the
    // paced jump of saved_cwnd / 2 (1), a round of validation that doubles (1), the last
    // bytes' serialisation and half an RTT.
    assert!(
        warm_rtts < 6.0 && warm_rtts <= cold_rtts - 2.5,
        "returning {warm_rtts:.2} RTT against {cold_rtts:.2}"
    );
    assert_eq!(
        warm.server.packets_retransmitted, 0,
        "the jump lost nothing"
    );
    // The state the returning connection ended with replaced the one it took.
    assert_eq!(w.server().ep.path_cache().len(), 1);
    assert_eq!(w.server().ep.stats().path_states_used, 1);
    assert_eq!(w.server().ep.stats().path_states_saved, 2);

    // Without the option the second transfer is as slow as the first.
    let (cold2, again, _) = two_transfers(1, MIB, false, path, None);
    assert!(
        (again.rtts(RTT) - cold2.rtts(RTT)).abs() < 0.2,
        "{:?} {:?}",
        again.done,
        cold2.done
    );
    assert_eq!(again.server.resume.reconnaissance, 0);
}

#[test]
fn after_a_long_transfer_the_megabyte_goes_in_one_paced_round() {
    // A first connection long enough to fill the path (8 MiB: slow start overshoots into the
    // one-BDP queue and settles) leaves saved_cwnd ≥ 2 MB, so the returning 1 MiB fits into
    // the jump (saved_cwnd / 2): handshake (1), request (0.5), the initial window's round
    // (1), the jump paced at about the path's rate (0.7), half an RTT — under 4 RTT, where
    // after a 1 MiB first connection it takes about 5.3. (With Fast Open, one RTT less: the
    // lab's `peg lab transfer --fast-open --warm-up 8mb`.)
    let path = link(RTT / 2, RATE, 1_500_000);
    let (_, warm, _) = two_transfers_at(7, [8 * MIB, MIB], true, path, None, SECOND_AT);
    let rtts = warm.rtts(RTT);
    let r = warm.server.resume;
    eprintln!("returning {:?} = {rtts:.2} RTT, resume {r:?}", warm.done);
    assert!(r.saved_cwnd >= 2_000_000, "saved {}", r.saved_cwnd);
    assert!(r.jump_cwnd >= MIB, "jump {}", r.jump_cwnd);
    assert_eq!((r.unvalidated, r.safe_retreats), (1, 0), "{r:?}");
    assert!(rtts < 4.0, "returning {rtts:.2} RTT");
    assert_eq!(warm.server.packets_retransmitted, 0);
}

#[test]
fn a_path_whose_rtt_changed_does_not_jump() {
    // RTT 117 ms, then 20 ms: less than half the saved RTT, a different path.
    let first = link(RTT / 2, RATE, 1_500_000);
    let second = link(Duration::from_millis(10), RATE, 1_500_000);
    let (_, warm, _) = two_transfers(2, MIB, true, first, Some(second));
    let r = warm.server.resume;
    assert_eq!(
        (r.reconnaissance, r.not_confirmed, r.unvalidated),
        (1, 1, 0)
    );
    assert_eq!(r.jump_cwnd, 0);
    assert_eq!(r.phase, ResumePhase::Normal);
    // And 117 ms then 1.5 s: more than ten times the saved RTT.
    let first = link(RTT / 2, RATE, 1_500_000);
    let second = link(Duration::from_millis(750), RATE, 20_000_000);
    let (_, warm, _) = two_transfers(3, MIB, true, first, Some(second));
    let r = warm.server.resume;
    assert_eq!((r.not_confirmed, r.unvalidated), (1, 0));
}

#[test]
fn a_jump_into_a_ten_times_smaller_bottleneck_retreats_safely() {
    // Saved at 100 Mbit/s; the second connection meets 10 Mbit/s with a queue of a third
    // of its BDP (146 kB at 117 ms).
    let first = link(RTT / 2, RATE, 1_500_000);
    let slow = link(RTT / 2, RATE / 10, 50_000);
    let (_, warm, _) = two_transfers(4, MIB, true, first, Some(slow.clone()));
    let r = warm.server.resume;
    eprintln!(
        "stale jump: {:?}, {} RTT, retransmitted {} packets ({} bytes), resume {r:?}",
        warm.done,
        warm.rtts(RTT),
        warm.server.packets_retransmitted,
        warm.server.bytes_retransmitted
    );
    assert_eq!((r.unvalidated, r.safe_retreats), (1, 1), "{r:?}");
    assert_eq!(r.phase, ResumePhase::Normal, "retreat ended");
    // Bounded loss: the paced jump overshoots the bottleneck for about one round trip at
    // most jump_cwnd per RTT, and what it loses is at most what did not fit in the queue —
    // never more than the jump itself.
    assert!(
        warm.server.bytes_retransmitted <= r.jump_cwnd,
        "retransmitted {} bytes after a jump of {}",
        warm.server.bytes_retransmitted,
        r.jump_cwnd
    );
    assert_eq!(warm.server.rto_timeouts, 0, "recovered without a timeout");
    // The same transfer cold on the slow path, for scale: the stale jump costs at most a few
    // round trips more than not knowing anything.
    let (cold, _, _) = two_transfers(4, MIB, false, slow.clone(), Some(slow));
    eprintln!(
        "cold on the slow path: {:?}, retransmitted {}",
        cold.done, cold.server.bytes_retransmitted
    );
    assert!(
        warm.done <= cold.done + RTT * 4,
        "{:?} against {:?}",
        warm.done,
        cold.done
    );
}

#[test]
fn the_endpoint_cache_exports_imports_and_expires() {
    let path = link(RTT / 2, RATE, 1_500_000);
    let (_, _, w) = two_transfers(5, MIB, true, path, None);
    let ep = &w.server().ep;
    let now = w.sim.now();
    let saved = ep.export_path_state(now);
    assert_eq!(saved.len(), 1);
    let s = saved[0];
    assert_eq!(s.remote, CLIENT.parse::<SocketAddr>().unwrap().ip());
    assert!(
        s.rtt >= RTT && s.rtt < RTT + Duration::from_millis(5),
        "{s:?}"
    );
    assert!(s.cwnd > 4 * 14_480);
    // Another endpoint (a later process) loads it; past the lifetime it is gone.
    let mut other = squarepeg_tcp::Endpoint::new(squarepeg_tcp::EndpointConfig::default(), now);
    other.import_path_state(now, &saved);
    assert_eq!(
        other.path_cache().get(s.remote, now).map(|r| r.cwnd),
        Some(s.cwnd)
    );
    let lifetime = other.path_cache().config().lifetime;
    assert!(
        other
            .path_cache()
            .get(s.remote, now + lifetime + Duration::from_secs(1))
            .is_none()
    );
}

#[test]
fn state_older_than_the_lifetime_is_not_used() {
    // The default lifetime is five minutes (RFC 7661's non-validated period, which RFC 9959
    // points at); a client returning after six starts cold.
    let lifetime = squarepeg_tcp::PathCacheConfig::default().lifetime;
    let path = link(RTT / 2, RATE, 1_500_000);
    let (cold, late, w) = two_transfers_at(
        6,
        [MIB; 2],
        true,
        path,
        None,
        lifetime + Duration::from_secs(60),
    );
    assert_eq!(
        late.server.resume.reconnaissance, 0,
        "{:?}",
        late.server.resume
    );
    assert!((late.rtts(RTT) - cold.rtts(RTT)).abs() < 0.2);
    assert_eq!(w.server().ep.stats().path_states_used, 0);
    // The expired entry was replaced by the late connection's own.
    assert_eq!(w.server().ep.path_cache().len(), 1);
}
