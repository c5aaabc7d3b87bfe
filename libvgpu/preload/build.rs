// Link the front as compactly as the loader allows: every process of the container maps it, so each
// page and segment it spares is spared on every `ls` and `bash`. One read-execute segment instead of
// separate read-only and executable ones, and no RELRO (its mprotect and separate read-write segment
// protect a handful of GOT entries that the front never writes after load).
// No libdl: the dl functions are found at first use (src/libdl.rs).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-rosegment");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,norelro");
}
