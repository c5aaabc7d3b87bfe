//! The driver surface held to the hooks (tests only): every entry point of the CUDA headers and of the
//! real driver's exports is classified in `libvgpu/abi/surface.tsv` (generated from the headers and
//! `libvgpu/abi/classes.txt` by `libvgpu/abi/gen/surface.py`), and every one that charges, holds memory,
//! launches, synchronises or is refused must be hooked under each of its names (`libvgpu/abi/symbols.rs`, which
//! builds the `dlsym` and `cuGetProcAddress` routing), unless `classes.txt` lists it as a known gap.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Classes whose every entry point must be hooked.
const HOOKED: [&str; 5] = ["charge", "hold", "launch", "sync", "refuse"];
const CLASSES: [&str; 7] = [
    "charge", "hold", "launch", "sync", "refuse", "query", "pass",
];

/// One row of surface.tsv.
struct Row {
    name: String,
    base: String,
    src: String,
    class: String,
    gap: String,
}

fn abi(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("abi").join(file);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn table() -> Vec<Row> {
    abi("surface.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 6, "surface.tsv: bad row {l:?}");
            Row {
                name: f[0].into(),
                base: f[1].into(),
                src: f[3].into(),
                class: f[4].into(),
                gap: f[5].into(),
            }
        })
        .collect()
}

/// classes.txt: the ordered (class, pattern) rules and the known gaps (entry point -> issue item).
fn rules() -> (Vec<(String, String)>, BTreeMap<String, String>) {
    let (mut order, mut gaps) = (Vec::new(), BTreeMap::new());
    for line in abi("classes.txt").lines() {
        let words: Vec<&str> = line.split('#').next().unwrap().split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["gap", item, names @ ..] => {
                for n in names {
                    gaps.insert(n.to_string(), item.to_string());
                }
            }
            [class, pats @ ..] if CLASSES.contains(class) => {
                order.extend(pats.iter().map(|p| (class.to_string(), p.to_string())))
            }
            _ => panic!("classes.txt: bad line {line:?}"),
        }
    }
    (order, gaps)
}

/// `*`-glob match of a whole name.
fn glob(pat: &str, name: &str) -> bool {
    match pat.split_once('*') {
        None => pat == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|i| glob(rest, &name[head.len() + i..]))
        }
    }
}

fn classify(order: &[(String, String)], base: &str) -> String {
    order
        .iter()
        .find(|(_, p)| glob(p, base))
        .map_or("unclassified".into(), |(c, _)| c.clone())
}

/// The CUDA names libvgpu hooks, as `libvgpu/abi/symbols.rs` lists them.
fn hooked() -> BTreeSet<String> {
    let names: BTreeSet<String> = crate::interpose::hooked_names()
        .filter(|n| n.starts_with("cu"))
        .map(String::from)
        .collect();
    assert!(names.contains("cuMemAlloc_v2"), "the hook table is read");
    names
}

#[test]
fn globs_match_whole_names() {
    assert!(glob("cuMemcpy*", "cuMemcpyHtoD"));
    assert!(glob("cuGraph*Get*", "cuGraphKernelNodeGetParams"));
    assert!(!glob("cuGraph*Get*", "cuGraphLaunch"));
    assert!(!glob("cuMemAlloc", "cuMemAllocManaged"));
    assert!(glob("cu*", "cu"));
}

#[test]
fn every_header_entry_is_classified_as_the_rules_say() {
    let (order, gaps) = rules();
    let rows = table();
    assert!(rows.len() > 700, "the table lists the whole surface");
    let unclassified: Vec<&str> = rows
        .iter()
        .filter(|r| !CLASSES.contains(&r.class.as_str()))
        .map(|r| r.name.as_str())
        .collect();
    assert!(
        unclassified.is_empty(),
        "unclassified entry points (add them to libvgpu/abi/classes.txt, then run `make surface`): {unclassified:?}"
    );
    for r in &rows {
        let want = classify(&order, &r.base);
        let gap = gaps.get(&r.name).map_or("-", |g| g.as_str());
        assert!(
            want == r.class && gap == r.gap,
            "{}: surface.tsv says {} / gap {}, classes.txt says {want} / gap {gap}: run `make surface`",
            r.name,
            r.class,
            r.gap
        );
    }
    let named: BTreeSet<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    for g in gaps.keys() {
        assert!(named.contains(g.as_str()), "gap {g} is no entry point");
    }
}

