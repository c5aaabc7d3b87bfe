//! A compute share's limit and request as the annotations (`vgpu.io/compute-limit*`,
//! `vgpu.io/compute-request*`) and `vgpuctl update --compute-limit/--compute-request` write them: a whole
//! percent 1..=100, `0` refused (leave it out for none). Not here: the environment's grammar, where `0` is
//! no limit (`vgpu_ledger::envcompute`, which the library reads too), the pacing window's
//! (`vgpu_ledger::envcompute::parse_window`, shared with the library).

/// A share as the OCI annotations write it: a whole percent 1..=100 (100: the whole GPU, no share);
/// `0`, empty or anything else is an error of one line naming `source` (a share of nothing is a mistake:
/// leave the annotation out for none). Returns the share, None for 100.
pub fn parse_annotation_percent(value: &str, source: &str) -> Result<Option<u32>, PercentError> {
    match value.trim().parse::<u32>() {
        Ok(100) => Ok(None),
        Ok(p) if (1..100).contains(&p) => Ok(Some(p)),
        _ => Err(PercentError {
            setting: source.to_string(),
            value: value.to_string(),
            what: "limit",
        }),
    }
}

/// A request (the floor) as the annotations, vgpuctl and the environment write it: a whole percent
/// 1..=100 (100: the whole GPU whenever it is busy); `0`, empty or anything else is an error of one line
/// naming `source`.
pub fn parse_request_percent(value: &str, source: &str) -> Result<u32, PercentError> {
    match value.trim().parse::<u32>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => Err(PercentError {
            setting: source.to_string(),
            value: value.to_string(),
            what: "request",
        }),
    }
}

/// A share's limit or request that is no whole percent 1..=100. `Display` is one line naming the
/// setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={value:?}: a compute {what} is a whole percent of the GPU's time, 1 to 100")]
pub struct PercentError {
    /// Where the value was read ("annotation vgpu.io/compute-limit").
    pub setting: String,
    pub value: String,
    /// `limit` or `request`.
    pub what: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(parse_annotation_percent(" 30 ", "k"), Ok(Some(30)));
        assert_eq!(parse_annotation_percent("1", "k"), Ok(Some(1)));
        assert_eq!(parse_annotation_percent("100", "k"), Ok(None));
        for v in ["0", "", "101", "30%", "-5", "0.5", "x"] {
            let e = parse_annotation_percent(v, "annotation vgpu.io/compute-limit").unwrap_err();
            assert_eq!(e.value, v);
            assert_eq!(e.setting, "annotation vgpu.io/compute-limit");
        }
        assert_eq!(
            parse_annotation_percent("0", "annotation vgpu.io/compute-limit")
                .unwrap_err()
                .to_string(),
            "annotation vgpu.io/compute-limit=\"0\": a compute limit is a whole percent of the GPU's time, 1 to 100"
        );
    }

    #[test]
    fn requests() {
        assert_eq!(parse_request_percent(" 30 ", "k"), Ok(30));
        assert_eq!(parse_request_percent("100", "k"), Ok(100));
        for v in ["0", "", "101", "30%", "-5", "0.5", "x"] {
            let e = parse_request_percent(v, "annotation vgpu.io/compute-request").unwrap_err();
            assert_eq!((e.value.as_str(), e.what), (v, "request"));
        }
        assert_eq!(
            parse_request_percent("0", "annotation vgpu.io/compute-request")
                .unwrap_err()
                .to_string(),
            "annotation vgpu.io/compute-request=\"0\": a compute request is a whole percent of the GPU's time, 1 to 100"
        );
    }
}
