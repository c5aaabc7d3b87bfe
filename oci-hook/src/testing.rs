//! Helpers shared by the crate's unit tests.

/// Owned `(key, value)` pairs, as a spec's env and annotations are read.
pub fn kv(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
