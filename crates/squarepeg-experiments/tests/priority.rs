//! Minion §8.3 on the simulator, through the library's connection core at both ends: under
//! a network-limited sender, messages sent at a higher priority overtake lower-priority
//! messages still waiting in the TCP's send queue (order), and so wait less (time).

use std::time::Duration;

use squarepeg_experiments::priority::{
    PRIORITY_SCHEMA, PriorityConfig, Transport, Variant, priority_json, priority_table, run,
    run_lab,
};

fn config() -> PriorityConfig {
    PriorityConfig {
        duration: Duration::from_secs(5),
        ..PriorityConfig::default()
    }
}

#[test]
fn high_priority_messages_overtake_untransmitted_low_priority_ones() {
    let c = config();
    let prio = run(&c, Variant::Priority, 1).expect("priority run");
    let fifo = run(&c, Variant::Fifo, 1).expect("fifo run");
    eprintln!("{}", priority_table(&[prio.clone(), fifo.clone()]));
    for r in [&prio, &fifo] {
        // No duplicate delivery, no message the sender never sent, no error at either end.
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // Network-limited: the path (8 Mbit/s) is the limit, and every message sent is
        // delivered, exactly once.
        assert!(r.throughput_mbps() > 6.0, "{}", r.throughput_mbps());
        assert!(r.messages.iter().all(|m| m.deliveries == 1));
        assert!(r.messages.len() > 3000);
    }
    // With priorities every high message is transmitted and delivered before every low
    // message sent before it that had not been transmitted when it entered the TCP's queue.
    let o = prio.overtaking().expect("simulator");
    assert!(
        o.pairs > 1000,
        "the send queue holds many low messages: {o:?}"
    );
    assert_eq!(o.transmitted_first, o.pairs, "{o:?}");
    assert_eq!(o.delivered_first, o.pairs, "{o:?}");
    // FIFO: none overtakes.
    let f = fifo.overtaking().expect("simulator");
    assert!(f.pairs > 1000);
    assert_eq!((f.transmitted_first, f.delivered_first), (0, 0), "{f:?}");
    // And so high messages wait less than low ones, and less than under FIFO: about the
    // path's delay, against the send buffer's drain (Minion Figure 10).
    let (high, low) = (prio.class(true), prio.class(false));
    let fifo_high = fifo.class(true);
    assert_eq!(high.count, fifo_high.count);
    assert!(high.p99_ms < low.p50_ms, "{high:?} vs {low:?}");
    assert!(high.p99_ms < fifo_high.p50_ms, "{high:?} vs {fifo_high:?}");
    assert!(high.max_ms < Some(100.0), "{high:?}");
}

#[test]
fn json_shape_and_determinism() {
    let c = PriorityConfig {
        duration: Duration::from_secs(2),
        ..PriorityConfig::default()
    };
    let runs = |seed| {
        vec![
            run(&c, Variant::Priority, seed).expect("run"),
            run(&c, Variant::Fifo, seed).expect("run"),
        ]
    };
    let a = priority_json(&c, 4, &runs(4));
    let b = priority_json(&c, 4, &runs(4));
    assert_eq!(a, b, "the same seed gives the same JSON");
    assert_eq!(a["schema"], PRIORITY_SCHEMA);
    let variants: Vec<&str> = a["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["variant"].as_str())
        .collect();
    assert_eq!(variants, ["priority", "fifo"]);
    for r in a["runs"].as_array().expect("runs") {
        for class in ["high", "low"] {
            for f in ["count", "delivered", "p50_ms", "p95_ms", "p99_ms", "max_ms"] {
                assert!(r[class].get(f).is_some(), "{class}.{f}");
            }
        }
        assert!(r["overtaking"]["pairs"].as_u64().is_some());
    }
    assert!(run(&PriorityConfig { high_every: 1, ..c }, Variant::Fifo, 1).is_err());
}

/// The same on the real lab, through the `squarepeg` crate over its userspace TCP on TUN at
/// both ends: every message delivered exactly once, high-priority messages well ahead of
/// FIFO. Needs root, /dev/net/tun and iproute2.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn priorities_on_the_real_lab_over_the_userspace_tcp() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let c = PriorityConfig {
        duration: Duration::from_secs(3),
        ..PriorityConfig::default()
    };
    let prio = run_lab(&c, Variant::Priority, 1, Transport::Utcp).expect("priority run");
    let fifo = run_lab(&c, Variant::Fifo, 1, Transport::Utcp).expect("fifo run");
    eprintln!("{}", priority_table(&[prio.clone(), fifo.clone()]));
    for r in [&prio, &fifo] {
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert!(r.messages.len() > 1000);
        assert!(r.messages.iter().all(|m| m.deliveries == 1));
    }
    let (high, fifo_high) = (prio.class(true), fifo.class(true));
    assert!(high.p95_ms < fifo_high.p50_ms, "{high:?} vs {fifo_high:?}");
}
