//! The node's GPUs as the plugin's two extended resources. The kubelet counts devices, so each resource is
//! a set of device IDs: `vgpu.io/memory` has one per `--memory-unit` of each GPU's memory (less the vgpu
//! config's `admission_reserve`, so the scheduler never counts memory admission would refuse), and
//! `vgpu.io/compute` 100 per GPU, one per percent. An ID names its GPU: `<uuid>::<n>`, NVIDIA's own
//! plugin's form for the replicas of a shared GPU. Not here: which IDs a container should get (`prefer`),
//! what it gets for them (`allocate`).

use vgpu_host::keys::device_plugin;
use vgpu_host::nvml::HostGpu;

/// One of the plugin's extended resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    Compute,
}

impl Resource {
    /// Both, in the order they are served.
    pub const ALL: [Resource; 2] = [Resource::Memory, Resource::Compute];

    /// The resource's name, as a pod's `resources.limits` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => device_plugin::MEMORY,
            Resource::Compute => device_plugin::COMPUTE,
        }
    }

    /// The plugin's socket for it, in the kubelet's device plugin folder.
    pub fn socket(self) -> &'static str {
        match self {
            Resource::Memory => "vgpu-memory.sock",
            Resource::Compute => "vgpu-compute.sock",
        }
    }
}

/// The most devices one resource may list: the kubelet reads ListAndWatch with gRPC's default 4 MiB
/// message limit and keeps every ID in memory and in its checkpoint, so a unit that makes more IDs than this
/// is refused at start (a finer unit is for smaller nodes).
pub const MAX_DEVICES: u64 = 20_000;

/// One GPU and how many units of memory it lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// The minor number of its `/dev/nvidiaN`.
    pub minor: Option<u32>,
    /// Its memory in units (whole units only, after the reserve).
    pub memory_units: u64,
}

/// The node's GPUs as the plugin lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// Bytes per `vgpu.io/memory` device.
    pub memory_unit: u64,
}

/// A node the plugin cannot list. `Display` is one line naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    #[error("NVML lists no GPU on this node: nothing to offer")]
    NoGpu,
    #[error("--memory-unit {unit}: the node's GPUs make {count} vgpu.io/memory devices, more than the {MAX_DEVICES} the kubelet can be sent in one list; use a larger unit")]
    TooMany { unit: String, count: u64 },
}

impl Inventory {
    /// The GPUs NVML lists, each with `(memory - reserve) / unit` memory devices.
    pub fn new(
        gpus: &[HostGpu],
        memory_unit: u64,
        reserve: u64,
    ) -> Result<Inventory, InventoryError> {
        if gpus.is_empty() {
            return Err(InventoryError::NoGpu);
        }
        let gpus: Vec<Gpu> = gpus
            .iter()
            .map(|g| Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
                memory_units: g.total_memory.saturating_sub(reserve) / memory_unit,
            })
            .collect();
        let count: u64 = gpus.iter().map(|g| g.memory_units).sum();
        if count > MAX_DEVICES {
            return Err(InventoryError::TooMany {
                unit: vgpu_ledger::quantity::format_bytes(memory_unit),
                count,
            });
        }
        Ok(Inventory { gpus, memory_unit })
    }

    /// How many devices of `resource` `gpu` lists.
    pub fn units(&self, resource: Resource, gpu: &Gpu) -> u64 {
        match resource {
            Resource::Memory => gpu.memory_units,
            Resource::Compute => 100,
        }
    }

    /// Every device ID of `resource`, GPU by GPU.
    pub fn ids(&self, resource: Resource) -> Vec<String> {
        self.gpus
            .iter()
            .flat_map(|g| (0..self.units(resource, g)).map(|n| device_id(&g.uuid, n)))
            .collect()
    }

    /// The GPU whose UUID is `uuid`.
    pub fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// The ID of the `n`-th device of GPU `uuid`.
pub fn device_id(uuid: &str, n: u64) -> String {
    format!("{uuid}::{n}")
}

/// The GPU UUID an ID names (`None`: not an ID of this plugin's form).
pub fn uuid_of(id: &str) -> Option<&str> {
    let (uuid, n) = id.rsplit_once("::")?;
    n.parse::<u64>().ok().map(|_| uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, total: u64) -> HostGpu {
        HostGpu {
            index,
            uuid: format!("GPU-{index}"),
            total_memory: total,
            minor: Some(index),
        }
    }

    #[test]
    fn memory_is_whole_units_after_the_reserve_compute_a_hundred() {
        let inv = Inventory::new(&[gpu(0, 16 * GIB), gpu(1, 81559 << 20)], GIB, GIB).unwrap();
        assert_eq!(inv.gpus[0].memory_units, 15);
        // An H100's 81559 MiB less 1 GiB: 78.6 GiB, 78 whole units.
        assert_eq!(inv.gpus[1].memory_units, 78);
        let ids = inv.ids(Resource::Memory);
        assert_eq!(ids.len(), 93);
        assert_eq!(ids[0], "GPU-0::0");
        assert_eq!(ids[15], "GPU-1::0");
        assert_eq!(inv.ids(Resource::Compute).len(), 200);
    }

    #[test]
    fn an_id_names_its_gpu() {
        assert_eq!(uuid_of("GPU-fa4e::12"), Some("GPU-fa4e"));
        assert_eq!(uuid_of("GPU-fa4e"), None);
        assert_eq!(uuid_of("GPU-fa4e::x"), None);
    }

    #[test]
    fn a_unit_too_fine_for_the_kubelet_and_a_node_without_gpus_are_refused() {
        let e = Inventory::new(&[gpu(0, 80 * GIB)], 1 << 20, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--memory-unit 1.00 MiB: the node's GPUs make 81920 vgpu.io/memory devices, more than the 20000 the kubelet can be sent in one list; use a larger unit"
        );
        assert_eq!(
            Inventory::new(&[], GIB, 0).unwrap_err(),
            InventoryError::NoGpu
        );
    }
}
