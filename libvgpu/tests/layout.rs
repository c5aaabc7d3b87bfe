//! The interposer's own layout rule, beside the workspace's (tests/layout: short files with a `//!`
//! header, no import circle, checked on every crate): the exit/panic guard imports nothing of the crate,
//! so it can run while anything else is broken or being torn down.

use std::path::Path;

#[test]
fn the_guard_is_a_leaf() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = vgpu_layout::graph(&src);
    assert!(
        g.get(&vec!["hooks".to_string(), "common".to_string()])
            .is_some_and(|e| e.contains(&vec!["driver".to_string()])),
        "the scan sees imports"
    );
    let guard = g.get(&vec!["guard".to_string()]).expect("a guard module");
    assert!(guard.is_empty(), "guard imports {guard:?}");
}
