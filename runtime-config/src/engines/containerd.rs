//! containerd: a runtime handler `vgpu`, either edited into the main config (`/etc/containerd/config.toml`,
//! the default) or written as a drop-in file of its own that the main config imports (`--drop-in`). The
//! main file is edited with toml_edit, so every other key, the comments and the layout stay as they were;
//! files it imports are read, never edited (except vgpuctl's own drop-in).
//!
//! Config version 2 (containerd 1.x) keeps the CRI runtimes under
//! `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`, version 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`. The handler is a runc v2 shim whose
//! `BinaryName` is vgpu-container-runtime; it starts as a copy of the default runtime (so `SystemdCgroup`
//! and friends match) and lets `vgpu.io/*` pod and container annotations through to the OCI spec.
//!
//! `imports` are read as containerd reads them: the main file, then each file it imports (a relative path is
//! relative to the importing file's folder; an entry with `*` is a glob, its matches in name order), then
//! their imports, each file once. How a later file combines with what came before depends on the version:
//! containerd 1.x (config version 2) replaces a whole plugin section with a later file's, containerd 2.x
//! (version 3) merges them key by key (tables deeply, arrays appended, other values overridden). The
//! default runtime and the settings the handler copies come from that merged view.
use super::record::{Entry, ImportAdded, PreviousDefault};
use super::{foreign, is_shim, line_col, parse_error, Change, Engine};
use anyhow::{anyhow, bail, Result};
use std::collections::{HashSet, VecDeque};
use std::path::{Component, Path, PathBuf};
use toml_edit::{Array, DocumentMut, Item, Table, Value};

pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// `--drop-in` without a path: this file in the main config's folder.
pub const DEFAULT_DROP_IN: &str = "conf.d/99-vgpu.toml";
const RUNTIME: &str = "vgpu";
const RUNC_V2: &str = "io.containerd.runc.v2";
const ANNOTATIONS: &str = "vgpu.io/*";
/// First line of a config file vgpuctl created because there was none; unconfigure removes such a file
/// again once nothing but the version is left in it.
const CREATED: &str = "# Created by `vgpuctl runtime configure --runtime=containerd`";
/// First lines of vgpuctl's drop-in: what makes a file vgpuctl's to rewrite and remove.
const DROP_IN_HEADER: &str =
    "# vgpu runtime handler: written by `vgpuctl runtime configure --runtime=containerd --drop-in`;\n\
     # `vgpuctl runtime unconfigure --runtime=containerd` removes this file.\n";
/// Why a version 2 drop-in restates the whole CRI plugin section.
const DROP_IN_V2_NOTE: &str =
    "# Config version 2: containerd 1.x replaces a whole plugin section with an imported file's, so this\n\
     # file restates the CRI plugin's settings from the files read before it, with the vgpu handler added.\n\
     # After editing those settings there, run `vgpuctl runtime configure --runtime=containerd --drop-in` again.\n";
/// Older vgpuctl kept the `default_runtime_name` that `--set-as-default` replaced in a comment on the same
/// line (now in vgpuctl's record); still read, for files configured by those versions.
const LEGACY_PREVIOUS: &str = "vgpuctl: previous default_runtime_name ";
const LEGACY_WAS_UNSET: &str = "vgpuctl: default_runtime_name was unset";
/// On a table that had no header of its own until `--set-as-default` put a key in it.
const HEADER_ADDED: &str = "# vgpuctl: header added for default_runtime_name";
/// containerd replaces its built-in runtimes map with the file's as soon as the file names any runtime,
/// so adding `vgpu` alone would make the built-in `runc` (the usual default) disappear. vgpuctl then
/// restates it, marked with this comment, and unconfigure removes it again.
const RUNC_RESTATED: &str =
    "# vgpuctl: containerd's built-in runc, restated because the file now names runtimes";

pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
    /// Replace a `runtimes.vgpu` that is not vgpu's.
    pub force: bool,
    /// Version for a config created from nothing; None = ask `containerd --version` (2 for 1.x, 3 for 2.x).
    pub version_for_new_file: Option<i64>,
    /// Write the handler into this file (absolute) and import it from the main config, instead of editing
    /// the main config.
    pub drop_in: Option<&'a Path>,
}

/// The files containerd's config imports, as vgpuctl reads them (the disk; a map in tests).
pub trait Files {
    /// The file's text; None when it does not exist.
    fn read(&self, path: &Path) -> Result<Option<String>>;
    /// The existing paths matching `pattern` (absolute), in name order.
    fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>>;
    /// Whether `path` is a folder.
    fn is_dir(&self, path: &Path) -> bool;
}

/// Glob matching as Go's `filepath.Glob`, which containerd uses: `*` does not cross `/`, and matches a
/// leading dot.
pub const GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether `path` matches the import pattern `pattern`.
pub fn glob_matches(pattern: &Path, path: &Path) -> Result<bool> {
    let p = glob::Pattern::new(&pattern.to_string_lossy())
        .map_err(|e| anyhow!("bad import pattern {}: {e}", pattern.display()))?;
    Ok(p.matches_path_with(path, GLOB))
}

/// Whether a file at vgpuctl's drop-in path was written by vgpuctl.
pub fn is_our_drop_in(text: &str) -> bool {
    text.starts_with(DROP_IN_HEADER)
}

fn cri_plugin(version: i64) -> &'static str {
    if version >= 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut> {
    text.parse::<DocumentMut>().map_err(|e| {
        let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        parse_error(path, line, col, e.message())
    })
}

fn version_of(path: &Path, doc: &DocumentMut) -> Result<i64> {
    match doc.get("version") {
        Some(v) => match v.as_integer() {
            Some(n @ (2 | 3)) => Ok(n),
            _ => bail!("{}: unsupported containerd config version {} (vgpuctl knows 2 and 3)", path.display(), v.to_string().trim()),
        },
        None => bail!(
            "{}: no `version` key, so containerd reads it as config version 1, which vgpuctl does not edit; \
             add `version = 2` (containerd 1.x) after checking the file, or migrate it",
            path.display()
        ),
    }
}

/// containerd 2.x reads version 3; 1.x reads version 2.
fn installed_version() -> i64 {
    let out = std::process::Command::new("containerd")
        .arg("--version")
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or "... v2.0.0 ..."
    let major = text.split_whitespace().nth(2).and_then(|v| {
        v.trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<i64>()
            .ok()
    });
    if major.unwrap_or(1) >= 2 {
        3
    } else {
        2
    }
}

/// The table at `key` under `parent`, created (implicit: no header of its own) if missing.
fn child<'a>(parent: &'a mut Table, key: &str, path: &Path) -> Result<&'a mut Table> {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_mut().ok_or_else(|| {
        anyhow!(
            "{}: `{key}` is not a [table] (inline tables are not edited by vgpuctl)",
            path.display()
        )
    })
}

/// Why `runtimes.vgpu` is not vgpu's (None: it is). vgpu's handler is the one whose `options.BinaryName`
/// is the shim; anything else (a kata handler, another runc wrapper) belongs to someone else.
fn foreign_why(vgpu: &Item) -> Option<String> {
    let Some(t) = vgpu.as_table_like() else {
        return Some("it is not a table".into());
    };
    let binary = t
        .get("options")
        .and_then(Item::as_table_like)
        .and_then(|o| o.get("BinaryName"))
        .and_then(Item::as_str);
    match binary {
        Some(b) if is_shim(b) => None,
        Some(b) => Some(format!("its BinaryName is {b}")),
        None => Some(match t.get("runtime_type").and_then(Item::as_str) {
            Some(rt) => format!("runtime_type {rt}, no vgpu BinaryName"),
            None => "it has no vgpu BinaryName".into(),
        }),
    }
}

/// A value as written by vgpuctl, whatever its decor, for comparisons.
fn bare(v: &Value) -> String {
    let mut v = v.clone();
    v.decor_mut().clear();
    v.to_string()
}

/// Sets `table[key] = v` unless it already holds that value (so a second configure rewrites nothing).
fn ensure(table: &mut Table, key: &str, v: Value) {
    match table.get_mut(key) {
        Some(Item::Value(old)) if bare(old) == bare(&v) => {}
        // In place, so the key keeps its indentation and comments.
        Some(Item::Value(old)) => *old = v.decorated(" ", ""),
        _ => {
            table.insert(key, Item::Value(v));
        }
    }
}

