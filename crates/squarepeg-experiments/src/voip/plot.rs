//! Plots: per message in the style of Hollywood figures 5.4-5.16 (transport delay and
//! buffered time of every message, messages that missed their playout in red, plus a window
//! of 100 messages around the first miss), the latency CDF of every transport of a
//! scenario (Minion figure 7), its complement on a log scale (the fraction of messages later
//! than x, never-delivered ones included: the tail the CDF hides), and bars of each
//! transport's late losses next to the network's losses. Each is written as SVG and PNG.
//!
//! Text is measured and (in PNG) drawn with `ab_glyph` from a system TrueType font: DejaVu
//! Sans (Debian package `fonts-dejavu-core`, which `.ci/run` installs), or the file named by
//! `SQUAREPEG_PLOT_FONT`. Without a font no plot can be laid out, and plotting fails with a
//! clear error (`--no-plots` skips them).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::analysis::{MessageRecord, MessageState, ms};
use super::report::stem;
use super::{RunResult, VoipError};

/// Where the PNG font is looked for, in order (after `SQUAREPEG_PLOT_FONT`).
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

pub(crate) const FONT: &str = "sans-serif";
pub(crate) const SIZE: (u32, u32) = (1200, 600);
/// Messages shown in the zoomed plot (Hollywood's zooms show 100).
pub const ZOOM_MESSAGES: u64 = 100;

/// Loads and registers the font once, or says why it cannot.
pub fn ensure_font() -> Result<(), VoipError> {
    if font_loaded() {
        Ok(())
    } else {
        Err(VoipError::Plot(format!(
            "no TrueType font for the plots: install fonts-dejavu-core (looked in {}) or set \
             SQUAREPEG_PLOT_FONT to a .ttf file",
            FONT_PATHS.join(", ")
        )))
    }
}

fn font_loaded() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let env = std::env::var("SQUAREPEG_PLOT_FONT").ok();
        let candidates = env
            .iter()
            .map(String::as_str)
            .chain(FONT_PATHS.iter().copied());
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // Registered fonts live as long as the process: leak the bytes once.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

pub(crate) fn plot_err<E: std::fmt::Debug>(e: E) -> VoipError {
    VoipError::Plot(format!("{e:?}"))
}

/// The message range of the zoomed plot: 100 messages starting 10 before the first message
/// that missed its playout (or the first one the network lost, or the middle of the call).
pub fn zoom_window(records: &[MessageRecord]) -> Range<u64> {
    let n = records.len() as u64;
    let centre = records
        .iter()
        .find(|r| r.state != MessageState::OnTime)
        .or_else(|| records.iter().find(|r| r.lost_by_network))
        .map_or(n / 2, |r| r.number);
    let start = centre
        .saturating_sub(10)
        .min(n.saturating_sub(ZOOM_MESSAGES));
    start..(start + ZOOM_MESSAGES).min(n)
}

/// Writes the per-message plot and its zoom for one run; returns the files.
pub fn per_message(dir: &Path, run: &RunResult) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    let name = stem(run);
    let records = &run.analysis.records;
    let mut files = Vec::new();
    let title = format!(
        "{} over {} ({}): {} — playout delay {} ms",
        run.transport,
        run.scenario.name,
        run.engine.name(),
        "transport delay and buffered time",
        ms(run.scenario.playout_delay)
    );
    let all = 0..records.len() as u64;
    let zoom = zoom_window(records);
    for (suffix, range) in [("delay", all), ("zoom", zoom)] {
        let chart = DelayChart {
            title: &title,
            records,
            range,
        };
        files.extend(write_svg_and_png(
            &dir.join(format!("{name}-{suffix}")),
            &chart,
        )?);
    }
    Ok(files)
}

/// A chart drawn the same way on any plotters backend.
pub(crate) trait Chart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError>;
}

/// Draws `chart` into `base`.svg and `base`.png; returns both paths.
pub(crate) fn write_svg_and_png(
    base: &Path,
    chart: &impl Chart,
) -> Result<[PathBuf; 2], VoipError> {
    let svg = base.with_extension("svg");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(plot_err)?;
    }
    let png = base.with_extension("png");
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(plot_err)?;
    }
    Ok([svg, png])
}

struct DelayChart<'a> {
    title: &'a str,
    records: &'a [MessageRecord],
    range: Range<u64>,
}

