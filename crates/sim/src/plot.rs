//! Charts with plotters, in SVG or PNG (chosen by the file's extension).
//!
//! One client count: requests per 100 ms over time, one line per strategy (the first seeded
//! run of each, so waves show as they happen, not averaged away). A sweep: calls and mean
//! completion time against the number of clients, and the timeline at the largest count.
//!
//! Text needs a TrueType font: `REDRIVE_FONT` names one, else a common system font
//! (DejaVu Sans, Liberation Sans, Arial, Helvetica) is used.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::SimError;
use crate::sweep::Report;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/local/share/fonts/DejaVuSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REDRIVE_FONT") {
        return Some(PathBuf::from(p));
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| scan(Path::new("/usr/share/fonts"), 4))
}

fn scan(dir: &Path, depth: u32) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in &entries {
        if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            return Some(p.clone());
        }
    }
    if depth == 0 {
        return None;
    }
    entries
        .iter()
        .filter(|p| p.is_dir())
        .find_map(|p| scan(p, depth - 1))
}

/// Registers a font once per process; the error says how to provide one.
fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = find_font().ok_or_else(|| {
            "no TrueType font found for the chart's text; set REDRIVE_FONT to a .ttf file"
                .to_owned()
        })?;
        let bytes = std::fs::read(&path).map_err(|e| format!("font {}: {e}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font("sans-serif", style, bytes)
                .map_err(|_| format!("font {} is not a TrueType font", path.display()))?;
        }
        Ok(())
    })
    .clone()
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Draws with `$draw` on an SVG or PNG backend chosen by the extension, then writes the file.
macro_rules! render {
    ($ext:expr, $path:expr, $size:expr, $err:expr, |$root:ident| $draw:expr) => {
        match $ext {
            Some("svg") => {
                let $root = &SVGBackend::new($path, $size).into_drawing_area();
                $draw.map_err(|e| $err(e.to_string()))?;
                $root.present().map_err(|e| $err(e.to_string()))
            }
            Some("png") => {
                let $root = &BitMapBackend::new($path, $size).into_drawing_area();
                $draw.map_err(|e| $err(e.to_string()))?;
                $root.present().map_err(|e| $err(e.to_string()))
            }
            _ => Err($err("the file must end in .svg or .png".into())),
        }
    };
}

/// Draws the report's chart to `path` (`.svg` or `.png`).
///
/// # Errors
/// [`SimError::Plot`] for another extension, a missing font, or a file that cannot be written.
pub fn plot(report: &Report, path: &Path) -> Result<(), SimError> {
    let err = |reason: String| SimError::Plot {
        path: path.to_owned(),
        reason,
    };
    let ext = extension(path);
    let sweep = report.clients.len() > 1;
    let size = if sweep { (1000, 1200) } else { (1000, 520) };
    ensure_font().map_err(err)?;
    render!(ext.as_deref(), path, size, err, |root| draw(root, report))
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &Report) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let title = format!("redrive simulate --model {} ({} runs)", r.model, r.runs);
    let root = root.titled(&title, ("sans-serif", 22))?;
    if r.clients.len() > 1 {
        let parts = root.split_evenly((3, 1));
        against_clients(&parts[0], r, "calls", |c| c.calls)?;
        against_clients(&parts[1], r, "completion time (s, mean)", |c| {
            c.completion_ms.mean / 1e3
        })?;
        timeline(&parts[2], r)?;
    } else {
        timeline(&root, r)?;
    }
    Ok(())
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

fn against_clients<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &Report,
    what: &str,
    f: impl Fn(&crate::sweep::Cell) -> f64,
) -> DrawResult<DB> {
    let lo = f64::from(*r.clients.iter().min().unwrap_or(&0));
    let hi = f64::from(*r.clients.iter().max().unwrap_or(&1));
    let top = r.cells.iter().map(&f).fold(0.0, f64::max).max(1e-9) * 1.05;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what} against clients"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(lo..hi.max(lo + 1.0), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc(what)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, s) in r.strategies.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .cells
            .iter()
            .filter(|c| &c.strategy == s)
            .map(|c| (f64::from(c.clients), f(c)))
            .collect();
        let col = color(i);
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
            .label(s.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], col.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

/// The time by which `share` of a timeline's calls were made, in buckets.
fn quantile_bucket(t: &[u32], share: f64) -> usize {
    let total: u64 = t.iter().map(|x| u64::from(*x)).sum();
    let want = (total as f64 * share).ceil() as u64;
    let mut acc = 0u64;
    for (i, x) in t.iter().enumerate() {
        acc += u64::from(*x);
        if acc >= want {
            return i + 1;
        }
    }
    t.len()
}