/// A copy of a table from elsewhere, without its comments, indentation or position; inline tables in it
/// become tables (so views from several files merge alike).
fn detached(t: &Table) -> Table {
    let mut t = t.clone();
    t.decor_mut().clear();
    t.set_position(None);
    t.set_implicit(false);
    t.set_dotted(false);
    let keys: Vec<String> = t.iter().map(|(k, _)| k.to_string()).collect();
    for k in keys {
        if let Some(mut key) = t.key_mut(&k) {
            key.leaf_decor_mut().clear();
            key.dotted_decor_mut().clear();
        }
        let item = t.get_mut(&k).expect("listed");
        match item {
            Item::Value(Value::InlineTable(it)) => {
                *item = Item::Table(detached(&it.clone().into_table()));
            }
            Item::Value(v) => v.decor_mut().clear(),
            Item::Table(sub) => *sub = detached(sub),
            _ => {}
        }
    }
    t
}

/// An item as a detached table (None: it is no table).
fn table_of(item: &Item) -> Option<Table> {
    match item {
        Item::Table(t) => Some(detached(t)),
        Item::Value(Value::InlineTable(it)) => Some(detached(&it.clone().into_table())),
        _ => None,
    }
}

/// containerd 2.x's merge of a later file into what came before: tables key by key, arrays appended (each
/// element once), other values replaced.
fn merge(base: &mut Table, over: &Table) {
    for (k, v) in over.iter() {
        match (base.get_mut(k), v) {
            (Some(Item::Table(b)), Item::Table(o)) => merge(b, o),
            (Some(Item::Value(Value::Array(b))), Item::Value(Value::Array(o))) => {
                for x in o.iter() {
                    if !b.iter().any(|y| bare(y) == bare(x)) {
                        b.push(x.clone());
                    }
                }
            }
            _ => {
                base.insert(k, v.clone());
            }
        }
    }
}

fn annotations() -> Value {
    Value::Array(Array::from_iter([ANNOTATIONS]))
}

/// `p` with `.` and `..` resolved lexically, as Go's `filepath.Clean`.
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// One file of containerd's config, in the order containerd reads them.
struct Source {
    path: PathBuf,
    /// None: vgpuctl's drop-in, which is about to be (re)written.
    doc: Option<DocumentMut>,
    /// A drop-in vgpuctl wrote (its header), at this path or another.
    ours: bool,
}

impl Source {
    /// This file's CRI runtime plugin section, read at the file's own config version (the main file's
    /// when it names none).
    fn cri(&self, root_version: i64) -> Option<&Item> {
        let doc = self.doc.as_ref()?;
        let v = doc
            .get("version")
            .and_then(Item::as_integer)
            .unwrap_or(root_version);
        doc.get("plugins")?.get(cri_plugin(v))
    }
    fn containerd(&self, root_version: i64) -> Option<&Item> {
        self.cri(root_version)?.get("containerd")
    }
    fn vgpu(&self, root_version: i64) -> Option<&Item> {
        self.containerd(root_version)?.get("runtimes")?.get(RUNTIME)
    }
    fn sets_default(&self, root_version: i64) -> bool {
        self.containerd(root_version)
            .and_then(|c| c.get("default_runtime_name"))
            .is_some()
    }
}

/// The `imports` of a file (each entry as written).
fn imports_of(path: &Path, doc: &DocumentMut) -> Result<Vec<String>> {
    let Some(item) = doc.get("imports") else {
        return Ok(vec![]);
    };
    let err = || anyhow!("{}: `imports` is not an array of strings", path.display());
    item.as_array()
        .ok_or_else(err)?
        .iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(err))
        .collect()
}

/// An `imports` entry of `parent` as the paths containerd loads: relative to the parent's folder, a glob's
/// matches in name order; `target` (vgpuctl's drop-in, which may not exist yet) among them when it matches.
fn resolve(
    parent: &Path,
    entry: &str,
    files: &dyn Files,
    target: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let p = Path::new(entry);
    let p = clean(&if p.is_absolute() {
        p.to_path_buf()
    } else {
        parent.parent().unwrap_or(Path::new("/")).join(p)
    });
    // As containerd: a glob only when there is a `*`.
    if !entry.contains('*') {
        return Ok(vec![p]);
    }
    let mut out = files.glob(&p)?;
    if let Some(t) = target {
        if glob_matches(&p, t)? && !out.iter().any(|m| m == t) {
            out.push(t.to_path_buf());
        }
    }
    out.sort();
    Ok(out)
}

/// containerd's config files in the order it reads them, starting from the main file `main` (its current
/// document `main_doc`). `target`, vgpuctl's drop-in, is listed without being read. A missing import is an
/// error when `strict` (containerd would not start), skipped otherwise.
fn load_chain(
    main: &Path,
    main_doc: &DocumentMut,
    files: &dyn Files,
    target: Option<&Path>,
    strict: bool,
) -> Result<Vec<Source>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = VecDeque::from([(main.to_path_buf(), main.to_path_buf())]);
    while let Some((path, parent)) = pending.pop_front() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let src = if path == main {
            Source {
                path,
                doc: Some(main_doc.clone()),
                ours: false,
            }
        } else if Some(path.as_path()) == target {
            Source {
                path,
                doc: None,
                ours: true,
            }
        } else {
            match files.read(&path)? {
                Some(text) => Source {
                    doc: Some(parse(&path, &text)?),
                    ours: is_our_drop_in(&text),
                    path,
                },
                None if strict => bail!(
                    "{}: imports {}, which does not exist (containerd would not start); fix the imports first",
                    parent.display(),
                    path.display()
                ),
                None => continue,
            }
        };
        if let Some(doc) = &src.doc {
            for entry in imports_of(&src.path, doc)? {
                for p in resolve(&src.path, &entry, files, target)? {
                    pending.push_back((p, src.path.clone()));
                }
            }
        }
        out.push(src);
    }
    Ok(out)
}

/// The CRI runtime plugin section as containerd sees it after reading `sources` in order: version 2
/// (containerd 1.x) takes the last file's section whole, version 3 (containerd 2.x) merges them.
fn merged_view<'a>(sources: impl IntoIterator<Item = &'a Source>, version: i64) -> Table {
    let mut view = Table::new();
    for s in sources {
        if let Some(t) = s.cri(version).and_then(table_of) {
            if version >= 3 {
                merge(&mut view, &t);
            } else {
                view = t;
            }
        }
    }
    view
}

/// `view`'s `containerd` table (empty if none).
fn view_containerd(view: &Table) -> Table {
    view.get("containerd")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default()
}

/// One line for a handler named vgpu in a file vgpuctl reads but never edits, read after where vgpuctl
/// writes its own.
fn imported_foreign(src: &Path, why: &str, ours: &Path) -> anyhow::Error {
    anyhow!(
        "{}: the containerd runtime handler vgpu exists and is not vgpu's ({why}); containerd reads this file \
         after {}, so it would override vgpu's handler, and vgpuctl does not edit files it did not write: \
         remove or rename it there",
        src.display(),
        ours.display()
    )
}

/// The runtime the handler copies: the default (or runc), unless vgpu itself is the default, then the one
/// configure replaced (vgpuctl's record, else an older vgpuctl's comment in `main_containerd`).
fn base_name(view_ctd: &Table, prior: Option<&Entry>, main_containerd: Option<&Table>) -> String {
    let name = view_ctd
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .unwrap_or("runc");
    if name != RUNTIME {
        return name.to_string();
    }
    if let Some(p) = prior.and_then(|e| e.previous_default.as_ref()) {
        return p.name.clone().unwrap_or_else(|| "runc".into());
    }
    main_containerd
        .and_then(legacy_previous_default)
        .flatten()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "runc".into())
}

