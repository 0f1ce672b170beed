//! The queue-delay bound (`ConnectionConfig::queue_delay_limit`, `squarepeg_tcp::delay`) in
//! the simulator, in virtual time: a bulk download through an ADSL-like bottleneck with a
//! 1000-packet buffer (seconds long), the path Minion §8.4 and `peg tunnel` run on. CUBIC
//! alone fills the buffer; with the bound the RTT stays near the path's own and the link stays
//! busy; a route change that raises the path's RTT for good moves the base instead of
//! holding the window at its floor; with an upload the other way (a tunnel's outer
//! connection), timestamps keep the upload's queue out of the download's measure.

mod simnet;

use std::time::Duration;

use simnet::*;
use squarepeg_lab::Direction;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_tcp::{ConnectionConfig, ConnectionStats};

/// 8 Mbit/s, 35 ms each way (Hollywood's ADSL downlink), a 1000-packet buffer: 1.5 s.
const RATE: u64 = 8_000_000;
const ONE_WAY: Duration = Duration::from_millis(35);
const BASE_RTT: Duration = Duration::from_millis(70);
const LIMIT: Duration = Duration::from_millis(50);
/// 8 MB: 8 s at the link's rate.
const SIZE: u64 = 8_000_000;

fn link(one_way: Duration) -> LinkConfig {
    LinkConfig::new()
        .with_delay(one_way)
        .with_rate(RATE)
        .with_queue(None, Some(1000))
}

/// What the server (the sender) saw.
struct Download {
    /// Its smoothed RTT every 100 ms from `from` on, while the transfer ran.
    srtts: Vec<Duration>,
    /// From the client's connect to its last byte.
    done: Duration,
    stats: ConnectionStats,
}

impl Download {
    fn max_srtt(&self) -> Duration {
        self.srtts.iter().copied().max().expect("samples")
    }
}

/// One download of [`SIZE`] bytes, the server's connection configured with `limit`;
/// `change`: at that time both directions' one-way delay become the given one. The srtt is
/// sampled from `from`.
fn download(
    limit: Option<Duration>,
    change: Option<(Duration, Duration)>,
    from: Duration,
) -> Download {
    let mut server_cfg = ConnectionConfig::default();
    server_cfg.queue_delay_limit = limit;
    let mut answer = Plan::new(SIZE, 11, 1, 10);
    answer.respond_after_eof = true;
    let mut w = World::pair(
        7,
        Bottleneck::symmetric(link(ONE_WAY)),
        ConnectionConfig::default(),
        server_cfg,
        Plan::new(1, 10, SIZE, 11),
        answer,
        0,
    );
    let start = w.start;
    let mut srtts = Vec::new();
    let mut t = Duration::ZERO;
    let mut changed = false;
    while !w.finished() && t < Duration::from_secs(60) {
        t += Duration::from_millis(100);
        if let Some((at, one_way)) = change
            && !changed
            && t >= at
        {
            changed = true;
            for dir in [Direction::LeftToRight, Direction::RightToLeft] {
                w.sim
                    .link_mut(dir)
                    .reconfigure(link(one_way))
                    .expect("valid path");
            }
        }
        w.sim.run_until(start + t).expect("run");
        let server = w.server();
        let live = server.conns[0]
            .handle
            .and_then(|h| server.ep.stats_of(h).ok());
        if t >= from
            && let Some(s) = live
            && s.bytes_in_flight > 0
            && let Some(srtt) = s.srtt
        {
            srtts.push(srtt);
        }
    }
    finish(&mut w);
    Download {
        srtts,
        done: w.client().conns[0].eof_at.expect("EOF") - start,
        stats: w.server().conns[0].stats.clone().expect("server stats"),
    }
}

/// Runs `w` until its applications are done, checks every connection, and keeps the server's
/// stats.
fn finish(w: &mut World) {
    let limits = Limits {
        deadline: Duration::from_secs(120),
        watchdog: Duration::from_secs(60),
    };
    w.run(&limits)
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
    w.check_connections()
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
    w.server_mut().snapshot_stats();
}

/// The time the download takes at the link's rate, plus the handshake and the request.
fn ideal() -> Duration {
    Duration::from_secs_f64(SIZE as f64 * 8.0 / RATE as f64) + 2 * BASE_RTT
}

#[test]
fn cubic_alone_fills_the_buffer_and_the_bound_keeps_the_rtt_near_the_paths() {
    let unbounded = download(None, None, Duration::from_secs(2));
    let bounded = download(Some(LIMIT), None, Duration::from_secs(2));
    // The scenario builds a queue: without the bound the RTT grows far past the path's.
    assert!(
        unbounded.max_srtt() > BASE_RTT * 8,
        "CUBIC alone: srtt at most {:?}",
        unbounded.max_srtt()
    );
    assert_eq!(unbounded.stats.queue_delay_reductions, 0);
    // With it, the smoothed RTT stays within the limit plus one round trip's overshoot.
    let bound = BASE_RTT + LIMIT + BASE_RTT;
    assert!(
        bounded.max_srtt() <= bound,
        "bounded: srtt up to {:?} (bound {bound:?}); samples {:?}",
        bounded.max_srtt(),
        bounded.srtts
    );
    assert!(bounded.stats.queue_delay_reductions > 0);
    assert_eq!(bounded.stats.queue_delay_rebases, 0, "nothing else queues");
    // And the link stays busy: within 10 % of the ideal time, as fast as CUBIC alone.
    let ideal = ideal();
    assert!(
        bounded.done.as_secs_f64() <= ideal.as_secs_f64() * 1.10,
        "bounded: {:?} against an ideal {ideal:?}",
        bounded.done
    );
    assert!(
        bounded.done.as_secs_f64() <= unbounded.done.as_secs_f64() * 1.05,
        "bounded {:?}, CUBIC alone {:?}",
        bounded.done,
        unbounded.done
    );
}

