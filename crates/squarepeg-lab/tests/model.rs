//! The link model: statistics within computed bounds, exact timing, determinism.

use std::time::{Duration, Instant};

use squarepeg_lab::model::{
    DropReason, Fates, GilbertElliott, Jitter, JitterDistribution, LinkConfig, LinkDirection,
    Verdict,
};

const MS: Duration = Duration::from_millis(1);

/// Offers `n` packets of `len` bytes, one every `spacing`, and returns (send time, verdict).
fn offer_all(
    link: &mut LinkDirection,
    t0: Instant,
    n: usize,
    spacing: Duration,
    len: usize,
) -> Vec<(Instant, Verdict)> {
    (0..n)
        .map(|i| {
            let now = t0 + spacing * i as u32;
            (now, link.offer(now, len))
        })
        .collect()
}

/// |observed - expected| must be within 4 standard deviations.
fn assert_within_4_sigma(what: &str, observed: f64, expected: f64, sigma: f64) {
    assert!(
        (observed - expected).abs() <= 4.0 * sigma,
        "{what}: observed {observed}, expected {expected} ± 4 × {sigma}"
    );
}

#[test]
fn random_loss_rate_is_binomial() {
    let n = 100_000;
    let p = 0.01;
    let mut link = LinkDirection::new(LinkConfig::new().with_loss(p), 1).expect("config");
    let verdicts = offer_all(&mut link, Instant::now(), n, MS, 100);
    let lost = verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Drop(DropReason::RandomLoss))
        .count();
    let n_f = n as f64;
    assert_within_4_sigma(
        "random loss",
        lost as f64,
        n_f * p,
        (n_f * p * (1.0 - p)).sqrt(),
    );
    let stats = link.stats();
    assert_eq!(stats.dropped_random_loss, lost as u64);
    assert_eq!(stats.dropped(), lost as u64);
    assert_eq!(stats.delivered, (n - lost) as u64);
    assert_eq!(stats.offered, n as u64);
    assert_eq!(stats.offered_bytes, 100 * n as u64);
}

/// Lengths of the runs of consecutive drops.
fn loss_runs(verdicts: &[(Instant, Verdict)]) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut current = 0;
    for (_, verdict) in verdicts {
        if matches!(verdict, Verdict::Drop(_)) {
            current += 1;
        } else if current > 0 {
            runs.push(current);
            current = 0;
        }
    }
    if current > 0 {
        runs.push(current);
    }
    runs
}

#[test]
fn gilbert_elliott_stationary_loss_and_mean_burst() {
    let n = 200_000;
    let ge = GilbertElliott::new(0.01, 0.3);
    let mut link =
        LinkDirection::new(LinkConfig::new().with_gilbert_elliott(ge), 7).expect("config");
    let verdicts = offer_all(&mut link, Instant::now(), n, MS, 100);
    let lost = link.stats().dropped_burst_loss as f64;
    let pi = ge.stationary_bad();
    // The loss indicator is the Markov state itself: the variance of its mean is the binomial
    // one times (1 + λ) / (1 - λ), λ = 1 - p - r the chain's second eigenvalue.
    let lambda = 1.0 - ge.p - ge.r;
    let sigma = (pi * (1.0 - pi) / n as f64 * (1.0 + lambda) / (1.0 - lambda)).sqrt();
    assert_within_4_sigma("GE loss rate", lost / n as f64, ge.stationary_loss(), sigma);

    // Bad runs are geometric with mean 1/r and standard deviation sqrt(1 - r)/r.
    let runs = loss_runs(&verdicts);
    let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
    let sigma = (1.0 - ge.r).sqrt() / ge.r / (runs.len() as f64).sqrt();
    assert_within_4_sigma("GE mean burst", mean, ge.mean_bad_run(), sigma);
    assert!(
        runs.iter().any(|&r| r >= 5),
        "bursts are really bursts: {runs:?}"
    );
}

