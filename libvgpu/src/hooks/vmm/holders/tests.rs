//! Sparse-array tiles and multicast bindings on the fake driver (issue 48 item 4): each holds its handle's
//! memory, so a release of the handle refunds nothing while one lives.

use super::super::super::testing::World;
use super::*;
use crate::driver::Place;

const MIB: u64 = 1 << 20;
const H: u64 = 0x41;
const ARRAY: u64 = 0xa1;
const MC: u64 = 0xc1;
const IMPORTED: u64 = 0x51;

fn create(w: &World, bytes: u64, handle: u64) -> CUresult {
    w.interposer().vmm_create(
        bytes,
        CU_MEM_LOCATION_TYPE_DEVICE,
        0,
        || CUDA_SUCCESS,
        || handle,
    )
}

fn tile(op: i32, handle: u64, level: u64) -> TileMap {
    TileMap {
        resource: ARRAY,
        key: TileKey {
            subresource: 0,
            fields: [level, 0, 0, 0],
        },
        op,
        handle,
    }
}

fn map_tiles(w: &World, maps: &[TileMap], rc: CUresult) -> CUresult {
    w.interposer().array_map(maps, || rc)
}

// Issue 48 item 4: cuMemMapArrayAsync was passed through; releasing a handle whose memory a sparse
// array's tile still held refunded it.
#[test]
fn a_handle_mapped_into_a_sparse_array_stays_charged_until_its_tile_is_unmapped() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    create(&w, 600 * MIB, H);
    let map = tile(CU_MEM_OPERATION_TYPE_MAP, H, 0);
    assert_eq!(map_tiles(&w, &[map], CUDA_SUCCESS), CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "the tile holds the memory");
    assert_eq!(create(&w, 600 * MIB, H + 1), CUDA_ERROR_OUT_OF_MEMORY);
    // an unmap of another region, or a failed one, gives nothing back
    map_tiles(&w, &[tile(CU_MEM_OPERATION_TYPE_UNMAP, 0, 1)], CUDA_SUCCESS);
    map_tiles(&w, &[tile(CU_MEM_OPERATION_TYPE_UNMAP, 0, 0)], 1);
    assert_eq!(w.used(), 600 * MIB);
    map_tiles(&w, &[tile(CU_MEM_OPERATION_TYPE_UNMAP, 0, 0)], CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    assert!(w.rec.vmm.keys().is_empty());
}

