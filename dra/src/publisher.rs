//! Keeping the node's ResourceSlice true: at start the node's slices of this driver that the API server
//! already has are read, every one but ours is stale (an older name, a renamed driver's leftovers of this
//! node) and goes, and ours continues the pool's generation one past the highest seen, so the scheduler
//! takes the restarted plugin's slice over any it cached; afterwards the GPUs are read again every
//! interval and a change (a GPU gone or added, its memory changed, another driver) is published at the next generation.
//! Each slice names the Node as its owner, so it goes with the node. Not here: what a slice holds
//! (`crate::slice`), the API calls (`crate::apiserver`).

use crate::node_gpus::NodeGpu;
use crate::slice;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// What was published last, and for whom.
#[derive(Debug, Clone)]
pub struct Publisher {
    driver: String,
    node: String,
    owner: OwnerReference,
    generation: i64,
    gpus: Vec<NodeGpu>,
    /// The last slice was not published: the next rescan publishes even without a change.
    unpublished: bool,
}

/// What start found and decided.
#[derive(Debug, Clone)]
pub struct Start {
    pub publisher: Publisher,
    /// The slice to publish now.
    pub slice: ResourceSlice,
    /// Names of the node's stale slices, to delete.
    pub stale: Vec<String>,
}

/// The owner reference to Node `node` (uid `uid`).
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

impl Publisher {
    /// Starts from `existing` (the API server's slices of this driver on this node) with `gpus`.
    pub fn start(
        driver: &str,
        node: &str,
        node_uid: &str,
        existing: &[ResourceSlice],
        gpus: &[NodeGpu],
    ) -> Start {
        let ours = slice::slice_name(node, driver);
        let last = existing
            .iter()
            .filter(|s| s.spec.pool.name == node)
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let stale = existing
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .filter(|n| *n != ours)
            .collect();
        let publisher = Publisher {
            driver: driver.to_string(),
            node: node.to_string(),
            owner: node_owner(node, node_uid),
            generation: last + 1,
            gpus: gpus.to_vec(),
            unpublished: false,
        };
        Start {
            slice: publisher.slice(),
            publisher,
            stale,
        }
    }

    /// The pool's generation of the slice published last.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The slice to publish when `gpus` differ from those published last (at the next generation); None
    /// when nothing changed.
    pub fn rescan(&mut self, gpus: &[NodeGpu]) -> Option<ResourceSlice> {
        if gpus == self.gpus.as_slice() && !self.unpublished {
            return None;
        }
        self.gpus = gpus.to_vec();
        self.unpublished = false;
        self.generation += 1;
        Some(self.slice())
    }

    /// The slice `rescan` gave could not be published: the next rescan gives one again.
    pub fn retry(&mut self) {
        self.unpublished = true;
    }

    fn slice(&self) -> ResourceSlice {
        let mut s = slice::build(&self.driver, &self.node, &self.gpus);
        s.spec.pool.generation = self.generation;
        s.metadata.owner_references = Some(vec![self.owner.clone()]);
        s
    }
}

#[cfg(test)]
mod tests;
