//! The status page (`GET /` of the HTTP server): one self-contained HTML
//! page of a [`Scrape`].

use super::scrape::Scrape;

/// The page of `scrape`.
pub fn render(scrape: &Scrape) -> String {
    let mut out =
        String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>emq</title></head><body><ul>");
    for q in &scrape.queues {
        out.push_str(&format!("<li>{}</li>", escape(&q.name)));
    }
    out.push_str("</ul></body></html>");
    out
}

/// `text` with the HTML special characters escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
