//! The vgpu ledger: see docs/architecture.md.
