//! Label values as the exposition must carry them. `prometheus-client` writes a label value as given, so a
//! pod name holding `"} 0\n# EOF\n…` would end the scrape early (Prometheus then drops the whole target)
//! or forge series for another container. Every value goes through [`Value`], whose encoding escapes what
//! OpenMetrics requires (`\` → `\\`, `"` → `\"`, newline → `\n`); all else is allowed as written.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::fmt::Write;

/// A label value, escaped when encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Value(pub String);

impl<T: Into<String>> From<T> for Value {
    fn from(s: T) -> Value {
        Value(s.into())
    }
}

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let mut rest = self.0.as_str();
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..i])?;
            encoder.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        encoder.write_str(rest)
    }
}

/// HAMi's `zone` label: its vGPU monitor and scheduler register every series under `zone="vGPU"`.
pub const HAMI_ZONE: &str = "vGPU";

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, Value)>;
