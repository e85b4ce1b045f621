//! Text relattn keeps from a worker (error messages, stderr lines, hello fields) goes into
//! reports, summary.md and terminals: control characters there could move the cursor, recolour
//! or erase a terminal, or break a Markdown table, so they are shown as visible escapes.

/// Longest message kept from one answer (a line may be up to 1 MiB long; a report row need not).
pub const MAX_MESSAGE_CHARS: usize = 4000;

/// Unicode characters that reorder displayed text (bidirectional overrides and isolates): shown
/// escaped too, so a message reads as it is stored.
fn reorders(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(c: char, out: &mut String) {
    let n = c as u32;
    if n < 0x100 {
        out.push_str(&format!("\\x{n:02x}"));
    } else {
        out.push_str(&format!("\\u{{{n:x}}}"));
    }
}

fn clean(s: &str, keep_newlines: bool, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars));
    for (taken, c) in s.chars().enumerate() {
        if taken == max_chars {
            let rest = s.chars().count() - taken;
            out.push_str(&format!(" ... ({rest} more characters)"));
            break;
        }
        if (c.is_control() && !(keep_newlines && c == '\n')) || reorders(c) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// One line: every control character escaped, newlines included.
pub fn one_line(s: &str, max_chars: usize) -> String {
    clean(s, false, max_chars)
}

/// Several lines (a message, a stderr tail): newlines kept, every other control character
/// escaped.
pub fn lines(s: &str, max_chars: usize) -> String {
    clean(s, true, max_chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_escapes() {
        let raw = "\x1b[31mred\x1b[0m\r\tbell\x07 del\x7f c1\u{85} rtl\u{202e}x\nnext";
        assert_eq!(
            lines(raw, 100),
            "\\x1b[31mred\\x1b[0m\\x0d\\x09bell\\x07 del\\x7f c1\\x85 rtl\\u{202e}x\nnext"
        );
        assert!(one_line(raw, 100).ends_with("x\\x0anext"));
        assert_eq!(lines("plain ünïcode", 100), "plain ünïcode");
    }

    #[test]
    fn long_text_is_cut_and_says_so() {
        assert_eq!(one_line("abcdef", 4), "abcd ... (2 more characters)");
        assert_eq!(one_line("abcd", 4), "abcd");
    }
}
