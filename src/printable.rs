//! Text from peers made safe for a terminal or a log: [`printable`] escapes
//! control characters and the invisible characters that reorder or hide
//! text, [`printable_lines`] keeps line breaks and tabs. A leaf: the logger
//! and the binaries use it alike.

/// `text` with its control characters escaped (`\u{1b}`, `\r`, `\n`), and
/// the invisible characters that reorder text (`\u{202e}`), for a terminal:
/// text from peers (queue names, msgids, task data, error texts) can then
/// neither move the cursor, colour the screen, break a line nor show in
/// another order than it is.
pub fn printable(text: &str) -> String {
    if !text.chars().any(hidden) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Control characters, and the invisible format characters that reorder
/// or hide text on a terminal: bidirectional embeddings, overrides and
/// isolates (U+202A–U+202E, U+2066–U+2069, the "Trojan Source" kind),
/// marks (U+200E, U+200F, U+061C), zero-width and invisible format
/// characters (U+200B–U+200D, U+2060–U+2064, U+206A–U+206F, U+00AD,
/// U+180E, U+FEFF, U+FFF9–U+FFFB), line and paragraph separators (U+2028,
/// U+2029) and tag characters (U+E0001, U+E0020–U+E007F, "ASCII
/// smuggling").
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200B}'..='\u{200F}')
        || matches!(c, '\u{2060}'..='\u{2064}' | '\u{206A}'..='\u{206F}' | '\u{2028}' | '\u{2029}')
        || matches!(c, '\u{061C}' | '\u{00AD}' | '\u{180E}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
        || matches!(c, '\u{E0001}' | '\u{E0020}'..='\u{E007F}')
}

/// Like [`printable`], but line breaks and tabs are kept (multi-line
/// messages, such as a config file's error with its caret line).
pub fn printable_lines(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
            body.split('\t').map(printable).collect::<Vec<_>>().join("\t") + end
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_lines_kept_where_asked() {
        assert_eq!(printable("a\u{1b}[31mb\r\nc"), "a\\u{1b}[31mb\\r\\nc");
        assert_eq!(printable_lines("bad key\n  | x\t= \u{7}\r\n"), "bad key\n  | x\t= \\u{7}\\r\n");
    }

    #[test]
    fn invisible_reordering_characters_are_escaped_and_other_text_kept() {
        assert_eq!(printable("admin\u{202e}txt.exe"), "admin\\u{202e}txt.exe");
        assert_eq!(printable("a\u{2066}b\u{200b}c\u{feff}"), "a\\u{2066}b\\u{200b}c\\u{feff}");
        assert_eq!(printable("a\u{e0041}\u{2028}b\u{ad}"), "a\\u{e0041}\\u{2028}b\\u{ad}");
        assert_eq!(printable("café 東京 ✓"), "café 東京 ✓");
    }
}
