//! `--svg`: a timeline plot of live and held bytes, per pool and in total, written as SVG text.
//!
//! Owns the drawing: axes with ticks (MiB on the left, the operation index below), a line per
//! series (the trace's live bytes and the pages held in total, the most within each sample's span
//! of operations; per pool, the bytes of pages it holds (solid) and the bytes its live allocations
//! asked for (dashed), in one colour a pool), the smallest budget as a dotted line, a legend, and
//! under it the run's figures (held/live at the peak and over time, device map and unmap calls per
//! operation). No dependency: the SVG is written by hand. Pool colours come from one palette, in
//! the order pools first appear, so a new pool kind needs no change here.

use crate::replay::Timeline;
use crate::units::MIB;
use std::fmt::Write;

const W: f64 = 1100.0;
const H: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// Pool colours, in the order pools first appear in the timeline.
const PALETTE: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22",
];

/// What the plot shows besides the timeline.
#[derive(Debug, Clone)]
pub struct Plot<'a> {
    /// The title (trace and configuration).
    pub title: &'a str,
    /// The operations in the trace (the x axis' end).
    pub ops: u64,
    /// The smallest budget found, drawn as a line.
    pub min_budget: Option<u64>,
    /// Lines of figures printed under the legend.
    pub figures: &'a [String],
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks up to `max`.
fn nice_step(max: f64, target: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / target;
    let pow = 10f64.powf(raw.log10().floor());
    let m = raw / pow;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * pow
}

fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

fn ops_label(v: f64) -> String {
    let short = |x: f64| {
        let t = format!("{x:.1}");
        t.strip_suffix(".0").map(str::to_owned).unwrap_or(t)
    };
    if v >= 1e6 {
        format!("{}M", short(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", short(v / 1e3))
    } else {
        format!("{v:.0}")
    }
}

/// The SVG text of `timeline`.
pub fn render(timeline: &Timeline, plot: &Plot<'_>) -> String {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let max_bytes = timeline
        .held
        .iter()
        .chain(&timeline.live)
        .chain(timeline.pools.iter().flat_map(|p| p.held.iter()))
        .copied()
        .chain(plot.min_budget)
        .max()
        .unwrap_or(0)
        .max(1);
    let y_step = nice_step(max_bytes as f64 / MIB as f64, 6.0);
    let y_max = ((max_bytes as f64 / MIB as f64) / y_step).ceil().max(1.0) * y_step;
    let x_max = plot.ops.max(1) as f64;
    let x_step = nice_step(x_max, 8.0);
    let px = |op: f64| LEFT + pw * op / x_max;
    let py = |b: u64| TOP + ph * (1.0 - (b as f64 / MIB as f64) / y_max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(plot.title)
    );
    // Grid, ticks and their labels.
    let _ = writeln!(s, r##"<g class="axes" stroke="#ccc" stroke-width="1">"##);
    let y_ticks = (y_max / y_step).round() as u32;
    let x_ticks = (x_max / x_step).floor() as u32;
    for k in 0..=y_ticks {
        let y = TOP + ph * (1.0 - f64::from(k) * y_step / y_max);
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/>"#,
            LEFT + pw
        );
    }
    for k in 0..=x_ticks {
        let x = px(f64::from(k) * x_step);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}"/>"#,
            TOP + ph
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r#"<g class="ticks" fill="black">"#);
    for k in 0..=y_ticks {
        let v = f64::from(k) * y_step;
        let y = TOP + ph * (1.0 - v / y_max);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            tick_label(v, y_step)
        );
    }
    for k in 0..=x_ticks {
        let v = f64::from(k) * x_step;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            px(v),
            TOP + ph + 18.0,
            ops_label(v)
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">operation (alloc or free) index</text>"#,
        LEFT + pw / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle">MiB</text>"#,
        TOP + ph / 2.0
    );
    // The series.
    let path = |values: &[u64]| -> String {
        let mut d = String::new();
        for (i, (&x, &b)) in timeline.x.iter().zip(values).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                px(x as f64),
                py(b)
            );
        }
        d
    };
    let mut legend: Vec<(String, String, &str)> = Vec::new(); // label, colour, dash
    for (i, pool) in timeline.pools.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let name = escape(&pool.name);
        let _ = writeln!(
            s,
            r#"<path class="pool-held" data-pool="{name}" d="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            path(&pool.held)
        );
        let _ = writeln!(
            s,
            r#"<path class="pool-used" data-pool="{name}" d="{}" fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="5 3"/>"#,
            path(&pool.used)
        );
        legend.push((format!("{name}: held"), colour.into(), ""));
        legend.push((format!("{name}: used"), colour.into(), "5 3"));
    }
    let _ = writeln!(
        s,
        r##"<path class="total-held" d="{}" fill="none" stroke="#444" stroke-width="2.5"/>"##,
        path(&timeline.held)
    );
    let _ = writeln!(
        s,
        r#"<path class="total-live" d="{}" fill="none" stroke="black" stroke-width="1.5"/>"#,
        path(&timeline.live)
    );
    legend.push(("total held (pages)".into(), "#444".into(), ""));
    legend.push(("total live (asked for)".into(), "black".into(), ""));
    if let Some(b) = plot.min_budget {
        let y = py(b);
        let _ = writeln!(
            s,
            r#"<line class="min-budget" x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="red" stroke-dasharray="2 3"/>"#,
            LEFT + pw
        );
        legend.push(("smallest budget".into(), "red".into(), "2 3"));
    }
    // The legend.
    let lx = LEFT + pw + 16.0;
    let _ = writeln!(s, r#"<g class="legend">"#);
    for (i, (label, colour, dash)) in legend.iter().enumerate() {
        let y = TOP + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}">{label}</text>"#,
            lx + 24.0,
            lx + 30.0,
            y + 4.0
        );
    }
    let note_y = TOP + 10.0 + 18.0 * legend.len() as f64 + 10.0;
    let _ = writeln!(
        s,
        r##"<text x="{lx}" y="{note_y:.1}" font-size="10" fill="#555">totals: the most within each sample</text>"##
    );
    for (i, line) in plot.figures.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text class="figure" x="{lx}" y="{:.1}">{}</text>"#,
            note_y + 22.0 + 16.0 * i as f64,
            escape(line)
        );
    }
    let _ = writeln!(s, "</g>\n</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_nice() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 6.0), 2.0);
        assert_eq!(nice_step(0.3, 6.0), 0.05);
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(ops_label(1500.0), "1.5k");
        assert_eq!(ops_label(2_000_000.0), "2M");
    }
}
