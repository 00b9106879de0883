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

/// A log writer (tracing-subscriber's `MakeWriter`) to stderr that writes each event as [`log_line`] makes it
/// — replaysafe's own lines and those of librdkafka and tokio-postgres, at every level: each event is written
/// once, when its writer is dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaskedStderr;

/// One event's text, written masked to stderr when dropped.
#[derive(Debug, Default)]
pub struct MaskedLine(Vec<u8>);

impl std::io::Write for MaskedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for MaskedLine {
    fn drop(&mut self) {
        let text = log_line(&String::from_utf8_lossy(&self.0));
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
    }
}

/// One formatted log event as written: the password of every URL masked ([`crate::endpoint::mask_urls`]), and
/// its carriage returns and inner newlines escaped (`\r`, `\n`), so a record's text cannot forge a log line (the
/// formatter escapes ESC, BEL and the C1 controls itself); one line, ending in a newline.
pub fn log_line(event: &str) -> String {
    let masked = crate::endpoint::mask_urls(event);
    let body = masked.strip_suffix('\n').unwrap_or(&masked);
    let mut out = body.replace('\r', "\\r").replace('\n', "\\n");
    out.push('\n');
    out
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for MaskedStderr {
    type Writer = MaskedLine;

    fn make_writer(&'a self) -> MaskedLine {
        MaskedLine::default()
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
