//! Export and import of VMM memory on the fake driver (issue 23 item 5): the importer is charged, an
//! import of the process's own export keeps the exported record charged, the ordinary release refunds.

use super::super::super::testing::World;
use super::*;

const MIB: u64 = 1 << 20;
const H: u64 = 0x21;
const IMPORTED: u64 = 0x31;
const FD_ID: u64 = 0xabc1;

fn create(w: &World, bytes: u64, handle: u64) -> CUresult {
    w.interposer().vmm_create(
        bytes,
        CU_MEM_LOCATION_TYPE_DEVICE,
        0,
        || CUDA_SUCCESS,
        || handle,
    )
}

fn import(w: &World, identity: Option<u64>, handle: u64) -> CUresult {
    w.interposer()
        .vmm_import(identity, || CUDA_SUCCESS, || handle)
}

// Regression (issue 23 item 5, H100): create -> export to a POSIX fd -> import -> release the charged
// handle: the library refunded while the import kept the memory (3,590 MiB held under 2 GiB).
#[test]
fn create_export_import_release_original_stays_charged() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    assert_eq!(create(&w, 600 * MIB, H), CUDA_SUCCESS);
    e.vmm_exported(H, Some(FD_ID));
    assert_eq!(import(&w, Some(FD_ID), IMPORTED), CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "the same memory is charged once");
    assert_eq!(
        e.vmm_map(0x7000_0000, 600 * MIB, IMPORTED, || 0),
        CUDA_SUCCESS
    );
    assert_eq!(e.vmm_release(H, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(
        w.used(),
        600 * MIB,
        "the import keeps the memory: it stays charged"
    );
    assert_eq!(create(&w, 600 * MIB, H + 1), CUDA_ERROR_OUT_OF_MEMORY);
    e.vmm_unmap(0x7000_0000, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(
        w.used(),
        600 * MIB,
        "the import handle itself still holds it"
    );
    e.vmm_release(IMPORTED, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    assert!(w.rec.vmm.keys().is_empty() && w.rec.vmm_exports.keys().is_empty());
}

#[test]
fn the_ordinary_release_refunds_exported_or_not() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    create(&w, 600 * MIB, H);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    create(&w, 600 * MIB, H);
    e.vmm_exported(H, Some(FD_ID));
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0, "an export nobody imported changes nothing");
    assert!(w.rec.vmm_exports.keys().is_empty());
    // the import released first, then the original
    create(&w, 600 * MIB, H);
    e.vmm_exported(H, Some(FD_ID));
    import(&w, Some(FD_ID), IMPORTED);
    e.vmm_release(IMPORTED, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
}

#[test]
fn another_processs_memory_is_charged_to_the_importer_by_what_it_maps() {
    let w = World::new(4096 * MIB);
    let (q1, _) = w.add_device(1, 1024 * MIB);
    w.fake
        .handle_places
        .borrow_mut()
        .insert(IMPORTED, Place::Device(1));
    let e = w.interposer();
    assert_eq!(import(&w, Some(0x5eed), IMPORTED), CUDA_SUCCESS);
    assert_eq!(
        e.vmm_map(0x8000_0000, 2048 * MIB, IMPORTED, || panic!("mapped")),
        CUDA_ERROR_OUT_OF_MEMORY,
        "past device 1's quota, whichever context is current"
    );
    assert_eq!(
        e.vmm_map(0x8000_0000, 600 * MIB, IMPORTED, || 0),
        CUDA_SUCCESS
    );
    assert_eq!((w.used(), q1.used()), (0, 600 * MIB));
    // a second mapping of the same memory is not charged again
    assert_eq!(
        e.vmm_map(0x1_0000_0000, 600 * MIB, IMPORTED, || 0),
        CUDA_SUCCESS
    );
    assert_eq!(q1.used(), 600 * MIB);
    // a map the driver refuses gives back what it was charged
    e.vmm_map(0xa000_0000, 700 * MIB, IMPORTED, || {
        CUDA_ERROR_INVALID_VALUE
    });
    assert_eq!(q1.used(), 600 * MIB);
    e.vmm_release(IMPORTED, || CUDA_SUCCESS);
    e.vmm_unmap(0x8000_0000, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(q1.used(), 600 * MIB, "one mapping still holds it");
    e.vmm_unmap(0x1_0000_0000, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(q1.used(), 0);
}

// Issue 23 item 11: an import whose device the driver does not give is released and refused.
#[test]
fn an_import_whose_device_cannot_be_told_is_released_and_refused() {
    let w = World::new(1024 * MIB);
    assert_eq!(import(&w, None, IMPORTED), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("mem_release 0x31"));
    assert!(w.rec.vmm.keys().is_empty());
    w.fake
        .handle_places
        .borrow_mut()
        .insert(IMPORTED, Place::Host);
    assert_eq!(import(&w, None, IMPORTED), CUDA_SUCCESS);
    assert!(w.rec.vmm.keys().is_empty(), "host memory is nobody's quota");
}

#[test]
fn a_descriptors_identity_is_the_same_through_a_duplicate() {
    let f = std::fs::File::open("/proc/self/stat").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: duplicating a descriptor this test owns.
    let dup = unsafe { libc::dup(fd) };
    assert_eq!(fd_identity(fd), fd_identity(dup));
    assert!(fd_identity(fd).is_some());
    // SAFETY: closing the duplicate made above.
    unsafe { libc::close(dup) };
    assert_eq!(fd_identity(-1), None);
}