/// Adds the vgpu handler (a copy of runtime `base_name` from `view_runtimes`) to `runtimes`, restating the
/// built-in runc where containerd would lose it.
fn add_handler(
    runtimes: &mut Table,
    view_runtimes: &Table,
    base_name: &str,
    runtime_path: &str,
    path: &Path,
) -> Result<()> {
    let base = view_runtimes
        .get(base_name)
        .and_then(Item::as_table)
        .filter(
            |t| !matches!(t.get("runtime_type").and_then(Item::as_str), Some(rt) if rt != RUNC_V2),
        )
        .map(detached);
    if base_name == "runc"
        && !view_runtimes.contains_key("runc")
        && !runtimes.contains_key("runc")
        && !runtimes.contains_key(RUNTIME)
    {
        let mut runc = Table::new();
        runc.decor_mut().set_prefix(format!("\n{RUNC_RESTATED}\n"));
        runc.insert("runtime_type", Item::Value(Value::from(RUNC_V2)));
        runtimes.insert("runc", Item::Table(runc));
    }
    if !runtimes.contains_key(RUNTIME) {
        let mut t = base.clone().unwrap_or_default();
        // Annotations are ours to set; the rest of the copy stays.
        t.remove("pod_annotations");
        t.remove("container_annotations");
        runtimes.insert(RUNTIME, Item::Table(t));
    }
    let vgpu = runtimes[RUNTIME]
        .as_table_mut()
        .ok_or_else(|| anyhow!("{}: runtimes.{RUNTIME} is not a [table]", path.display()))?;
    ensure(vgpu, "runtime_type", Value::from(RUNC_V2));
    ensure(vgpu, "pod_annotations", annotations());
    ensure(vgpu, "container_annotations", annotations());
    if !vgpu.contains_key("options") {
        let opts = base
            .as_ref()
            .and_then(|b| b.get("options"))
            .and_then(Item::as_table)
            .cloned()
            .unwrap_or_default();
        vgpu.insert("options", Item::Table(opts));
    }
    let options = vgpu["options"].as_table_mut().ok_or_else(|| {
        anyhow!(
            "{}: runtimes.{RUNTIME}.options is not a [table]",
            path.display()
        )
    })?;
    ensure(options, "BinaryName", Value::from(runtime_path));
    Ok(())
}

/// What `configure` does: the files to write, and vgpuctl's record entry for this config afterwards.
#[derive(Debug)]
pub struct Configured {
    pub changes: Vec<Change>,
    pub entry: Entry,
}

/// The changes that add the vgpu runtime handler for the main config `path` (absolute; current text
/// `current`, None if absent), given vgpuctl's record entry for it (`prior`).
pub fn configure(
    path: &Path,
    current: Option<&str>,
    files: &dyn Files,
    prior: Option<&Entry>,
    s: &Settings,
) -> Result<Configured> {
    let mut doc = match current {
        Some(text) if !text.trim().is_empty() => parse(path, text)?,
        _ => {
            let version = s.version_for_new_file.unwrap_or_else(installed_version);
            parse(path, &format!("{CREATED}\nversion = {version}\n"))?
        }
    };
    let version = version_of(path, &doc)?;
    let mut entry = prior
        .cloned()
        .unwrap_or_else(|| Entry::new(Engine::Containerd, path));
    let mut changes = Vec::new();
    match s.drop_in {
        None => configure_main(path, &mut doc, version, files, &mut entry, s)?,
        Some(target) => {
            if let Some(c) =
                configure_drop_in(path, &mut doc, version, files, target, &mut entry, s)?
            {
                changes.push(c);
            }
        }
    }
    let new = doc.to_string();
    if current != Some(new.as_str()) {
        changes.push(Change::write(path.to_path_buf(), new, 0o644));
    }
    Ok(Configured { changes, entry })
}

/// The handler edited into the main file.
fn configure_main(
    path: &Path,
    doc: &mut DocumentMut,
    version: i64,
    files: &dyn Files,
    entry: &mut Entry,
    s: &Settings,
) -> Result<()> {
    let plugin = cri_plugin(version);
    let chain = load_chain(path, doc, files, None, true)?;
    let recorded = entry.drop_in.as_ref().filter(|d| {
        files
            .read(d)
            .ok()
            .flatten()
            .is_some_and(|t| is_our_drop_in(&t))
    });
    if let Some(d) = chain.iter().find(|c| c.ours).map(|c| &c.path).or(recorded) {
        bail!(
            "{}: vgpu is configured through the drop-in {}; configure with --drop-in {} (or unconfigure first to \
             move the handler into {})",
            path.display(),
            d.display(),
            d.display(),
            path.display()
        );
    }
    for src in &chain[1..] {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            return Err(imported_foreign(&src.path, &why, path));
        }
        if version < 3 && src.cri(version).is_some() {
            bail!(
                "{}: restates [plugins.\"{plugin}\"], and containerd 1.x (config version 2) then ignores that whole \
                 section of {}, where vgpuctl would add its handler; use --drop-in (a file read after this one)",
                src.path.display(),
                path.display()
            );
        }
        if s.set_as_default && src.sets_default(version) {
            bail!(
                "{}: sets default_runtime_name and is read after {}, so --set-as-default there would be \
                 overridden; use --drop-in (a file read after this one), or change it there",
                src.path.display(),
                path.display()
            );
        }
    }
    let view = merged_view(&chain, version);
    let view_ctd = view_containerd(&view);
    let view_runtimes = view_ctd
        .get("runtimes")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default();
    // Nothing of a drop-in is left to remember (an import entry still there would have failed the chain).
    entry.drop_in = None;
    entry.drop_in_dirs_created = None;
    let still_there = |ia: &ImportAdded| imports_of(path, doc).is_ok_and(|i| i.contains(&ia.entry));
    entry.import_added = entry.import_added.take().filter(still_there);

    let plugins = child(doc.as_table_mut(), "plugins", path)?;
    let cri = child(plugins, plugin, path)?;
    let containerd = child(cri, "containerd", path)?;
    let base = base_name(&view_ctd, Some(&*entry), Some(&*containerd));
    if s.set_as_default {
        if let Some(prev) = set_default(containerd) {
            entry.previous_default = Some(prev);
        }
    }
    let runtimes = child(containerd, "runtimes", path)?;
    if let Some(why) = runtimes.get(RUNTIME).and_then(foreign_why) {
        if !s.force {
            return Err(foreign(path, "the containerd runtime handler vgpu", &why));
        }
        // --force: replaced whole, nothing of the foreign handler's settings kept.
        runtimes.remove(RUNTIME);
    }
    add_handler(runtimes, &view_runtimes, &base, s.runtime_path, path)
}

