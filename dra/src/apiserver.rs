//! What the plugin asks of the API server, through `kube`: publishing the node's ResourceSlice
//! (server-side apply, so a restart replaces it whole) and reading a claim the kubelet asks to prepare.
//! The driver's RBAC in the chart grants exactly these: `resourceslices` get/create/update/patch and
//! `resourceclaims` get. Not here: what the slice holds (`crate::slice`).

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};

/// The field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "vgpu-dra-plugin";

/// Creates or replaces the node's slice.
pub async fn publish(client: &kube::Client, slice: &ResourceSlice) -> Result<(), kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(slice),
    )
    .await?;
    Ok(())
}

/// The claim `namespace/name`.
pub async fn claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ResourceClaim, kube::Error> {
    Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .get(name)
        .await
}
