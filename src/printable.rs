//! Text from records or from other servers made safe for a terminal and for line-oriented output: control
//! characters escaped, so a value cannot move the cursor, recolour the terminal (ECMA-48 escape sequences) or
//! forge a line of tab-separated output.
//!
//! The escapes are Rust's: `\n`, `\r`, `\t`, `\\` (a backslash, so the escaped text reads back unambiguously),
//! and `\u{XX}` for every other control character (C0, DEL, C1: Unicode general category Cc). Everything else —
//! letters of any script, emoji, quotes — is kept as is.

use std::borrow::Cow;

/// `text` with control characters and backslashes escaped (see the module documentation); borrowed when
/// nothing needs escaping.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` for a terminal: control characters other than a newline and a tab escaped as `\u{XX}` (an escape
/// sequence from a record or a server cannot act on the terminal); backslashes kept. For messages of several
/// lines (errors), not for line-oriented output (use [`escape_controls`]).
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(bad) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match bad(c) {
                true => format!("\\u{{{:x}}}", u32::from(c)),
                false => c.to_string(),
            })
            .collect(),
    )
}

/// [`escape_controls`] of at most the first `max` characters of `text`, with `…` when cut.
pub fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", escape_controls(&text[..end])),
        None => escape_controls(text).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_text_kept() {
        assert_eq!(escape_controls("plain é ✓ \"q\""), "plain é ✓ \"q\"");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("a\nb\tc\rd\\e\u{1b}[31mf\u{7f}\u{9b}"),
            "a\\nb\\tc\\rd\\\\e\\u{1b}[31mf\\u{7f}\\u{9b}"
        );
        assert_eq!(bounded("abcdef", 3), "abc…");
        assert_eq!(
            terminal_safe("a\nb\\c\u{1b}]0;x\u{7}"),
            "a\nb\\c\\u{1b}]0;x\\u{7}"
        );
        assert_eq!(bounded("a\nb", 3), "a\\nb");
    }
}