fn timeline<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, r: &Report) -> DrawResult<DB> {
    let n = *r.clients.iter().max().unwrap_or(&0);
    let cells: Vec<_> = r.cells.iter().filter(|c| c.clients == n).collect();
    // Show until 95% of every strategy's calls are made, but no further than five times the
    // median strategy's: a very long tail (plain exponential) would squeeze everyone's waves.
    let mut q95: Vec<usize> = cells
        .iter()
        .map(|c| quantile_bucket(&c.timeline, 0.95))
        .collect();
    q95.sort_unstable();
    let longest = q95.last().copied().unwrap_or(1);
    let median = q95.get(q95.len() / 2).copied().unwrap_or(1);
    let buckets = longest.min(median.saturating_mul(5)).max(10);
    let x_max = buckets as f64 / 10.0;
    let top = cells
        .iter()
        .flat_map(|c| c.timeline.iter().take(buckets).copied())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("requests per 100 ms, {n} clients (first seeded run)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..f64::from(top) * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests per 100 ms")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    if let Some(cap) = r.capacity_per_100ms {
        chart
            .draw_series(LineSeries::new(
                [(0.0, cap), (x_max, cap)],
                BLACK.mix(0.6).stroke_width(1),
            ))?
            .label("PSP capacity")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.6)));
    }
    for (i, c) in cells.iter().enumerate() {
        let col = color(i);
        let pts = c
            .timeline
            .iter()
            .take(buckets)
            .enumerate()
            .map(|(b, v)| (b as f64 / 10.0, f64::from(*v)));
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(1)))?
            .label(c.strategy.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

/// A PSP's load over time, for `redrive demo`: one 100 ms slice per entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadChart {
    /// The chart's title.
    pub title: String,
    /// Per 100 ms slice: answered 2xx.
    pub ok: Vec<u64>,
    /// Per 100 ms slice: answered 429.
    pub limited: Vec<u64>,
    /// Per 100 ms slice: answered 5xx (errors and the outage).
    pub failed: Vec<u64>,
    /// Windows (start, end) in seconds during which the breaker was open, shaded.
    pub open: Vec<(f64, f64)>,
    /// The PSP's outage window (start, end) in seconds, marked, if any.
    pub outage: Option<(f64, f64)>,
    /// The PSP's rate limit in requests per 100 ms (its limit per second / 10), drawn as a
    /// horizontal line, if it has one.
    pub limit: Option<f64>,
}

/// Draws a [`LoadChart`] to `path` (`.svg` or `.png`).
///
/// # Errors
/// [`SimError::Plot`] for another extension, a missing font, or a file that cannot be written.
pub fn plot_load(c: &LoadChart, path: &Path) -> Result<(), SimError> {
    let err = |reason: String| SimError::Plot {
        path: path.to_owned(),
        reason,
    };
    ensure_font().map_err(err)?;
    render!(extension(path).as_deref(), path, (1000, 480), err, |root| {
        draw_load(root, c)
    })
}

fn draw_load<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LoadChart) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let n = c.ok.len().max(c.failed.len()).max(c.limited.len()).max(10);
    let x_max = n as f64 / 10.0;
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    let top = (0..n)
        .map(|i| at(&c.ok, i) + at(&c.limited, i) + at(&c.failed, i))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let top = c.limit.map_or(top, |l| top.max(l));
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..top * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests per 100 ms")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let shade = RGBColor(230, 80, 60).mix(0.18);
    for (i, (a, b)) in c.open.iter().enumerate() {
        let s =
            chart.draw_series([Rectangle::new([(*a, 0.0), (*b, top * 1.1)], shade.filled())])?;
        if i == 0 {
            s.label("breaker open").legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 18, y + 5)], shade.filled())
            });
        }
    }
    if let Some((a, b)) = c.outage {
        let mark = BLACK.mix(0.5);
        chart
            .draw_series([PathElement::new(
                [(a, top * 1.05), (b, top * 1.05)],
                mark.stroke_width(3),
            )])?
            .label("PSP outage")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], mark.stroke_width(3)));
    }
    if let Some(l) = c.limit {
        let line = RGBColor(60, 90, 200);
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, l), (x_max, l)],
                8,
                5,
                line.stroke_width(2),
            ))?
            .label(format!("rate limit ({l} per 100 ms)"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], line.stroke_width(2)));
    }
    let series: [(&str, &[u64], RGBColor); 3] = [
        ("2xx", &c.ok, RGBColor(40, 150, 70)),
        ("429", &c.limited, RGBColor(230, 160, 20)),
        ("5xx", &c.failed, RGBColor(200, 40, 40)),
    ];
    for (name, v, col) in series {
        let pts = (0..n).map(|i| (i as f64 / 10.0, at(v, i) as f64));
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}
