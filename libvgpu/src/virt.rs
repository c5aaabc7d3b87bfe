//! What a process under a quota is told about memory: the quota is the GPU's size. Pure arithmetic and
//! size estimates; which quota applies and when to ask is `hooks`'.
//! All arithmetic saturates: usage above the limit (a forced charge, a racing refund) never underflows.

/// (free, total) for cuMemGetInfo: total = min(limit, physical total), free = min(limit − used, physical free).
pub fn mem_info(limit: u64, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64) {
    let total = limit.min(phys_total);
    let free = limit.saturating_sub(used).min(phys_free).min(total);
    (free, total)
}

/// (free, total) in oversubscribe mode: the quota is the size even past the GPU's (managed memory pages),
/// and free keeps `reserve` back so the driver has room to page.
pub fn oversubscribed_mem_info(limit: u64, used: u64, reserve: u64) -> (u64, u64) {
    (limit.saturating_sub(used).saturating_sub(reserve), limit)
}

/// cuDeviceTotalMem: the quota, never more than the GPU has.
pub fn total_mem(limit: u64, phys_total: u64) -> u64 {
    limit.min(phys_total)
}

/// (total, free, used) for NVML: used is the container's usage clamped to the quota.
pub fn nvml_info(limit: u64, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64, u64) {
    let (free, total) = mem_info(limit, used, phys_free, phys_total);
    let used = used.min(total);
    (total, free, used)
}

/// Bytes per element of a CUDA array format (CUarray_format); unknown or packed formats are estimated at 4
/// per channel, and the estimate is trued up with cuArrayGetMemoryRequirements after creation.
pub fn array_format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 4,
    }
}

/// Estimated bytes of an array of `levels` mipmap levels (1 for a plain array).
pub fn array_estimate(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> u64 {
    let elem = array_format_bytes(format).saturating_mul(channels.max(1) as u64);
    let (mut w, mut h, mut d) = (width.max(1), height.max(1), depth.max(1));
    let mut sum: u64 = 0;
    for _ in 0..levels.max(1) {
        sum = sum.saturating_add(w.saturating_mul(h).saturating_mul(d).saturating_mul(elem));
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        d = (d / 2).max(1);
    }
    sum
}

/// Pitch allocations: rows are padded to the driver's pitch alignment (512 bytes on current GPUs).
pub const PITCH_ALIGN_ESTIMATE: u64 = 512;

pub fn pitch_estimate(width: u64, height: u64) -> u64 {
    width
        .div_ceil(PITCH_ALIGN_ESTIMATE)
        .saturating_mul(PITCH_ALIGN_ESTIMATE)
        .saturating_mul(height.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_is_the_total() {
        assert_eq!(mem_info(1 << 30, 0, 80 << 30, 80 << 30), (1 << 30, 1 << 30));
        assert_eq!(
            mem_info(1 << 30, 256 << 20, 80 << 30, 80 << 30),
            (768 << 20, 1 << 30)
        );
    }

    #[test]
    fn physical_free_caps_free() {
        assert_eq!(mem_info(8 << 30, 0, 2 << 30, 80 << 30), (2 << 30, 8 << 30));
    }

    #[test]
    fn limit_above_physical_is_physical() {
        assert_eq!(
            mem_info(200 << 30, 0, 70 << 30, 80 << 30),
            (70 << 30, 80 << 30)
        );
        assert_eq!(total_mem(200 << 30, 80 << 30), 80 << 30);
    }

    #[test]
    fn never_underflows() {
        assert_eq!(mem_info(100, 250, 1000, 1000), (0, 100));
        assert_eq!(nvml_info(100, 250, 1000, 1000), (100, 0, 100));
        assert_eq!(nvml_info(u64::MAX, u64::MAX, 0, 0), (0, 0, 0));
    }

    proptest::proptest! {
        #[test]
        fn view_is_consistent(limit in 1u64.., used: u64, phys_total: u64, free_frac in 0u64..=100) {
            let phys_free = phys_total / 100 * free_frac;
            let (free, total) = mem_info(limit, used, phys_free, phys_total);
            proptest::prop_assert!(free <= total);
            proptest::prop_assert!(total <= limit && total <= phys_total);
            proptest::prop_assert!(free <= phys_free);
            proptest::prop_assert!(free <= limit.saturating_sub(used));
            let (t, f, u) = nvml_info(limit, used, phys_free, phys_total);
            proptest::prop_assert_eq!((t, f), (total, free));
            proptest::prop_assert!(u <= t);
        }
    }

    #[test]
    fn array_estimates() {
        assert_eq!(array_estimate(100, 0, 0, 0x20, 4, 1), 1600);
        assert_eq!(array_estimate(4, 4, 0, 0x01, 1, 3), 16 + 4 + 1);
        assert_eq!(pitch_estimate(100, 10), 5120);
        assert_eq!(pitch_estimate(512, 0), 512);
    }
}
