//! A hand-written SVG line chart: fractions against GiB on a log-2 axis,
//! with labelled vertical markers.

use std::fmt::Write;

/// One curve.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// CSS colour.
    pub color: &'static str,
    /// `(GiB, fraction)` points, in increasing GiB.
    pub points: Vec<(f64, f64)>,
}

/// A labelled vertical line.
pub struct Marker {
    /// Text drawn beside the line.
    pub label: String,
    /// Position on the x axis.
    pub gib: f64,
    /// CSS colour.
    pub color: &'static str,
}

/// The whole chart.
pub struct Chart {
    /// First line of the heading.
    pub title: String,
    /// Smaller lines under the title.
    pub subtitle: Vec<String>,
    /// X axis caption.
    pub x_label: String,
    /// Y axis caption.
    pub y_label: String,
    /// Curves.
    pub series: Vec<Series>,
    /// Vertical markers.
    pub markers: Vec<Marker>,
    /// A labelled horizontal guide at this fraction, if any.
    pub reference_hit: Option<(f64, String)>,
}

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 620.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 970.0;
const TOP: f64 = 100.0;
const BOTTOM: f64 = 550.0;

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `2^k` GiB as a tick label.
fn size_label(log2_gib: i32) -> String {
    if log2_gib >= 10 {
        format!("{} TiB", 1u64 << (log2_gib - 10))
    } else if log2_gib >= 0 {
        format!("{} GiB", 1u64 << log2_gib)
    } else {
        format!("{} MiB", 1024u64 >> -log2_gib)
    }
}

impl Chart {
    /// The SVG document.
    pub fn render(&self) -> String {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.markers.iter().map(|m| m.gib));
        let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        // A little room beyond the outermost point or marker.
        let (lo, hi) = if lo <= hi {
            (
                (lo.log2() - 0.2).floor() as i32,
                (hi.log2() + 0.2).ceil() as i32,
            )
        } else {
            (0, 1)
        };
        let hi = hi.max(lo + 1);
        let ymax_data = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        let ymax = ((ymax_data * 10.0).ceil() / 10.0).clamp(0.1, 1.0);
        let x = |gib: f64| LEFT + (gib.log2() - lo as f64) / (hi - lo) as f64 * (RIGHT - LEFT);
        let y = |v: f64| BOTTOM - v / ymax * (BOTTOM - TOP);

        let mut svg = String::new();
        let out = &mut svg;
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="32" font-size="19" font-weight="bold">{}</text>"#,
            esc(&self.title)
        );
        for (i, line) in self.subtitle.iter().enumerate() {
            let ty = 56.0 + 18.0 * i as f64;
            let _ = writeln!(
                out,
                r##"<text x="{LEFT}" y="{ty}" font-size="13" fill="#444">{}</text>"##,
                esc(line)
            );
        }

        // Grid and axes.
        let label_every = if hi - lo > 12 { 2 } else { 1 };
        for k in lo..=hi {
            let gx = x(2f64.powi(k));
            let _ = writeln!(
                out,
                r##"<line x1="{gx:.1}" y1="{TOP}" x2="{gx:.1}" y2="{BOTTOM}" stroke="#e6e6e6"/>"##
            );
            if (k - lo) % label_every == 0 {
                let _ = writeln!(
                    out,
                    r#"<text x="{gx:.1}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
                    BOTTOM + 18.0,
                    size_label(k)
                );
            }
        }
        let steps = (ymax * 10.0).round() as i32;
        for i in 0..=steps {
            let v = i as f64 / 10.0;
            let gy = y(v);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{RIGHT}" y2="{gy:.1}" stroke="#e6e6e6"/>"##
            );
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{:.1}" font-size="12" text-anchor="end">{:.0} %</text>"#,
                LEFT - 8.0,
                gy + 4.0,
                v * 100.0
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
            RIGHT - LEFT,
            BOTTOM - TOP
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            BOTTOM + 44.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            out,
            r#"<text transform="translate(22 {}) rotate(-90)" font-size="13" text-anchor="middle">{}</text>"#,
            (TOP + BOTTOM) / 2.0,
            esc(&self.y_label)
        );

        // Reference hit rate and markers.
        if let Some((h, label)) = &self.reference_hit {
            let gy = y(*h);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{RIGHT}" y2="{gy:.1}" stroke="#888" stroke-dasharray="2 4"/>"##
            );
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{:.1}" font-size="12.5" fill="#555">{}</text>"##,
                LEFT + 8.0,
                gy - 6.0,
                esc(label)
            );
        }
        for (i, m) in self.markers.iter().enumerate() {
            let mx = x(m.gib);
            let _ = writeln!(
                out,
                r#"<line x1="{mx:.1}" y1="{TOP}" x2="{mx:.1}" y2="{BOTTOM}" stroke="{}" stroke-width="1.5" stroke-dasharray="7 4"/>"#,
                m.color
            );
            // Labels hang to the left of the line, staggered downwards.
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" font-size="12.5" text-anchor="end" fill="{}">{}</text>"#,
                mx - 5.0,
                BOTTOM - 14.0 - 18.0 * i as f64,
                m.color,
                esc(&m.label)
            );
        }

        // Curves and legend.
        for (i, s) in self.series.iter().enumerate() {
            let path: Vec<String> = s
                .points
                .iter()
                .map(|&(gx, gy)| format!("{:.1},{:.1}", x(gx), y(gy)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2.5"/>"#,
                path.join(" "),
                s.color
            );
            for &(gx, gy) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/>"#,
                    x(gx),
                    y(gy),
                    s.color
                );
            }
            let ly = TOP + 22.0 + 22.0 * i as f64;
            let _ = writeln!(
                out,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2.5"/>"#,
                LEFT + 16.0,
                LEFT + 46.0,
                s.color
            );
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" font-size="13">MLA {}</text>"#,
                LEFT + 54.0,
                ly + 4.5,
                esc(&s.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_and_marker() {
        let chart = Chart {
            title: "t & u".into(),
            subtitle: vec!["s".into()],
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "bf16".into(),
                color: "red",
                points: vec![(8.0, 0.1), (64.0, 0.5)],
            }],
            markers: vec![Marker {
                label: "MHA".into(),
                gib: 4096.0,
                color: "gray",
            }],
            reference_hit: Some((0.5, "ref".into())),
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &amp; u"));
        assert!(svg.contains("MLA bf16") && svg.contains(">MHA<"));
        assert!(svg.contains("8 GiB") && svg.contains("4 TiB") && svg.contains(">ref<"));
        assert_eq!(svg.matches("<circle").count(), 2);
    }
}
