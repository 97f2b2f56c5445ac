//! An SVG of IOPS and traps per I/O against queue depth, one line per mode.

use std::fmt::Write;

use super::Run;

const W: f64 = 900.0;
const PANEL_H: f64 = 260.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 160.0;
const COLORS: [&str; 6] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// What a panel plots of a run.
type Metric = fn(&Run) -> f64;

/// Two panels sharing a log2 queue-depth axis.
pub fn svg(runs: &[Run]) -> String {
    let mut modes: Vec<&str> = Vec::new();
    for r in runs {
        if !modes.contains(&r.mode.as_str()) {
            modes.push(&r.mode);
        }
    }
    let qds: Vec<f64> = runs.iter().map(|r| f64::from(r.qd.max(1))).collect();
    let (qmin, qmax) = qds
        .iter()
        .fold((f64::MAX, 1.0f64), |(a, b), &q| (a.min(q), b.max(q)));
    let qmin = if qmin == f64::MAX { 1.0 } else { qmin };
    let x = |qd: u16| {
        let span = (qmax.log2() - qmin.log2()).max(1.0);
        LEFT + (f64::from(qd.max(1)).log2() - qmin.log2()) / span * (W - LEFT - RIGHT)
    };
    let mut s = String::new();
    let total_h = 2.0 * PANEL_H + 80.0;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let panels: [(&str, Metric); 2] = [
        ("IOPS", |r| r.iops),
        ("doorbell traps per I/O", |r| r.traps_per_io),
    ];
    for (p, (title, value)) in panels.iter().enumerate() {
        let top = 30.0 + p as f64 * (PANEL_H + 30.0);
        let bottom = top + PANEL_H - 30.0;
        let vmax = runs.iter().map(value).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let y = |v: f64| bottom - v / vmax * (bottom - top);
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}" font-weight="bold">{title} vs queue depth</text>"#,
            top - 8.0
        );
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="black"/><line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="black"/>"#,
            W - RIGHT
        );
        for i in 0..=4 {
            let v = vmax * f64::from(i) / 4.0;
            let label = if *title == "IOPS" {
                format!("{:.0}K", v / 1e3)
            } else {
                format!("{v:.2}")
            };
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{label}</text>"##,
                y(v),
                W - RIGHT,
                LEFT - 6.0,
                y(v) + 4.0
            );
        }
        let mut seen_qd: Vec<u16> = runs.iter().map(|r| r.qd).collect();
        seen_qd.sort_unstable();
        seen_qd.dedup();
        for qd in seen_qd {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{qd}</text>"#,
                x(qd),
                bottom + 16.0
            );
        }
        for (m, mode) in modes.iter().enumerate() {
            let color = COLORS[m % COLORS.len()];
            let points: Vec<String> = runs
                .iter()
                .filter(|r| r.mode == *mode)
                .map(|r| format!("{:.1},{:.1}", x(r.qd), y(value(r))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            );
            let ly = top + 10.0 + m as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{2}" y="{3}">{mode}</text>"#,
                W - RIGHT + 15.0,
                W - RIGHT + 40.0,
                W - RIGHT + 46.0,
                ly + 4.0
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">queue depth (log scale)</text>"#,
        (W - RIGHT + LEFT) / 2.0,
        total_h - 10.0
    );
    s.push_str("</svg>\n");
    s
}
