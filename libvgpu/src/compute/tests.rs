//! Unit tests of the compute share's pacing arithmetic (`compute`).

use super::*;

#[test]
fn naps_last_as_long_as_earning_the_deficit_takes() {
    assert_eq!(nap_for(300_000, 300_000), 1_000_000);
    assert_eq!(nap_for(0, 300_000), MIN_NAP_NS);
    assert_eq!(nap_for(u64::MAX, 1), MAX_NAP_NS);
    assert_eq!(nap_for(10_000_000, PPM), MAX_NAP_NS);
}

#[test]
fn the_estimate_follows_the_measurements() {
    let mut e = FIRST_ESTIMATE_NS;
    for _ in 0..100 {
        e = averaged(e, 8_000);
    }
    assert!((7_000..=9_000).contains(&e), "{e}");
    assert_eq!(averaged(800, 800), 800);
}
