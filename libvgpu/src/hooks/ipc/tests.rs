//! Unit tests of legacy CUDA IPC's importer side: charged once per container, the exporter's charge never
//! given back by an importer, an open charged once its exporter ends. Two processes are two record tables
//! (two sets of open file descriptions) over one ledger file.

use super::super::common::Interposer;
use super::super::testing::World;
use crate::driver::Driver;
use crate::ffi::*;
use crate::records::Records;

const OPENED: u64 = 0x7000;

fn handle(n: u8) -> CUipcMemHandle {
    let mut h = [0u8; 64];
    h[0] = n;
    h
}

/// The driver says `ptr` is an allocation of `bytes` on device 0 (what an open of it returns).
fn at(w: &World, ptr: u64, bytes: u64) {
    w.fake.ptr_ranges.borrow_mut().insert(ptr, (ptr, bytes, 0));
}

/// `e` opens handle `n`; the driver gives `ptr` (closed again through the fake when refused).
fn open(
    e: &Interposer<'_, crate::driver::fake::FakeDriver>,
    w: &World,
    n: u8,
    ptr: u64,
) -> CUresult {
    e.ipc_open(&handle(n), || CUDA_SUCCESS, || ptr, |p| w.fake.ipc_close(p))
}

/// Whether the library closed `OPENED` again through the driver (a refused open).
fn closed_again(w: &World) -> bool {
    w.fake
        .calls
        .borrow()
        .contains(&format!("ipc_close {OPENED:#x}"))
}

/// A process of `w`'s container with records of its own (its own descriptions of the ledger file).
fn other<'a>(w: &'a World, rec: &'a Records) -> Interposer<'a, crate::driver::fake::FakeDriver> {
    Interposer { drv: &w.fake, rec }
}

