//! The scanner's own checks: module paths, path resolution, blanking, circles.

use super::*;

fn m(s: &str) -> ModPath {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split("::").map(String::from).collect()
    }
}

fn set(list: &[&str]) -> BTreeSet<ModPath> {
    list.iter().map(|s| m(s)).collect()
}

#[test]
fn only_lib_main_and_mod_stand_for_their_folder() {
    let src = Path::new("/x/src");
    assert_eq!(module_path(src, Path::new("/x/src/lib.rs")), Some(m("")));
    assert_eq!(
        module_path(src, Path::new("/x/src/library.rs")),
        Some(m("library"))
    );
    assert_eq!(module_path(src, Path::new("/x/src/a/mod.rs")), Some(m("a")));
    assert_eq!(
        module_path(src, Path::new("/x/src/a/lib.rs")),
        Some(m("a::lib"))
    );
    assert_eq!(
        module_path(src, Path::new("/x/src/a/b.rs")),
        Some(m("a::b"))
    );
    assert_eq!(module_path(src, Path::new("/x/src/bin/tool.rs")), None);
}

#[test]
fn paths_resolve_to_the_longest_module() {
    let mods = set(&["", "a", "a::b", "a::c", "d"]);
    let got = imports(
        "use crate::a::b::Thing; fn f() { super::c::g(); }",
        &m("a::b"),
        &mods,
    );
    assert_eq!(
        got,
        set(&["a::c"]),
        "crate::a::b is the file itself, super::c its sibling"
    );
    let got = imports("use super::Shared;", &m("a::b"), &mods);
    assert_eq!(
        got,
        set(&["a"]),
        "an item of the parent is an edge to the parent"
    );
    let got = imports("pub use b::*; fn f() { c::g() }", &m("a"), &mods);
    assert_eq!(got, set(&["a::b", "a::c"]), "children named bare");
    let got = imports(
        "use crate::Facade; use crate::{a::{b, c}, d};",
        &m("d"),
        &mods,
    );
    assert_eq!(
        got,
        set(&["", "a::b", "a::c"]),
        "use groups, nested; an item named through the root is an edge to the root; the file itself left out"
    );
    let got = imports("use super::super::d::X;", &m("a::b"), &mods);
    assert_eq!(got, set(&["d"]));
    let got = imports("fn f(x: std::a::b) { other::a::f() }", &m("d"), &mods);
    assert!(
        got.is_empty(),
        "paths of other crates are not edges: {got:?}"
    );
}

#[test]
fn inline_test_modules_are_not_imports() {
    let mods = set(&["", "a", "a::b"]);
    let text = "fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn g() { crate::a::x() }\n}\n";
    assert!(imports(text, &m("a::b"), &mods).is_empty());
    assert_eq!(
        blank_inline_modules(text).lines().count(),
        text.lines().count()
    );
    assert_eq!(
        imports("mod x; use super::Y;", &m("a::b"), &mods),
        set(&["a"])
    );
}

#[test]
fn comments_and_strings_are_not_imports() {
    let mods = set(&["", "a", "b"]);
    let text = "// use crate::b;\n/* crate::b */ let s = \"crate::b\"; let r = r#\"crate::b\"#; let c = ':';";
    assert!(imports(text, &m("a"), &mods).is_empty());
    assert_eq!(blank_comments_and_strings("a // x\nb").lines().count(), 2);
}

#[test]
fn a_circle_is_found_and_a_chain_is_not() {
    let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    g.insert(m("a"), set(&["b"]));
    g.insert(m("b"), set(&["c"]));
    g.insert(m("c"), BTreeSet::new());
    assert!(circles(&g).is_empty());
    g.insert(m("c"), set(&["a"]));
    assert_eq!(circles(&g), vec![vec![m("a"), m("b"), m("c")]]);
}

#[test]
fn test_files_are_named_or_placed_as_tests() {
    let src = Path::new("/x/src");
    assert!(is_test_file(src, Path::new("/x/src/a/tests.rs")));
    assert!(is_test_file(src, Path::new("/x/src/a/tests/big.rs")));
    assert!(!is_test_file(src, Path::new("/x/src/a/contests.rs")));
}

#[test]
fn a_module_naming_an_item_through_its_facade_root_is_a_circle() {
    let mods = set(&["", "collector", "http"]);
    let root = imports(
        "mod collector;\npub mod http;\n#[cfg(test)]\nmod tests;\npub use collector::Monitor;",
        &m(""),
        &mods,
    );
    assert_eq!(
        root,
        set(&["collector", "http"]),
        "the root names what it declares"
    );
    let bad = imports("use crate::Monitor;", &m("http"), &mods);
    let good = imports("use crate::collector::Monitor;", &m("http"), &mods);
    let edges = |http: BTreeSet<ModPath>| {
        BTreeMap::from([
            (m(""), root.clone()),
            (m("collector"), BTreeSet::new()),
            (m("http"), http),
        ])
    };
    assert_eq!(circles(&edges(bad)), vec![vec![m(""), m("http")]]);
    assert!(circles(&edges(good)).is_empty());
}
