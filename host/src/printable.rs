//! Text a tenant chose (pod and container names, paths from its image), made safe for a log line or a
//! terminal: every control character (C0, DEL, C1: newlines, carriage returns, the escape that starts a
//! terminal sequence) is written as Rust writes it in a string literal (`\n`, `\r`, `\u{1b}`), so one log
//! record stays one line and no name can forge another line or drive the operator's terminal. Everything
//! else, a backslash included, is written as is: the text stays readable, and a line is never split.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with its control characters escaped (borrowed when it has none).
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            // Writing to a String cannot fail.
            let _ = write!(out, "{}", c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// As [`printable`], but the one newline that ends `s` (a log record's end) is kept.
pub fn printable_line(s: &str) -> Cow<'_, str> {
    match s.strip_suffix('\n') {
        Some(body) if body.chars().any(char::is_control) => {
            Cow::Owned(format!("{}\n", printable(body)))
        }
        Some(_) => Cow::Borrowed(s),
        None => printable(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_escaped_the_rest_as_is() {
        assert!(matches!(printable("ml/trainer-0 \\ é"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\nkilled pid 1\r\x1b[2J\x07\u{9b}31m\tz"),
            "a\\nkilled pid 1\\r\\u{1b}[2J\\u{7}\\u{9b}31m\\tz"
        );
        assert_eq!(printable_line("x\x1b]0;t\x07\n"), "x\\u{1b}]0;t\\u{7}\n");
        assert_eq!(printable_line("a\nb\n"), "a\\nb\n");
        assert_eq!(printable_line("plain\n"), "plain\n");
        assert_eq!(printable_line("no end\r"), "no end\\r");
    }
}