impl Chart for DelayChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        delay_chart(root, self.title, self.records, self.range.clone())
    }
}

fn delay_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    records: &[MessageRecord],
    range: Range<u64>,
) -> Result<(), VoipError> {
    root.fill(&WHITE).map_err(plot_err)?;
    let shown: Vec<&MessageRecord> = records
        .iter()
        .filter(|r| range.contains(&r.number))
        .collect();
    let delay = |r: &MessageRecord| r.transport_delay().map(ms);
    let buffered = |r: &MessageRecord| r.buffered_ns().map(|ns| ns as f64 / 1e6);
    let mut lo: f64 = 0.0;
    let mut hi: f64 = 10.0;
    for r in &shown {
        for v in [delay(r), buffered(r)].into_iter().flatten() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    let pad = (hi - lo) * 0.05 + 1.0;
    let x_end = range.end.max(range.start + 1);
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(range.start as f64..x_end as f64, (lo - pad)..(hi + pad))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("message number")
        .y_desc("milliseconds")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(LineSeries::new(
            [(range.start as f64, 0.0), (x_end as f64, 0.0)],
            BLACK.mix(0.4),
        ))
        .map_err(plot_err)?;
    let blue = RGBColor(31, 119, 180);
    let green = RGBColor(44, 160, 44);
    // Lines broken where a message never arrived.
    for (series, colour, label) in [
        (
            &delay as &dyn Fn(&MessageRecord) -> Option<f64>,
            blue,
            "transport delay",
        ),
        (&buffered, green, "buffered time (playout - arrival)"),
    ] {
        let mut first = true;
        for run in shown.split(|r| series(r).is_none()) {
            let points: Vec<(f64, f64)> = run
                .iter()
                .filter_map(|r| Some((r.number as f64, series(r)?)))
                .collect();
            if points.is_empty() {
                continue;
            }
            let s = chart
                .draw_series(LineSeries::new(points, colour.stroke_width(1)))
                .map_err(plot_err)?;
            if first {
                s.label(label).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                });
                first = false;
            }
        }
    }
    let late: Vec<(f64, f64)> = shown
        .iter()
        .filter(|r| r.state == MessageState::Late)
        .filter_map(|r| Some((r.number as f64, buffered(r)?)))
        .collect();
    chart
        .draw_series(late.into_iter().map(|p| Circle::new(p, 3, RED.filled())))
        .map_err(plot_err)?
        .label("late (buffered < 0)")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, RED.filled()));
    let lost: Vec<(f64, f64)> = shown
        .iter()
        .filter(|r| r.state == MessageState::Lost)
        .map(|r| (r.number as f64, 0.0))
        .collect();
    chart
        .draw_series(
            lost.into_iter()
                .map(|p| Cross::new(p, 5, RED.stroke_width(2))),
        )
        .map_err(plot_err)?
        .label("never delivered")
        .legend(|(x, y)| Cross::new((x + 10, y), 5, RED.stroke_width(2)));
    let network: Vec<(f64, f64)> = shown
        .iter()
        .filter(|r| r.lost_by_network)
        .map(|r| (r.number as f64, delay(r).unwrap_or(0.0)))
        .collect();
    chart
        .draw_series(
            network
                .into_iter()
                .map(|p| TriangleMarker::new(p, 6, BLACK.stroke_width(1))),
        )
        .map_err(plot_err)?
        .label("first transmission lost by the network")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, BLACK.stroke_width(1)));
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

/// Writes one latency CDF per engine and scenario, every transport on it; returns the
/// files.
pub fn cdfs(dir: &Path, runs: &[RunResult]) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    let mut files = Vec::new();
    for (key, group) in by_engine_and_scenario(runs) {
        let Some(chart) = latency_cdf(&group) else {
            continue;
        };
        files.extend(write_svg_and_png(&dir.join(format!("{key}-cdf")), &chart)?);
    }
    Ok(files)
}

/// Writes, per engine and scenario, the complementary latency CDF on a log scale and the
/// late-loss bars; returns the files.
pub fn tails(dir: &Path, runs: &[RunResult]) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    let mut files = Vec::new();
    for (key, group) in by_engine_and_scenario(runs) {
        files.extend(write_svg_and_png(
            &dir.join(format!("{key}-ccdf")),
            &CcdfChart::of(&group),
        )?);
        files.extend(write_svg_and_png(
            &dir.join(format!("{key}-late-loss")),
            &LateLossBars::of(&group),
        )?);
    }
    Ok(files)
}