/// The handler written into vgpuctl's drop-in `target`, imported from the main file. Returns the drop-in's
/// change, if any; the main file's edit (an `imports` entry) is left in `doc`.
fn configure_drop_in(
    path: &Path,
    doc: &mut DocumentMut,
    version: i64,
    files: &dyn Files,
    target: &Path,
    entry: &mut Entry,
    s: &Settings,
) -> Result<Option<Change>> {
    let plugin = cri_plugin(version);
    if target == path {
        bail!("--drop-in {} is the main config itself", target.display());
    }
    let main = Source {
        path: path.to_path_buf(),
        doc: Some(doc.clone()),
        ours: false,
    };
    if main.vgpu(version).is_some_and(|v| foreign_why(v).is_none()) {
        bail!(
            "{}: vgpu's handler is in this file (configured without --drop-in); unconfigure first, then \
             configure --drop-in",
            path.display()
        );
    }
    let existing = files.read(target)?;
    if let Some(text) = &existing {
        if !is_our_drop_in(text) && !s.force {
            return Err(foreign(target, "the file", "no vgpuctl header"));
        }
    }
    let chain = load_chain(path, doc, files, Some(target), true)?;
    if let Some(other) = chain.iter().find(|c| c.ours && c.path != target) {
        bail!(
            "{}: vgpu is already configured through the drop-in {}; unconfigure first to move it to {}",
            path.display(),
            other.path.display(),
            target.display()
        );
    }
    // The main file must import the drop-in; an entry (or glob) that already does is left as it is.
    let still_there = |ia: &ImportAdded| imports_of(path, doc).is_ok_and(|i| i.contains(&ia.entry));
    entry.import_added = entry.import_added.take().filter(still_there);
    let chain = if chain.iter().any(|c| c.path == target) {
        chain
    } else {
        let name = target.to_string_lossy().into_owned();
        let created_key = !doc.contains_key("imports");
        if created_key {
            doc.insert("imports", Item::Value(Value::Array(Array::new())));
        }
        doc["imports"]
            .as_array_mut()
            .ok_or_else(|| anyhow!("{}: `imports` is not an array of strings", path.display()))?
            .push(name.as_str());
        entry.import_added = Some(ImportAdded {
            entry: name,
            created_key,
        });
        load_chain(path, doc, files, Some(target), true)?
    };
    let at = chain
        .iter()
        .position(|c| c.path == target)
        .expect("the drop-in is imported now");
    let (before, after) = (&chain[..at], &chain[at + 1..]);
    for src in before.iter().filter(|c| !c.ours) {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            if !s.force {
                return Err(foreign(
                    &src.path,
                    "the containerd runtime handler vgpu",
                    &why,
                ));
            }
        }
    }
    for src in after.iter().filter(|c| !c.ours) {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            return Err(imported_foreign(&src.path, &why, target));
        }
        if version < 3 && src.cri(version).is_some() {
            bail!(
                "{}: restates [plugins.\"{plugin}\"] and is read after {}, and containerd 1.x (config version 2) \
                 then ignores the drop-in's section; choose a --drop-in path read after it",
                src.path.display(),
                target.display()
            );
        }
        if s.set_as_default && src.sets_default(version) {
            bail!(
                "{}: sets default_runtime_name and is read after {}, so --set-as-default there would be \
                 overridden; choose a --drop-in path read after it, or change it there",
                src.path.display(),
                target.display()
            );
        }
    }
    let view = merged_view(before.iter().filter(|c| !c.ours), version);
    let view_ctd = view_containerd(&view);
    let view_runtimes = view_ctd
        .get("runtimes")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default();
    let base = base_name(&view_ctd, None, None);

    // Version 2: the whole CRI section as containerd 1.x would see it so far (it replaces sections whole);
    // version 3: only what vgpu adds (containerd 2.x merges).
    let mut cri = if version < 3 { view } else { Table::new() };
    let mut out = DocumentMut::new();
    out.insert("version", Item::Value(Value::from(version)));
    {
        let containerd = child(&mut cri, "containerd", target)?;
        if s.set_as_default {
            containerd.insert("default_runtime_name", Item::Value(Value::from(RUNTIME)));
        }
        let runtimes = child(containerd, "runtimes", target)?;
        // --force: a foreign handler of an earlier file, restated here (version 2), is replaced whole.
        if runtimes.get(RUNTIME).and_then(foreign_why).is_some() {
            runtimes.remove(RUNTIME);
        }
        add_handler(runtimes, &view_runtimes, &base, s.runtime_path, target)?;
    }
    cri.set_implicit(version >= 3);
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(plugin, Item::Table(cri));
    out.insert("plugins", Item::Table(plugins));
    let note = if version < 3 { DROP_IN_V2_NOTE } else { "" };
    let text = format!("{DROP_IN_HEADER}{note}\n{out}");
    if existing.is_none() {
        // The folders written with a new drop-in that were not there: unconfigure removes them again.
        entry.drop_in_dirs_created = target
            .parent()
            .and_then(|p| p.ancestors().take_while(|d| !files.is_dir(d)).last())
            .map(Path::to_path_buf);
    }
    entry.drop_in = Some(target.to_path_buf());
    Ok((existing.as_deref() != Some(text.as_str()))
        .then(|| Change::write(target.to_path_buf(), text, 0o644)))
}

/// Makes vgpu the default runtime (the replaced value's whitespace and comment kept around the new one);
/// returns what it replaced, None if vgpu was the default already.
fn set_default(containerd: &mut Table) -> Option<PreviousDefault> {
    let raw =
        |r: Option<&toml_edit::RawString>| r.and_then(|r| r.as_str()).unwrap_or("").to_string();
    let (prev, new) = match containerd
        .get("default_runtime_name")
        .and_then(Item::as_value)
    {
        Some(v) if v.as_str() == Some(RUNTIME) => return None,
        Some(v) => {
            let (prefix, suffix) = (raw(v.decor().prefix()), raw(v.decor().suffix()));
            let prev = PreviousDefault {
                name: v.as_str().map(str::to_string),
                toml: Some([bare(v), prefix.clone(), suffix.clone()]),
            };
            (prev, Value::from(RUNTIME).decorated(prefix, suffix))
        }
        None => (
            PreviousDefault {
                name: None,
                toml: None,
            },
            Value::from(RUNTIME),
        ),
    };
    if containerd.is_implicit() {
        containerd.set_implicit(false);
        containerd
            .decor_mut()
            .set_prefix(format!("\n{HEADER_ADDED}\n"));
    }
    match containerd.get_mut("default_runtime_name") {
        Some(Item::Value(old)) => *old = new,
        _ => {
            containerd.insert("default_runtime_name", Item::Value(new));
        }
    }
    Some(prev)
}

/// What an older vgpuctl's `--set-as-default` replaced, from its comment: Some(Some(value as it was
/// written)), Some(None) if unset, None if there is no such comment.
fn legacy_previous_default(containerd: &Table) -> Option<Option<Value>> {
    let v = containerd.get("default_runtime_name")?.as_value()?;
    let comment = v
        .decor()
        .suffix()?
        .as_str()?
        .trim()
        .trim_start_matches('#')
        .trim()
        .to_string();
    if comment == LEGACY_WAS_UNSET {
        return Some(None);
    }
    let [repr, prefix, suffix]: [String; 3] =
        serde_json::from_str(comment.strip_prefix(LEGACY_PREVIOUS)?).ok()?;
    Some(Some(repr.parse::<Value>().ok()?.decorated(prefix, suffix)))
}

/// The value a recorded previous default is written back as (None: remove the key).
fn recorded_value(p: &PreviousDefault) -> Option<Value> {
    let name = p.name.as_deref()?;
    Some(match &p.toml {
        Some([repr, prefix, suffix]) => repr
            .parse::<Value>()
            .map(|v| v.decorated(prefix.as_str(), suffix.as_str()))
            .unwrap_or_else(|_| Value::from(name).decorated(" ", "")),
        None => Value::from(name).decorated(" ", ""),
    })
}

/// Whether vgpuctl's comment `mark` is on the line(s) before the table's header.
fn marked(t: &Table, mark: &str) -> bool {
    t.decor()
        .prefix()
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(mark))
}

/// Removes `key` from `parent` if it is an empty table without a header of its own (one that
/// configure created on the way to the runtime).
fn prune(parent: &mut Table, key: &str) {
    if let Some(t) = parent.get(key).and_then(Item::as_table) {
        if t.is_empty() && t.is_implicit() {
            parent.remove(key);
        }
    }
}

/// The changes that take back what `configure` added for the main config `path` (absolute): the handler
/// and default in the main file, vgpuctl's drop-in (the one `drop_in` names, the record's, or any file
/// with vgpuctl's header among those containerd reads) and the `imports` entry vgpuctl added for it.
pub fn unconfigure(
    path: &Path,
    current: Option<&str>,
    files: &dyn Files,
    prior: Option<&Entry>,
    drop_in: Option<&Path>,
) -> Result<Vec<Change>> {
    let text = current.filter(|t| !t.trim().is_empty());
    let doc = text.map(|t| parse(path, t)).transpose()?;
    let mut drop_ins: Vec<PathBuf> = drop_in
        .map(Path::to_path_buf)
        .into_iter()
        .chain(prior.and_then(|e| e.drop_in.clone()))
        .collect();
    if let Some(doc) = &doc {
        version_of(path, doc)?;
        let chain = load_chain(path, doc, files, None, false)?;
        drop_ins.extend(chain.into_iter().filter(|c| c.ours).map(|c| c.path));
    }
    let mut removals = Vec::new();
    for d in drop_ins {
        if removals.iter().any(|c: &Change| c.path == d) {
            continue;
        }
        match files.read(&d)? {
            Some(t) if is_our_drop_in(&t) => removals.push(Change::remove(d)),
            Some(_) => return Err(foreign(&d, "the file", "no vgpuctl header")),
            None => {}
        }
    }
    // With a drop-in of vgpuctl's to remove, a foreign handler in the main file is not in the way: it is
    // left as it is (and is what containerd uses again once the drop-in is gone).
    let through_drop_in = !removals.is_empty() || prior.is_some_and(|e| e.drop_in.is_some());
    let mut changes = Vec::new();
    if let (Some(text), Some(doc)) = (text, doc) {
        if let Some(c) = unconfigure_main(path, text, doc, prior, through_drop_in)? {
            changes.push(c);
        }
    }
    // The folders configure created for the recorded drop-in go after it, deepest first, each if empty.
    let mut dirs = Vec::new();
    if let Some((d, top)) =
        prior.and_then(|e| e.drop_in.as_ref().zip(e.drop_in_dirs_created.as_ref()))
    {
        if removals.iter().any(|c| &c.path == d) && d.starts_with(top) {
            for dir in d.ancestors().skip(1) {
                dirs.push(Change::remove_empty_dir(dir.to_path_buf()));
                if dir == top {
                    break;
                }
            }
        }
    }
    // The main file stops importing the drop-in before it goes.
    changes.extend(removals);
    changes.extend(dirs);
    Ok(changes)
}

