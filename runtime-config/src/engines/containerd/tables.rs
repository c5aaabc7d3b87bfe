//! Editing TOML tables without disturbing what is around them (toml_edit): a child table created on the
//! way, a value set only when it changes, a copy detached from its file's layout, and the header-less
//! tables configure created removed again.
use crate::engines::error::{EngineError, Result};
use std::path::Path;
use toml_edit::{Item, Table, Value};

/// The table at `key` under `parent`, created (implicit: no header of its own) if missing.
pub fn child<'a>(parent: &'a mut Table, key: &str, path: &Path) -> Result<&'a mut Table> {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_mut().ok_or_else(|| {
        EngineError::shape(
            path,
            format!("`{key}` is not a [table] (inline tables are not edited by vgpuctl)"),
        )
    })
}

/// A value as written by vgpuctl, whatever its decor, for comparisons.
pub fn bare(v: &Value) -> String {
    let mut v = v.clone();
    v.decor_mut().clear();
    v.to_string()
}

/// Sets `table[key] = v` unless it already holds that value (so a second configure rewrites nothing).
pub fn ensure(table: &mut Table, key: &str, v: Value) {
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
pub fn detached(t: &Table) -> Table {
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
pub fn table_of(item: &Item) -> Option<Table> {
    match item {
        Item::Table(t) => Some(detached(t)),
        Item::Value(Value::InlineTable(it)) => Some(detached(&it.clone().into_table())),
        _ => None,
    }
}

/// Removes `key` from `parent` if it is an empty table without a header of its own (one that
/// configure created on the way to the runtime).
pub fn prune(parent: &mut Table, key: &str) {
    if let Some(t) = parent.get(key).and_then(Item::as_table) {
        if t.is_empty() && t.is_implicit() {
            parent.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toml_edit::DocumentMut;

    /// A value set again is not rewritten (its comment stays); a detached copy loses the layout.
    #[test]
    fn ensure_keeps_what_is_already_right_and_detached_drops_layout() {
        let mut d: DocumentMut = "[a]\nk = \"v\" # mine\n".parse().unwrap();
        let a = d["a"].as_table_mut().unwrap();
        ensure(a, "k", Value::from("v"));
        assert_eq!(d.to_string(), "[a]\nk = \"v\" # mine\n");
        let d: DocumentMut = "# c\n[a]\n  k = { x = 1 } # c\n".parse().unwrap();
        let t = detached(d["a"].as_table().unwrap());
        assert!(t["k"].is_table(), "inline tables become tables");
        assert!(!t.to_string().contains('#'));
        let mut d: DocumentMut = "x = 1\n".parse().unwrap();
        child(d.as_table_mut(), "t", Path::new("/f")).unwrap();
        prune(d.as_table_mut(), "t");
        assert_eq!(d.to_string(), "x = 1\n");
        assert!(child(d.as_table_mut(), "x", Path::new("/f")).is_err());
    }
}
