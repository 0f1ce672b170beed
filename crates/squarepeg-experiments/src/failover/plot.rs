//! Plots of the failover and multipath experiments, as SVG and PNG (the VoIP experiment's
//! font and colours, `crate::voip::plot`): goodput over time per row (the death marked),
//! the call's per-message delay, and multipath goodput against the paths' rates. Any number
//! of rows.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{FailoverReport, MessageState, MultipathReport};
use crate::voip::VoipError;
use crate::voip::plot::{
    Chart, FONT, PALETTE, draw_legend, ensure_font, plot_err, write_svg_and_png,
};

/// Bins averaged in a plotted point (a centred moving mean: MPTCP hands data to the
/// application in bursts, as its subflows' segments come in order, and single 50 ms bins
/// swing from 0 to several times the rate).
pub const SMOOTHING_BINS: usize = 5;

/// One row's goodput series: (bin centre s, Mbit/s), a centred moving mean over
/// [`SMOOTHING_BINS`] bins.
fn series(bins: &[u64], bin_s: f64) -> Vec<(f64, f64)> {
    let half = SMOOTHING_BINS / 2;
    (0..bins.len())
        .map(|i| {
            let window = &bins[i.saturating_sub(half)..(i + half + 1).min(bins.len())];
            let mean = window.iter().sum::<u64>() as f64 / window.len() as f64;
            ((i as f64 + 0.5) * bin_s, mean * 8.0 / bin_s / 1e6)
        })
        .collect()
}

struct GoodputChart {
    title: String,
    rows: Vec<(String, Vec<(f64, f64)>)>,
    /// Vertical lines: (x, label).
    marks: Vec<(f64, String)>,
    /// Horizontal lines: (y, label).
    levels: Vec<(f64, String)>,
    x_end: f64,
}

impl Chart for GoodputChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let y_end = self
            .rows
            .iter()
            .flat_map(|(_, s)| s.iter().map(|&(_, y)| y))
            .chain(self.levels.iter().map(|&(y, _)| y))
            .fold(1.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..self.x_end, 0.0..y_end)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("goodput (Mbit/s, 250 ms moving mean of 50 ms bins)")
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        for (x, label) in &self.marks {
            let x = *x;
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, y_end)],
                    BLACK.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(label.as_str())
                .legend(move |(lx, ly)| {
                    PathElement::new([(lx, ly), (lx + 20, ly)], BLACK.stroke_width(2))
                });
        }
        for (y, label) in &self.levels {
            let y = *y;
            let grey = RGBColor(127, 127, 127);
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, y), (self.x_end, y)],
                    6,
                    4,
                    grey.stroke_width(1),
                ))
                .map_err(plot_err)?;
            chart
                .draw_series([Text::new(
                    label.clone(),
                    (self.x_end * 0.80, y),
                    (FONT, 12).into_font().color(&grey),
                )])
                .map_err(plot_err)?;
        }
        for (i, (name, points)) in self.rows.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

struct VoiceChart<'a> {
    title: String,
    report: &'a FailoverReport,
}

impl Chart for VoiceChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let c = &self.report.config;
        let x_end = c.duration.as_secs_f64();
        let playout = self
            .report
            .rows
            .first()
            .map_or(0.0, |r| r.voice.playout_offset_ms);
        let delays = self
            .report
            .rows
            .iter()
            .flat_map(|r| r.voice.messages.iter().filter_map(|m| m.delay_ms));
        // Lost messages are drawn at the top.
        let y_end = delays.fold(playout * 2.0, f64::max).min(5000.0) * 1.1;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_end, 0.0..y_end)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("message due (s)")
            .y_desc("arrival - due (ms); lost at the top")
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        let at = c.at.as_secs_f64();
        chart
            .draw_series(LineSeries::new(
                [(at, 0.0), (at, y_end)],
                BLACK.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!("path 0 {}", c.death.name()))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, playout), (x_end, playout)],
                6,
                4,
                RGBColor(127, 127, 127).stroke_width(1),
            ))
            .map_err(plot_err)?
            .label(format!("playout deadline ({playout:.0} ms)"))
            .legend(|(x, y)| {
                PathElement::new(
                    [(x, y), (x + 20, y)],
                    RGBColor(127, 127, 127).stroke_width(1),
                )
            });
        for (i, row) in self.report.rows.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let s = &row.voice.summary;
            chart
                .draw_series(row.voice.messages.iter().map(|m| {
                    let y = m.delay_ms.unwrap_or(y_end * 0.98).min(y_end * 0.98);
                    match m.state {
                        MessageState::Lost => {
                            Cross::new((m.send_s, y), 3, colour.stroke_width(1)).into_dyn()
                        }
                        _ => Circle::new((m.send_s, y), 2, colour.filled()).into_dyn(),
                    }
                }))
                .map_err(plot_err)?
                .label(format!(
                    "{}: {} late, {} lost of {}",
                    row.rival.name(),
                    s.delivered_late,
                    s.never_delivered,
                    s.messages_sent
                ))
                .legend(move |(x, y)| Circle::new((x + 10, y), 3, colour.filled()));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

/// Writes `failover-goodput` and `failover-voice` (.svg, .png) into `dir`; returns the
/// files.
pub fn failover(dir: &Path, report: &FailoverReport) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    let c = &report.config;
    let paths = format!("path 0 {} | path 1 {}", c.path0, c.path1);
    let goodput = GoodputChart {
        title: format!(
            "Failover: bulk download, path 0 {} at {:.1} s ({paths})",
            c.death.name(),
            c.at.as_secs_f64()
        ),
        rows: report
            .rows
            .iter()
            .map(|r| (r.rival.name(), series(&r.bulk.bins, r.bulk.bin_s)))
            .collect(),
        marks: vec![(c.at.as_secs_f64(), format!("path 0 {}", c.death.name()))],
        levels: Vec::new(),
        x_end: (c.duration + c.drain).as_secs_f64(),
    };
    let mut files = Vec::new();
    files.extend(write_svg_and_png(&dir.join("failover-goodput"), &goodput)?);
    let voice = VoiceChart {
        title: format!(
            "Failover: voice (160 B / 20 ms) next to the download, path 0 {} at {:.1} s",
            c.death.name(),
            c.at.as_secs_f64()
        ),
        report,
    };
    files.extend(write_svg_and_png(&dir.join("failover-voice"), &voice)?);
    Ok(files)
}

/// Writes `multipath-goodput` (.svg, .png) into `dir`; returns the files.
pub fn multipath(dir: &Path, report: &MultipathReport) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    let c = &report.config;
    let mut levels = Vec::new();
    for (i, link) in [&c.path0, &c.path1].into_iter().enumerate() {
        if let Some(rate) = link.rate_bps {
            levels.push((rate as f64 / 1e6, format!("path {i} rate")));
        }
    }
    if let Some(sum) = report.sum_of_rates_mbps {
        levels.push((sum, "sum of the rates".to_owned()));
    }
    let chart = GoodputChart {
        title: format!(
            "Multipath: bulk download (path 0 {} | path 1 {})",
            c.path0, c.path1
        ),
        rows: report
            .rows
            .iter()
            .map(|r| {
                (
                    format!("{} ({:.1} Mbit/s steady)", r.rival.name(), r.steady_mbps),
                    series(&r.bulk.bins, r.bulk.bin_s),
                )
            })
            .collect(),
        marks: vec![(c.warm_up.as_secs_f64(), "end of warm-up".to_owned())],
        levels,
        x_end: c.duration.as_secs_f64(),
    };
    Ok(write_svg_and_png(&dir.join("multipath-goodput"), &chart)?.to_vec())
}
