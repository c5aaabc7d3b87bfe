//! The workspace's layout rules as a library the layout test runs on every crate: each source file opens
//! with a `//!` comment saying what it holds, a file that is not a test has at most 600 lines, and the
//! modules of a crate import each other without a circle.
//!
//! A module is a file (`a/b.rs` and `a/b/mod.rs` are `a::b`). Its imports are the paths it names:
//! `crate::…`, `self::…`, `super::…` (each `super` one level up) and a child module named bare
//! (`child::f()`), each resolved to the longest module path that exists; a path to an item of an
//! enclosing module (`super::Engine`) is an edge to that module. So a `mod.rs` that re-exports its
//! children while they take shared items from it is a circle: shared items live in a sibling module.
//! The crate root counts as a module like any other, and it names every module it declares (`mod a;`): it
//! is the crate's facade, so a module that names an item through it (`crate::Item`, for what the root
//! re-exports or defines) is in a circle with it; a module names an item by the module that holds it
//! (`crate::collector::Monitor`).
//! The scan is textual (comments and string literals are blanked first), which is enough for code that
//! names its imports by path, as this workspace does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a source file that is not a test may have.
pub const MAX_LINES: usize = 600;

/// A module's path inside its crate: `[]` for the crate root, `["region", "commit"]` for
/// `region/commit.rs` or `region/commit/mod.rs`.
pub type ModPath = Vec<String>;

/// Every `.rs` file under `dir`, sorted.
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The files a crate's sources pull in with `include!("…")`: fragments of another module (a generated
/// table), not modules of their own, so they have no `//!` header and no place in the import graph.
pub fn included(src: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in sources(src) {
        let text = fs::read_to_string(&f).unwrap_or_default();
        for part in text.split("include!(\"").skip(1) {
            if let Some(end) = part.find('"') {
                if let Some(dir) = f.parent() {
                    out.push(dir.join(&part[..end]));
                }
            }
        }
    }
    out
}

/// The module path of `file` under the crate's `src`; `None` for the roots of binaries under `src/bin`,
/// which are crates of their own.
pub fn module_path(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.trim_end_matches(".rs");
    // Only a file named exactly lib.rs, main.rs or mod.rs stands for its folder.
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if !(is_root || stem == "mod") {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// Whether a file is a test: `tests.rs`, `testing.rs` or anything under a `tests` folder.
pub fn is_test_file(src: &Path, file: &Path) -> bool {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs"
        || name == "testing.rs"
        || rel
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

/// `text` with comments and the contents of string and char literals blanked, line breaks kept.
pub fn blank_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && !prev_ident(b, i)
        {
            // Raw string: r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                if b[j] == b'\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as 'x' (a lifetime has no closing quote two bytes on).
            out.push_str("' '");
            i += 3;
        } else if c == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let end = b[i + 2..]
                .iter()
                .position(|&x| x == b'\'')
                .map_or(b.len(), |p| i + 3 + p);
            out.push_str("' '");
            i = end;
        } else {
            // Copy one whole UTF-8 character.
            let len = utf8_len(c);
            out.push_str(&text[i..(i + len).min(text.len())]);
            i += len;
        }
    }
    out
}

/// `text` (already without comments and strings) with the bodies of inline modules (`mod tests { … }`)
/// blanked: inside them `super::` names the file's own module, and they are tests as a rule.
pub fn blank_inline_modules(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("mod ") && !prev_ident(b, i) {
            let name_end = text[i + 4..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(b.len(), |p| i + 4 + p);
            let after = text[name_end..].trim_start();
            if after.starts_with('{') {
                let open = b.len() - after.len();
                let mut depth = 0;
                let mut j = open;
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                out.push_str(&text[i..open]);
                out.push_str("{}");
                out.extend(text[open..j.min(b.len())].chars().filter(|&c| c == '\n'));
                i = (j + 1).min(b.len());
                continue;
            }
        }
        let len = utf8_len(b[i]);
        out.push_str(&text[i..(i + len).min(text.len())]);
        i += len;
    }
    out
}