#[test]
fn gilbert_elliott_partial_losses_in_both_states() {
    let n = 200_000;
    let ge = GilbertElliott {
        p: 0.02,
        r: 0.2,
        loss_in_bad: 0.5,
        loss_in_good: 0.01,
    };
    let mut link =
        LinkDirection::new(LinkConfig::new().with_gilbert_elliott(ge), 9).expect("config");
    offer_all(&mut link, Instant::now(), n, MS, 100);
    let lost = link.stats().dropped_burst_loss as f64;
    // Loss = h(state) + independent Bernoulli noise: variance of the mean is the state part,
    // (h_bad - h_good)² π(1-π)(1+λ)/(1-λ), plus the noise part, E[h(1-h)].
    let pi = ge.stationary_bad();
    let lambda = 1.0 - ge.p - ge.r;
    let (hb, hg) = (ge.loss_in_bad, ge.loss_in_good);
    let state = (hb - hg).powi(2) * pi * (1.0 - pi) * (1.0 + lambda) / (1.0 - lambda);
    let noise = pi * hb * (1.0 - hb) + (1.0 - pi) * hg * (1.0 - hg);
    let sigma = ((state + noise) / n as f64).sqrt();
    assert_within_4_sigma(
        "GE partial loss rate",
        lost / n as f64,
        ge.stationary_loss(),
        sigma,
    );
}

#[test]
fn duplication_rate_and_timing() {
    let n = 50_000;
    let p = 0.05;
    let mut link = LinkDirection::new(LinkConfig::new().with_delay(10 * MS).with_duplicate(p), 3)
        .expect("config");
    let verdicts = offer_all(&mut link, Instant::now(), n, MS, 100);
    let mut duplicates = 0;
    for (sent, verdict) in &verdicts {
        let Verdict::Deliver { at, duplicate_at } = *verdict else {
            panic!("no loss configured");
        };
        assert_eq!(at, *sent + 10 * MS);
        if let Some(copy) = duplicate_at {
            // No jitter: the copy arrives with the original.
            assert_eq!(copy, at);
            duplicates += 1;
        }
    }
    let n_f = n as f64;
    assert_within_4_sigma(
        "duplicates",
        duplicates as f64,
        n_f * p,
        (n_f * p * (1.0 - p)).sqrt(),
    );
    assert_eq!(link.stats().duplicated, duplicates);
    assert_eq!(link.stats().delivered, n as u64);
}

/// Indices of packets that some later-offered packet arrives strictly before.
fn overtaken(verdicts: &[(Instant, Verdict)]) -> Vec<usize> {
    let arrivals: Vec<Instant> = verdicts
        .iter()
        .map(|(_, v)| v.arrivals().next().expect("delivered"))
        .collect();
    let mut earliest_after = vec![None::<Instant>; arrivals.len()];
    let mut min: Option<Instant> = None;
    for i in (0..arrivals.len()).rev() {
        earliest_after[i] = min;
        min = Some(min.map_or(arrivals[i], |m| m.min(arrivals[i])));
    }
    (0..arrivals.len())
        .filter(|&i| earliest_after[i].is_some_and(|e| e < arrivals[i]))
        .collect()
}

#[test]
fn reordering_only_when_enabled_and_at_the_configured_rate() {
    let n = 50_000;
    let t0 = Instant::now();
    let base = LinkConfig::new().with_delay(20 * MS);

    let mut plain = LinkDirection::new(base.clone(), 5).expect("config");
    let verdicts = offer_all(&mut plain, t0, n, MS, 100);
    assert!(overtaken(&verdicts).is_empty());
    assert_eq!(plain.stats().reordered, 0);
    assert_eq!(plain.stats().overtaking, 0);

    let p = 0.02;
    let mut reordering = LinkDirection::new(base.with_reorder(p, 5 * MS), 5).expect("config");
    let verdicts = offer_all(&mut reordering, t0, n, MS, 100);
    let held: Vec<usize> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, (sent, v))| v.arrivals().next() == Some(*sent + 25 * MS))
        .map(|(i, _)| i)
        .collect();
    let n_f = n as f64;
    assert_within_4_sigma(
        "held back",
        held.len() as f64,
        n_f * p,
        (n_f * p * (1.0 - p)).sqrt(),
    );
    assert_eq!(reordering.stats().reordered, held.len() as u64);
    // Packets are 1 ms apart and held 5 ms: exactly the held packets are overtaken (the last
    // packet of the run has nobody behind it).
    let mut expected = held.clone();
    expected.retain(|&i| i + 1 < n);
    assert_eq!(overtaken(&verdicts), expected);
}

fn delays(verdicts: &[(Instant, Verdict)]) -> Vec<Duration> {
    verdicts
        .iter()
        .map(|(sent, v)| v.arrivals().next().expect("delivered") - *sent)
        .collect()
}

#[test]
fn no_jitter_means_exact_delay() {
    let mut link = LinkDirection::new(LinkConfig::new().with_delay(35 * MS), 1).expect("config");
    let verdicts = offer_all(
        &mut link,
        Instant::now(),
        1000,
        Duration::from_micros(333),
        188,
    );
    assert!(delays(&verdicts).iter().all(|&d| d == 35 * MS));
}