fn by_engine_and_scenario(runs: &[RunResult]) -> Vec<(String, Vec<&RunResult>)> {
    let mut groups: Vec<(String, Vec<&RunResult>)> = Vec::new();
    for run in runs {
        let key = format!("{}-{}", run.engine.name(), run.scenario.name);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(run),
            None => groups.push((key, vec![run])),
        }
    }
    groups
}

/// The fraction of messages later than x (log scale), per transport: a message never
/// delivered is later than every x, so each curve ends at the never-delivered fraction; the
/// playout deadline is marked, and where a curve crosses it is the late-loss rate.
struct CcdfChart {
    caption: String,
    /// Name and points (delay in ms, fraction later) of each curve.
    curves: Vec<(String, Vec<(f64, f64)>)>,
    hi: f64,
    /// The smallest fraction shown: below one message of the largest run.
    floor: f64,
    deadline: f64,
}

impl CcdfChart {
    fn of(runs: &[&RunResult]) -> CcdfChart {
        let first = runs[0];
        let deadline = ms(first.scenario.playout_offset());
        let mut hi = deadline * 1.5;
        let mut most = 1usize;
        let curves = runs
            .iter()
            .map(|run| {
                let mut delays: Vec<f64> = run
                    .analysis
                    .records
                    .iter()
                    .filter_map(|r| r.transport_delay().map(ms))
                    .collect();
                delays.sort_by(f64::total_cmp);
                let total = run.analysis.records.len().max(1);
                most = most.max(total);
                if let Some(&last) = delays.last() {
                    hi = hi.max(last);
                }
                // Just after each delay, one message fewer is later.
                let points = delays
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| (d, (total - i - 1) as f64 / total as f64))
                    .collect();
                (run.transport.clone(), points)
            })
            .collect();
        CcdfChart {
            caption: format!(
                "messages later than x: {} ({}), playout deadline {:.1} ms after send",
                first.scenario.name,
                first.engine.name(),
                deadline
            ),
            curves,
            hi,
            floor: 0.5 / most as f64,
            deadline,
        }
    }
}

impl Chart for CcdfChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let (hi, floor) = (self.hi * 1.05, self.floor);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.caption, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..hi, (floor..1.0).log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("transport delay (ms)")
            .y_desc("fraction of messages later (log)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0e}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                [(self.deadline, floor), (self.deadline, 1.0)],
                BLACK.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label("playout deadline")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        for (i, (name, points)) in self.curves.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            // A step function from 1 at x = 0, each fraction held until the next delay; a
            // fraction of 0 (every message delivered by then) is drawn at the floor.
            let mut steps = vec![(0.0, 1.0)];
            let mut level = 1.0;
            for &(d, f) in points {
                steps.push((d, level));
                level = f.max(floor);
                steps.push((d, level));
            }
            steps.push((hi, level));
            chart
                .draw_series(LineSeries::new(steps, colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

/// Per transport, the percentage of messages that missed their playout (late or never
/// delivered), next to the percentage the network lost (the reference: what UDP would
/// miss; not known over TLS, where the wire does not show which message a packet carried).
struct LateLossBars {
    caption: String,
    /// Transport, late-loss %, network-loss % (if known).
    bars: Vec<(String, f64, Option<f64>)>,
}

impl LateLossBars {
    fn of(runs: &[&RunResult]) -> LateLossBars {
        let first = runs[0];
        let bars = runs
            .iter()
            .map(|run| {
                let s = &run.analysis.summary;
                let sent = s.messages_sent.max(1) as f64;
                let net = run
                    .network_losses_visible()
                    .then(|| 100.0 * s.lost_by_network as f64 / sent);
                (run.transport.clone(), 100.0 * s.late_loss_rate, net)
            })
            .collect();
        LateLossBars {
            caption: format!(
                "missed playout vs lost by the network: {} ({})",
                first.scenario.name,
                first.engine.name()
            ),
            bars,
        }
    }
}

impl Chart for LateLossBars {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let top = self
            .bars
            .iter()
            .map(|(_, late, net)| late.max(net.unwrap_or(0.0)))
            .fold(0.1, f64::max)
            * 1.2;
        let n = self.bars.len();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.caption, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .map_err(plot_err)?;
        let names: Vec<String> = self.bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                // Label the middle of each slot only.
                if (x - x.floor() - 0.5).abs() < 0.01 {
                    names.get(i).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("% of messages sent")
            .y_label_formatter(&|y| format!("{y:.2}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        let late = PALETTE[0];
        let net = RGBColor(127, 127, 127);
        chart
            .draw_series(self.bars.iter().enumerate().map(|(i, (_, v, _))| {
                let x = i as f64;
                Rectangle::new([(x + 0.15, 0.0), (x + 0.5, *v)], late.filled())
            }))
            .map_err(plot_err)?
            .label("missed playout (late or never)")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], late.filled()));
        chart
            .draw_series(self.bars.iter().enumerate().filter_map(|(i, (_, _, v))| {
                let x = i as f64;
                v.map(|v| Rectangle::new([(x + 0.5, 0.0), (x + 0.85, v)], net.filled()))
            }))
            .map_err(plot_err)?
            .label("lost by the network")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], net.filled()));
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

/// The series labels every chart here draws: a framed box of the curves' names at `position`.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), VoipError> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .position(position)
        .draw()
        .map_err(plot_err)
}

pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The latency CDF of a group of runs of one engine and scenario, with the playout deadline
/// marked; `None` for no runs.
fn latency_cdf(runs: &[&RunResult]) -> Option<CdfChart> {
    let first = runs.first()?;
    let deadline = ms(first.scenario.playout_offset());
    let curves = runs
        .iter()
        .map(|run| {
            let delays = run
                .analysis
                .records
                .iter()
                .filter_map(|r| r.transport_delay().map(ms))
                .collect();
            (run.transport.clone(), delays, run.analysis.records.len())
        })
        .collect();
    Some(CdfChart::new(
        (
            format!(
                "latency CDF: {} ({}), playout deadline {:.1} ms after send",
                first.scenario.name,
                first.engine.name(),
                deadline
            ),
            20,
        ),
        "transport delay (ms)",
        "fraction of messages sent",
        curves,
        Some(deadline),
    ))
}

/// Cumulative distributions of delays, one step curve per series, with an optional
/// deadline marked as a vertical line.
pub(crate) struct CdfChart {
    caption: String,
    caption_size: u32,
    x_desc: &'static str,
    y_desc: &'static str,
    /// Name and points (delay in ms, fraction of the series' total) of each curve.
    curves: Vec<(String, Vec<(f64, f64)>)>,
    /// The largest delay shown (before a 5 % margin).
    hi: f64,
    deadline: Option<f64>,
}

impl CdfChart {
    /// `curves`: name, delays in ms (any order) and the count the fractions are of (the
    /// series' messages, delivered or not).
    pub(crate) fn new(
        (caption, caption_size): (String, u32),
        x_desc: &'static str,
        y_desc: &'static str,
        curves: Vec<(String, Vec<f64>, usize)>,
        deadline: Option<f64>,
    ) -> CdfChart {
        let mut hi: f64 = deadline.map_or(1.0, |d| d * 1.5);
        let curves = curves
            .into_iter()
            .map(|(name, mut delays, total)| {
                delays.sort_by(f64::total_cmp);
                if let Some(&last) = delays.last() {
                    hi = hi.max(last);
                }
                let total = total.max(1) as f64;
                let points = delays
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| (d, (i + 1) as f64 / total))
                    .collect();
                (name, points)
            })
            .collect();
        CdfChart {
            caption,
            caption_size,
            x_desc,
            y_desc,
            curves,
            hi,
            deadline,
        }
    }
}

impl Chart for CdfChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let hi = self.hi;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.caption, (FONT, self.caption_size))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..hi * 1.05, 0.0..1.0)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        if let Some(deadline) = self.deadline {
            chart
                .draw_series(LineSeries::new(
                    [(deadline, 0.0), (deadline, 1.0)],
                    BLACK.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label("playout deadline")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        }
        for (i, (name, points)) in self.curves.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            // A step function: hold each fraction until the next delay.
            let mut points = points.clone();
            if let Some(&(_, y)) = points.last() {
                points.push((hi * 1.05, y));
            }
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    }
}
