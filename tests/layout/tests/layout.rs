//! The layout gate, run on every crate of the workspace (the members of the root Cargo.toml and the
//! interposer's preload front, a workspace of its own): every source file opens with a `//!` comment (but
//! a fragment another file pulls in with `include!`),
//! a file that is not a test (a crate root included) has at most 600 lines, and no crate's modules import
//! each other in a circle, the crate root included (a facade: a module names an item by the module that
//! holds it, not through the root).

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