#[test]
fn uniform_jitter_stays_in_range_and_order_is_preserved() {
    let t0 = Instant::now();
    let jitter = Jitter {
        amount: 5 * MS,
        distribution: JitterDistribution::Uniform,
        preserve_order: true,
    };
    let config = LinkConfig::new()
        .with_delay(20 * MS)
        .with_jitter_config(jitter);
    // Packets 1 ms apart with ±5 ms jitter would cross often if order were not preserved.
    let mut link = LinkDirection::new(config.clone(), 11).expect("config");
    let verdicts = offer_all(&mut link, t0, 20_000, MS, 100);
    let d = delays(&verdicts);
    assert!(d.iter().all(|&x| x >= 15 * MS && x <= 25 * MS));
    let arrivals: Vec<Instant> = verdicts
        .iter()
        .map(|(_, v)| v.arrivals().next().expect("delivered"))
        .collect();
    assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "order preserved");
    assert_eq!(link.stats().overtaking, 0);

    // The same jitter with reordering: the raw deviation, exactly in range, filling it.
    let mut link = LinkDirection::new(
        config.with_jitter_config(Jitter {
            preserve_order: false,
            ..jitter
        }),
        11,
    )
    .expect("config");
    let verdicts = offer_all(&mut link, t0, 20_000, MS, 100);
    let d = delays(&verdicts);
    let (min, max) = (d.iter().min().copied(), d.iter().max().copied());
    assert!(
        min >= Some(15 * MS) && min < Some(15 * MS + Duration::from_micros(50)),
        "{min:?}"
    );
    assert!(
        max <= Some(25 * MS) && max > Some(25 * MS - Duration::from_micros(50)),
        "{max:?}"
    );
    let reordered = overtaken(&verdicts).len();
    assert!(reordered > 1000, "{reordered}");
    assert!(link.stats().overtaking > 1000);
    // Uniform on ±5 ms: mean 0, standard deviation 5/√3 ms.
    let sample: Vec<f64> = d.iter().map(|x| x.as_secs_f64() * 1e3 - 20.0).collect();
    let mean = sample.iter().sum::<f64>() / sample.len() as f64;
    let sd = 5.0 / 3f64.sqrt();
    assert_within_4_sigma(
        "uniform jitter mean (ms)",
        mean,
        0.0,
        sd / (sample.len() as f64).sqrt(),
    );
}

