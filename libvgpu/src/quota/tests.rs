//! Unit tests of `quota`: forced overruns told once, the environment mode's files, live updates followed.
#[test]
fn a_forced_overrun_is_told_once_at_the_crossing() {
    assert!(crossed(1100, 200, 1000), "900 -> 1100 crosses");
    assert!(!crossed(1200, 100, 1000), "already past: said before");
    assert!(!crossed(1000, 100, 1000), "at the quota is within it");
    assert!(crossed(5000, 5000, 1000));
}

use super::*;
use vgpu_host::limits_file::WriteLimits;

const UUID: &str = "GPU-00000000-0000-0000-0000-0000000000aa";
const ENV: LedgerMode<'static> = LedgerMode::Env { dir: None };

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn the_environment_mode_makes_ledgers_for_this_user_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    drop(DeviceQuota::open_unattached(0, UUID, 100, &path, ENV).unwrap());
    assert_eq!(mode(&path), 0o600);
    // One another user can write could be truncated under this process (SIGBUS): not used.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = DeviceQuota::open_unattached(0, UUID, 100, &path, ENV)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("other users can write") && e.contains("/l"),
        "{e}"
    );
    // A limits file's ledgers are for every user of the container.
    let listed = dir.path().join("listed");
    drop(DeviceQuota::open_unattached(0, UUID, 100, &listed, LedgerMode::File).unwrap());
    assert_eq!(mode(&listed), 0o666);
}

#[test]
fn a_containers_ledger_is_never_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("GPU-x.ledger");
    let open = || {
        DeviceQuota::open_unattached(0, UUID, 100, &path, LedgerMode::Provisioned)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let e = open().unwrap_err();
    assert!(e.contains("GPU-x.ledger") && e.contains("missing"), "{e}");
    assert!(!path.exists(), "not created");
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let e = open().unwrap_err();
    assert!(
        e.contains("GPU-x.ledger") && e.contains("not a regular file"),
        "{e}"
    );
    std::fs::remove_file(&path).unwrap();
    drop(Ledger::open_or_create(&path, UUID, 100).unwrap());
    open().unwrap();
}

#[test]
fn the_slot_is_attached_on_the_first_charge() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeviceQuota::open_unattached(0, UUID, 100, &dir.path().join("l"), ENV).unwrap();
    assert!(!q.attached(), "opening the quota takes no slot");
    q.refund(Kind::Data, 5);
    assert!(
        !q.attached(),
        "a refund without a slot is nothing to give back"
    );
    assert!(q.charge(Kind::Data, 60));
    assert!(q.attached());
    assert!(!q.charge(Kind::Data, 60), "the limit holds");
    let host = vgpu_host::hostfile::read_ledger(&dir.path().join("l")).unwrap();
    assert_eq!(host.refusals, 1, "the refusal is counted for the monitor");
    q.refund(Kind::Data, 60);
    assert_eq!(q.used(), 0);
    q.release_slot();
    assert!(!q.attached());
}

#[test]
fn the_environment_mode_refuses_a_symlinked_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    drop(DeviceQuota::open_unattached(0, UUID, 100, &real, ENV).unwrap());
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = DeviceQuota::open_unattached(0, UUID, 100, &link, ENV)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("symbolic link") && e.contains("link"), "{e}");
    assert!(DeviceQuota::open_unattached(0, UUID, 100, &link, LedgerMode::File).is_ok());
}

#[test]
fn the_per_user_folder_is_made_before_its_ledgers_and_refused_when_not_private() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("vgpu-me");
    let env = LedgerMode::Env { dir: Some(&dir) };
    let ledger = dir.join("cudevshr.cache.x");
    drop(DeviceQuota::open_unattached(0, UUID, 100, &ledger, env).unwrap());
    assert_eq!((mode(&dir), mode(&ledger)), (0o700, 0o600));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = DeviceQuota::open_unattached(0, UUID, 100, &ledger, env)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("ledger folder") && e.contains("vgpu-me"), "{e}");
}

#[test]
fn the_measurement_lock_needs_no_file_and_excludes_other_holders() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let a = DeviceQuota::open_unattached(0, UUID, 100, &path, LedgerMode::File).unwrap();
    let b = DeviceQuota::open_unattached(0, UUID, 100, &path, LedgerMode::File).unwrap();
    let held = a.measure_lock().expect("free");
    assert!(b.ledger.try_measure_lock().unwrap().is_none(), "held");
    // A container cannot create files beside its ledger: nothing but the ledger is there.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    drop(held);
    assert!(b.measure_lock().is_some(), "released when dropped");
}

