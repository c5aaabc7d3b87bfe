//! Unit tests of `live`: a reading during a write is never applied (the host's publish and this read
//! together: `vgpu_host::live`'s tests).
use super::*;
use crate::fixtures::{provisioned, UUID};
use crate::layout;
use crate::region::Ledger;

fn ledger(d: &Path) -> Ledger {
    Ledger::open(&d.join(layout::relative_ledger_path(UUID).unwrap())).unwrap()
}

#[test]
fn a_reading_while_the_host_writes_is_never_applied() {
    let (d, _) = provisioned();
    let mounted = d.path().join(layout::MOUNTED_LIMITS_FILE_NAME);
    let led = ledger(d.path());
    led.set_limits_generation(3);
    assert!(matches!(
        read_stable(&mounted, || led.limits_generation()),
        Err(ReadError::Moving)
    ));
    // the generation moved during the read: not applied
    let calls = std::cell::Cell::new(0u64);
    let moving = || {
        calls.set(calls.get() + 1);
        calls.get() * 2
    };
    assert!(matches!(
        read_stable(&mounted, moving),
        Err(ReadError::Moving)
    ));
    // half a file (cut short) is not applied either
    std::fs::write(&mounted, b"{\"version\": 1, \"devi").unwrap();
    led.set_limits_generation(4);
    assert!(matches!(
        read_stable(&mounted, || led.limits_generation()),
        Err(ReadError::Invalid(_))
    ));
}
