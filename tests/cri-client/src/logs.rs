//! The CRI log format the kubelet reads: one record a line, `<RFC 3339 time> <stdout|stderr> <P|F> <text>`,
//! where `P` is a partial line that the next record continues and `F` ends it.

use anyhow::{bail, Result};

/// The text the container wrote, both streams in the order logged, lines rejoined.
pub fn messages(log: &str) -> Result<String> {
    let mut out = String::new();
    for (n, record) in log.lines().enumerate() {
        let mut parts = record.splitn(4, ' ');
        let (Some(_time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("log line {}: not a CRI log record: {record:?}", n + 1);
        };
        if !matches!(stream, "stdout" | "stderr") || !matches!(tag, "P" | "F") {
            bail!("log line {}: not a CRI log record: {record:?}", n + 1);
        }
        out.push_str(parts.next().unwrap_or(""));
        if tag == "F" {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_become_the_containers_lines() {
        let log = "2026-01-01T00:00:00.1Z stdout F op=info total=1\n\
                   2026-01-01T00:00:00.2Z stderr P half \n\
                   2026-01-01T00:00:00.3Z stderr F and rest\n\
                   2026-01-01T00:00:00.4Z stdout F \n";
        assert_eq!(messages(log).unwrap(), "op=info total=1\nhalf and rest\n\n");
        assert_eq!(messages("").unwrap(), "");
    }

    #[test]
    fn a_line_that_is_no_record_is_named() {
        let e = messages("t stdout F ok\ngarbage\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("log line 2: not a CRI log record"), "{e}");
        assert!(messages("t stdin F x\n").is_err());
    }
}