// Issue 27: the limit was read once from the limits file; a host update never reached a running process.
#[test]
fn a_host_update_is_followed_on_the_next_charge_and_held_memory_is_kept_on_a_shrink() {
    use vgpu_ledger::fixtures::UUID as uuid;
    use vgpu_ledger::layout;
    use vgpu_ledger::limits::Limits;
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let mut limits = vgpu_ledger::fixtures::one_gpu("c1", uuid, 1024 * MIB);
    std::fs::create_dir(dir.path().join("ledgers")).unwrap();
    let host = dir.path().join(layout::LIMITS_FILE_NAME);
    let file = dir.path().join(layout::MOUNTED_LIMITS_FILE_NAME);
    limits.write_atomic(&host).unwrap();
    std::fs::hard_link(&host, &file).unwrap();
    let ledger = limits.ledger_path(&file, &limits.devices[0]);
    let q = DeviceQuota::open(0, uuid, 1024 * MIB, &ledger).unwrap();
    q.follow(&file);
    assert!(q.charge(Kind::Data, 600 * MIB));
    assert!(
        !q.charge(Kind::Data, 900 * MIB),
        "1.5 GiB does not fit 1 GiB"
    );
    let publish = |l: &mut Limits, bytes| {
        l.updates += 1;
        l.devices[0].settings.memory_limit = Some(bytes);
        vgpu_host::live::publish(dir.path(), l).unwrap();
    };
    publish(&mut limits, 2048 * MIB);
    assert_eq!(q.limit(), 2048 * MIB);
    assert!(q.charge(Kind::Data, 900 * MIB), "fits after the grow");
    publish(&mut limits, 1024 * MIB);
    assert!(
        !q.charge(Kind::Data, 64 * MIB),
        "below use: the next charge is refused"
    );
    assert_eq!(q.used(), 1500 * MIB, "what is held is kept");
    q.refund(Kind::Data, 900 * MIB);
    assert!(q.charge(Kind::Data, 64 * MIB), "under the new quota again");
    // Unchanged generation: the file is not read again (gone, and the limit stays).
    std::fs::remove_file(&file).unwrap();
    assert_eq!(q.limit(), 1024 * MIB);
    // The host writing (odd): nothing applied until it is whole.
    q.ledger().set_limits_generation(5);
    assert_eq!(q.limit(), 1024 * MIB);
    // A tenant that writes the generation the host's next update would leave, before it comes: with a
    // predictable generation (2 × updates) the library applied the old file at that value and then never
    // read the shrink. The host's generation is unpredictable, so the update is still seen.
    let next = 2 * (limits.updates + 1);
    limits.write_atomic(&file).unwrap();
    q.ledger().set_limits_generation(next);
    assert_eq!(
        q.limit(),
        1024 * MIB,
        "the forged word only makes it read the same file"
    );
    publish(&mut limits, 512 * MIB);
    assert_eq!(
        q.limit(),
        512 * MIB,
        "the shrink after a forged generation is applied"
    );
}

// A limits generation left odd: an update that died half way, or a tenant keeping the word odd so its
// processes never read a shrink (the pending-shrink hole's library side). Nothing is read while a host
// could still be writing; once it has been odd for ODD_BOUND, the file as it is. A file that does not
// parse then is not applied (looked at again). Failed before: the odd word kept the old quota for good.
/// A container's limits file (1 GiB on one GPU) with its mounted copy, and a quota following it.
pub(crate) fn followed_quota(
    dir: &Path,
) -> (vgpu_ledger::limits::Limits, std::path::PathBuf, DeviceQuota) {
    use vgpu_ledger::fixtures::UUID as uuid;
    use vgpu_ledger::layout;
    const MIB: u64 = 1 << 20;
    let limits = vgpu_ledger::fixtures::one_gpu("c1", uuid, 1024 * MIB);
    std::fs::create_dir(dir.join("ledgers")).unwrap();
    let host = dir.join(layout::LIMITS_FILE_NAME);
    let file = dir.join(layout::MOUNTED_LIMITS_FILE_NAME);
    limits.write_atomic(&host).unwrap();
    std::fs::hard_link(&host, &file).unwrap();
    let ledger = limits.ledger_path(&file, &limits.devices[0]);
    let q = DeviceQuota::open(0, uuid, 1024 * MIB, &ledger).unwrap();
    q.follow(&file);
    (limits, file, q)
}

