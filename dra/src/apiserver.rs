//! What the plugin asks of the API server, through `kube`: its Node (the owner its slices name, so they
//! go with the node), the node's ResourceSlices of this driver (to delete stale ones and continue the
//! pool's generation at start), publishing the node's slice (server-side apply, replaced whole) and
//! reading a claim the kubelet asks to prepare. The driver's RBAC in the chart grants exactly these:
//! `nodes` get, `resourceslices` get/list/create/update/patch/delete and `resourceclaims` get. Not here:
//! what the slice holds (`crate::slice`), which slices are stale (`crate::publisher`).

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

/// The field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "vgpu-dra-plugin";

/// The uid of Node `name`.
pub async fn node_uid(client: &kube::Client, name: &str) -> Result<String, kube::Error> {
    let node = Api::<Node>::all(client.clone()).get(name).await?;
    Ok(node.metadata.uid.unwrap_or_default())
}

/// The ResourceSlices of `driver` on node `node` (the fields ResourceSlices may be selected by).
pub async fn node_slices(
    client: &kube::Client,
    driver: &str,
    node: &str,
) -> Result<Vec<ResourceSlice>, kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
    Ok(api.list(&lp).await?.items)
}

/// Deletes slice `name`; one already gone is no error.
pub async fn delete_slice(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

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
