//! The layout rules of `src/engines/`, checked on its sources: every file short (≤ 600 lines) and saying
//! what it holds (`//!`), no import circle between its modules (a folder's `mod.rs` sits above its files,
//! so a file importing from its `mod.rs` — `super::Item` — is a circle too), and the engine modules pure:
//! no filesystem or process call outside the `files` seam, `change` (which writes) and `record`'s lock.
//! Test code (`#[cfg(test)]` modules, `#![cfg(test)]` files) is left out of the import and purity rules.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engines")
}

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

/// The module a file is: "docker", "containerd" (its mod.rs), "containerd/handler"; "" for engines/mod.rs.
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(root()).unwrap().with_extension("");
    let rel = rel.to_string_lossy().into_owned();
    match rel.strip_suffix("mod") {
        Some(folder) => folder.trim_end_matches('/').to_string(),
        None => rel,
    }
}

fn parent(m: &str) -> Option<String> {
    if m.is_empty() {
        return None;
    }
    Some(
        m.rsplit_once('/')
            .map(|(p, _)| p.to_string())
            .unwrap_or_default(),
    )
}

fn join(m: &str, child: &str) -> String {
    if m.is_empty() {
        child.to_string()
    } else {
        format!("{m}/{child}")
    }
}

/// The file's code outside its tests and comments.
fn non_test(text: &str) -> String {
    if text.lines().any(|l| l.trim() == "#![cfg(test)]") {
        return String::new();
    }
    let code = match text.find("\n#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let n = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..n]
}

/// The deepest modules a path names from module `at`: `a::b::Item` walks into `a`, then `a/b` while they
/// are modules; a group `{a, b::c}` walks each.
fn walk(at: &str, path: &str, modules: &BTreeSet<String>, out: &mut BTreeSet<String>) {
    if let Some(g) = path.strip_prefix('{') {
        let g = &g[..g.find('}').unwrap_or(g.len())];
        for part in g.split(',') {
            walk(at, part.trim(), modules, out);
        }
        return;
    }
    let id = ident(path);
    let next = join(at, id);
    if id.is_empty() || !modules.contains(&next) {
        out.insert(at.to_string());
        return;
    }
    match path[id.len()..].strip_prefix("::") {
        Some(rest) => walk(&next, rest, modules, out),
        None => {
            out.insert(next);
        }
    }
}

/// The modules a module's code names through `super::` or `crate::engines::`.
fn refs(m: &str, code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        rest = &rest[i..];
        let mut base = Some(m.to_string());
        while let Some(r) = rest.strip_prefix("super::") {
            base = base.and_then(|b| parent(&b));
            rest = r;
        }
        if let Some(b) = base {
            walk(&b, rest, modules, &mut out);
        }
    }
    let mut rest = code;
    while let Some(i) = rest.find("crate::engines") {
        rest = &rest[i + "crate::engines".len()..];
        match rest.strip_prefix("::") {
            Some(r) => walk("", r, modules, &mut out),
            None => {
                out.insert(String::new());
            }
        }
    }
    out.remove(m);
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(f);
        let code = non_test(&fs::read_to_string(f).unwrap());
        edges
            .entry(m.clone())
            .or_default()
            .extend(refs(&m, &code, &modules));
        // A folder's module sits above its files.
        if let Some(p) = parent(&m) {
            edges.entry(p).or_default().insert(m.clone());
        }
    }
    edges
}

#[test]
fn engine_modules_import_each_other_without_a_circle() {
    let edges = graph();
    assert!(
        edges["containerd/main_file"].contains("containerd/imports")
            && edges["docker"].contains("api")
            && edges["registry"].contains("containerd"),
        "the scan sees imports: {edges:?}"
    );
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

/// The scan finds a circle through a `mod.rs` when there is one.
#[test]
fn the_scan_sees_a_circle_through_a_folder_module() {
    let modules: BTreeSet<String> = ["", "containerd", "containerd/handler", "files"]
        .map(String::from)
        .into();
    let r = refs(
        "containerd/handler",
        "use super::Settings;\nuse crate::engines::files::{Files, Disk};\n",
        &modules,
    );
    assert_eq!(r, ["containerd", "files"].map(String::from).into());
    let r = refs(
        "containerd",
        "use super::super::x;\nuse super::{files, Change};\n",
        &modules,
    );
    assert_eq!(r, ["", "files"].map(String::from).into());
}

#[test]
fn every_file_is_short_and_says_what_it_holds() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        let lines = text.lines().count();
        assert!(
            lines <= 600,
            "{} has {lines} lines (at most 600)",
            f.display()
        );
        assert!(text.starts_with("//!"), "{} has no //! header", f.display());
    }
}

/// The engine modules read through `Files` and return changes: no filesystem or process call of their own.
#[test]
fn engine_modules_are_pure() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    // `error` calls nothing; it names the seams' own error types (fsutil's `FileError`) among the room's.
    let seams = ["files", "change", "record", "cli", "error"];
    for f in files {
        let m = module_of(&f);
        if seams.contains(&m.as_str()) {
            continue;
        }
        let code = non_test(&fs::read_to_string(&f).unwrap());
        for bad in ["std::fs", "fs::", "process::", "fsutil", "Disk"] {
            assert!(
                !code.contains(bad),
                "{} calls {bad} outside the Files seam",
                f.display()
            );
        }
    }
}