fn prev_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The modules `text` (the source of module `me`) names, resolved against `modules`; `me` itself left out.
pub fn imports(text: &str, me: &ModPath, modules: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let text = blank_inline_modules(&blank_comments_and_strings(text));
    let mut out = BTreeSet::new();
    if me.is_empty() {
        out.extend(declared(&text, modules));
    }
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':');
        if !starts_word || !is_ident(chars[i]) {
            i += 1;
            continue;
        }
        let (path, end) = read_path(&chars, i);
        i = end.max(i + 1);
        if path.len() < 2 && !path.last().is_some_and(|s| s.starts_with('{')) {
            continue;
        }
        let (base, rest) = match path[0].as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (me.clone(), &path[1..]),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                if ups > me.len() {
                    continue;
                }
                (me[..me.len() - ups].to_vec(), &path[ups..])
            }
            child => {
                let mut c = me.clone();
                c.push(child.to_string());
                if !modules.contains(&c) {
                    continue;
                }
                (me.clone(), &path[..])
            }
        };
        for r in expand(rest) {
            if let Some(target) = resolve(&base, &r, modules) {
                if &target != me {
                    out.insert(target);
                }
            }
        }
    }
    out
}

/// The modules a crate root declares (`mod a;`, `pub mod a;`): the facade names each of them. Test modules
/// (`tests`, `testing`) are left out: they take everything from the root by design (`use super::*`).
fn declared(text: &str, modules: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut out = BTreeSet::new();
    for part in text.split("mod ").skip(1) {
        let name: String = part.chars().take_while(|&c| is_ident(c)).collect();
        let rest = part[name.len()..].trim_start();
        if rest.starts_with(';') && name != "tests" && name != "testing" {
            let m = vec![name];
            if modules.contains(&m) {
                out.insert(m);
            }
        }
    }
    out
}

/// Reads `a::b::{c, d::e}` from `at`: the segments (a trailing group kept whole as `{…}`) and where it ends.
fn read_path(chars: &[char], at: usize) -> (Vec<String>, usize) {
    let mut segs = Vec::new();
    let mut i = at;
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if i == start {
            break;
        }
        segs.push(chars[start..i].iter().collect());
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                i += 1;
            }
            if chars.get(i) == Some(&'*') {
                segs.push("*".to_string());
                i += 1;
                break;
            }
            if chars.get(i) == Some(&'{') {
                let mut depth = 0;
                let start = i;
                while i < chars.len() {
                    match chars[i] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                segs.push(chars[start..i].iter().collect());
                break;
            }
        } else {
            break;
        }
    }
    (segs, i)
}

/// The paths a `use` tree stands for: `a::{b, c::d}` → `a::b`, `a::c::d`.
fn expand(path: &[String]) -> Vec<Vec<String>> {
    let Some(last) = path.last() else {
        return vec![Vec::new()];
    };
    if !last.starts_with('{') {
        return vec![path.to_vec()];
    }
    let prefix = &path[..path.len() - 1];
    let inner = &last[1..last.len().saturating_sub(1)];
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in inner.chars().chain(std::iter::once(',')) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let item = cur.trim();
                if !item.is_empty() {
                    let chars: Vec<char> = item.chars().collect();
                    let (segs, _) = read_path(&chars, 0);
                    for tail in expand(&segs) {
                        let mut p = prefix.to_vec();
                        p.extend(tail);
                        out.push(p);
                    }
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out
}

/// The longest module path `base` + a prefix of `rest` that is a module (`base` itself if none is).
fn resolve(base: &ModPath, rest: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut cur = base.clone();
    let mut best = modules.contains(&cur).then(|| cur.clone());
    for seg in rest {
        if seg == "self" {
            continue;
        }
        if seg == "*" {
            break;
        }
        cur.push(seg.clone());
        if modules.contains(&cur) {
            best = Some(cur.clone());
        } else {
            break;
        }
    }
    best
}

/// A crate's import graph: each module and the modules it names.
pub fn graph(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let fragments = included(src);
    let files: Vec<(ModPath, PathBuf)> = sources(src)
        .into_iter()
        .filter(|f| !fragments.contains(f))
        .filter_map(|f| module_path(src, &f).map(|m| (m, f)))
        .collect();
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (m, f) in &files {
        let text = fs::read_to_string(f).unwrap_or_default();
        edges
            .entry(m.clone())
            .or_default()
            .extend(imports(&text, m, &modules));
    }
    edges
}

/// `edges` with the crate root left out (no node, no edge into it): for a crate whose root is not a facade
/// by design (the layout test names them and why).
pub fn without_root(
    mut edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    edges.remove(&Vec::new());
    for e in edges.values_mut() {
        e.remove(&Vec::new());
    }
    edges
}

/// Every import circle of a graph, each as the modules on it in order (strongly connected components of
/// more than one module).
pub fn circles(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Tarjan's algorithm, iterative enough for a crate's few hundred modules.
    struct St<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a ModPath) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let Some((w, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// A module path as Rust writes it (`crate` for the root).
pub fn show(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

#[cfg(test)]
mod tests;
