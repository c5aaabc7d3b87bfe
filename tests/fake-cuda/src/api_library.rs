//! Libraries with context-independent loading (`cuLibrary*`, `cuKernelGetFunction`), as the real driver
//! loads them lazily: a library loaded while a context is current is loaded into that context at once;
//! one loaded with none current holds no device memory until its first use in a context
//! (`cuLibraryGetModule`, `cuKernelGetFunction`, `cuLibraryGetGlobal`, `cuLibraryGetManaged`,
//! `cuLibraryGetUnifiedFunction`, or a launch of one of its kernels), where it takes
//! FAKE_CUDA_MODULE_BYTES of that context's device, once per context. Each context's copy is a module
//! of that context (given back with it); `cuLibraryUnload` gives back every copy.

use crate::api_module::{get_function, image, load, unload};
use crate::driver::*;
use crate::types::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

struct Library {
    /// PTX text, or None for a binary image (any kernel name resolves).
    ptx: Option<String>,
    /// Context -> the module this library is loaded as there.
    loaded: HashMap<Handle, Handle>,
}

/// A kernel handle (`CUkernel`): its library, its name, and its function in each context.
struct Kernel {
    lib: Handle,
    name: std::ffi::CString,
    functions: HashMap<Handle, Handle>,
}

static LIBRARIES: Mutex<Option<HashMap<Handle, Library>>> = Mutex::new(None);
static KERNELS: Mutex<Option<HashMap<Handle, Kernel>>> = Mutex::new(None);

fn libraries<T>(f: impl FnOnce(&mut HashMap<Handle, Library>) -> T) -> T {
    f(lock(&LIBRARIES).get_or_insert_with(HashMap::new))
}

fn kernels<T>(f: impl FnOnce(&mut HashMap<Handle, Kernel>) -> T) -> T {
    f(lock(&KERNELS).get_or_insert_with(HashMap::new))
}

/// Creates a library from `ptx`; loaded into the current context if there is one.
fn create(d: &Driver, out_lib: *mut Handle, ptx: Option<String>) -> R {
    if out_lib.is_null() {
        return Err(INVALID_VALUE);
    }
    let h = new_handle();
    libraries(|l| {
        l.insert(
            h,
            Library {
                ptx,
                loaded: HashMap::new(),
            },
        )
    });
    if current(d).is_ok() {
        if let Err(e) = module_here(d, h) {
            libraries(|l| l.remove(&h));
            return Err(e);
        }
    }
    // SAFETY: checked non-null above.
    unsafe { out(out_lib, h) }
}

/// The module `lib` is loaded as in the current context, loading it there (charged) on first use.
fn module_here(d: &Driver, lib: Handle) -> Result<Handle, CUresult> {
    let (ctx, _, _) = current(d)?;
    let (ptx, known) = libraries(|l| {
        let lib = l.get(&lib).ok_or(INVALID_HANDLE)?;
        Ok::<_, CUresult>((lib.ptx.clone(), lib.loaded.get(&ctx).copied()))
    })?;
    if let Some(m) = known {
        if lock(&d.objs).modules.contains_key(&m) {
            return Ok(m);
        }
    }
    let mut m: Handle = 0;
    load(d, &mut m, ptx)?;
    libraries(|l| l.get_mut(&lib).map(|lib| lib.loaded.insert(ctx, m)));
    Ok(m)
}

/// The function of kernel `k` in the current context (its library loaded there first).
fn kernel_function(d: &Driver, k: Handle) -> Result<Handle, CUresult> {
    let (ctx, _, _) = current(d)?;
    let (lib, name, known) = kernels(|ks| {
        let k = ks.get(&k).ok_or(INVALID_HANDLE)?;
        Ok::<_, CUresult>((k.lib, k.name.clone(), k.functions.get(&ctx).copied()))
    })?;
    let m = module_here(d, lib)?;
    if let Some(f) = known {
        if lock(&d.objs).functions.get(&f) == Some(&m) {
            return Ok(f);
        }
    }
    let mut f: Handle = 0;
    get_function(d, &mut f, m, name.as_ptr())?;
    kernels(|ks| ks.get_mut(&k).map(|k| k.functions.insert(ctx, f)));
    Ok(f)
}

