// The answer of the engine's `vgpu_dlsym_route` to the front's `dlsym` trampoline, shared by both crates
// (`include!`d): one definition of an ABI the two files must agree on.

/// What the `dlsym` trampoline does: return `hook` if non-zero, else tail-call `real` (a `dlsym`) with the
/// caller's arguments and return address.
#[repr(C)]
pub struct Route {
    /// Non-zero: return this to the caller.
    pub hook: usize,
    /// Otherwise: tail-call this dlsym.
    pub real: usize,
}
