//! The layout gate, run on every crate of the workspace (the members of the root Cargo.toml and the
//! interposer's preload front, a workspace of its own): every source file opens with a `//!` comment (but
//! a fragment another file pulls in with `include!`),
//! a file that is not a test (a crate root included) has at most 600 lines, and no crate's modules import
//! each other in a circle, the crate root included (a facade: a module names an item by the module that
//! holds it, not through the root). And the crates depend on each other one way, as docs/architecture.md's
//! table says: the interposer on the ledger crate alone, no crate on the `vgpuctl` crate.

use std::fs;
use std::path::{Path, PathBuf};
use vgpu_layout::*;

/// Every crate's `src` folder: the root manifest's members, plus `libvgpu/preload`.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members").nth(1).expect("a members list");
    let list = &members[..members.find(']').unwrap()];
    let mut out: Vec<PathBuf> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m).join("src"))
        .collect();
    out.push(root.join("libvgpu/preload/src"));
    assert!(out.len() >= 8, "the members list was read: {out:?}");
    for s in &out {
        assert!(s.is_dir(), "{} is not a folder", s.display());
    }
    out
}

#[test]
fn every_file_opens_with_what_it_holds() {
    let mut bad = Vec::new();
    for src in crate_sources() {
        let fragments = included(&src);
        for f in sources(&src) {
            if !fragments.contains(&f) && !fs::read_to_string(&f).unwrap().starts_with("//!") {
                bad.push(f.display().to_string());
            }
        }
    }
    assert!(
        bad.is_empty(),
        "files that do not open with a //! comment:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_file_but_a_test_is_longer_than_600_lines() {
    let mut bad = Vec::new();
    for src in crate_sources() {
        for f in sources(&src) {
            let lines = fs::read_to_string(&f).unwrap().lines().count();
            if lines > MAX_LINES && !is_test_file(&src, &f) {
                bad.push(format!("{} has {lines} lines", f.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "at most {MAX_LINES} lines outside tests:\n{}",
        bad.join("\n")
    );
}

/// Crates whose root is not a facade, by design: the fake NVML's root is the C surface it exports, whose
/// helpers (`addressing`, `utilisation`) take the root's handle table and return codes. Their roots are
/// left out of the circle check (every other crate's root counts: it names each module it declares).
const ROOT_NOT_A_FACADE: &[&str] = &["tests/fake-nvml/src"];

#[test]
fn no_crate_has_an_import_circle() {
    let mut bad = Vec::new();
    let mut edges_seen = 0;
    for src in crate_sources() {
        let g = match ROOT_NOT_A_FACADE.iter().any(|c| src.ends_with(c)) {
            true => without_root(graph(&src)),
            false => graph(&src),
        };
        edges_seen += g.values().map(|e| e.len()).sum::<usize>();
        for c in circles(&g) {
            let names: Vec<String> = c.iter().map(show).collect();
            bad.push(format!("{}: {}", src.display(), names.join(" <-> ")));
        }
    }
    assert!(
        edges_seen > 100,
        "the scan sees imports ({edges_seen} edges)"
    );
    assert!(
        bad.is_empty(),
        "import circles (modules that import each other, super:: included):\n{}",
        bad.join("\n")
    );
}

/// The vgpu crates each of vgpu's crates may depend on (its `[dependencies]`; tests' own are free), as
/// docs/architecture.md's table lists them: one way, top to bottom.
const MAY_DEPEND_ON: &[(&str, &[&str])] = &[
    (
        "runtime-config",
        &["vgpu-monitor", "vgpu-oci", "vgpu-host", "vgpu-ledger"],
    ),
    ("dra", &["vgpu-host", "vgpu-ledger"]),
    ("device-plugin", &["vgpu-host", "vgpu-ledger"]),
    ("monitor", &["vgpu-host", "vgpu-ledger"]),
    ("oci-hook", &["vgpu-host", "vgpu-ledger"]),
    ("host", &["vgpu-ledger"]),
    ("libvgpu", &["vgpu-ledger"]),
    ("ledger", &[]),
];

/// The path dependencies of a manifest's `[dependencies]` table, by name (`name = { path = ... }`).
fn path_dependencies(manifest: &str) -> Vec<String> {
    let Some(table) = manifest.split("\n[dependencies]\n").nth(1) else {
        return Vec::new();
    };
    let table = table.split("\n[").next().unwrap_or("");
    table
        .lines()
        .filter(|l| l.contains("path = "))
        .filter_map(|l| l.split('=').next())
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn crates_depend_on_each_other_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut bad = Vec::new();
    for (folder, allowed) in MAY_DEPEND_ON {
        let manifest = fs::read_to_string(root.join(folder).join("Cargo.toml")).unwrap();
        let deps = path_dependencies(&manifest);
        if *folder != "ledger" {
            assert!(!deps.is_empty(), "{folder}: no path dependency read");
        }
        for d in deps {
            if !allowed.contains(&d.as_str()) {
                bad.push(format!("{folder} depends on {d}"));
            }
        }
    }
    // No crate at all, tests included, depends on the vgpuctl crate (its library is the binary's own).
    for src in crate_sources() {
        let manifest = fs::read_to_string(src.with_file_name("Cargo.toml")).unwrap();
        if path_dependencies(&manifest).iter().any(|d| d == "vgpuctl") {
            bad.push(format!("{} depends on vgpuctl", src.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "dependencies against docs/architecture.md's table: {bad:?}"
    );
}

#[test]
fn path_dependencies_are_read_from_the_dependencies_table_only() {
    let m = "[package]\nname = \"x\"\n[dependencies]\na = { path = \"../a\" }\nserde = \"1\"\n\n[dev-dependencies]\nb = { path = \"../b\" }\n";
    assert_eq!(path_dependencies(m), ["a"]);
    assert!(path_dependencies("[package]\n").is_empty());
}