#[test]
fn destroying_the_array_gives_its_tiles_references_back() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    create(&w, 600 * MIB, H);
    let maps = [
        tile(CU_MEM_OPERATION_TYPE_MAP, H, 0),
        tile(CU_MEM_OPERATION_TYPE_MAP, H, 1),
    ];
    assert_eq!(map_tiles(&w, &maps, CUDA_SUCCESS), CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    map_tiles(&w, &[tile(CU_MEM_OPERATION_TYPE_UNMAP, 0, 0)], CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "level 1 still holds it");
    e.array_gone(ARRAY);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_failed_list_of_several_counts_its_maps_as_made_and_a_failed_single_map_as_not() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    create(&w, 300 * MIB, H);
    assert_eq!(
        map_tiles(&w, &[tile(CU_MEM_OPERATION_TYPE_MAP, H, 0)], 1),
        1
    );
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0, "one entry refused: nothing was mapped");
    create(&w, 300 * MIB, H);
    let maps = [
        tile(CU_MEM_OPERATION_TYPE_MAP, H, 0),
        tile(CU_MEM_OPERATION_TYPE_MAP, H, 1),
    ];
    assert_eq!(map_tiles(&w, &maps, 1), 1);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 300 * MIB, "some may have been mapped");
    e.array_gone(ARRAY);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_tile_of_another_processs_memory_is_refused() {
    let w = World::new(1024 * MIB);
    w.fake
        .handle_places
        .borrow_mut()
        .insert(IMPORTED, Place::Device(0));
    let e = w.interposer();
    assert_eq!(e.vmm_import(None, || 0, || IMPORTED), CUDA_SUCCESS);
    let map = tile(CU_MEM_OPERATION_TYPE_MAP, IMPORTED, 0);
    assert_eq!(
        e.array_map(&[map], || panic!("mapped")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
}

#[test]
fn a_mip_tails_padding_is_not_part_of_its_region() {
    let mut m = CUarrayMapInfo {
        resource_type: 0,
        resource: ARRAY,
        subresource_type: CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL,
        subresource: [7 | 0xdead_0000_0000, 64 << 10, 128 << 10, 0xffff],
        mem_operation_type: CU_MEM_OPERATION_TYPE_MAP,
        mem_handle_type: 0,
        mem_handle: H,
        offset: 0,
        device_bit_mask: 1,
        flags: 0,
        reserved: [0; 2],
    };
    let a = TileMap::of(&m);
    m.subresource[0] = 7;
    m.subresource[3] = 0;
    m.mem_operation_type = CU_MEM_OPERATION_TYPE_UNMAP;
    m.mem_handle = 0;
    let b = TileMap::of(&m);
    assert_eq!(a.key, b.key);
    assert_eq!((a.handle, b.handle), (H, 0));
}

// Issue 48 item 4: cuMulticastBindMem was passed through; releasing a handle a multicast object still had
// bound refunded it.
#[test]
fn memory_bound_to_a_multicast_object_stays_charged_until_unbound() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    assert_eq!(e.mc_create(|| CUDA_SUCCESS, || MC), CUDA_SUCCESS);
    create(&w, 600 * MIB, H);
    let bind = |rc| e.mc_bind(MC, 0, H, 0, 600 * MIB, || rc);
    assert_eq!(bind(1), 1);
    assert_eq!(bind(CUDA_SUCCESS), CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "the binding holds the memory");
    e.mc_unbind(MC, 1, 0, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "another device's memory unbound");
    e.mc_unbind(MC, 0, 0, 600 * MIB, || 1);
    assert_eq!(w.used(), 600 * MIB, "a failed unbind");
    e.mc_unbind(MC, 0, 0, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_multicast_object_gone_drops_its_bindings_unless_it_was_exported() {
    let w = World::new(2048 * MIB);
    let e = w.interposer();
    e.mc_create(|| CUDA_SUCCESS, || MC);
    create(&w, 600 * MIB, H);
    e.mc_bind(MC, 0, H, 0, 600 * MIB, || CUDA_SUCCESS);
    e.vmm_map(0x9000_0000, 600 * MIB, 0, MC, || CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    e.vmm_release(MC, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "the object is still mapped");
    e.vmm_unmap(0x9000_0000, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0, "object gone: its binding with it");
    // exported, the object may live on elsewhere with its binding
    e.mc_create(|| CUDA_SUCCESS, || MC);
    create(&w, 600 * MIB, H);
    e.mc_bind(MC, 0, H, 0, 600 * MIB, || CUDA_SUCCESS);
    e.vmm_export(MC, || CUDA_SUCCESS, || None);
    e.vmm_release(MC, || CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB);
    // the object's handle value made again does not reach the old binding
    e.mc_create(|| CUDA_SUCCESS, || MC);
    e.mc_unbind(MC, 0, 0, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB);
}

#[test]
fn a_binding_by_address_holds_the_handle_mapped_there() {
    let w = World::new(1024 * MIB);
    let e = w.interposer();
    e.mc_create(|| CUDA_SUCCESS, || MC);
    create(&w, 600 * MIB, H);
    e.vmm_map(0x7000_0000, 600 * MIB, 0, H, || CUDA_SUCCESS);
    let r = e.mc_bind_addr(MC, 0, 0x7000_0000 + 64 * MIB, 64 * MIB, || CUDA_SUCCESS);
    assert_eq!(r, CUDA_SUCCESS);
    e.vmm_release(H, || CUDA_SUCCESS);
    e.vmm_unmap(0x7000_0000, 600 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 600 * MIB, "bound by its address");
    e.mc_unbind(MC, 0, 0, 64 * MIB, || CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    // an address that is no VMM mapping of ours is passed through
    assert_eq!(e.mc_bind_addr(MC, 0, 0x1234_0000, 2 * MIB, || 0), 0);
    assert!(w.rec.mc_binds.with(MC, |v| v.is_none_or(|v| v.is_empty())));
}

#[test]
fn binding_another_processs_memory_charges_the_union_of_what_is_bound_and_mapped() {
    let w = World::new(1024 * MIB);
    w.fake
        .handle_places
        .borrow_mut()
        .insert(IMPORTED, Place::Device(0));
    let e = w.interposer();
    e.vmm_import(None, || 0, || IMPORTED);
    e.mc_create(|| CUDA_SUCCESS, || MC);
    e.vmm_map(0x7000_0000, 200 * MIB, 0, IMPORTED, || 0);
    assert_eq!(
        e.mc_bind(MC, 0, IMPORTED, 100 * MIB, 400 * MIB, || 0),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 500 * MIB, "[0, 200) and [100, 500): 500 MiB");
    assert_eq!(
        e.mc_bind(MC, 0, IMPORTED, 500 * MIB, 600 * MIB, || panic!("bound")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    e.vmm_release(IMPORTED, || 0);
    e.vmm_unmap(0x7000_0000, 200 * MIB, || 0);
    assert_eq!(w.used(), 500 * MIB, "still bound");
    e.mc_unbind(MC, 0, 0, 2 * MIB, || 0);
    assert_eq!(w.used(), 0);
}