/// What a launch of `f` on `stream` runs: a kernel handle is resolved to its function in the stream's
/// context (loading its library there, whatever context is current, as the driver does); anything else
/// is `f` itself.
pub fn launchable(f: Handle, stream: Handle) -> Result<Handle, CUresult> {
    if !kernels(|ks| ks.contains_key(&f)) {
        return Ok(f);
    }
    let d = drv()?;
    let ctx = crate::driver::stream_ctx(&lock(&d.objs), stream)?;
    if ctx == crate::driver::stack_top() {
        return kernel_function(d, f);
    }
    // SAFETY: a context the stream belongs to, pushed for the resolution and popped again.
    unsafe { crate::api_ctx::cuCtxPushCurrent_v2(ctx) };
    let r = kernel_function(d, f);
    let mut popped: Handle = 0;
    // SAFETY: pops what was pushed above.
    unsafe { crate::api_ctx::cuCtxPopCurrent_v2(&mut popped) };
    r
}

unsafe fn read_file(path: *const c_char) -> Result<Option<String>, CUresult> {
    if path.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated path from the caller.
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let mut bytes = std::fs::read(&path).map_err(|_| FILE_NOT_FOUND)?;
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    // SAFETY: the file's bytes, NUL-terminated.
    unsafe { image(bytes.as_ptr() as *const c_void) }
}

cu_fn! {
fn cuLibraryLoadData(lib: *mut Handle, code: *const c_void, _jo: *mut c_int, _jv: *mut *mut c_void, _nj: c_uint,
                     _lo: *mut c_int, _lv: *mut *mut c_void, _nl: c_uint) {
    let d = drv()?;
    create(d, lib, image(code)?)
}

fn cuLibraryLoadFromFile(lib: *mut Handle, path: *const c_char, _jo: *mut c_int, _jv: *mut *mut c_void, _nj: c_uint,
                         _lo: *mut c_int, _lv: *mut *mut c_void, _nl: c_uint) {
    let d = drv()?;
    create(d, lib, read_file(path)?)
}

fn cuLibraryUnload(lib: Handle) {
    let d = drv()?;
    let l = libraries(|l| l.remove(&lib)).ok_or(INVALID_HANDLE)?;
    kernels(|ks| ks.retain(|_, k| k.lib != lib));
    for m in l.loaded.into_values() {
        let _ = unload(d, m); // a copy whose context is gone went with it
    }
    Ok(())
}

fn cuLibraryGetModule(m: *mut Handle, lib: Handle) {
    let d = drv()?;
    if m.is_null() { return Err(INVALID_VALUE); }
    out(m, module_here(d, lib)?)
}

// A kernel's attributes are asked per device: cuFuncGetAttribute does not know a CUkernel handle (the
// CUDA runtime launches those).
fn cuKernelGetAttribute(v: *mut c_int, attr: c_int, k: Handle, _dev: CUdevice) {
    let d = drv()?;
    if !kernels(|ks| ks.contains_key(&k)) { return Err(INVALID_HANDLE); }
    out(v, crate::api_module::func_attribute(d, attr))
}

fn cuLibraryGetKernel(k: *mut Handle, lib: Handle, name: *const c_char) {
    drv()?;
    if k.is_null() || name.is_null() { return Err(INVALID_VALUE); }
    let name = CStr::from_ptr(name).to_owned();
    let ptx = libraries(|l| l.get(&lib).map(|l| l.ptx.clone())).ok_or(INVALID_HANDLE)?;
    if let Some(ptx) = ptx {
        if !crate::api_module::has_entry(&ptx, &name.to_string_lossy()) { return Err(NOT_FOUND); }
    }
    let h = new_handle();
    kernels(|ks| ks.insert(h, Kernel { lib, name, functions: HashMap::new() }));
    out(k, h)
}

fn cuKernelGetFunction(f: *mut Handle, k: Handle) {
    let d = drv()?;
    if f.is_null() { return Err(INVALID_VALUE); }
    out(f, kernel_function(d, k)?)
}

fn cuLibraryGetGlobal(_dptr: *mut u64, _bytes: *mut usize, lib: Handle, _name: *const c_char) {
    // Loads the library into the context; globals are not modelled: it has none.
    module_here(drv()?, lib)?;
    Err(NOT_FOUND)
}

fn cuLibraryGetManaged(_dptr: *mut u64, _bytes: *mut usize, lib: Handle, _name: *const c_char) {
    module_here(drv()?, lib)?;
    Err(NOT_FOUND)
}

fn cuLibraryGetUnifiedFunction(_fptr: *mut *mut c_void, lib: Handle, _name: *const c_char) {
    module_here(drv()?, lib)?;
    Err(NOT_FOUND)
}
}
