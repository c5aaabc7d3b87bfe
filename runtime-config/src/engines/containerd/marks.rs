//! vgpuctl's marks in containerd's files: the header of its drop-in, the first line of a config it created,
//! and the comments by which unconfigure finds what configure added (a table header, a restated runc) or
//! what an older vgpuctl replaced.
use toml_edit::Table;

/// First line of a config file vgpuctl created because there was none; unconfigure removes such a file
/// again once nothing but the version is left in it.
pub const CREATED: &str = "# Created by `vgpuctl runtime configure --runtime=containerd`";
/// First lines of vgpuctl's drop-in: what makes a file vgpuctl's to rewrite and remove.
pub const DROP_IN_HEADER: &str =
    "# vgpu runtime handler: written by `vgpuctl runtime configure --runtime=containerd --drop-in`;\n\
     # `vgpuctl runtime unconfigure --runtime=containerd` removes this file.\n";
/// Why a version 2 drop-in restates the whole CRI plugin section.
pub const DROP_IN_V2_NOTE: &str =
    "# Config version 2: containerd 1.x replaces a whole plugin section with an imported file's, so this\n\
     # file restates the CRI plugin's settings from the files read before it, with the vgpu handler added.\n\
     # After editing those settings there, run `vgpuctl runtime configure --runtime=containerd --drop-in` again.\n";
/// Older vgpuctl kept the `default_runtime_name` that `--set-as-default` replaced in a comment on the same
/// line (now in vgpuctl's record); still read, for files configured by those versions.
pub const LEGACY_PREVIOUS: &str = "vgpuctl: previous default_runtime_name ";
pub const LEGACY_WAS_UNSET: &str = "vgpuctl: default_runtime_name was unset";
/// On a table that had no header of its own until `--set-as-default` put a key in it.
pub const HEADER_ADDED: &str = "# vgpuctl: header added for default_runtime_name";
/// containerd replaces its built-in runtimes map with the file's as soon as the file names any runtime,
/// so adding `vgpu` alone would make the built-in `runc` (the usual default) disappear. vgpuctl then
/// restates it, marked with this comment, and unconfigure removes it again.
pub const RUNC_RESTATED: &str =
    "# vgpuctl: containerd's built-in runc, restated because the file now names runtimes";

/// Whether a file at vgpuctl's drop-in path was written by vgpuctl.
pub fn is_our_drop_in(text: &str) -> bool {
    text.starts_with(DROP_IN_HEADER)
}

/// Whether vgpuctl's comment `mark` is on the line(s) before the table's header.
pub fn marked(t: &Table, mark: &str) -> bool {
    t.decor()
        .prefix()
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(mark))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_found_where_vgpuctl_puts_them() {
        assert!(is_our_drop_in(&format!("{DROP_IN_HEADER}version = 3\n")));
        assert!(!is_our_drop_in("version = 3\n"));
        let d: toml_edit::DocumentMut = format!("[a]\n\n{RUNC_RESTATED}\n[b]\n").parse().unwrap();
        assert!(marked(d["b"].as_table().unwrap(), RUNC_RESTATED));
        assert!(!marked(d["a"].as_table().unwrap(), RUNC_RESTATED));
    }
}
