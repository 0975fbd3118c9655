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

/// A yes/no cell.
pub fn killed_cell(killed: bool) -> Markup {
    html! {
        @if killed { span.killed { "killed" } } @else { span.ok { "live" } }
    }
}
