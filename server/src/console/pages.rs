//! The console's HTML, rendered on the server (maud: escaped by construction). Pages are
//! plain HTML forms and tables: they work without JavaScript. Every control has a label,
//! every page one `h1` and a landmark per region; colours meet WCAG AA contrast.

use maud::{DOCTYPE, Markup, PreEscaped, html};

/// The one style sheet (inline: no asset route to serve or cache-bust).
const STYLE: &str = r#"
:root { color-scheme: light; }
body { font: 16px/1.5 system-ui, sans-serif; margin: 0; color: #1b1f24; background: #fff; }
header { background: #0b3d5c; color: #fff; padding: .5rem 1rem; display: flex; gap: 1.5rem; align-items: center; flex-wrap: wrap; }
header a { color: #fff; }
header form { margin-left: auto; }
main { padding: 1rem; max-width: 72rem; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; }
th, td { border: 1px solid #8c959f; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #eaeef2; }
.killed { color: #a40e26; font-weight: 600; }
.ok { color: #116329; font-weight: 600; }
.notice { border-left: 4px solid #0b3d5c; background: #eaeef2; padding: .5rem 1rem; }
.error { border-left: 4px solid #a40e26; background: #ffebe9; padding: .5rem 1rem; }
label { display: block; font-weight: 600; margin-top: .5rem; }
textarea, input[type=text] { width: 100%; max-width: 40rem; font: inherit; }
button { font: inherit; padding: .25rem .75rem; margin-top: .5rem; }
"#;

/// Who is looking, for the header (none on the login and error pages).
pub struct Viewer<'a> {
    pub user: &'a str,
    pub csrf: &'a str,
}

/// A whole page.
pub fn page(title: &str, viewer: Option<&Viewer<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " - Halos console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "Halos console" }
                    @if let Some(v) = viewer {
                        nav aria-label="Main" {
                            a href="/console" { "Overview" } " · "
                            a href="/console/fleet" { "Fleet" } " · "
                            a href="/console/audit" { "Audit log" }
                        }
                        span { "Signed in as " (v.user) }
                        form method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(v.csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// A page that says something went wrong, and what to do.
pub fn problem(title: &str, message: &str, action: Option<(&str, &str)>) -> Markup {
    page(
        title,
        None,
        html! {
            p.error role="alert" { (message) }
            @if let Some((href, text)) = action {
                p { a href=(href) { (text) } }
            }
        },
    )
}

/// A controller PR: a link when it is an http(s) URL (what `gh pr create` prints), else
/// the text as given, or "not yet".
pub fn pr_link(pr: Option<&str>) -> Markup {
    html! {
        @match pr {
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => a href=(url) { (url) },
            Some(text) => (text),
            None => "not yet",
        }
    }
}

/// An RFC 3339 time to the minute, for tables ("2026-12-02 09:12 UTC"); anything else
/// as given.
pub fn minute(at: &str) -> String {
    match (at.get(..10), at.get(11..16)) {
        (Some(day), Some(hm)) if at.ends_with('Z') => format!("{day} {hm} UTC"),
        _ => at.to_string(),
    }
}

/// A yes/no cell.
pub fn killed_cell(killed: bool) -> Markup {
    html! {
        @if killed { span.killed { "killed" } } @else { span.ok { "live" } }
    }
}

/// The controller's evidence table for one experiment, each treatment arm's always-valid
/// interval of treatment - control drawn against zero (one scale per metric, so arms
/// of a metric compare by eye). Control rows and arms below the sample floor have no
/// interval and show only their mean.
pub fn evidence_table(rows: &[halo_controller::decide::Row]) -> Markup {
    // Half the drawing's width covers the largest |bound| of the metric.
    let scale = |metric: &str| {
        rows.iter()
            .filter(|r| r.metric == metric)
            .filter_map(|r| r.interval)
            .map(|iv| iv.low.abs().max(iv.high.abs()))
            .fold(0.0_f64, f64::max)
    };
    html! {
        table {
            thead { tr { th scope="col" { "Metric" } th scope="col" { "Variant" } th scope="col" { "Units" } th scope="col" { "Mean" } th scope="col" { "Treatment - control (always valid)" } th scope="col" { "Verdict" } } }
            tbody {
                @for r in rows {
                    tr {
                        td { (r.metric) }
                        td { (r.variant) }
                        td { (r.n) }
                        td { (format!("{:.4}", r.estimate)) }
                        td {
                            @if let Some(iv) = r.interval {
                                (interval_svg(iv.low, iv.estimate, iv.high, scale(&r.metric)))
                                " " (format!("{:+.4} [{:+.4}, {:+.4}]", iv.estimate, iv.low, iv.high))
                            } @else { "-" }
                        }
                        td { (r.verdict) }
                    }
                }
            }
        }
    }
}

/// Each (metric, treatment arm) of an experiment's history drawn over the run's ticks:
/// the always-valid interval of treatment - control as a band, the estimate as a line,
/// zero as a rule. The band leaving zero is the moment the controller could decide.
pub fn interval_charts(points: &[halo_controller::history::Point]) -> Markup {
    let mut series: Vec<(String, String)> = Vec::new();
    for p in points {
        for r in p.rows.iter().filter(|r| r.interval.is_some()) {
            let key = (r.metric.clone(), r.variant.clone());
            if !series.contains(&key) {
                series.push(key);
            }
        }
    }
    html! {
        @for (metric, variant) in &series {
            figure {
                (interval_chart(points, metric, variant))
                figcaption { (metric) ", " (variant) " - control, from " (points.first().map_or("", |p| p.at.as_str())) " to " (points.last().map_or("", |p| p.at.as_str())) }
            }
        }
    }
}

fn interval_chart(
    points: &[halo_controller::history::Point],
    metric: &str,
    variant: &str,
) -> Markup {
    const W: f64 = 480.0;
    const H: f64 = 120.0;
    let ivs: Vec<(usize, halo_controller::stats::Interval)> = points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.rows
                .iter()
                .find(|r| r.metric == metric && r.variant == variant)
                .and_then(|r| r.interval)
                .map(|iv| (i, iv))
        })
        .collect();
    let scale = ivs
        .iter()
        .map(|(_, iv)| iv.low.abs().max(iv.high.abs()))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let last = points.len().saturating_sub(1).max(1) as f64;
    let x = |i: usize| 4.0 + (i as f64 / last) * (W - 8.0);
    let y = |v: f64| H / 2.0 - (v / scale).clamp(-1.0, 1.0) * (H / 2.0 - 4.0);
    let upper: Vec<String> = ivs
        .iter()
        .map(|(i, iv)| format!("{:.1},{:.1}", x(*i), y(iv.high)))
        .collect();
    let lower: Vec<String> = ivs
        .iter()
        .rev()
        .map(|(i, iv)| format!("{:.1},{:.1}", x(*i), y(iv.low)))
        .collect();
    let estimate: Vec<String> = ivs
        .iter()
        .map(|(i, iv)| format!("{:.1},{:.1}", x(*i), y(iv.estimate)))
        .collect();
    let label = match ivs.last() {
        Some((_, iv)) => format!(
            "{metric}, {variant} - control over {} ticks; now {:+.4} [{:+.4}, {:+.4}]",
            ivs.len(),
            iv.estimate,
            iv.low,
            iv.high
        ),
        None => format!("{metric}, {variant}: no interval yet"),
    };
    html! {
        svg.chart width=(W) height=(H) viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(label) {
            title { (label) }
            line x1="0" y1=(H / 2.0) x2=(W) y2=(H / 2.0) stroke="#8c959f" {}
            @if ivs.len() > 1 {
                polygon.band points=(format!("{} {}", upper.join(" "), lower.join(" "))) fill="#0b3d5c" fill-opacity="0.25" {}
                polyline.estimate points=(estimate.join(" ")) fill="none" stroke="#0b3d5c" stroke-width="2" {}
            } @else if let Some((i, iv)) = ivs.first() {
                line x1=(format!("{:.1}", x(*i))) y1=(format!("{:.1}", y(iv.high))) x2=(format!("{:.1}", x(*i))) y2=(format!("{:.1}", y(iv.low))) stroke="#0b3d5c" stroke-width="3" {}
            }
        }
    }
}

/// One interval as a small SVG: the zero line, the interval, the estimate.
fn interval_svg(low: f64, estimate: f64, high: f64, scale: f64) -> Markup {
    let x = |v: f64| {
        let s = if scale > 0.0 && scale.is_finite() {
            scale
        } else {
            1.0
        };
        (100.0 + (v / s).clamp(-1.0, 1.0) * 95.0).clamp(0.0, 200.0)
    };
    let label = format!("from {low:+.4} to {high:+.4}, estimate {estimate:+.4}");
    html! {
        svg width="200" height="16" viewBox="0 0 200 16" role="img" aria-label=(label) {
            line x1="100" y1="0" x2="100" y2="16" stroke="#8c959f" {}
            line.interval x1=(format!("{:.1}", x(low))) y1="8" x2=(format!("{:.1}", x(high))) y2="8" stroke="#0b3d5c" stroke-width="3" {}
            circle cx=(format!("{:.1}", x(estimate))) cy="8" r="4" fill="#0b3d5c" {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_controller::decide::{Role, Row};
    use halo_controller::stats::Interval;

    fn row(variant: &str, interval: Option<Interval>) -> Row {
        Row {
            metric: "halo.api.error_rate".into(),
            role: Role::Guardrail,
            variant: variant.into(),
            n: 400,
            estimate: 0.3,
            interval,
            verdict: "breached".into(),
        }
    }

    #[test]
    fn each_interval_is_drawn_against_zero_on_its_metrics_scale() {
        let rows = [
            row("control", None),
            row(
                "canary",
                Some(Interval {
                    estimate: 0.28,
                    low: 0.2,
                    high: 0.4,
                }),
            ),
        ];
        let html = evidence_table(&rows).into_string();
        // The widest bound (0.4) spans the half width: 0.2 -> 147.5, 0.4 -> 195.
        assert!(html.contains(r#"x1="147.5" y1="8" x2="195.0""#), "{html}");
        assert!(html.contains(r#"cx="166.5""#), "{html}");
        assert!(
            html.contains("from +0.2000 to +0.4000, estimate +0.2800"),
            "{html}"
        );
        // Control has no interval: one drawing only.
        assert_eq!(html.matches("<svg").count(), 1, "{html}");
        assert!(html.contains("+0.2800 [+0.2000, +0.4000]"), "{html}");
    }

    #[test]
    fn the_interval_is_drawn_over_the_runs_ticks() {
        use halo_controller::history::Point;
        let iv = |low: f64, high: f64| {
            Some(Interval {
                estimate: (low + high) / 2.0,
                low,
                high,
            })
        };
        let points: Vec<Point> = [(-0.4, 0.4), (-0.1, 0.3), (0.1, 0.2)]
            .into_iter()
            .enumerate()
            .map(|(i, (low, high))| Point {
                at: format!("2026-12-01T00:0{i}:00Z"),
                run: 1,
                rows: vec![row("control", None), row("canary", iv(low, high))],
            })
            .collect();
        let html = interval_charts(&points).into_string();
        // One chart for the one treatment arm; the scale is the widest bound (0.4), so
        // the first tick's band spans the height (4..116) and the last sits above zero.
        assert_eq!(html.matches("<svg").count(), 1, "{html}");
        assert!(
            html.contains(
                r#"points="4.0,4.0 240.0,18.0 476.0,32.0 476.0,46.0 240.0,74.0 4.0,116.0""#
            ),
            "{html}"
        );
        assert!(html.contains("now +0.1500 [+0.1000, +0.2000]"), "{html}");
        assert!(html.contains("halo.api.error_rate, canary - control, from 2026-12-01T00:00:00Z to 2026-12-01T00:02:00Z"), "{html}");
    }

    #[test]
    fn no_chart_without_an_interval() {
        let html = interval_charts(&[]).into_string();
        assert!(!html.contains("<svg"), "{html}");
    }
}
