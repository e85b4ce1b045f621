//! Text from rows (worker messages, trial names, environment fields) made safe to render: a
//! row may hold any characters, and a control character printed raw (ESC sequences, a carriage
//! return, a bell) rewrites a terminal that shows `report show`, or the CI page that shows
//! summary.md or junit.xml. results.jsonl keeps the text as it was (JSON escapes it there).

use std::borrow::Cow;

/// Whether `c` must not reach a terminal or a page raw: the C0 and C1 controls and DEL
/// (newline and tab excepted), and the bidirectional overrides and isolates, which reorder
/// the text shown around them.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` with each such character written as a visible escape, `\u{1b}` for ESC. A carriage
/// return before a newline (a Windows line end) is dropped instead.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' && chars.peek() == Some(&'\n') {
            continue;
        }
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`visible`] for text that must stay on one line: newlines too become spaces.
pub fn one_line(text: &str) -> String {
    visible(text).replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_visible_and_plain_text_stays() {
        assert!(matches!(
            visible("plain, ünïcode\tand\nlines"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            visible("a\x1b[2J\x1b]0;t\x07b\rc\r\nd\u{7f}\u{9b}e\u{202e}f"),
            "a\\u{1b}[2J\\u{1b}]0;t\\u{7}b\\u{d}c\nd\\u{7f}\\u{9b}e\\u{202e}f"
        );
        assert_eq!(one_line("x\ny\r\nz\u{0}"), "x y z\\u{0}");
        // Escaping twice changes nothing more: the escapes are printable.
        let once = visible("\x1b\r");
        assert_eq!(visible(&once), once);
    }
}
