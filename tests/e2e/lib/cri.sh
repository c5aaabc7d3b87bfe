# A private containerd with its CRI plugin, driven by the kubelet stand-in (tests/cri-client).
#   oci_image_tar DIR NAME TAR CMD...  an OCI image archive of rootfs DIR named NAME (`ctr images import`
#                                      reads it; nothing is pulled), its default command CMD
#   cri_start DIR SANDBOX_IMAGE        containerd on DIR/containerd.sock (own root, state, config): CRI on,
#                                      `sandbox_image` SANDBOX_IMAGE, native snapshotter, no CNI (pods use
#                                      the node's network), the `vgpu` handler as `vgpuctl runtime configure
#                                      --runtime=containerd` writes it (BinaryName $SHIM); exports CRI_SOCK
#   cri_import TAR                     imports an image archive into the CRI's namespace (k8s.io)
#   cri_stop                           stops that containerd and unmounts what it left under DIR
#   cri ARGS...                        runs the stand-in on CRI_SOCK
# Needs $VGPUCTL (vgpuctl) and VGPU_CONFIG set (lib/vgpu.sh) before cri_start: containerd passes its
# environment to the shims, and they to vgpu-container-runtime.
CRI_CLIENT=$T/release/vgpu-cri-client
_CRI_PID=
_CRI_DIR=

oci_image_tar() {
    local dir=$1 name=$2 tar=$3; shift 3
    python3 - "$dir" "$name" "$tar" "$@" <<'PY'
import hashlib, io, json, sys, tarfile
src, name, out, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as t:
    t.add(src, arcname=".")
layer = layer.getvalue()
def blob(data, media):
    d = hashlib.sha256(data).hexdigest()
    return {"mediaType": media, "digest": "sha256:" + d, "size": len(data)}, ("blobs/sha256/" + d, data)
diff = "sha256:" + hashlib.sha256(layer).hexdigest()
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
                     "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
ldesc, lfile = blob(layer, "application/vnd.oci.image.layer.v1.tar")
cdesc, cfile = blob(config, "application/vnd.oci.image.config.v1+json")
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": cdesc, "layers": [ldesc]}).encode()
mdesc, mfile = blob(manifest, "application/vnd.oci.image.manifest.v1+json")
mdesc["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
index = json.dumps({"schemaVersion": 2, "manifests": [mdesc]}).encode()
with tarfile.open(out, "w") as t:
    for path, data in [lfile, cfile, mfile, ("index.json", index), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]:
        info = tarfile.TarInfo(path); info.size = len(data)
        t.addfile(info, io.BytesIO(data))
PY
}

cri_start() {
    _CRI_DIR=$1
    local sandbox_image=$2 cfg=$1/containerd.toml
    mkdir -p "$1/root" "$1/state" "$1/cni-conf" "$1/cni-bin"
    cat > "$cfg" <<TOML
version = 2
root = "$1/root"
state = "$1/state"
[grpc]
  address = "$1/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$sandbox_image"
  # The pause container asks for oom_score_adj -998, below what a test machine may let even root set.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "$1/cni-conf"
    bin_dir = "$1/cni-bin"
TOML
    "$VGPUCTL" runtime configure --runtime=containerd --config "$cfg" --runtime-path "$SHIM" > /dev/null || return 1
    containerd --config "$cfg" > "$1/containerd.log" 2>&1 &
    _CRI_PID=$!
    CRI_SOCK=$1/containerd.sock
    export CRI_SOCK
    wait_for 20 "$CRI_CLIENT" --socket "$CRI_SOCK" version
}

cri_import() {
    ctr -a "$CRI_SOCK" -n k8s.io images import --snapshotter native "$1" > /dev/null
}

cri_stop() {
    [ -n "$_CRI_PID" ] || return 0
    kill "$_CRI_PID" 2>/dev/null && wait "$_CRI_PID" 2>/dev/null
    _CRI_PID=
    # The shims outlive containerd by design: end the ones of this instance (their sockets name its state).
    local p
    for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $CRI_SOCK" || true); do kill -9 "$p" 2>/dev/null; done
    grep -o " $_CRI_DIR/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    return 0
}

cri() { "$CRI_CLIENT" --socket "$CRI_SOCK" "$@"; }
