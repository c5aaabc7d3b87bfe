//! Unit tests of shared pools: an exported pool's frees give nothing back (even when the driver's reading
//! of its reservation drops, or the pool is destroyed), an exported pointer's import is charged once in a
//! container, and an imported pointer's free gives back what its import charged.

use super::super::super::testing::World;
use crate::driver::Driver;
use crate::ffi::*;
use crate::records::Records;

const MIB: u64 = 1 << 20;
const POOL: u64 = 0x5000;
const STREAM: usize = 0x77;
const PTR: u64 = 0x9000_0000;

/// `w`'s device 0 with POOL as its default pool and one allocation of `bytes` from it at PTR.
fn pool_with_allocation(w: &World, bytes: u64) {
    w.fake.pool_reserved.borrow_mut().insert(POOL, 0);
    w.fake.device_pools.borrow_mut().insert(0, POOL);
    let mut ptr: CUdeviceptr = 0;
    let out: *mut CUdeviceptr = &mut ptr;
    let r = w.interposer().alloc_async(out, bytes, STREAM, false, || {
        w.fake.pool_reserved.borrow_mut().insert(POOL, bytes);
        // SAFETY: `out` points at the local `ptr`.
        unsafe { *out = PTR };
        CUDA_SUCCESS
    });
    assert_eq!((r, ptr), (CUDA_SUCCESS, PTR));
}

/// Frees PTR, the driver's reservation then reads 0 (the worst reading: the memory the importer keeps is
/// not counted in the exporter's pool), reconciles and destroys the pool; what stays charged.
fn free_and_destroy(w: &World) -> u64 {
    let e = w.interposer();
    assert_eq!(
        e.tracked_free(&w.rec.allocs, PTR, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    w.fake.pool_reserved.borrow_mut().insert(POOL, 0);
    e.reconcile_pool(POOL);
    let after_free = w.used();
    e.pool_destroyed(POOL);
    e.reconcile_dirty_pools();
    assert_eq!(after_free, w.used(), "the destroy changes nothing");
    w.used()
}

#[test]
fn an_exported_pools_free_and_destroy_give_nothing_back() {
    let w = World::new(1 << 30);
    pool_with_allocation(&w, 64 * MIB);
    assert_eq!(
        w.interposer().pool_export(POOL, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(free_and_destroy(&w), 64 * MIB);
}

#[test]
fn a_pool_never_exported_gives_its_free_back() {
    let w = World::new(1 << 30);
    pool_with_allocation(&w, 64 * MIB);
    assert_eq!(free_and_destroy(&w), 0);
}

#[test]
fn a_failed_export_leaves_the_pool_unexported() {
    let w = World::new(1 << 30);
    pool_with_allocation(&w, 64 * MIB);
    assert_eq!(
        w.interposer()
            .pool_export(POOL, || CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(free_and_destroy(&w), 0);
}

#[test]
fn an_exported_pointer_is_charged_once_in_its_container() {
    let w = World::new(1 << 30);
    pool_with_allocation(&w, 64 * MIB);
    let data = [9u8; 64];
    let e = w.interposer();
    assert_eq!(
        e.pool_export_pointer(PTR, || CUDA_SUCCESS, || data),
        CUDA_SUCCESS
    );
    assert!(w.rec.allocs.with(PTR, |r| r.is_some_and(|r| r.exported)));
    // another process of the container imports it
    let rec = Records::new();
    let importer = super::super::super::common::Interposer {
        drv: &w.fake,
        rec: &rec,
    };
    w.fake
        .ptr_ranges
        .borrow_mut()
        .insert(0x7000, (0x7000, 64 * MIB, 0));
    let before = w.used();
    let r = importer.ipc_open(&data, || CUDA_SUCCESS, || 0x7000, |p| w.fake.mem_free(p));
    assert_eq!((r, w.used()), (CUDA_SUCCESS, before));
    assert_eq!(
        importer.tracked_free(&rec.allocs, 0x7000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(
        w.used(),
        before,
        "its free gives back nothing the exporter holds"
    );
}

#[test]
fn another_containers_pointer_is_charged_to_the_importer_until_its_free() {
    let w = World::new(100 * MIB);
    w.fake
        .ptr_ranges
        .borrow_mut()
        .insert(0x7000, (0x7000, 64 * MIB, 0));
    let e = w.interposer();
    let r = e.ipc_open(
        &[3u8; 64],
        || CUDA_SUCCESS,
        || 0x7000,
        |p| w.fake.mem_free(p),
    );
    assert_eq!((r, w.used()), (CUDA_SUCCESS, 64 * MIB));
    // a second import past the quota is freed again and refused
    w.fake
        .ptr_ranges
        .borrow_mut()
        .insert(0x8000, (0x8000, 64 * MIB, 0));
    let r = e.ipc_open(
        &[4u8; 64],
        || CUDA_SUCCESS,
        || 0x8000,
        |p| w.fake.mem_free(p),
    );
    assert_eq!((r, w.used()), (CUDA_ERROR_OUT_OF_MEMORY, 64 * MIB));
    assert!(w.fake.calls.borrow().iter().any(|c| c == "mem_free 0x8000"));
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x7000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
}
