//! Errors in files vgpuctl was asked to edit: one line, `path:line:column: message`.
use super::error::EngineError;
use std::path::Path;

/// An error in a file vgpuctl was asked to edit: `path:line:column: message`, one line.
pub fn parse_error(path: &Path, line: usize, column: usize, msg: &str) -> EngineError {
    let msg = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    EngineError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        msg,
    }
}

/// 1-based line and column of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

/// A TOML document, or the one-line error naming where it is broken.
pub fn parse_toml(path: &Path, text: &str) -> Result<toml_edit::DocumentMut, EngineError> {
    text.parse::<toml_edit::DocumentMut>().map_err(|e| {
        let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        parse_error(path, line, col, e.message())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn toml_errors_name_the_line() {
        let e = parse_toml(Path::new("/x.toml"), "a = 1\n[b\n").unwrap_err();
        assert!(matches!(e, EngineError::Syntax { line: 2, .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("/x.toml:2:") && !msg.contains('\n'),
            "{msg}"
        );
    }
}
