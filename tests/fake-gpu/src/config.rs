//! Configuration of the fake devices, read from the environment.

use std::env;

/// Format version of the state file (part of its name, which this module makes).
pub const VERSION: u32 = 4;

/// Most devices the state file can describe.
pub const MAX_DEVICES: usize = 16;
/// Memory of a device when `FAKE_CUDA_DEVICES` gives only a count.
pub const DEFAULT_DEVICE_BYTES: u64 = 16 << 30;

/// The fake machine: physical devices (NVML order) and the state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Memory of each physical device, in bytes.
    pub totals: Vec<u64>,
    /// Folder of the shared state file.
    pub state_dir: String,
}

impl Config {
    /// Reads `FAKE_CUDA_DEVICES` and `FAKE_CUDA_STATE_DIR`.
    pub fn from_env() -> Result<Config, String> {
        let devices = env::var("FAKE_CUDA_DEVICES").unwrap_or_default();
        let totals =
            parse_devices(&devices).map_err(|e| format!("FAKE_CUDA_DEVICES={devices:?}: {e}"))?;
        let state_dir = env::var("FAKE_CUDA_STATE_DIR")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/tmp/fake-cuda".to_string());
        Ok(Config { totals, state_dir })
    }

    /// Name of the state file: processes configured with other device sizes use another file.
    pub fn state_file(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a over the device sizes
        for t in &self.totals {
            for b in t.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
        format!("{}/state-v{}-{:016x}", self.state_dir, VERSION, h)
    }
}

/// Parses `FAKE_CUDA_DEVICES`: empty = one 16 GiB device; `N` (1..=16) = N devices of 16 GiB;
/// `NxSIZE` = N devices of SIZE; otherwise a comma-separated list of sizes (`16Gi,8Gi`).
pub fn parse_devices(s: &str) -> Result<Vec<u64>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(vec![DEFAULT_DEVICE_BYTES]);
    }
    let list = if let Some((n, size)) = s.split_once('x') {
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("bad count in {s:?}"))?;
        vec![parse_size(size)?; n]
    } else if !s.contains(',') && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        let n: usize = s.parse().map_err(|_| format!("bad count {s:?}"))?;
        vec![DEFAULT_DEVICE_BYTES; n]
    } else {
        s.split(',')
            .map(parse_size)
            .collect::<Result<Vec<_>, _>>()?
    };
    if list.is_empty() || list.len() > MAX_DEVICES {
        return Err(format!("between 1 and {MAX_DEVICES} devices, got {s:?}"));
    }
    if list.iter().any(|&b| b == 0 || b >= 1 << 47) {
        return Err(format!("a device size is zero or too large in {s:?}"));
    }
    Ok(list)
}

/// Parses a size: bytes, or a number with `k`/`m`/`g`/`t` (binary, also `Ki`/`KiB`/`Mi`/...).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(format!(
            "bad size {s:?}: expected a number with an optional k/m/g/t suffix"
        ));
    }
    let n: u64 = t[..digits].parse().map_err(|_| format!("bad size {s:?}"))?;
    let shift = match t[digits..].to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" | "kb" => 10,
        "m" | "mi" | "mib" | "mb" => 20,
        "g" | "gi" | "gib" | "gb" => 30,
        "t" | "ti" | "tib" | "tb" => 40,
        _ => return Err(format!("bad size {s:?}: unknown unit")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("bad size {s:?}: too large"))
}

/// Reads a size from the environment, `default` when unset or empty.
pub fn env_size(name: &str, default: u64) -> u64 {
    match env::var(name) {
        Ok(v) if !v.trim().is_empty() => match parse_size(&v) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("fake-cuda: {name}: {e}; using {default}");
                default
            }
        },
        _ => default,
    }
}