#[test]
fn another_containers_memory_is_charged_to_the_importer_and_its_close_gives_it_back() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let e = w.interposer();
    assert_eq!(open(&e, &w, 1, OPENED), CUDA_SUCCESS);
    assert_eq!(w.used(), 600);
    assert_eq!(e.ipc_close_hooked(OPENED, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
}

#[test]
fn an_open_past_the_quota_is_closed_again_and_refused() {
    let w = World::new(1000);
    at(&w, OPENED, 1200);
    let e = w.interposer();
    assert_eq!(open(&e, &w, 1, OPENED), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(w.used(), 0);
    assert!(closed_again(&w), "the open closed again");
}

#[test]
fn an_open_whose_device_cannot_be_told_is_closed_and_refused() {
    let w = World::new(1000);
    let e = w.interposer();
    assert_eq!(open(&e, &w, 1, OPENED), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(closed_again(&w), "the open closed again");
}

#[test]
fn memory_exported_in_the_same_container_is_charged_once_and_its_close_refunds_nothing() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let exporter = w.interposer();
    // the exporter's allocation, charged and shared (its free will not refund it)
    assert_eq!(
        exporter.alloc_plain(600, || CUDA_SUCCESS, || 0x10, |_| ()),
        CUDA_SUCCESS
    );
    assert_eq!(
        exporter.ipc_handle(0x10, || CUDA_SUCCESS, || handle(7)),
        CUDA_SUCCESS
    );
    let rec = Records::new();
    let importer = other(&w, &rec);
    assert_eq!(open(&importer, &w, 7, OPENED), CUDA_SUCCESS);
    assert_eq!(w.used(), 600, "charged once in the container");
    // another container's handle (another mark) opened by the same importer is charged
    at(&w, 0x9000, 300);
    assert_eq!(open(&importer, &w, 8, 0x9000), CUDA_SUCCESS);
    assert_eq!(w.used(), 900);
    assert_eq!(
        importer.ipc_close_hooked(OPENED, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(
        w.used(),
        900,
        "the close gives back nothing the exporter holds"
    );
    assert_eq!(
        importer.ipc_close_hooked(0x9000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 600);
}

// An export of memory this process never charged (not in its records) holds no mark: an open of it in
// the same container is charged, or the memory would be charged to nobody.
#[test]
fn an_export_of_memory_never_charged_marks_nothing() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let exporter = w.interposer();
    assert_eq!(
        exporter.ipc_handle(0x10, || CUDA_SUCCESS, || handle(7)),
        CUDA_SUCCESS
    );
    let rec = Records::new();
    let importer = other(&w, &rec);
    assert_eq!(open(&importer, &w, 7, OPENED), CUDA_SUCCESS);
    assert_eq!(w.used(), 600, "charged to the importer");
}

#[test]
fn an_open_of_an_exporter_that_ended_is_charged_at_the_next_admission() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let exporter_rec = Records::new();
    let exporter = other(&w, &exporter_rec);
    exporter.ipc_mark(0, &handle(7));
    let importer = w.interposer();
    assert_eq!(open(&importer, &w, 7, OPENED), CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    // nothing changes while the exporter lives
    assert_eq!(
        importer.alloc_plain(100, || CUDA_SUCCESS, || 0x20, |_| ()),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 100);
    // the exporter ends: its mappings (and with them its marks) go with it
    for k in exporter_rec.ipc_marks.keys() {
        super::unpin(exporter_rec.ipc_marks.remove(k).unwrap());
    }
    assert_eq!(
        importer.alloc_plain(400, || panic!("over the quota"), || 0, |_| ()),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(w.used(), 700, "the open is charged here now");
    assert_eq!(
        importer.ipc_close_hooked(OPENED, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 100);
}

#[test]
fn an_open_settled_by_the_truth_up_is_charged_once() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let exporter_rec = Records::new();
    other(&w, &exporter_rec).ipc_mark(0, &handle(7));
    let importer = w.interposer();
    let r = open(&importer, &w, 7, OPENED);
    assert_eq!((r, w.used()), (CUDA_SUCCESS, 0));
    for k in exporter_rec.ipc_marks.keys() {
        super::unpin(exporter_rec.ipc_marks.remove(k).unwrap());
    }
    // the exporter ended: NVML counts the memory in the importer's process now
    w.fake.own_used.set(600);
    importer.truth_up();
    assert_eq!(w.used(), 600);
    // the next admission finds it charged already: 300 more fit under 1000
    let r = importer.alloc_plain(300, || CUDA_SUCCESS, || 0x20, |_| ());
    assert_eq!(
        (r, w.used()),
        (CUDA_SUCCESS, 900),
        "the open's charge, not a truth-up's beside it"
    );
}

#[test]
fn a_context_that_ends_gives_back_what_its_opens_charged() {
    let w = World::new(1000);
    at(&w, OPENED, 600);
    let e = w.interposer();
    assert_eq!(open(&e, &w, 1, OPENED), CUDA_SUCCESS);
    e.ipc_context_gone(w.fake.home);
    assert_eq!(w.used(), 0);
    assert!(w.rec.ipc_opens.keys().is_empty());
}

#[test]
fn marks_differ_by_handle_and_lie_past_the_ledger() {
    let (a, b) = (super::mark_of(&handle(1)), super::mark_of(&handle(2)));
    assert_ne!(a, b);
    for m in [a, b] {
        assert!(m >= vgpu_ledger::region::IPC_MARK_OFFSET);
        assert!(m < vgpu_ledger::region::IPC_MARK_OFFSET + vgpu_ledger::region::IPC_MARK_SPAN);
    }
}

#[test]
fn a_mark_never_lives_on_in_a_fork_child() {
    use std::os::unix::ffi::OsStrExt;
    let w = World::new(1000);
    let mark = super::mark_of(&handle(5));
    let pin = super::hold_mark(w.q, mark).expect("marked");
    assert_eq!(super::marked_elsewhere(w.q, mark), Some(true));
    // everything the child does is prepared here: it only opens, asks and exits (no allocation after fork)
    let path = std::ffi::CString::new(w.q.ledger_path().as_os_str().as_bytes()).unwrap();
    let mut ask = super::one_byte(libc::F_WRLCK, mark);
    let mut pipe = [0; 2];
    // SAFETY: a valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child runs only async-signal-safe calls on what was prepared above, then _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above; the byte says the parent dropped its mark.
        unsafe {
            let mut b = 0u8;
            libc::read(pipe[0], (&mut b as *mut u8).cast(), 1);
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            let r = libc::fcntl(fd, libc::F_OFD_GETLK, &mut ask);
            libc::_exit(if r == 0 && ask.l_type == libc::F_UNLCK as libc::c_short {
                0
            } else {
                1
            });
        }
    }
    super::unpin(pin);
    let mut status = 0;
    // SAFETY: our pipe and our child.
    unsafe {
        libc::write(pipe[1], [1u8].as_ptr().cast(), 1);
        libc::waitpid(child, &mut status, 0);
    }
    assert_eq!(
        status, 0,
        "the child saw the parent's mark after the parent dropped it"
    );
}
