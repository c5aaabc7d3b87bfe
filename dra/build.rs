//! Generates the kubelet's plugin registration and DRA v1 gRPC bindings from `proto/` (protoc, as
//! tests/cri-client's k8s-cri does): both the servers the plugin serves and the clients the stand-in kubelet
//! (`vgpu-dra-kubelet`) drives them with.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/pluginregistration/v1/api.proto",
            "proto/dra/v1/api.proto",
        ],
        &["proto"],
    )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
