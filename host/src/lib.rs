//! vgpu's host side, the rooms the runtime shim, the hook, vgpuctl, the monitor and the DRA driver share.
//! Not here: anything the interposer links (that is `vgpu_ledger`, kept lean), a tool's own decisions
//! (reading a spec and planning its quota: `vgpu_oci`; status: `vgpuctl`; the monitor: `vgpu_monitor`).
//!
//! * [`config`]: `/etc/vgpu/config.toml`, the whole file (its `[monitor]` table too), parsed once into
//!   typed values.
//! * [`nvml`]: the one NVML binding of the host tools, behind the [`nvml::Nvml`] trait, with a fake.
//! * [`state_root`]: the state root on the host and each container's paths under it.
//! * [`walk`]: the walk over the state root's container folders (markers, leftovers, what is not ours).
//! * [`inventory`]: the one reader of the state root: containers, their limits, ledgers and owners,
//!   always through the safe host-file reader.
//! * [`procs`]: a host process as `/proc` shows it (its innermost PID, namespace and cgroup), for the
//!   attribution of NVML's processes to containers.
//! * [`cdi`]: vgpu's devices as a Container Device Interface spec (`vgpuctl cdi generate`, the DRA driver's
//!   per-claim specs).
//! * [`usage`]: each container's quotas and its ledgers' figures, from the inventory, and which are live.
//! * [`attribution`]: which container each GPU process NVML lists belongs to, and what each truly holds.
//! * [`held`]: what a container holds by NVML now (`vgpuctl update`'s shrink), attributed as the watchdog
//!   attributes.
//! * [`shrink`]: what a container may still hold on a GPU while a shrink of its quota is pending.
//! * [`removal`]: removing a container's state folder, only one vgpu made.
//! * [`gc`], [`abandoned`]: the garbage collector (every hook, `vgpuctl gc`) and state whose create was killed.
//! * [`creator`]: the process that provisions a container's state, told apart from a later one with its PID.
//! * [`memory_limit`]: a memory quota given as a quantity (the config file, the annotations, `vgpuctl update`).
//! * [`compute_share`]: a compute share's limit or request as a whole percent (the annotations, `vgpuctl
//!   update`).
//! * [`request`]: one GPU of a container with what it asks there, memory quota and compute share together.
//! * [`admission`]: the node's committed quotas against each GPU, under the node lock (the shim's and the
//!   hook's creates, `vgpuctl update`).
//! * [`division`]: how one GPU's time is divided among its tenants' requests and limits (the monitor's
//!   share wall; the library converges on the same rules without calling it).
//! * [`driver_root`]: the node's NVML under a driver root mounted into a node daemon's pod.
//! * [`driverlimit`]: a container's quotas set as its cgroup's limits in the driver (NVML r615+).
//! * [`cgroup`]: a container's cgroup folder on the host, from its recorded path (the monitor's freezer)
//!   or from a live process (`driverlimit`).
//! * [`logging`]: the logs of the shim, the hook and vgpuctl (`tracing`, by the config's `log_*` keys).
//! * [`version`]: the version and commit every host binary prints.
//! * [`keys`]: the names only the host tools use (binaries, the hooks' `PATH`, CDI kinds, the DRA driver's).
//! * [`printable`]: a tenant's text (names, image paths) made safe for a log line or a terminal.
//! * [`atomic`]: replacing a file atomically (every writer of vgpu uses it).
//! * [`hami`]: HAMi's per-container folders and the ledgers vgpu's library makes there, read as a
//!   tenant's files (the monitor and `vgpuctl status` under HAMi's device plugin).
//! * [`hostfile`]: host-side reads of state files a tenant can reach (no link followed, never blocking):
//!   limits files, ledgers (`read_ledger`), the monitor's records.
//! * [`limits_file`]: limits.json as the host writes it (validated, capped, replaced atomically).
//! * [`turn_write`]: the time-quanta arbiter's writes into a container's ledger (its turn and heartbeat).
//! * [`live`]: a live update's write into a running container (`vgpuctl update`): its mounted limits file
//!   rewritten in place between two generations of its ledgers.

pub mod abandoned;
pub mod admission;
pub mod atomic;
pub mod attribution;
pub mod cdi;
pub mod cgroup;
pub mod compute_share;
pub mod config;
pub mod creator;
pub mod division;
pub mod driver_root;
pub mod driverlimit;
pub mod gc;
pub mod hami;
pub mod held;
pub mod hostfile;
pub mod inventory;
pub mod keys;
pub mod limits_file;
pub mod live;
pub mod logging;
pub mod memory_limit;
pub mod nvml;
pub mod printable;
pub mod procs;
pub mod removal;
pub mod request;
pub mod shrink;
pub mod state_root;
pub mod turn_write;
pub mod usage;
pub mod version;
pub mod walk;