#[test]
fn a_generation_written_back_hides_no_update_past_a_second() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (mut limits, _file, q) = followed_quota(dir.path());
    assert!(q.charge(Kind::Data, 600 * MIB));
    // The host shrinks to 512 MiB; before the process looks, the tenant writes back the generation its
    // processes applied (0: the file as loaded), as a thread that watches the word can.
    limits.updates += 1;
    limits.devices[0].settings.memory_limit = Some(512 * MIB);
    vgpu_host::live::publish(dir.path(), &limits).unwrap();
    q.ledger().set_limits_generation(0);
    std::thread::sleep(Duration::from_millis(crate::live::FILE_CHECK_MS + 50));
    assert_eq!(q.limit(), 512 * MIB, "the file itself, within a second");
    assert!(!q.charge(Kind::Data, 64 * MIB), "below use: refused");
    // Read once for that change: the next update is seen again the same way.
    limits.updates += 1;
    limits.devices[0].settings.memory_limit = Some(2048 * MIB);
    vgpu_host::live::publish(dir.path(), &limits).unwrap();
    q.ledger().set_limits_generation(0);
    std::thread::sleep(Duration::from_millis(crate::live::FILE_CHECK_MS + 50));
    assert_eq!(q.limit(), 2048 * MIB);
}

// Issue 48 item 1, the adversary as a thread: it writes the applied generation back whenever the word
// moves, all the while; the host's shrink is still applied within a second (FILE_CHECK_MS, plus the
// settling of a file changed a moment ago).
#[test]
fn a_tenant_thread_rewriting_the_word_hides_no_shrink() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (mut limits, _file, q) = followed_quota(dir.path());
    let q = std::sync::Arc::new(q);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tenant = {
        let (q, stop) = (q.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if q.ledger().limits_generation() != 0 {
                    q.ledger().set_limits_generation(0);
                }
                std::hint::spin_loop();
            }
        })
    };
    assert_eq!(q.limit(), 1024 * MIB);
    limits.updates += 1;
    limits.devices[0].settings.memory_limit = Some(512 * MIB);
    let published = Instant::now();
    vgpu_host::live::publish(dir.path(), &limits).unwrap();
    // the thread is faster than this process's next call (so it is on a busy machine, not always)
    q.ledger().set_limits_generation(0);
    while q.limit() != 512 * MIB && published.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = published.elapsed();
    stop.store(true, Ordering::Relaxed);
    tenant.join().unwrap();
    assert_eq!(q.limit(), 512 * MIB, "applied");
    assert!(
        took < Duration::from_millis(crate::live::FILE_CHECK_MS + 250),
        "within a second: {took:?}"
    );
}

#[test]
fn a_generation_left_odd_is_read_through_after_a_bound() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (mut limits, file, q) = followed_quota(dir.path());
    assert!(q.charge(Kind::Data, 600 * MIB));
    // The host shrinks to 512 MiB; before the process looks, the tenant makes the word odd.
    limits.updates += 1;
    limits.devices[0].settings.memory_limit = Some(512 * MIB);
    vgpu_host::live::publish(dir.path(), &limits).unwrap();
    let forged = q.ledger().limits_generation() | 1;
    q.ledger().set_limits_generation(forged);
    assert_eq!(q.limit(), 1024 * MIB, "odd: a host may be writing");
    assert!(q.charge(Kind::Data, 100 * MIB), "the old quota, for now");
    std::thread::sleep(ODD_BOUND + Duration::from_millis(50));
    assert_eq!(
        q.limit(),
        512 * MIB,
        "odd past the bound: the file as it is"
    );
    assert!(!q.charge(Kind::Data, 64 * MIB), "below use: refused");
    assert_eq!(q.limit(), 512 * MIB, "read once for that value");
    // Another odd value over a file that does not parse: not applied, looked at again.
    std::fs::write(&file, b"{\"version\":1,\"devi").unwrap();
    q.ledger().set_limits_generation(forged + 2);
    assert_eq!(q.limit(), 512 * MIB);
    std::thread::sleep(ODD_BOUND + Duration::from_millis(50));
    assert_eq!(q.limit(), 512 * MIB, "a torn file is never applied");
    limits.devices[0].settings.memory_limit = Some(256 * MIB);
    limits.write_atomic(&file).unwrap();
    assert_eq!(q.limit(), 256 * MIB, "whole again: read");
    // The host's next update (an even word) is read as ever.
    limits.updates += 1;
    limits.devices[0].settings.memory_limit = Some(2048 * MIB);
    vgpu_host::live::publish(dir.path(), &limits).unwrap();
    assert_eq!(q.limit(), 2048 * MIB);
}
