//! `collbench plot`: bus bandwidth and time against message size, as an SVG, from one or more
//! `--json` files (collbench's own, or the medians `benches/openmpi_compare.sh` writes).

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `collbench plot`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlotArgs {
    /// Result files written by `collbench -J FILE` (one series each; a file's `label` field,
    /// else its name and rank count, names the series).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The SVG to write.
    #[arg(short, long, default_value = "collbench.svg")]
    out: PathBuf,
    /// Chart title.
    #[arg(long, default_value = "all_reduce")]
    title: String,
    /// Plot the in-place columns instead of the out-of-place ones.
    #[arg(long)]
    in_place: bool,
}

/// One series: (bytes, time µs, busbw GB/s) per row.
struct Series {
    label: String,
    points: Vec<(f64, f64, f64)>,
}

fn load(path: &Path, in_place: bool) -> Result<Series, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows = v["rows"].as_array().ok_or_else(|| {
        format!(
            "{}: no \"rows\" array: not a collbench --json file",
            path.display()
        )
    })?;
    let column = if in_place { "in_place" } else { "out_of_place" };
    let mut points = Vec::new();
    for row in rows {
        let m = &row[column];
        let (Some(size), Some(t), Some(b)) = (
            row["size_bytes"].as_f64(),
            m["time_us"].as_f64(),
            m["busbw_gbs"].as_f64(),
        ) else {
            continue;
        };
        if size > 0.0 && t > 0.0 {
            points.push((size, t, b));
        }
    }
    if points.is_empty() {
        return Err(format!(
            "{}: no rows with a {column} measurement",
            path.display()
        ));
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let label = match v["label"].as_str() {
        Some(l) => l.to_string(),
        None => {
            let stem = path.file_stem().map_or("".into(), |s| s.to_string_lossy());
            let algos: Vec<&str> = rows
                .iter()
                .filter_map(|r| r["algorithm"].as_str())
                .collect();
            let mut distinct = algos.clone();
            distinct.dedup();
            let ranks = v["nranks"]
                .as_u64()
                .map_or(String::new(), |n| format!(", {n} ranks"));
            let algo = if distinct.len() == 1 {
                format!(", {}", distinct[0])
            } else {
                String::new()
            };
            format!("{stem}{ranks}{algo}")
        }
    };
    Ok(Series { label, points })
}

/// `collbench plot FILE... --out chart.svg`.
pub fn plot_main(a: &PlotArgs) -> ExitCode {
    let series: Result<Vec<Series>, String> = a.files.iter().map(|f| load(f, a.in_place)).collect();
    let result = series.and_then(|s| draw(&s, &a.out, &a.title));
    match result {
        Ok(()) => {
            println!("collbench: wrote {}", a.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collbench plot: {e}");
            ExitCode::FAILURE
        }
    }
}

/// "8 B", "64 KiB", "16 MiB".
fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        _ if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        _ if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        _ if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        _ => format!("{b} B"),
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// One of the two charts, before its axes are given.
fn chart<'a, 'b>(area: &'a Area<'b>, caption: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut c = ChartBuilder::on(area);
    c.margin(12)
        .caption(caption, ("sans-serif", 24))
        .margin_right(40)
        .x_label_area_size(44)
        .y_label_area_size(60);
    c
}

/// The grid, tick labels and axis names of a chart whose x axis is log2 of the size.
fn mesh<'a, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    y_desc: &str,
    y_label: &dyn Fn(&f64) -> String,
    ticks: usize,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("message size (bytes per rank)")
        .y_desc(y_desc)
        .x_label_formatter(&|x| size_label(x.exp2()))
        .y_label_formatter(y_label)
        .x_labels(ticks.min(14))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
}

