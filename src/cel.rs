//! Compiling and running CEL expressions without letting the `cel-interpreter` crate's panics reach the user.
//!
//! `cel-parser` 0.10 (over antlr4rust) panics on some malformed input instead of returning a parse error — a
//! trailing operator (`amount >`), an unterminated string, a stray `)`: its tree visitor reaches an error node
//! and hits `unreachable!()` ("internal error: entered unreachable code"). [`quietly`] catches any panic of the
//! crate (`std::panic::catch_unwind`) with the panic hook silenced for that call on that thread, so no panic
//! text or backtrace is printed; [`compile`] then says where the expression fails — the parser's own position
//! when it returns errors, else the position [`locate`] finds by scanning the expression (strings and escapes,
//! brackets, a missing operand).

use std::cell::Cell;
use std::sync::Once;

use cel_interpreter::Program;

thread_local! {
    /// Set while [`quietly`] runs a guarded call on this thread: the panic hook then prints nothing.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

static HOOK: Once = Once::new();

/// Installs (once per process) a panic hook that stays silent for panics raised inside [`quietly`] on the
/// same thread and defers to the previous hook (Rust's default: message, and the backtrace under
/// `RUST_BACKTRACE`) for every other panic.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f` (a call into the CEL crate); a panic inside it is caught and returned as `Err` with its message,
/// and nothing is printed.
///
/// # Errors
/// The panic's message when `f` panicked.
pub fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string())
    })
}

/// Compiles `expr`. The error names the position in the expression (line and column, 1-based) and what is
/// wrong there; it never carries panic text.
///
/// # Errors
/// A message `` `EXPR` does not compile: at line L, column C: … `` (or without position when none is known).
pub fn compile(expr: &str) -> Result<Program, String> {
    match quietly(|| Program::compile(expr)) {
        Ok(Ok(program)) => Ok(program),
        Ok(Err(errors)) => {
            let what = errors
                .errors
                .iter()
                .map(|e| at(e.pos.0.max(1).unsigned_abs(), e.pos.1.max(1).unsigned_abs(), &e.msg))
                .collect::<Vec<_>>()
                .join("; ");
            Err(format!("`{expr}` does not compile: {what}"))
        }
        Err(_panic) => Err(match locate(expr) {
            Some((line, col, what)) => format!("`{expr}` does not compile: {}", at(line, col, &what)),
            None => format!(
                "`{expr}` does not compile (the CEL parser gave no position; check operators, brackets and quotes)"
            ),
        }),
    }
}

fn at(line: usize, col: usize, what: &str) -> String {
    let what = what.trim_start_matches("Syntax error: ");
    if line == 1 {
        format!("at column {col}: {what}")
    } else {
        format!("at line {line}, column {col}: {what}")
    }
}

/// Binary operators, longest first (CEL spec, "Syntax").
const BINARY: [&str; 15] = [
    "&&", "||", "==", "!=", "<=", ">=", "in", "<", ">", "+", "*", "/", "%", "?", ":",
];

#[derive(Clone, Copy, PartialEq)]
enum Last {
    Nothing,
    Operand,
    Operator,
    Open,
}

/// Finds where a malformed CEL expression fails by scanning it: an invalid escape or a string never closed,
/// a closing bracket without its opening one (or the other kind), an opening bracket never closed, an
/// operator without its left or right operand. Returns `(line, column, what)`, 1-based.
pub fn locate(expr: &str) -> Option<(usize, usize, String)> {
    let chars: Vec<char> = expr.chars().collect();
    let pos = |i: usize| {
        let before = &chars[..i];
        let line = before.iter().filter(|c| **c == '\n').count() + 1;
        let col = i - before.iter().rposition(|c| *c == '\n').map_or(0, |p| p + 1) + 1;
        (line, col)
    };
    let found = |i: usize, what: String| {
        let (l, c) = pos(i);
        Some((l, c, what))
    };
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut last = (Last::Nothing, 0usize, String::new());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if let Some((end, raw)) = string_start(&chars, i) {
            match scan_string(&chars, i, end, raw) {
                Ok(next) => {
                    last = (Last::Operand, i, String::new());
                    i = next;
                    continue;
                }
                Err((at, what)) => return found(at, what),
            }
        }
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            last = if word == "in" {
                match operator(last, start, word) {
                    Ok(l) => l,
                    Err((at, what)) => return found(at, what),
                }
            } else {
                (Last::Operand, start, word)
            };
            continue;
        }
        match c {
            '(' | '[' | '{' => {
                stack.push((c, i));
                last = (Last::Open, i, c.to_string());
            }
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                match stack.pop() {
                    Some((o, _)) if o == open => {}
                    Some((o, at)) => {
                        let (l, col) = pos(at);
                        return found(
                            i,
                            format!("`{c}` closes the `{o}` of line {l}, column {col}"),
                        );
                    }
                    None => return found(i, format!("`{c}` has no opening `{open}`")),
                }
                if last.0 == Last::Operator {
                    return found(last.1, format!("`{}` has no right operand", last.2));
                }
                last = (Last::Operand, i, c.to_string());
            }
            ',' => {
                if matches!(last.0, Last::Operator | Last::Open | Last::Nothing) {
                    return found(i, "`,` without a value before it".into());
                }
                last = (Last::Open, i, ",".into());
            }
            '!' | '-' if chars.get(i + 1) != Some(&'=') => {
                // Unary (or binary minus after an operand): needs an operand after it either way.
                last = (Last::Operator, i, c.to_string());
            }
            '.' => last = (Last::Operator, i, ".".into()),
            _ => {
                let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
                let Some(op) = BINARY.iter().find(|op| rest.starts_with(**op)) else {
                    return found(i, format!("`{c}` is not a CEL token"));
                };
                last = match operator(last, i, op.to_string()) {
                    Ok(l) => l,
                    Err((at, what)) => return found(at, what),
                };
                i += op.chars().count();
                continue;
            }
        }
        i += 1;
    }
    if last.0 == Last::Operator {
        return found(
            last.1,
            format!(
                "the expression ends after `{}`: an operand is missing",
                last.2
            ),
        );
    }
    if let Some((o, at)) = stack.pop() {
        return found(at, format!("`{o}` is never closed"));
    }
    if last.0 == Last::Nothing {
        return found(1.min(chars.len()), "the expression is empty".into());
    }
    None
}

