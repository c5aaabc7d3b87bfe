//! Generates the kubelet's device plugin API v1beta1 bindings from `proto/` (protoc, as the DRA driver's
//! build does): the plugin's server and the registration client, and the clients and registration server
//! the stand-in kubelet of the tests (`vgpu-dp-kubelet`) drives it with.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .compile_protos(&["proto/deviceplugin/v1beta1/api.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
