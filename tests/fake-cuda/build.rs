// Link as the real driver is: soname libcuda.so.1, and -Bsymbolic so that our own calls and the
// pointers cuGetProcAddress hands out bind to our functions even when an interposer that exports
// the same names is preloaded in front of us.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
