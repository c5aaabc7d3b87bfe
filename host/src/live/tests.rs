//! Unit tests of `live`: the host's publish and the library's stable read (`vgpu_ledger::live`) agree, the
//! mounted inode is rewritten in place without the host's facts, a container made before live updates is
//! refused with nothing changed.
use super::*;
use std::os::unix::fs::MetadataExt;
use vgpu_ledger::fixtures::{provisioned, UUID};
use vgpu_ledger::live::read_stable;
use vgpu_ledger::Ledger;

fn ledger(d: &Path) -> Ledger {
    Ledger::open(&d.join(layout::relative_ledger_path(UUID).unwrap())).unwrap()
}

#[test]
fn a_published_update_is_read_whole_at_its_generation() {
    let (d, mut l) = provisioned();
    let mounted = d.path().join(layout::MOUNTED_LIMITS_FILE_NAME);
    let ino = std::fs::metadata(&mounted).unwrap().ino();
    let led = ledger(d.path());
    assert_eq!(led.limits_generation(), 0, "never updated");
    l.updates = 1;
    l.devices[0].settings.memory_limit = Some(2 << 30);
    l.devices[0].settings.compute_limit = Some(60);
    publish(d.path(), &l).unwrap();
    let first = led.limits_generation();
    assert!(
        first != 0 && first.is_multiple_of(2),
        "whole: even, not 0 ({first})"
    );
    let (g, read) = read_stable(&mounted, || led.limits_generation()).unwrap();
    assert_eq!(g, first);
    assert_eq!(read.devices[0].settings.memory_limit, Some(2 << 30));
    assert_eq!(read.devices[0].settings.compute_limit, Some(60));
    // in place: the inode the container's mount holds, not a new file
    assert_eq!(std::fs::metadata(&mounted).unwrap().ino(), ino);
    // the host's facts stay on the host
    assert_eq!(
        (read.init_pid, read.pid_ns, read.cgroup),
        (None, None, None)
    );
    // a shorter file leaves no tail of the longer one
    l.updates = 2;
    l.devices[0].settings.compute_limit = None;
    publish(d.path(), &l).unwrap();
    let (g, read) = read_stable(&mounted, || led.limits_generation()).unwrap();
    assert_eq!(read.devices[0].settings.compute_limit, None);
    // a fresh generation each update, so the tenant cannot write the next one ahead of it
    assert!(g != first && g.is_multiple_of(2), "{first} then {g}");
}

#[test]
fn the_generation_is_written_where_the_library_loads_it() {
    let (d, _) = provisioned();
    let path = d.path().join(layout::relative_ledger_path(UUID).unwrap());
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    write_generation(&f, 0x1234_5678_9abc_def0).unwrap();
    assert_eq!(ledger(d.path()).limits_generation(), 0x1234_5678_9abc_def0);
}

#[test]
fn a_container_made_before_live_updates_is_refused_naming_the_file() {
    let (d, mut l) = provisioned();
    assert!(check_publishable(d.path()).is_ok());
    std::fs::remove_file(d.path().join(layout::MOUNTED_LIMITS_FILE_NAME)).unwrap();
    let e = check_publishable(d.path()).unwrap_err();
    assert!(matches!(e, PublishError::NoMountedFile(_)), "{e}");
    l.updates = 1;
    let e = publish(d.path(), &l).unwrap_err();
    assert!(matches!(e, PublishError::NoMountedFile(_)), "{e}");
    assert_eq!(ledger(d.path()).limits_generation(), 0, "nothing changed");
    // a link where the file was is never written through
    std::os::unix::fs::symlink(
        "/etc/passwd",
        d.path().join(layout::MOUNTED_LIMITS_FILE_NAME),
    )
    .unwrap();
    assert!(matches!(
        publish(d.path(), &l).unwrap_err(),
        PublishError::Io { .. }
    ));
}