fn draw(series: &[Series], out: &Path, title: &str) -> Result<(), String> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut lo, mut hi, mut tmin, mut tmax, mut bmax) = (f64::MAX, 0f64, f64::MAX, 0f64, 0f64);
    for &(size, t, b) in all {
        (lo, hi) = (lo.min(size), hi.max(size));
        (tmin, tmax, bmax) = (tmin.min(t), tmax.max(t), bmax.max(b));
    }
    // Sizes are plotted on a log2 axis (x = log2 bytes) so ticks fall on powers of two.
    let (lo, hi) = (
        lo.log2().floor(),
        hi.log2().ceil().max(lo.log2().floor() + 1.0),
    );
    let root = SVGBackend::new(out, (1400, 560)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 28)).map_err(e)?;
    let (left, right) = root.split_horizontally(700);
    // Colours that stay apart on white (the first ones of matplotlib's tab10).
    const COLOURS: [RGBColor; 8] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
    ];
    let palette = |i: usize| COLOURS[i % COLOURS.len()].to_rgba();
    let x_axis = lo..hi;
    let ticks = (hi - lo) as usize + 1;
    // Bus bandwidth, linear (with headroom for the legend); time, log.
    let mut busbw = chart(&left, "bus bandwidth")
        .build_cartesian_2d(x_axis.clone(), 0f64..bmax * 1.4 + 1e-9)
        .map_err(e)?;
    mesh(&mut busbw, "busbw (GB/s)", &|b| format!("{b:.1}"), ticks).map_err(e)?;
    let mut time = chart(&right, "time per call")
        .build_cartesian_2d(x_axis, (tmin * 0.8..tmax * 1.25).log_scale())
        .map_err(e)?;
    let whole = |t: &f64| {
        if *t >= 1.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.1}")
        }
    };
    mesh(&mut time, "time (µs)", &whole, ticks).map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = palette(i);
        let style = ShapeStyle::from(color).stroke_width(2);
        busbw
            .draw_series(LineSeries::new(
                s.points.iter().map(|p| (p.0.log2(), p.2)),
                style,
            ))
            .map_err(e)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        busbw
            .draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new((p.0.log2(), p.2), 3, color.filled())),
            )
            .map_err(e)?;
        time.draw_series(LineSeries::new(
            s.points.iter().map(|p| (p.0.log2(), p.1)),
            style,
        ))
        .map_err(e)?;
        time.draw_series(
            s.points
                .iter()
                .map(|p| Circle::new((p.0.log2(), p.1), 3, color.filled())),
        )
        .map_err(e)?;
    }
    busbw
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_two_series_with_axes_and_legend() {
        let dir = std::env::temp_dir().join(format!("collbench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |size: u64, t: f64, b: f64| {
            serde_json::json!({"size_bytes": size, "algorithm": "rd",
                "out_of_place": {"time_us": t, "busbw_gbs": b}})
        };
        let a = dir.join("a.json");
        std::fs::write(
            &a,
            serde_json::json!({"nranks": 2, "rows": [row(8, 0.3, 0.02), row(1 << 20, 80.0, 13.0)]})
                .to_string(),
        )
        .unwrap();
        let b = dir.join("b.json");
        std::fs::write(
            &b,
            serde_json::json!({"label": "Open MPI", "rows": [row(8, 0.27, 0.03), row(1 << 20, 160.0, 6.4)]})
                .to_string(),
        )
        .unwrap();
        let out = dir.join("chart.svg");
        let series = vec![load(&a, false).unwrap(), load(&b, false).unwrap()];
        assert_eq!(series[0].label, "a, 2 ranks, rd");
        assert_eq!(series[1].label, "Open MPI");
        draw(&series, &out, "all_reduce").unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for text in [
            "busbw (GB/s)",
            "time (µs)",
            "message size",
            "Open MPI",
            "a, 2 ranks, rd",
            "1 MiB",
        ] {
            assert!(svg.contains(text), "the chart lacks {text:?}");
        }
        // Not a collbench file: a clear error, no chart.
        std::fs::write(dir.join("bad.json"), "{\"x\": 1}").unwrap();
        let err = load(&dir.join("bad.json"), false).err().unwrap();
        assert!(err.contains("not a collbench --json file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_are_labelled_in_binary_units() {
        assert_eq!(size_label(8.0), "8 B");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label((64u64 << 20) as f64), "64 MiB");
        assert_eq!(size_label(1000.0), "1000 B");
    }
}