/// How recently a process must have had work queued to count as active on a device for the paging model
/// (`FAKE_CUDA_PAGING_WINDOW_MS`, default 100 ms), in nanoseconds. Both fakes read it: the CUDA one to
/// slow work down, the NVML one to count the pages active processes pulled in.
pub fn paging_window_ns() -> u64 {
    env::var("FAKE_CUDA_PAGING_WINDOW_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(100)
        .saturating_mul(1_000_000)
}

/// The 16 UUID bytes of physical device `index`: `GPU-fa4ec0de-0000-4000-8000-00000000000N`.
pub fn uuid_bytes(index: usize) -> [u8; 16] {
    let mut u = [
        0xfa, 0x4e, 0xc0, 0xde, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0,
    ];
    u[10..16].copy_from_slice(&(index as u64).to_be_bytes()[2..8]);
    u
}

/// The UUID as NVML prints it.
pub fn uuid_string(index: usize) -> String {
    let u = uuid_bytes(index);
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Physical devices in MIG mode (`FAKE_CUDA_MIG`: a comma-separated list of physical indices). Each has
/// one MIG instance, which CUDA reports instead of the GPU (its UUID is [`mig_uuid_bytes`]).
pub fn mig_devices() -> Vec<usize> {
    env::var("FAKE_CUDA_MIG")
        .unwrap_or_default()
        .split(',')
        .filter_map(|e| e.trim().parse().ok())
        .collect()
}

/// The 16 UUID bytes of the MIG instance of physical device `index`:
/// `MIG-fa4ec0de-4d49-4000-8000-00000000000N` as NVML prints it.
pub fn mig_uuid_bytes(index: usize) -> [u8; 16] {
    let mut u = uuid_bytes(index);
    u[4] = 0x4d;
    u[5] = 0x49;
    u
}

/// The MIG instance's UUID as NVML prints it.
pub fn mig_uuid_string(index: usize) -> String {
    format!("MIG-{}", &uuid_string_of(&mig_uuid_bytes(index))[4..])
}

fn uuid_string_of(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// PCI bus id of physical device `index`, as NVML's `busId` and `cuDeviceGetPCIBusId` print it.
pub fn pci_bus_id(index: usize) -> String {
    format!("00000000:{:02X}:00.0", 0x18 + index * 0x10)
}

/// Maps CUDA ordinals to physical indices the way the driver reads `CUDA_VISIBLE_DEVICES`:
/// unset = all in order; entries are indices or (prefixes of) `GPU-` UUIDs; the list ends at the
/// first entry that is invalid, unknown or repeated.
pub fn visible_devices(var: Option<&str>, ndev: usize) -> Vec<usize> {
    let Some(var) = var else {
        return (0..ndev).collect();
    };
    let mut out: Vec<usize> = Vec::new();
    for entry in var.split(',') {
        let e = entry.trim();
        let found = if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            e.parse::<usize>().ok().filter(|&i| i < ndev)
        } else if e.len() > 4 && e[..4].eq_ignore_ascii_case("GPU-") {
            let want = e.to_ascii_lowercase();
            let hits: Vec<usize> = (0..ndev)
                .filter(|&i| uuid_string(i).to_ascii_lowercase().starts_with(&want))
                .collect();
            if hits.len() == 1 {
                Some(hits[0])
            } else {
                None
            }
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_forms() {
        assert_eq!(parse_devices("").unwrap(), vec![16 << 30]);
        assert_eq!(parse_devices("2").unwrap(), vec![16 << 30, 16 << 30]);
        assert_eq!(parse_devices("16Gi,8Gi").unwrap(), vec![16 << 30, 8 << 30]);
        assert_eq!(parse_devices("3x1g").unwrap(), vec![1 << 30; 3]);
        assert_eq!(parse_devices("4096").unwrap(), vec![4096]);
        assert!(parse_devices("0").is_err());
        assert!(parse_devices("17").is_err());
        assert!(parse_devices("1Gi,x").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256Mi").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("12").unwrap(), 12);
        assert!(parse_size("1Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn uuids() {
        assert_eq!(uuid_string(1), "GPU-fa4ec0de-0000-4000-8000-000000000001");
        assert_eq!(uuid_bytes(3)[15], 3);
        assert_eq!(
            mig_uuid_string(1),
            "MIG-fa4ec0de-4d49-4000-8000-000000000001"
        );
    }

    #[test]
    fn visible() {
        assert_eq!(visible_devices(None, 3), vec![0, 1, 2]);
        assert_eq!(visible_devices(Some("2,0"), 3), vec![2, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), 3), vec![1]);
        assert_eq!(visible_devices(Some(""), 3), Vec::<usize>::new());
        assert_eq!(visible_devices(Some("0,0"), 3), vec![0]);
        assert_eq!(
            visible_devices(Some("GPU-fa4ec0de-0000-4000-8000-000000000002,0"), 3),
            vec![2, 0]
        );
        // A prefix shared by all devices is ambiguous: the list ends there.
        assert_eq!(
            visible_devices(Some("GPU-fa4ec0de"), 3),
            Vec::<usize>::new()
        );
    }
}