#[test]
fn normal_jitter_is_truncated_at_two_sigma() {
    let jitter = Jitter {
        amount: 4 * MS,
        distribution: JitterDistribution::Normal,
        preserve_order: false,
    };
    let mut link = LinkDirection::new(
        LinkConfig::new()
            .with_delay(10 * MS)
            .with_jitter_config(jitter),
        13,
    )
    .expect("config");
    let n = 40_000;
    let verdicts = offer_all(&mut link, Instant::now(), n, MS, 100);
    let sample: Vec<f64> = delays(&verdicts)
        .iter()
        .map(|x| x.as_secs_f64() * 1e3 - 10.0)
        .collect();
    assert!(sample.iter().all(|x| x.abs() <= 4.0 + 1e-9));
    let mean = sample.iter().sum::<f64>() / n as f64;
    let sd = (sample.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
    // σ = 2 ms; a normal truncated at ±2σ has standard deviation 0.8796σ.
    let expected_sd = 0.8796 * 2.0;
    assert_within_4_sigma(
        "normal jitter mean (ms)",
        mean,
        0.0,
        expected_sd / (n as f64).sqrt(),
    );
    assert!(
        (sd - expected_sd).abs() < 0.03 * expected_sd,
        "sd {sd} vs {expected_sd}"
    );
    // Most of the mass is within ±σ (68 % before truncation, 71.5 % after).
    let within_sigma = sample.iter().filter(|x| x.abs() <= 2.0).count() as f64 / n as f64;
    assert!((within_sigma - 0.715).abs() < 0.02, "{within_sigma}");
}

#[test]
fn rate_limit_delivers_the_configured_rate_and_drops_the_excess() {
    // 1500-byte packets every 100 µs (120 Mbit/s) into 8 Mbit/s: 1.5 ms each on the wire.
    for config in [
        LinkConfig::new()
            .with_delay(5 * MS)
            .with_rate(8_000_000)
            .with_queue(None, Some(10)),
        LinkConfig::new()
            .with_delay(5 * MS)
            .with_rate(8_000_000)
            .with_queue(Some(15_000), None),
    ] {
        let t0 = Instant::now();
        let mut link = LinkDirection::new(config, 1).expect("config");
        let n = 10_000;
        let verdicts = offer_all(&mut link, t0, n, Duration::from_micros(100), 1500);
        // The transmitter is busy from t0 on: by the last arrival (999.9 ms) it has started
        // floor(999.9 / 1.5) + 1 = 667 packets, and 10 more wait in the queue.
        let delivered: Vec<Instant> = verdicts
            .iter()
            .filter_map(|(_, v)| v.arrivals().next())
            .collect();
        assert_eq!(delivered.len(), 677);
        let stats = link.stats();
        assert_eq!(stats.dropped_queue_full, (n - 677) as u64);
        assert_eq!(stats.max_queue_packets, 10);
        assert_eq!(stats.max_queue_bytes, 15_000);
        // Back to back at exactly the configured rate.
        for (k, at) in delivered.iter().enumerate() {
            assert_eq!(
                *at,
                t0 + 5 * MS + Duration::from_micros(1500) * (k as u32 + 1)
            );
        }
        assert_eq!(link.queue_at(t0 + Duration::from_millis(1016)), (0, 0));
    }
}

#[test]
fn serialization_carries_fractions_of_a_nanosecond() {
    // 1000 bytes at 3 Mbit/s is 2.666… ms: the n-th departure must be exactly n·8/3 ms,
    // rounded down, with no drift.
    let t0 = Instant::now();
    let mut link = LinkDirection::new(
        LinkConfig::new()
            .with_rate(3_000_000)
            .with_queue(None, Some(10_000)),
        1,
    )
    .expect("config");
    let verdicts = offer_all(&mut link, t0, 3000, Duration::ZERO, 1000);
    for (k, (_, v)) in verdicts.iter().enumerate() {
        let nanos = (k as u64 + 1) * 8_000_000_000 / 3_000;
        assert_eq!(v.arrivals().next(), Some(t0 + Duration::from_nanos(nanos)));
    }
}

#[test]
fn overhead_counts_against_the_rate() {
    let t0 = Instant::now();
    let mut link = LinkDirection::new(LinkConfig::new().with_rate(1_000_000).with_overhead(25), 1)
        .expect("config");
    // (100 + 25) bytes at 1 Mbit/s = 1 ms.
    assert_eq!(link.offer(t0, 100).arrivals().next(), Some(t0 + MS));
    assert_eq!(link.stats().delivered_bytes, 100);
}

#[test]
fn a_big_queue_at_a_low_rate_is_bufferbloat() {
    // 100 packets of 1250 bytes at 1 Mbit/s: 10 ms each.
    let t0 = Instant::now();
    let mut link = LinkDirection::new(
        LinkConfig::new().with_delay(10 * MS).with_rate(1_000_000),
        1,
    )
    .expect("config");
    let verdicts = offer_all(&mut link, t0, 100, Duration::ZERO, 1250);
    for (k, (_, v)) in verdicts.iter().enumerate() {
        assert_eq!(
            v.arrivals().next(),
            Some(t0 + 10 * MS + 10 * MS * (k as u32 + 1))
        );
    }
    let stats = link.stats();
    assert_eq!(stats.max_queue_delay, 990 * MS);
    assert_eq!(stats.max_queue_packets, 99);
    assert_eq!(stats.dropped(), 0);
    // A packet sent half a second later still waits for half the backlog.
    let later = t0 + 500 * MS;
    assert_eq!(
        link.offer(later, 1250).arrivals().next(),
        Some(t0 + 10 * MS + 1010 * MS)
    );
    assert_eq!(link.queue_at(later), (50, 50 * 1250));
}

#[test]
fn mtu_link_down_and_reconfigure() {
    let t0 = Instant::now();
    let mut link = LinkDirection::new(LinkConfig::new().with_mtu(1500), 1).expect("config");
    assert_eq!(link.offer(t0, 1501), Verdict::Drop(DropReason::TooBig));
    assert!(matches!(link.offer(t0, 1500), Verdict::Deliver { .. }));
    link.set_up(false);
    assert_eq!(link.offer(t0, 10), Verdict::Drop(DropReason::LinkDown));
    link.set_up(true);
    link.reconfigure(LinkConfig::new().with_delay(MS))
        .expect("valid");
    assert_eq!(link.offer(t0, 10).arrivals().next(), Some(t0 + MS));
    assert!(link.reconfigure(LinkConfig::new().with_loss(2.0)).is_err());
    let stats = link.stats();
    assert_eq!(
        (
            stats.dropped_too_big,
            stats.dropped_link_down,
            stats.delivered
        ),
        (1, 1, 2)
    );
}

/// FNV-1a over the verdicts, times relative to the start.
fn trace_hash(verdicts: &[(Instant, Verdict)], t0: Instant) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |value: u64| {
        for byte in value.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (_, verdict) in verdicts {
        match verdict {
            Verdict::Deliver { at, duplicate_at } => {
                feed(1);
                feed((*at - t0).as_nanos() as u64);
                feed(duplicate_at.map_or(u64::MAX, |d| (d - t0).as_nanos() as u64));
            }
            Verdict::Drop(reason) => feed(2 + *reason as u64),
        }
    }
    hash
}

fn everything() -> LinkConfig {
    "delay=35ms jitter=2ms,normal,reorder rate=8mbit queue=32kb loss=0.5% ge=p:1%,r:30%,bad:50% reorder=1%,3ms dup=1%"
        .parse()
        .expect("spec")
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let t0 = Instant::now();
    let run = |seed| {
        let mut link = LinkDirection::new(everything(), seed).expect("config");
        // Bursts of 20 back-to-back packets every 10 ms to exercise the queue too.
        let verdicts: Vec<_> = (0..20_000u32)
            .map(|i| {
                let now = t0 + 10 * MS * (i / 20);
                (now, link.offer(now, 200 + (i as usize * 37) % 1300))
            })
            .collect();
        let stats = link.stats();
        // Every impairment really acts in this trace.
        for count in [
            stats.dropped_queue_full,
            stats.dropped_random_loss,
            stats.dropped_burst_loss,
            stats.duplicated,
            stats.reordered,
            stats.overtaking,
        ] {
            assert!(count > 10, "{stats:?}");
        }
        trace_hash(&verdicts, t0)
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // Pinned: the same seed gives this trace on every machine and toolchain (ChaCha8 streams,
    // integer thresholds, IEEE-exact arithmetic only). A change here changes every seeded
    // scenario in the project.
    assert_eq!(run(42), PINNED_TRACE_HASH, "{:#x}", run(42));
}

const PINNED_TRACE_HASH: u64 = 0xe213_31b7_9176_2cd2;

#[test]
fn per_instant_fates_are_common_random_numbers() {
    // Two runs offer the same packets every 20 ms; one of them also offers extra packets in
    // between. With fates per instant the shared packets meet the same loss and the same
    // delay in both, with the default per-packet draws they part from the first extra one.
    // Jitter that reorders: on a FIFO link an extra packet may hold back the next one, which
    // is the link, not the draw.
    let config = LinkConfig::new()
        .with_delay(20 * MS)
        .with_jitter_config(Jitter {
            amount: 10 * MS,
            preserve_order: false,
            ..Jitter::default()
        })
        .with_loss(0.1);
    let run = |fates: Fates, extra: bool| -> Vec<Option<Duration>> {
        let start = Instant::now();
        let mut link = LinkDirection::new(config.clone().with_fates(fates), 11).expect("config");
        link.set_epoch(start);
        let mut out = Vec::new();
        for i in 0..2000u32 {
            let at = start + 20 * MS * i;
            match link.offer(at, 200) {
                Verdict::Deliver { at: arrival, .. } => out.push(Some(arrival - at)),
                Verdict::Drop(_) => out.push(None),
            }
            if extra && i % 3 == 0 {
                let _ = link.offer(at + 7 * MS, 60);
            }
        }
        out
    };
    let (a, b) = (run(Fates::PerInstant, false), run(Fates::PerInstant, true));
    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert_eq!(differ, 0, "shared packets with different fates");
    let lost = a.iter().filter(|v| v.is_none()).count();
    assert!((120..=280).contains(&lost), "10 % of 2000 lost: {lost}");
    let delays: std::collections::BTreeSet<_> = a.iter().flatten().collect();
    assert!(delays.len() > 100, "jitter varies the delay");
    let (c, d) = (run(Fates::PerPacket, false), run(Fates::PerPacket, true));
    let differ = c.iter().zip(&d).filter(|(x, y)| x != y).count();
    assert!(
        differ > 1000,
        "per packet, the extra packets shift later draws: {differ}"
    );
}