fn unconfigure_main(
    path: &Path,
    text: &str,
    mut doc: DocumentMut,
    prior: Option<&Entry>,
    leave_foreign: bool,
) -> Result<Option<Change>> {
    let version = version_of(path, &doc)?;
    let plugin = cri_plugin(version);
    let foreign_here = doc
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|c| c.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(RUNTIME))
        .and_then(foreign_why);
    if let Some(why) = &foreign_here {
        if !leave_foreign {
            return Err(foreign(path, "the containerd runtime handler vgpu", why));
        }
    }
    if let Some(containerd) = doc
        .get_mut("plugins")
        .and_then(Item::as_table_mut)
        .and_then(|p| p.get_mut(plugin))
        .and_then(Item::as_table_mut)
        .and_then(|c| c.get_mut("containerd"))
        .and_then(Item::as_table_mut)
        .filter(|_| foreign_here.is_none())
    {
        if containerd
            .get("default_runtime_name")
            .and_then(Item::as_str)
            == Some(RUNTIME)
        {
            let restore = match prior.and_then(|e| e.previous_default.as_ref()) {
                Some(p) => recorded_value(p),
                None => legacy_previous_default(containerd).flatten(),
            };
            match restore {
                Some(prev) => {
                    if let Some(Item::Value(v)) = containerd.get_mut("default_runtime_name") {
                        *v = prev;
                    }
                }
                None => {
                    containerd.remove("default_runtime_name");
                }
            }
        }
        if marked(containerd, HEADER_ADDED) {
            containerd.decor_mut().clear();
            containerd.set_implicit(true);
        }
        if let Some(runtimes) = containerd.get_mut("runtimes").and_then(Item::as_table_mut) {
            runtimes.remove(RUNTIME);
            if runtimes
                .get("runc")
                .and_then(Item::as_table)
                .is_some_and(|t| marked(t, RUNC_RESTATED))
            {
                runtimes.remove("runc");
            }
        }
        prune(containerd, "runtimes");
        // Walk back up, dropping the header-less tables configure had to create.
        let plugins = doc["plugins"].as_table_mut().expect("found above");
        prune(
            plugins[plugin].as_table_mut().expect("found above"),
            "containerd",
        );
        prune(plugins, plugin);
        prune(doc.as_table_mut(), "plugins");
    }
    if let Some(ia) = prior.and_then(|e| e.import_added.as_ref()) {
        if let Some(imports) = doc.get_mut("imports").and_then(Item::as_array_mut) {
            let at = imports
                .iter()
                .position(|v| v.as_str() == Some(ia.entry.as_str()));
            if let Some(i) = at {
                imports.remove(i);
            }
            if imports.is_empty() && ia.created_key {
                doc.remove("imports");
            }
        }
    }
    let new = doc.to_string();
    if new == text {
        return Ok(None);
    }
    // A file vgpuctl created from nothing goes away again once only its version is left.
    if new.starts_with(CREATED) && doc.len() == 1 && doc.contains_key("version") {
        return Ok(Some(Change::remove(path.to_path_buf())));
    }
    Ok(Some(Change::write(path.to_path_buf(), new, 0o644)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::apply_in_memory;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const P: &str = "/etc/containerd/config.toml";
    const D: &str = "/etc/containerd/conf.d/99-vgpu.toml";

    /// Files on a pretend disk.
    #[derive(Default, Clone)]
    struct Mem(BTreeMap<PathBuf, String>);
    impl Mem {
        fn with(files: &[(&str, &str)]) -> Self {
            Mem(files
                .iter()
                .map(|(p, t)| (PathBuf::from(p), t.to_string()))
                .collect())
        }
        /// Applies changes (writes and removals) to the pretend disk.
        fn apply(&mut self, changes: &[Change]) {
            for c in changes {
                match &c.contents {
                    Some(t) => {
                        self.0.insert(c.path.clone(), t.clone());
                    }
                    None if c.dir => {
                        assert!(!self.is_dir(&c.path), "a folder with files is kept");
                    }
                    None => {
                        self.0.remove(&c.path);
                    }
                }
            }
        }
        fn get(&self, p: &str) -> Option<&str> {
            self.0.get(Path::new(p)).map(String::as_str)
        }
    }
    impl Files for Mem {
        fn read(&self, path: &Path) -> Result<Option<String>> {
            Ok(self.0.get(path).cloned())
        }
        fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>> {
            let mut out = Vec::new();
            for p in self.0.keys() {
                if glob_matches(pattern, p)? {
                    out.push(p.clone());
                }
            }
            Ok(out)
        }
        /// A folder exists while a file is in it.
        fn is_dir(&self, path: &Path) -> bool {
            self.0.keys().any(|k| k != path && k.starts_with(path))
        }
    }

    fn s(def: bool) -> Settings<'static> {
        Settings {
            runtime_path: "/usr/bin/vgpu-container-runtime",
            set_as_default: def,
            force: false,
            version_for_new_file: Some(2),
            drop_in: None,
        }
    }
    fn drop_in(def: bool) -> Settings<'static> {
        Settings {
            drop_in: Some(Path::new(D)),
            ..s(def)
        }
    }

    /// configure, then the main file's text (None: removed) and the record entry.
    fn conf_e(text: Option<&str>, def: bool, prior: Option<&Entry>) -> (String, Entry) {
        let c = configure(Path::new(P), text, &Mem::default(), prior, &s(def)).unwrap();
        (apply_in_memory(&c.changes, P, text).unwrap(), c.entry)
    }
    fn conf(text: Option<&str>, def: bool) -> String {
        conf_e(text, def, None).0
    }
    fn unconf_e(text: &str, prior: Option<&Entry>) -> Option<String> {
        let ch = unconfigure(Path::new(P), Some(text), &Mem::default(), prior, None).unwrap();
        apply_in_memory(&ch, P, Some(text))
    }
    fn unconf(text: &str) -> Option<String> {
        unconf_e(text, None)
    }
    /// A whole configure (with what it records) on a pretend disk; returns the record entry.
    fn run_conf(disk: &mut Mem, prior: Option<&Entry>, st: &Settings) -> Result<Entry> {
        let c = configure(Path::new(P), disk.get(P), disk, prior, st)?;
        disk.apply(&c.changes);
        Ok(c.entry)
    }
    fn run_unconf(disk: &mut Mem, prior: Option<&Entry>) -> Result<Vec<Change>> {
        let ch = unconfigure(Path::new(P), disk.get(P), disk, prior, None)?;
        disk.apply(&ch);
        Ok(ch)
    }

    const KATA: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n# kata under the name vgpu\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.kata.v2\"\n";

    /// A handler named vgpu that someone else wrote (kata here) is refused by configure, left alone by
    /// unconfigure, and replaced whole with --force.
    #[test]
    fn foreign_vgpu_handler_is_never_clobbered() {
        let e = configure(Path::new(P), Some(KATA), &Mem::default(), None, &s(false)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(
                "handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2"
            ),
            "{msg}"
        );
        assert!(msg.contains("--force"), "{msg}");
        let e = unconfigure(Path::new(P), Some(KATA), &Mem::default(), None, None).unwrap_err();
        assert!(format!("{e:#}").contains("left untouched"), "{e:#}");
        let other = KATA.replace(
            "io.containerd.kata.v2\"\n",
            "io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu.options]\n    BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        );
        let e =
            configure(Path::new(P), Some(&other), &Mem::default(), None, &s(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("its BinaryName is /usr/bin/nvidia-container-runtime"),
            "{e:#}"
        );
        let forced = Settings {
            force: true,
            ..s(false)
        };
        let c = configure(Path::new(P), Some(KATA), &Mem::default(), None, &forced).unwrap();
        let out = apply_in_memory(&c.changes, P, Some(KATA)).unwrap();
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2), "{out}");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        // After --force the handler is vgpu's: unconfigure removes it.
        assert!(!unconf(&out).unwrap().contains("runtimes.vgpu"));
    }

    const V2: &str = r#"version = 2
