//! glibc's dl functions (dlvsym, and through it dlopen, dladdr, dlerror, dlsym), found on first use by
//! reading the dynamic symbol tables of the loaded objects, instead of being linked to.
//!
//! Why: a glibc-2.17 build must take these from libdl.so.2 (`dlopen@GLIBC_2.2.5`), and measured on
//! glibc 2.36, merely binding those versioned references at load time adds ~20-45 µs to the start of
//! every process, doubling what preloading an empty object costs. References resolved here cost nothing
//! until a process first calls CUDA, NVML or `dlsym`.
//!
//! Where they are found: in libc.so.6 on glibc >= 2.34; on older glibc in libdl.so.2, which every process
//! that can reach us has loaded by then (it called `dlsym`, or it links libcuda, which needs libdl).

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

#[repr(C)]
struct DlPhdrInfo {
    dlpi_addr: usize,
    dlpi_name: *const c_char,
    dlpi_phdr: *const Phdr,
    dlpi_phnum: u16,
}

#[repr(C)]
struct Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_val: u64,
}

#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const STT_FUNC: u8 = 2;

type IterCallback = unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int;

extern "C" {
    // In libc.so.6 since glibc 2.2.5: binding it costs what any libc reference costs.
    fn dl_iterate_phdr(cb: IterCallback, data: *mut c_void) -> c_int;
}

/// The address of the first defined function named `name` (NUL-terminated) in any loaded object.
pub fn find_function(name: &[u8]) -> usize {
    let mut want = Want { name, found: 0 };
    // SAFETY: the callback only reads the loader's own tables and writes into `want`, which outlives the call.
    unsafe { dl_iterate_phdr(visit, (&mut want as *mut Want).cast()) };
    want.found
}

struct Want<'a> {
    name: &'a [u8],
    found: usize,
}

unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info for a loaded object, and `data` is our `Want`.
    let (info, want) = unsafe { (&*info, &mut *data.cast::<Want>()) };
    // SAFETY: the object is loaded and stays so during the callback; its tables are mapped.
    match unsafe { lookup(info, want.name) } {
        Some(addr) => {
            want.found = addr;
            1 // stop iterating
        }
        None => 0,
    }
}

/// Looks `name` up in one object's dynamic symbol table (GNU hash, else a scan bounded by DT_HASH).
///
/// # Safety
/// `info` describes an object that is loaded for the duration of the call.
unsafe fn lookup(info: &DlPhdrInfo, name: &[u8]) -> Option<usize> {
    let base = info.dlpi_addr;
    // The loader relocates the dynamic section's addresses in place on x86-64 and aarch64, except in the
    // vDSO and on a few other architectures: a value below the load address is still an offset.
    let abs = |p: u64| -> usize {
        if (p as usize) < base {
            base + p as usize
        } else {
            p as usize
        }
    };
    // SAFETY: the loader's program headers of this object, dlpi_phnum of them.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    let (mut strtab, mut symtab, mut gnu_hash, mut hash) = (0, 0, 0, 0);
    // SAFETY: the dynamic array ends with DT_NULL.
    unsafe {
        while (*d).d_tag != DT_NULL {
            match (*d).d_tag {
                DT_STRTAB => strtab = abs((*d).d_val),
                DT_SYMTAB => symtab = abs((*d).d_val),
                DT_GNU_HASH => gnu_hash = abs((*d).d_val),
                DT_HASH => hash = abs((*d).d_val),
                _ => {}
            }
            d = d.add(1);
        }
    }
    if strtab == 0 || symtab == 0 {
        return None;
    }
    let syms = symtab as *const Sym;
    let matches = |i: usize| -> Option<usize> {
        // SAFETY: callers pass i below the table's symbol count (from the hash tables below).
        let s = unsafe { &*syms.add(i) };
        if s.st_shndx == 0 || s.st_value == 0 || s.st_info & 0xf != STT_FUNC {
            return None;
        }
        // SAFETY: st_name indexes the NUL-terminated string table.
        let same = unsafe { c_str_eq((strtab + s.st_name as usize) as *const u8, name) };
        same.then_some(base + s.st_value as usize)
    };
    if gnu_hash != 0 {
        // SAFETY: the GNU hash table's layout: nbuckets, symoffset, bloom size, shift, bloom words,
        // buckets, then the chain, one word per symbol from symoffset on (the last of a chain has bit 0).
        unsafe {
            let h = gnu_hash as *const u32;
            let (nbuckets, symoffset, bloom_size) =
                (*h as usize, *h.add(1) as usize, *h.add(2) as usize);
            if nbuckets == 0 {
                return None;
            }
            let buckets = h
                .add(4)
                .cast::<u8>()
                .add(bloom_size * core::mem::size_of::<usize>())
                .cast::<u32>();
            let chain = buckets.add(nbuckets);
            let hv = gnu_hash_of(name);
            let mut i = *buckets.add(hv as usize % nbuckets) as usize;
            if i < symoffset {
                return None;
            }
            loop {
                let c = *chain.add(i - symoffset);
                if (c | 1) == (hv | 1) {
                    if let Some(a) = matches(i) {
                        return Some(a);
                    }
                }
                if c & 1 != 0 {
                    return None;
                }
                i += 1;
            }
        }
    }
    if hash != 0 {
        // SAFETY: DT_HASH starts with nbucket, nchain; nchain is the number of symbols.
        let nchain = unsafe { *(hash as *const u32).add(1) } as usize;
        return (1..nchain).find_map(matches);
    }
    None
}

fn gnu_hash_of(name: &[u8]) -> u32 {
    name.iter()
        .take_while(|&&b| b != 0)
        .fold(5381u32, |h, &b| h.wrapping_mul(33).wrapping_add(b as u32))
}

/// Is the NUL-terminated string at `s` equal to `name` (NUL-terminated or not)?
///
/// # Safety
/// `s` is NUL-terminated.
unsafe fn c_str_eq(s: *const u8, name: &[u8]) -> bool {
    let mut i = 0;
    loop {
        let want = name.get(i).copied().unwrap_or(0);
        // SAFETY: we stop at s's NUL.
        let got = unsafe { *s.add(i) };
        if got != want {
            return false;
        }
        if got == 0 {
            return true;
        }
        i += 1;
    }
}

/// dlvsym, found once.
static DLVSYM: AtomicUsize = AtomicUsize::new(0);

type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// `dlvsym(RTLD_NEXT, name, version)` for each version in turn until one answers; 0 if none.
pub fn next_symbol(name: &[u8], versions: &[&[u8]]) -> usize {
    let mut f = DLVSYM.load(Ordering::Acquire);
    if f == 0 {
        f = find_function(b"dlvsym\0");
        if f == 0 {
            return 0;
        }
        DLVSYM.store(f, Ordering::Release);
    }
    const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
    for v in versions {
        // SAFETY: f is glibc's dlvsym; name and version are NUL-terminated. RTLD_NEXT: the next object
        // after this one (the caller dlvsym sees is us), i.e. glibc itself.
        let p = unsafe {
            core::mem::transmute::<usize, DlvsymFn>(f)(
                RTLD_NEXT,
                name.as_ptr().cast(),
                v.as_ptr().cast(),
            )
        };
        if !p.is_null() {
            return p as usize;
        }
    }
    0
}
