//! McTiny appendix A in the simulator: a server accepts a connection and sends 1 MiB over a
//! 100 Mbit/s path with a 117 ms RTT. Prints the completion time next to McTiny's 1.066 s,
//! and writes the sender's trace as JSON (an array, one record per line) and a plot of
//! sequence numbers and cwnd over time as SVG.
//!
//! `cargo run --release -p squarepeg-tcp --example trace [-- OUT_DIR]` (default `docs/figures`)

#[path = "../tests/simnet/mod.rs"]
mod simnet;

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use serde_json::json;
use simnet::{Limits, Plan, World};
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_tcp::{ConnectionConfig, TraceEvent, TraceRecord};

const MIB: u64 = 1 << 20;
const RTT: Duration = Duration::from_millis(117);

/// The server's trace, with times counted from the client's SYN.
struct Trace {
    records: Vec<TraceRecord>,
    start: Instant,
}

/// Runs the transfer; returns the time from the client's SYN to the last byte, and the
/// server's trace.
fn run(server: ConnectionConfig, client: ConnectionConfig) -> (Duration, Trace) {
    let link = LinkConfig::new()
        .with_delay(RTT / 2)
        .with_rate(100_000_000)
        .with_queue(None, Some(1000));
    let mut w = World::pair(
        1,
        Bottleneck::symmetric(link),
        client,
        server,
        Plan::new(0, 1, MIB, 2),
        Plan::new(MIB, 2, 0, 1),
        1 << 20,
    );
    let limits = Limits {
        deadline: Duration::from_secs(60),
        watchdog: Duration::from_secs(60),
    };
    w.run(&limits).expect("transfer");
    w.check_connections().expect("intact");
    let done = w.client().conns[0].eof_at.expect("EOF") - w.start;
    let records = w.trace_of(false);
    (
        done,
        Trace {
            records,
            start: w.start,
        },
    )
}

fn to_json(trace: &Trace) -> String {
    // Milliseconds to the microsecond.
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let mut out = String::from("[\n");
    for (i, r) in trace.records.iter().enumerate() {
        let event = match r.event {
            TraceEvent::Sent {
                offset,
                len,
                fin,
                retransmission,
            } => json!({"kind": "sent", "offset": offset, "len": len, "fin": fin,
                        "retransmission": retransmission}),
            TraceEvent::Ack {
                acked_offset,
                newly_acked,
                newly_sacked,
                duplicate,
            } => json!({"kind": "ack", "acked_offset": acked_offset, "newly_acked": newly_acked,
                        "newly_sacked": newly_sacked, "duplicate": duplicate}),
            other => json!({"kind": format!("{other:?}")}),
        };
        let record = json!({
            "t_ms": ms(r.time - trace.start),
            "event": event,
            "state": format!("{:?}", r.state),
            "cwnd": r.cwnd,
            "ssthresh": (r.ssthresh != u64::MAX).then_some(r.ssthresh),
            "srtt_ms": r.srtt.map(ms),
            "rttvar_ms": ms(r.rttvar),
            "rto_ms": ms(r.rto),
            "bytes_in_flight": r.bytes_in_flight,
            "pipe": r.pipe,
            "snd_una": r.snd_una,
            "snd_nxt": r.snd_nxt,
            "send_window": r.send_window,
            "retransmissions": r.retransmissions,
            "in_recovery": r.in_recovery,
        });
        out += &record.to_string();
        out += if i + 1 < trace.records.len() {
            ",\n"
        } else {
            "\n"
        };
    }
    out += "]\n";
    out
}

fn plot(trace: &Trace, done: Duration, path: &PathBuf) -> Result<(), Box<dyn Error>> {
    let secs = |r: &TraceRecord| (r.time - trace.start).as_secs_f64();
    let trace = &trace.records;
    let sent: Vec<(f64, f64)> = trace
        .iter()
        .filter_map(|r| match r.event {
            TraceEvent::Sent { offset, len, .. } if len > 0 => {
                Some((secs(r), (offset + u64::from(len)) as f64 / 1024.0))
            }
            _ => None,
        })
        .collect();
    let acked: Vec<(f64, f64)> = trace
        .iter()
        .filter(|r| matches!(r.event, TraceEvent::Ack { .. }))
        .map(|r| (secs(r), r.snd_una as f64 / 1024.0))
        .collect();
    let cwnd: Vec<(f64, f64)> = trace
        .iter()
        .map(|r| (secs(r), r.cwnd as f64 / 1024.0))
        .collect();
    let x_max = done.as_secs_f64().max(sent.last().map_or(1.0, |p| p.0)) * 1.05;
    let y_max = MIB as f64 / 1024.0 * 1.05;
    let c_max = cwnd.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;

    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "1 MiB over 100 Mbit/s, RTT 117 ms (McTiny appendix A), squarepeg sender",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?
        .set_secondary_coord(0.0..x_max, 0.0..c_max);
    chart
        .configure_mesh()
        .x_desc("time since the client's SYN (s)")
        .y_desc("stream offset (KiB)")
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("cwnd (KiB)")
        .draw()?;
    chart
        .draw_series(sent.iter().map(|&p| Circle::new(p, 1, BLUE.filled())))?
        .label("segment sent (end offset)")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, BLUE.filled()));
    chart
        .draw_series(LineSeries::new(acked, GREEN.stroke_width(2)))?
        .label("cumulatively acknowledged")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(cwnd, RED.stroke_width(2)))?
        .label("cwnd (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/figures"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&out)?;

    let (done, trace) = run(ConnectionConfig::default(), ConnectionConfig::default());
    let rounds = {
        let mut n = 0;
        let mut last = None;
        for r in &trace.records {
            if let TraceEvent::Sent { len, .. } = r.event
                && len > 0
            {
                if last.is_none_or(|t| r.time - t > RTT / 2) {
                    n += 1;
                }
                last = Some(r.time);
            }
        }
        n
    };
    println!(
        "squarepeg defaults (IW10, CUBIC, 4 MiB buffers): 1 MiB in {:.1} ms = {:.2} RTT, \
         {rounds} rounds of data after the handshake (McTiny on Linux: 1066 ms = 9.11 RTT)",
        done.as_secs_f64() * 1e3,
        done.as_secs_f64() / RTT.as_secs_f64()
    );
    // Variants that show where a round trip can go.
    for (name, server, client) in [
        (
            "receiver window 64 KiB (a receive buffer that does not grow)",
            ConnectionConfig::default(),
            {
                let mut config = ConnectionConfig::default();
                config.recv_buffer = 64 << 10;
                config
            },
        ),
        (
            "initial window 4 segments (RFC 3390)",
            {
                let mut config = ConnectionConfig::default();
                config.initial_window = 4;
                config
            },
            ConnectionConfig::default(),
        ),
    ] {
        let (t, _) = run(server, client);
        println!(
            "  {name}: {:.1} ms = {:.2} RTT",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / RTT.as_secs_f64()
        );
    }

    let json_path = out.join("mctiny_1mib_trace.json");
    std::fs::File::create(&json_path)?.write_all(to_json(&trace).as_bytes())?;
    let svg_path = out.join("mctiny_1mib_trace.svg");
    plot(&trace, done, &svg_path)?;
    println!(
        "wrote {} ({} records) and {}",
        json_path.display(),
        trace.records.len(),
        svg_path.display()
    );
    Ok(())
}