/// A binary operator `op` at `i` after `last`: the new state, or the position and reason when it has no left
/// operand.
fn operator(
    last: (Last, usize, String),
    i: usize,
    op: String,
) -> Result<(Last, usize, String), (usize, String)> {
    if last.0 == Last::Operand {
        Ok((Last::Operator, i, op))
    } else {
        Err((i, format!("`{op}` has no left operand")))
    }
}

/// Whether a string literal starts at `i`: its quote length (1 or 3) and whether it is raw (`r"…"`).
fn string_start(chars: &[char], i: usize) -> Option<(usize, bool)> {
    let mut j = i;
    let mut raw = false;
    while j < chars.len() && j < i + 2 && matches!(chars[j], 'r' | 'R' | 'b' | 'B') {
        raw |= matches!(chars[j], 'r' | 'R');
        j += 1;
    }
    let q = *chars.get(j)?;
    if q != '"' && q != '\'' {
        return None;
    }
    let triple = chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q);
    Some((j + if triple { 3 } else { 1 } - i, raw))
}

/// Scans the string literal starting at `i` (prefix and opening quotes `open` chars long): the index after
/// it, or the position and reason it is malformed (an escape CEL does not define, never closed).
fn scan_string(chars: &[char], i: usize, open: usize, raw: bool) -> Result<usize, (usize, String)> {
    let q = chars[i + open - 1];
    let triple = open >= 3 && chars[i + open - 3..i + open].iter().all(|c| *c == q);
    let mut j = i + open;
    while j < chars.len() {
        let c = chars[j];
        if c == '\\' && !raw {
            j = escape(chars, j)?;
            continue;
        }
        if c == '\n' && !triple {
            break;
        }
        if c == q && (!triple || (chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q))) {
            return Ok(j + if triple { 3 } else { 1 });
        }
        j += 1;
    }
    Err((i, "this string is never closed".into()))
}

/// Checks the escape sequence at `j` (a backslash): the index after it.
fn escape(chars: &[char], j: usize) -> Result<usize, (usize, String)> {
    let bad = |what: &str| Err((j, format!("invalid escape sequence: {what}")));
    let Some(&e) = chars.get(j + 1) else {
        return bad("a backslash at the end");
    };
    let hex = |n: usize| (1..=n).all(|k| chars.get(j + 1 + k).is_some_and(char::is_ascii_hexdigit));
    match e {
        'a' | 'b' | 'f' | 'n' | 'r' | 't' | 'v' | '\\' | '?' | '\'' | '"' | '`' => Ok(j + 2),
        'x' | 'X' if hex(2) => Ok(j + 4),
        'u' if hex(4) => Ok(j + 6),
        'U' if hex(8) => Ok(j + 10),
        '0'..='3' if (2..=3).all(|k| chars.get(j + k).is_some_and(|c| ('0'..='7').contains(c))) => {
            Ok(j + 4)
        }
        'x' | 'X' => bad("`\\x` needs 2 hex digits"),
        'u' => bad("`\\u` needs 4 hex digits"),
        'U' => bad("`\\U` needs 8 hex digits"),
        other => bad(&format!("`\\{other}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_expressions_give_a_position_and_no_panic_text() {
        for (expr, want) in [
            ("amount >", "at column 8: the expression ends after `>`"),
            (
                "amount > 5 &&",
                "at column 12: the expression ends after `&&`",
            ),
            ("1 +", "at column 3"),
            ("!", "at column 1"),
            ("\"abc", "at column 1: this string is never closed"),
            ("\"\\x\"", "at column 2: invalid escape sequence"),
            (")", "at column 1: `)` has no opening `(`"),
            ("amount in", "at column 8"),
            ("amount > > 3", "at column 10"),
            ("(amount", "at column 8"),
        ] {
            let e = compile(expr)
                .err()
                .unwrap_or_else(|| panic!("{expr} compiled"));
            assert!(e.contains(want), "{expr}: {e}");
            assert!(!e.contains("unreachable") && !e.contains("panicked"), "{e}");
        }
    }

    #[test]
    fn well_formed_expressions_compile() {
        for expr in [
            "amount > 5 && customer_id in ['a', 'b']",
            "r\"\\d\" == s",
            "'\\u00e9' == s",
        ] {
            assert!(compile(expr).is_ok(), "{expr}");
        }
        assert!(locate("a + (b * 2)").is_none());
    }
}