#[test]
fn a_route_whose_rtt_grew_moves_the_base_rather_than_starving_the_flow() {
    // At 2 s the path's one-way delay goes from 35 to 150 ms (RTT 70 → 300 ms): every
    // sample is then above the old base + limit, whatever the window.
    let one_way = Duration::from_millis(150);
    let change = Some((Duration::from_secs(2), one_way));
    let changed = download(Some(LIMIT), change, Duration::from_secs(5));
    let unbounded = download(None, change, Duration::from_secs(5));
    assert!(changed.stats.queue_delay_rebases > 0, "the base moved");
    // The flow kept up after the change: as fast as CUBIC alone on the same path, which has
    // to grow its window to the new path's too.
    assert!(
        changed.done.as_secs_f64() <= unbounded.done.as_secs_f64() * 1.10,
        "bounded {:?}, CUBIC alone {:?} ({} reductions, {} rebases)",
        changed.done,
        unbounded.done,
        changed.stats.queue_delay_reductions,
        changed.stats.queue_delay_rebases
    );
    // And from the new base it bounds the queue again.
    let bound = 2 * one_way + LIMIT + 2 * one_way;
    assert!(
        changed.max_srtt() <= bound,
        "srtt up to {:?} after the change (bound {bound:?})",
        changed.max_srtt()
    );
}

/// One connection carrying a download of `down` bytes at 8 Mbit/s and an upload of `up` bytes
/// at 1 Mbit/s at once (Hollywood's ADSL path, 1000-packet buffers both ways), both ends
/// bounded at [`LIMIT`]; `timestamps`: both ends negotiate them. Returns when each direction
/// finished, from the start.
fn both_ways(timestamps: bool, down: u64, up: u64) -> (Duration, Duration, ConnectionStats) {
    let mut config = ConnectionConfig::default();
    config.queue_delay_limit = Some(LIMIT);
    config.timestamps = timestamps;
    let uplink = LinkConfig::new()
        .with_delay(ONE_WAY)
        .with_rate(1_000_000)
        .with_queue(None, Some(1000));
    let bottleneck = Bottleneck {
        left_to_right: uplink,
        right_to_left: link(ONE_WAY),
    };
    let mut w = World::pair(
        9,
        bottleneck,
        config.clone(),
        config,
        Plan::new(up, 20, down, 21),
        Plan::new(down, 21, up, 20),
        0,
    );
    let start = w.start;
    finish(&mut w);
    let down_done = w.client().conns[0].eof_at.expect("download EOF") - start;
    let up_done = w.server().conns[0].eof_at.expect("upload EOF") - start;
    (
        down_done,
        up_done,
        w.server().conns[0].stats.clone().expect("server stats"),
    )
}

#[test]
fn an_upload_the_other_way_does_not_count_as_the_downloads_queue() {
    // 4 MB down (4 s at 8 Mbit/s) while 1 MB goes up (8 s at 1 Mbit/s): the upload's queue
    // in front of the download's ACKs is there the whole time.
    let (down, up) = (4_000_000, 1_000_000);
    let (one_way_down, one_way_up, stats) = both_ways(true, down, up);
    let (rtt_down, _, rtt_stats) = both_ways(false, down, up);
    let ideal_down = Duration::from_secs_f64(down as f64 * 8.0 / RATE as f64);
    let ideal_up = Duration::from_secs_f64(up as f64 * 8.0 / 1e6);
    // Measured one way, both directions run near their links' rates: the download, whose
    // ACKs wait behind the upload, within 60 % over its ideal time (5.9 s for 4 s here), the
    // upload within 30 % (9.4 s for 8 s).
    assert!(
        one_way_down.as_secs_f64() <= ideal_down.as_secs_f64() * 1.6,
        "download {one_way_down:?} against an ideal {ideal_down:?} ({} reductions, {} rebases)",
        stats.queue_delay_reductions,
        stats.queue_delay_rebases
    );
    assert!(
        one_way_up.as_secs_f64() <= ideal_up.as_secs_f64() * 1.3,
        "upload {one_way_up:?} against an ideal {ideal_up:?}"
    );
    // Without timestamps the bound measures RTTs, which hold the upload's queue: the download
    // takes far longer (11.4 s here), the reason one-way delays are used where they can be.
    assert!(
        rtt_down.as_secs_f64() > one_way_down.as_secs_f64() * 1.5,
        "by RTT {rtt_down:?} ({} reductions, {} rebases), one way {one_way_down:?}",
        rtt_stats.queue_delay_reductions,
        rtt_stats.queue_delay_rebases
    );
}
