//! The doctor's lines: one per check, a verdict each, and the exit status they add up to. Not here: the
//! checks (`checks`, `engines`).

use std::io::Write;

/// What a line says about the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Nothing to do (something absent that is not needed: an engine not installed, vgpu's CDI spec).
    Info,
    Ok,
    /// Works, but not as the operator probably wants (exit status 2 when nothing fails).
    Warn,
    /// vgpu will not work as configured (exit status 1).
    Fail,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Info => "-",
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One line: its verdict, what was checked (`config`, `engine`, `nvml`, ...) and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub verdict: Verdict,
    pub check: &'static str,
    pub text: String,
}

/// Every line, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub lines: Vec<Line>,
}

/// The exit status with warnings and no failure.
pub const EXIT_WARN: i32 = 2;
/// The exit status with a failure.
pub const EXIT_FAIL: i32 = 1;

impl Report {
    pub fn push(&mut self, verdict: Verdict, check: &'static str, text: impl Into<String>) {
        // One line each, whatever an error's text holds.
        let text = text.into().split_whitespace().collect::<Vec<_>>().join(" ");
        self.lines.push(Line {
            verdict,
            check,
            text,
        });
    }

    /// The lines of `check`.
    pub fn of(&self, check: &str) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.check == check).collect()
    }

    pub fn worst(&self) -> Verdict {
        self.lines
            .iter()
            .map(|l| l.verdict)
            .max()
            .unwrap_or(Verdict::Ok)
    }

    /// 0: every line ok (or nothing to do); 1: a failure; 2: warnings only.
    pub fn exit_status(&self) -> i32 {
        match self.worst() {
            Verdict::Fail => EXIT_FAIL,
            Verdict::Warn => EXIT_WARN,
            _ => 0,
        }
    }

    /// `VERDICT  CHECK     text`, one line each, then the count.
    pub fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
        for l in &self.lines {
            writeln!(out, "{:<5} {:<9} {}", l.verdict.word(), l.check, l.text)?;
        }
        let count = |v| self.lines.iter().filter(|l| l.verdict == v).count();
        writeln!(
            out,
            "vgpuctl doctor: {} failed, {} warning{}",
            count(Verdict::Fail),
            count(Verdict::Warn),
            if count(Verdict::Warn) == 1 { "" } else { "s" }
        )
    }
}