#[test]
fn every_charging_launching_synchronising_or_refused_entry_is_hooked_under_every_name() {
    let hooked = hooked();
    let (mut missing, mut closed, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
    for r in table()
        .iter()
        .filter(|r| HOOKED.contains(&r.class.as_str()))
    {
        match (hooked.contains(&r.name), r.gap != "-") {
            (false, false) => missing.push(format!("{} ({})", r.name, r.class)),
            (true, true) => closed.push(r.name.clone()),
            (false, true) => gaps.push(format!("{} ({}) -> issue {}", r.name, r.class, r.gap)),
            (true, false) => {}
        }
    }
    // The known gaps, by name, every run: the list is meant to shrink.
    eprintln!("driver surface: {} known gaps:", gaps.len());
    for g in &gaps {
        eprintln!("  gap: {g}");
    }
    assert!(
        missing.is_empty(),
        "entry points of a hooked class that are not hooked (hook them in libvgpu/abi/symbols.rs, or list them as a gap in classes.txt): {missing:?}"
    );
    assert!(
        closed.is_empty(),
        "hooked now, still listed as gaps (remove them from classes.txt, then `make surface`): {closed:?}"
    );
}

#[test]
fn every_hook_is_an_entry_point_of_the_table() {
    let rows = table();
    let names: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.class.as_str()))
        .collect();
    for h in hooked() {
        assert!(
            names.contains_key(h.as_str()),
            "{h} is hooked but neither the headers nor the driver know it"
        );
    }
}

#[test]
fn the_real_drivers_exports_are_all_in_the_table() {
    let exports: BTreeSet<String> = abi("libcuda-exports.txt")
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(exports.len(), 707, "driver 580.159.04 exports 707 names");
    let rows = table();
    let exported: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.src == "both" || r.src == "export")
        .map(|r| r.name.clone())
        .collect();
    let missing: Vec<&String> = exports.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "exported by the driver, not in surface.tsv: {missing:?}"
    );
    let extra: Vec<&String> = exported.difference(&exports).collect();
    assert!(
        extra.is_empty(),
        "surface.tsv says exported, the driver does not: {extra:?}"
    );
    // What the headers declare and driver 580 does not export (told, not failed: a newer header may).
    let header_only: Vec<&str> = rows
        .iter()
        .filter(|r| r.src == "header")
        .map(|r| r.name.as_str())
        .collect();
    eprintln!("declared by the headers, not exported by driver 580.159.04: {header_only:?}");
}

#[test]
fn the_rendered_table_in_docs_is_current() {
    let rows = table();
    let count = |c: &str| rows.iter().filter(|r| r.class == c).count();
    let line = format!(
        "Counts (entry points): {}, total {}.",
        CLASSES
            .iter()
            .map(|c| format!("{c} {}", count(c)))
            .collect::<Vec<_>>()
            .join(", "),
        rows.len()
    );
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/driver-surface.md");
    let doc = fs::read_to_string(&p).unwrap();
    assert!(
        doc.contains(&line),
        "docs/driver-surface.md is stale (run `make surface`): wants {line:?}"
    );
    for r in rows.iter().filter(|r| r.gap != "-") {
        assert!(
            doc.contains(&format!("- `{}` ({}) → {}", r.name, r.class, r.gap)),
            "docs/driver-surface.md does not list the gap {}",
            r.name
        );
    }
}
