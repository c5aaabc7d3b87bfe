//! `--set-as-default` in the main file: `default_runtime_name` set to vgpu (the replaced value's
//! whitespace and comment kept, the old value for vgpuctl's record), put back on unconfigure from the
//! record or an older vgpuctl's comment; and which runtime vgpu's handler copies (the default, or the one
//! vgpu replaced as the default).
use super::handler::RUNTIME;
use super::marks::{marked, HEADER_ADDED, LEGACY_PREVIOUS, LEGACY_WAS_UNSET};
use super::tables::bare;
use crate::engines::record::{Entry, PreviousDefault};
use toml_edit::{Item, Table, Value};

/// The runtime the handler copies: the default (or runc), unless vgpu itself is the default, then the one
/// configure replaced (vgpuctl's record, else an older vgpuctl's comment in `main_containerd`).
pub fn base_name(
    view_ctd: &Table,
    prior: Option<&Entry>,
    main_containerd: Option<&Table>,
) -> String {
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

/// Makes vgpu the default runtime (the replaced value's whitespace and comment kept around the new one);
/// returns what it replaced, None if vgpu was the default already.
pub fn set_default(containerd: &mut Table) -> Option<PreviousDefault> {
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

/// Takes `--set-as-default` back in the main file's `containerd` table: the recorded default (else an
/// older vgpuctl's comment) replaces vgpu, or the key goes; a header configure added goes again.
pub fn restore_default(containerd: &mut Table, prior: Option<&Entry>) {
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
}

/// What an older vgpuctl's `--set-as-default` replaced, from its comment: Some(Some(value as it was
/// written)), Some(None) if unset, None if there is no such comment.
pub fn legacy_previous_default(containerd: &Table) -> Option<Option<Value>> {
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
pub fn recorded_value(p: &PreviousDefault) -> Option<Value> {
    let name = p.name.as_deref()?;
    Some(match &p.toml {
        Some([repr, prefix, suffix]) => repr
            .parse::<Value>()
            .map(|v| v.decorated(prefix.as_str(), suffix.as_str()))
            .unwrap_or_else(|_| Value::from(name).decorated(" ", "")),
        None => Value::from(name).decorated(" ", ""),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
}
