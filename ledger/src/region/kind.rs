//! `Kind`: what an amount of device memory is for (usage is kept per slot and per kind), with its names.
//! Only the enum and its conversions; where the per-kind counters live in the file is `format`'s business.

use super::format::KINDS;
use std::fmt;

/// What an amount of device memory is for; usage is kept per slot and per kind.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Context = 0,
    Module = 1,
    Data = 2,
    Array = 3,
    AsyncPool = 4,
    Vmm = 5,
    Managed = 6,
    Graph = 7,
}

impl Kind {
    pub const ALL: [Kind; KINDS] = [
        Kind::Context,
        Kind::Module,
        Kind::Data,
        Kind::Array,
        Kind::AsyncPool,
        Kind::Vmm,
        Kind::Managed,
        Kind::Graph,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Context => "context",
            Kind::Module => "module",
            Kind::Data => "data",
            Kind::Array => "array",
            Kind::AsyncPool => "async_pool",
            Kind::Vmm => "vmm",
            Kind::Managed => "managed",
            Kind::Graph => "graph",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: usize) -> Option<Kind> {
        Kind::ALL.get(i).copied()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(Kind::ALL.len(), KINDS);
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(Kind::from_index(i), Some(*k));
        }
        assert_eq!(Kind::from_index(8), None);
        let names: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "context",
                "module",
                "data",
                "array",
                "async_pool",
                "vmm",
                "managed",
                "graph"
            ]
        );
    }
}
