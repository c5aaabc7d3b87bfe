// Link as the real NVML is: soname libnvidia-ml.so.1, own symbols bound locally (-Bsymbolic).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
