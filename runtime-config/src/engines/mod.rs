//! `vgpuctl runtime configure|unconfigure`: one interface for every container engine (`api`), the engines
//! that implement it, and what they share. The engine modules are pure: they read through the `files`
//! seam and return `change` lists; `cli` writes or prints them and says what to restart.
//!
//! | module | owns |
//! | --- | --- |
//! | `api` | the `ContainerEngine` trait, its `dyn` form, `Context`, the install options every engine takes |
//! | `registry` | the list of engines (adding one: its module, and a line there) |
//! | `cli` | the `runtime` subcommand: options from the registry, the one cross-engine check, apply/print |
//! | `files` | the `Files` seam: the real disk, and a map of texts for tests |
//! | `change` | the change list, writing it atomically, `--dry-run`'s printing |
//! | `record` | vgpuctl's record of what configure changed that the engine's files cannot hold, its lock |
//! | `ownership` | whose is a `vgpu` entry, and the refusal for one that is not vgpu's |
//! | `shim` | what the shim engines share: the shim's name, `--config`, `--set-as-default`, NVIDIA's note |
//! | `error` | `EngineError`: every refusal of the room, one variant each, its line the operator reads |
//! | `syntax` | one-line parse errors naming file, line and column |
//! | `docker` | Docker's `daemon.json` |
//! | `containerd/` | containerd's `config.toml`, its imports and vgpuctl's drop-in (its own table) |
//! | `crio` | CRI-O's drop-in `crio.conf.d/99-vgpu.toml` |
//! | `podman`, `hooks` | Podman's hooks.d folder; the OCI hooks files vgpu writes there |
pub mod api;
pub mod change;
pub mod cli;
pub mod containerd;
pub mod crio;
pub mod docker;
pub mod error;
pub mod files;
pub mod hooks;
pub mod lower;
pub mod ownership;
pub mod podman;
pub mod record;
pub mod registry;
pub mod shim;
pub mod syntax;