# The CRI plugin.
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6" # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          # keep cgroups under systemd
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"#;

    fn is_subsequence(orig: &str, out: &str) -> bool {
        let mut lines = out.lines();
        orig.lines().all(|l| lines.any(|o| o == l))
    }

    fn vgpu_table(doc: &str, plugin: &str) -> Table {
        let d: DocumentMut = doc.parse().unwrap();
        d["plugins"][plugin]["containerd"]["runtimes"]["vgpu"]
            .as_table()
            .unwrap()
            .clone()
    }

    #[test]
    fn v2_adds_handler_copies_options_keeps_comments() {
        let (out, entry) = conf_e(Some(V2), false, None);
        assert!(entry.is_empty(), "nothing to record: {entry:?}");
        assert!(
            is_subsequence(V2, &out),
            "every original line is kept, in order:\n{out}"
        );
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2));
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(t["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            t["pod_annotations"]
                .as_array()
                .unwrap()
                .get(0)
                .unwrap()
                .as_str(),
            Some("vgpu.io/*")
        );
        assert_eq!(t["container_annotations"].as_array().unwrap().len(), 1);
        assert!(
            !out.contains("# keep cgroups under systemd\n[plugins"),
            "copied keys carry no comments"
        );
        assert_eq!(conf(Some(&out), false), out, "idempotent");
        assert_eq!(unconf(&out).unwrap(), V2, "unconfigure restores the bytes");
    }

    #[test]
    fn v3_uses_the_v3_plugin() {
        let v3 = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  BinaryName = '/usr/bin/runc'\n";
        let out = conf(Some(v3), false);
        let t = vgpu_table(&out, "io.containerd.cri.v1.runtime");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(t["options"]["SystemdCgroup"].as_bool(), Some(false));
        assert!(!out.contains("io.containerd.grpc.v1.cri"));
        assert_eq!(unconf(&out).unwrap(), v3);
    }

    #[test]
    fn missing_file_gets_minimal_config_and_unconfigure_removes_it() {
        let out = conf(None, false);
        assert!(out.starts_with(CREATED));
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        let ch = unconfigure(Path::new(P), Some(&out), &Mem::default(), None, None).unwrap();
        assert_eq!(ch, vec![Change::remove(P.into())]);
    }

    #[test]
    fn tables_created_on_the_way_are_removed_again() {
        let orig = "version = 2\n# only this\n[debug]\n  level = \"info\"\n";
        let out = conf(Some(orig), false);
        assert_eq!(unconf(&out).unwrap(), orig);
        let (out, entry) = conf_e(Some(orig), true, None);
        assert!(out.contains(HEADER_ADDED));
        assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig);
    }

    #[test]
    fn builtin_runc_is_restated_when_the_file_names_no_runtime() {
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n";
        let out = conf(Some(orig), false);
        let d: DocumentMut = out.parse().unwrap();
        let runtimes = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        assert_eq!(runtimes["runc"]["runtime_type"].as_str(), Some(RUNC_V2));
        assert!(out.contains(RUNC_RESTATED));
        assert_eq!(conf(Some(&out), false), out);
        assert_eq!(unconf(&out).unwrap(), orig);
        // A runc the operator wrote is never removed.
        assert!(unconf(&conf(Some(V2), false))
            .unwrap()
            .contains("runtimes.runc]"));
    }

    /// The replaced default goes to vgpuctl's record, not into a comment; unconfigure restores it from
    /// there byte for byte.
    #[test]
    fn set_as_default_round_trip_through_the_record() {
        let (out, entry) = conf_e(Some(V2), true, None);
        assert!(
            out.contains("      default_runtime_name = \"vgpu\"\n"),
            "no comment: {out}"
        );
        assert_eq!(
            entry.previous_default,
            Some(PreviousDefault {
                name: Some("runc".into()),
                toml: Some(["\"runc\"".into(), " ".into(), "".into()])
            })
        );
        // The copy is still made from runc, not from vgpu itself.
        assert_eq!(
            vgpu_table(&out, "io.containerd.grpc.v1.cri")["options"]["SystemdCgroup"].as_bool(),
            Some(true)
        );
        // Again: nothing changes, and the record keeps what the first run replaced.
        let (again, entry2) = conf_e(Some(&out), true, Some(&entry));
        assert_eq!(again, out);
        assert_eq!(entry2, entry);
        assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), V2);
        // Unset before: recorded as unset, removed again.
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n";
        let (out, entry) = conf_e(Some(orig), true, None);
        assert_eq!(entry.previous_default.as_ref().unwrap().name, None);
        assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig);
        // A comment after the replaced value stays where it was.
        let orig = V2.replace("\"runc\"\n", "\"runc\"   # the node's default\n");
        let (out, entry) = conf_e(Some(&orig), true, None);
        assert!(
            out.contains("default_runtime_name = \"vgpu\"   # the node's default\n"),
            "{out}"
        );
        assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig);
    }

    /// Files configured by an older vgpuctl keep the replaced default in a comment: unconfigure still
    /// restores it from there (and configure still copies from it).
    #[test]
    fn the_legacy_comment_is_still_read() {
        let legacy = V2.replace(
            "      default_runtime_name = \"runc\"\n",
            "      default_runtime_name = \"vgpu\" # vgpuctl: previous default_runtime_name [\"\\\"runc\\\"\",\" \",\"\"]\n",
        );
        let with_handler = conf(Some(&legacy), false);
        assert_eq!(
            vgpu_table(&with_handler, "io.containerd.grpc.v1.cri")["options"]["SystemdCgroup"]
                .as_bool(),
            Some(true),
            "copied from runc, the legacy comment's default"
        );
        assert_eq!(
            unconf(&with_handler).unwrap(),
            V2,
            "restored from the comment"
        );
        let unset = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"vgpu\" # vgpuctl: default_runtime_name was unset\n  snapshotter = \"overlayfs\"\n";
        let out = conf(Some(unset), false);
        assert_eq!(
            unconf(&out).unwrap(),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"
        );
    }

    #[test]
    fn non_runc_default_is_not_copied() {
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"kata\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata.options]\n    ConfigPath = \"/etc/kata.toml\"\n";
        let t = vgpu_table(&conf(Some(orig), false), "io.containerd.grpc.v1.cri");
        assert!(t["options"].get("ConfigPath").is_none());
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2));
    }

    #[test]
    fn bad_input_is_reported_with_line() {
        let cfg = |text: &str| {
            configure(Path::new(P), Some(text), &Mem::default(), None, &s(false))
                .map(|_| ())
                .unwrap_err()
        };
        let e = cfg("version = 2\n[plugins\nfoo = 1\n");
        assert!(
            format!("{e:#}").starts_with("/etc/containerd/config.toml:2:"),
            "{e:#}"
        );
        let e = cfg("[plugins.cri]\nx = 1\n");
        assert!(format!("{e:#}").contains("version 1"), "{e:#}");
        let e = cfg("version = 4\n");
        assert!(
            format!("{e:#}").contains("unsupported containerd config version 4"),
            "{e:#}"
        );
        let e = cfg("version = 2\nimports = \"/etc/containerd/conf.d/*.toml\"\n");
        assert_eq!(
            format!("{e:#}"),
            "/etc/containerd/config.toml: `imports` is not an array of strings"
        );
    }

    // --- imports ---

    const V3_MAIN: &str = "version = 3\nimports = ['conf.d/*.toml']\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n";
    const V3_NVIDIA: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'nvidia'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n  BinaryName = '/usr/bin/nvidia-container-runtime'\n  SystemdCgroup = true\n";

    /// The default runtime and the options copied come from the merged view: here an import (relative glob,
    /// relative to the main file's folder) makes nvidia the default, so its options are copied; the import
    /// itself is never written.
    #[test]
    fn imports_are_read_for_the_default_runtime() {
        let mut disk = Mem::with(&[
            (P, V3_MAIN),
            ("/etc/containerd/conf.d/50-nvidia.toml", V3_NVIDIA),
        ]);
        let c = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap();
        assert_eq!(c.changes.len(), 1);
        assert_eq!(
            c.changes[0].path,
            Path::new(P),
            "only the main file is written"
        );
        disk.apply(&c.changes);
        let t = vgpu_table(disk.get(P).unwrap(), "io.containerd.cri.v1.runtime");
        assert_eq!(
            t["options"]["SystemdCgroup"].as_bool(),
            Some(true),
            "nvidia's options"
        );
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        // Absolute and non-glob entries too; a missing one is one line naming who imports it.
        let main = "version = 3\nimports = ['/opt/ctd/extra.toml', 'missing.toml']\n";
        let disk = Mem::with(&[(P, main), ("/opt/ctd/extra.toml", V3_NVIDIA)]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "/etc/containerd/config.toml: imports /etc/containerd/missing.toml, which does not exist \
             (containerd would not start); fix the imports first"
        );
    }

    /// A vgpu handler in an import vgpuctl did not write: refused, with --force too (vgpuctl never edits
    /// it, and it is read after the main file); unconfigure leaves it.
    #[test]
    fn a_foreign_handler_in_an_import_is_refused() {
        let kata = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.vgpu]\n  runtime_type = 'io.containerd.kata.v2'\n";
        let disk = Mem::with(&[(P, V3_MAIN), ("/etc/containerd/conf.d/20-kata.toml", kata)]);
        for force in [false, true] {
            let st = Settings { force, ..s(false) };
            let e = configure(Path::new(P), disk.get(P), &disk, None, &st).unwrap_err();
            let msg = format!("{e:#}");
            assert!(
                msg.starts_with("/etc/containerd/conf.d/20-kata.toml: the containerd runtime handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2"),
                "{msg}"
            );
            assert!(
                msg.contains("vgpuctl does not edit files it did not write"),
                "{msg}"
            );
        }
        assert!(unconfigure(Path::new(P), disk.get(P), &disk, None, None)
            .unwrap()
            .is_empty());
    }

    /// Version 2 (containerd 1.x): an import that restates the CRI plugin section replaces the main file's
    /// whole; a handler in the main file would be ignored, so vgpuctl says so and points at --drop-in.
    #[test]
    fn v2_import_restating_the_cri_section_needs_a_drop_in() {
        let main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
        let cri = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"mine:1\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n";
        let mut disk = Mem::with(&[(P, main), ("/etc/containerd/conf.d/10-cri.toml", cri)]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap_err();
        assert!(
            format!("{e:#}")
                .contains("10-cri.toml: restates [plugins.\"io.containerd.grpc.v1.cri\"]"),
            "{e:#}"
        );
        assert!(format!("{e:#}").contains("use --drop-in"), "{e:#}");
        // The drop-in (covered by the glob: the main file stays as it is) restates that section with the
        // handler added.
        let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
        assert_eq!(disk.get(P), Some(main));
        let text = disk.get(D).unwrap().to_string();
        assert!(
            is_our_drop_in(&text) && text.contains(DROP_IN_V2_NOTE),
            "{text}"
        );
        let d: DocumentMut = text.parse().unwrap();
        let cri_t = &d["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri_t["sandbox_image"].as_str(), Some("mine:1"), "{text}");
        let vgpu = &cri_t["containerd"]["runtimes"]["vgpu"];
        assert_eq!(vgpu["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            vgpu["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(entry.drop_in.as_deref(), Some(Path::new(D)));
        assert_eq!(entry.import_added, None, "the glob covers it");
        // Again: nothing to do.
        let c = configure(
            Path::new(P),
            disk.get(P),
            &disk,
            Some(&entry),
            &drop_in(false),
        )
        .unwrap();
        assert!(c.changes.is_empty(), "{:?}", c.changes);
        assert_eq!(c.entry, entry);
        run_unconf(&mut disk, Some(&entry)).unwrap();
        assert_eq!(disk.get(D), None);
        assert_eq!(disk.get(P), Some(main));
    }

    /// --drop-in where the main file imports nothing: the entry is added (comments and keys kept), the
    /// drop-in written; unconfigure takes both back, the main file byte for byte.
    #[test]
    fn drop_in_adds_the_import_and_unconfigure_takes_it_back() {
        for main in [
            V2.to_string(),
            "version = 2\n# mine\nimports = [\"/opt/other.toml\"] # theirs\n[debug]\n  level = \"info\"\n".into(),
        ] {
            let mut disk = Mem::with(&[(P, &main), ("/opt/other.toml", "version = 2\n")]);
            let entry = run_conf(&mut disk, None, &drop_in(true)).unwrap();
            let new_main = disk.get(P).unwrap().to_string();
            assert!(is_subsequence(&main, &new_main) || main.contains("imports"), "{new_main}");
            let d: DocumentMut = new_main.parse().unwrap();
            let imports = d["imports"].as_array().unwrap();
            assert_eq!(imports.iter().last().unwrap().as_str(), Some(D), "{new_main}");
            assert!(!new_main.contains("vgpu-container-runtime"), "the handler is not in the main file");
            let ia = entry.import_added.clone().unwrap();
            assert_eq!((ia.entry.as_str(), ia.created_key), (D, !main.contains("imports")));
            // The drop-in: version 2, the main file's CRI section restated, vgpu the default there.
            let dd: DocumentMut = disk.get(D).unwrap().parse().unwrap();
            let ctd = &dd["plugins"]["io.containerd.grpc.v1.cri"]["containerd"];
            assert_eq!(ctd["default_runtime_name"].as_str(), Some("vgpu"));
            assert_eq!(ctd["runtimes"]["vgpu"]["runtime_type"].as_str(), Some(RUNC_V2));
            assert_eq!(ctd["runtimes"]["runc"]["runtime_type"].as_str(), Some(RUNC_V2));
            // Idempotent.
            let before = disk.clone();
            let again = run_conf(&mut disk, Some(&entry), &drop_in(true)).unwrap();
            assert_eq!(again, entry);
            assert_eq!(disk.0, before.0);
            assert_eq!(
                entry.drop_in_dirs_created.as_deref(),
                Some(Path::new("/etc/containerd/conf.d")),
                "conf.d was made for the drop-in"
            );
            let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
            assert_eq!(ch.len(), 3);
            assert_eq!(ch[0].path, Path::new(P), "the import goes before the file");
            assert_eq!(ch[1].path, Path::new(D));
            assert_eq!(
                ch[2],
                Change::remove_empty_dir("/etc/containerd/conf.d".into()),
                "then the folder made for it"
            );
            assert_eq!(disk.get(P), Some(main.as_str()));
            assert_eq!(disk.get(D), None);
        }
    }

    /// Regression: `--drop-in` into a folder that did not exist left the folder behind after unconfigure.
    /// The folders configure made (nested ones too) go, deepest first; one that was there stays.
    #[test]
    fn folders_made_for_a_drop_in_go_with_it_and_others_stay() {
        let nested = Path::new("/etc/containerd/vgpu.d/rt/99-vgpu.toml");
        let st = Settings {
            drop_in: Some(nested),
            ..drop_in(false)
        };
        let mut disk = Mem::with(&[(P, V2)]);
        let entry = run_conf(&mut disk, None, &st).unwrap();
        assert_eq!(
            entry.drop_in_dirs_created.as_deref(),
            Some(Path::new("/etc/containerd/vgpu.d"))
        );
        let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
        let dirs: Vec<&Path> = ch
            .iter()
            .filter(|c| c.dir)
            .map(|c| c.path.as_path())
            .collect();
        assert_eq!(
            dirs,
            [
                Path::new("/etc/containerd/vgpu.d/rt"),
                Path::new("/etc/containerd/vgpu.d")
            ]
        );
        // conf.d held another file before: nothing to remove but the drop-in.
        let mut disk = Mem::with(&[
            (P, V2),
            ("/etc/containerd/conf.d/10-x.toml", "version = 2\n"),
        ]);
        let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
        assert_eq!(entry.drop_in_dirs_created, None);
        let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
        assert!(ch.iter().all(|c| !c.dir), "{ch:?}");
    }

    /// Without vgpuctl's record, unconfigure still finds its drop-in among the files containerd reads
    /// (by its header), and leaves the import entry it cannot tell was vgpuctl's.
    #[test]
    fn unconfigure_finds_the_drop_in_without_the_record() {
        let main = "version = 3\nimports = [\"conf.d/*.toml\"]\n";
        let mut disk = Mem::with(&[(P, main)]);
        run_conf(&mut disk, None, &drop_in(false)).unwrap();
        assert!(disk.get(D).is_some());
        run_unconf(&mut disk, None).unwrap();
        assert_eq!(disk.get(D), None);
        assert_eq!(disk.get(P), Some(main));
    }

    #[test]
    fn drop_in_on_a_missing_main_file_creates_and_removes_it() {
        let mut disk = Mem::default();
        let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
        let main = disk.get(P).unwrap();
        assert!(main.starts_with(CREATED) && main.contains(D), "{main}");
        assert!(entry.import_added.as_ref().unwrap().created_key);
        run_unconf(&mut disk, Some(&entry)).unwrap();
        assert!(disk.0.is_empty(), "{:?}", disk.0);
    }

    /// Version 3: the drop-in holds only what vgpu adds (containerd 2.x merges); the default and options
    /// copied come from every file read before it.
    #[test]
    fn v3_drop_in_holds_only_the_handler() {
        let mut disk = Mem::with(&[
            (P, V3_MAIN),
            ("/etc/containerd/conf.d/50-nvidia.toml", V3_NVIDIA),
        ]);
        let entry = run_conf(&mut disk, None, &drop_in(true)).unwrap();
        assert_eq!(disk.get(P), Some(V3_MAIN), "covered by conf.d/*.toml");
        let text = disk.get(D).unwrap();
        let d: DocumentMut = text.parse().unwrap();
        assert_eq!(d["version"].as_integer(), Some(3));
        let ctd = d["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
            .as_table()
            .unwrap();
        assert_eq!(ctd["default_runtime_name"].as_str(), Some("vgpu"));
        let keys: Vec<&str> = ctd["runtimes"]
            .as_table()
            .unwrap()
            .iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["vgpu"], "only the handler: {text}");
        assert_eq!(
            ctd["runtimes"]["vgpu"]["options"]["SystemdCgroup"].as_bool(),
            Some(true)
        );
        run_unconf(&mut disk, Some(&entry)).unwrap();
        assert_eq!(disk.get(D), None);
    }

    /// Files read after the drop-in that would undo it are refused, whatever --force says.
    #[test]
    fn files_read_after_the_drop_in_that_would_override_it_are_refused() {
        let main = "version = 3\nimports = [\"conf.d/*.toml\"]\n";
        let late_default = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'crun'\n";
        let disk = Mem::with(&[
            (P, main),
            ("/etc/containerd/conf.d/999-late.toml", late_default),
        ]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(true)).unwrap_err();
        assert!(
            format!("{e:#}").contains("999-late.toml: sets default_runtime_name and is read after"),
            "{e:#}"
        );
        assert!(configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).is_ok());
        let v2main = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
        let v2late =
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"x\"\n";
        let disk = Mem::with(&[
            (P, v2main),
            ("/etc/containerd/conf.d/999-late.toml", v2late),
        ]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("choose a --drop-in path read after it"),
            "{e:#}"
        );
        let kata = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.vgpu]\n  runtime_type = 'io.containerd.kata.v2'\n";
        let disk = Mem::with(&[(P, main), ("/etc/containerd/conf.d/999-kata.toml", kata)]);
        let forced = Settings {
            force: true,
            ..drop_in(false)
        };
        let e = configure(Path::new(P), disk.get(P), &disk, None, &forced).unwrap_err();
        assert!(
            format!("{e:#}").contains("999-kata.toml: the containerd runtime handler vgpu exists"),
            "{e:#}"
        );
    }

    /// A foreign handler read before the drop-in: refused without --force; with it the drop-in's wins.
    #[test]
    fn a_foreign_handler_before_the_drop_in_yields_to_force() {
        let mut disk = Mem::with(&[(P, KATA)]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
        assert!(format!("{e:#}").contains("--force"), "{e:#}");
        let forced = Settings {
            force: true,
            ..drop_in(false)
        };
        let entry = run_conf(&mut disk, None, &forced).unwrap();
        let d: DocumentMut = disk.get(D).unwrap().parse().unwrap();
        let vgpu = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vgpu"];
        assert_eq!(
            vgpu["runtime_type"].as_str(),
            Some(RUNC_V2),
            "replaced whole"
        );
        // Unconfigure removes vgpuctl's drop-in and the import, and leaves kata's handler.
        run_unconf(&mut disk, Some(&entry)).unwrap();
        assert_eq!(disk.get(P), Some(KATA));
        assert_eq!(disk.get(D), None);
    }

    /// A file at the drop-in's path that vgpuctl did not write: refused, --force replaces it; unconfigure
    /// leaves it. Switching between the main file and a drop-in goes through unconfigure.
    #[test]
    fn the_drop_in_path_and_the_modes() {
        let theirs = "version = 2\n# someone's\n";
        let mut disk = Mem::with(&[(P, V2), (D, theirs)]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!("{D}: the file exists and is not vgpu's (no vgpuctl header); left untouched (configure --force replaces it)")
        );
        let e =
            unconfigure(Path::new(P), disk.get(P), &disk, None, Some(Path::new(D))).unwrap_err();
        assert!(format!("{e:#}").contains("no vgpuctl header"), "{e:#}");
        let forced = Settings {
            force: true,
            ..drop_in(false)
        };
        let entry = run_conf(&mut disk, None, &forced).unwrap();
        assert!(is_our_drop_in(disk.get(D).unwrap()));
        let e = configure(Path::new(P), disk.get(P), &disk, Some(&entry), &s(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("vgpu is configured through the drop-in"),
            "{e:#}"
        );
        run_unconf(&mut disk, Some(&entry)).unwrap();
        assert_eq!(disk.get(P), Some(V2));
        run_conf(&mut disk, None, &s(false)).unwrap();
        let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("vgpu's handler is in this file"),
            "{e:#}"
        );
    }

    /// tests/golden/containerd: real configs (Debian's, `containerd config default`, a 2.x version 3) →
    /// the exact file vgpuctl writes; configure again is a no-op and unconfigure gives the input back.
    #[test]
    fn golden() {
        let n = crate::engines::golden("containerd", "toml", |case, input| {
            let def = case.ends_with("set-as-default");
            let (out, entry) = conf_e(Some(input), def, None);
            assert_eq!(
                conf_e(Some(&out), def, Some(&entry)).0,
                out,
                "{case}: idempotent"
            );
            assert_eq!(
                unconf_e(&out, Some(&entry)).unwrap(),
                input,
                "{case}: unconfigure restores the bytes"
            );
            out
        });
        assert!(n >= 3, "golden cases: {n}");
    }

    proptest! {
        // Comments and unrelated keys anywhere survive configure + unconfigure byte for byte.
        #[test]
        fn round_trip_with_comments(comment in "[a-zA-Z0-9 ]{0,30}", key in "[a-z_]{1,10}", n in any::<i32>(), def in any::<bool>()) {
            let orig = format!("# {comment}\nversion = 2\n{key}x = {n} # {comment}\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  # {comment}\n  snapshotter = \"overlayfs\"\n");
            let (out, entry) = conf_e(Some(&orig), def, None);
            prop_assert_eq!(conf_e(Some(&out), def, Some(&entry)).0, out.clone());
            prop_assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig.clone());
            // The same through a drop-in: the main file gets an import entry, and loses it again.
            let mut disk = Mem::with(&[(P, &orig)]);
            let entry = run_conf(&mut disk, None, &drop_in(def)).unwrap();
            run_unconf(&mut disk, Some(&entry)).unwrap();
            prop_assert_eq!(disk.get(P), Some(orig.as_str()));
            prop_assert_eq!(disk.0.len(), 1);
        }
    }
}
