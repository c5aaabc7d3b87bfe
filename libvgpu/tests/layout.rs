//! The engine's layout rules, checked on its sources: modules import each other without a circle, the
//! exit/panic guard imports nothing of the crate, and every file is short and says what it holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's top-level module a file belongs to ("" for lib.rs).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").replace("lib", "")
}

/// Top-level modules named through `crate::` in `text`.
fn crate_refs(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                out.insert(name);
            } else if rest.starts_with('{') {
                let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
                for part in group.split(',') {
                    let n: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if modules.contains(&n) {
                        out.insert(n);
                    }
                }
            }
        }
    }
    out
}

fn graph() -> (BTreeMap<String, BTreeSet<String>>, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(&src, f))
        .filter(|m| !m.is_empty())
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = top_module(&src, f);
        if m.is_empty() {
            continue;
        }
        let refs = crate_refs(&fs::read_to_string(f).unwrap(), &modules);
        edges
            .entry(m.clone())
            .or_default()
            .extend(refs.into_iter().filter(|r| *r != m));
    }
    (edges, files)
}

#[test]
fn modules_import_each_other_without_a_circle() {
    let (edges, _) = graph();
    assert!(
        edges.contains_key("hooks") && edges["hooks"].contains("driver"),
        "the scan sees imports: {edges:?}"
    );
    // Depth-first search for a back edge.
    fn visit<'a>(
        m: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(i) = path.iter().position(|p| *p == m) {
            panic!("import circle: {} -> {m}", path[i..].join(" -> "));
        }
        path.push(m);
        for n in edges.get(m).into_iter().flatten() {
            visit(n, edges, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_guard_is_a_leaf() {
    let (edges, _) = graph();
    assert_eq!(
        edges.get("guard").map(|e| e.len()),
        Some(0),
        "guard imports {:?}",
        edges.get("guard")
    );
}

#[test]
fn every_file_is_short_and_opens_with_what_it_holds() {
    let (_, files) = graph();
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        let lines = text.lines().count();
        assert!(
            lines <= 600,
            "{} has {lines} lines (at most 600)",
            f.display()
        );
        assert!(
            text.starts_with("//!"),
            "{} does not open with a //! comment",
            f.display()
        );
    }
}
