//! The chart's values: merging files and `--set` over `values.yaml`, and the conversions between YAML and
//! the template engine's values (maps come back sorted by key, as Helm's `toYaml` writes them).

use anyhow::{bail, Result};
use gtmpl::Value;
use serde_yaml_ng::{Mapping, Value as Yaml};

/// `over` merged into `base`: maps key by key, anything else replaced (Helm's coalescing of values files).
pub fn merge(base: &mut Yaml, over: Yaml) {
    match (base, over) {
        (Yaml::Mapping(b), Yaml::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// `--set a.b.c=value`: the dotted path created as maps where missing.
pub fn set(vals: &mut Yaml, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        bail!("--set {assignment}: not KEY=VALUE");
    };
    let value = match raw {
        "true" => Yaml::Bool(true),
        "false" => Yaml::Bool(false),
        _ => match raw.parse::<i64>() {
            Ok(n) => Yaml::Number(n.into()),
            Err(_) => Yaml::String(raw.to_string()),
        },
    };
    let mut at = vals;
    for part in key.split('.') {
        if part.is_empty() {
            bail!("--set {assignment}: an empty key part");
        }
        if !at.is_mapping() {
            *at = Yaml::Mapping(Mapping::new());
        }
        let map = at.as_mapping_mut().expect("made a mapping above");
        at = map
            .entry(Yaml::String(part.to_string()))
            .or_insert(Yaml::Null);
    }
    *at = value;
    Ok(())
}

pub fn to_gtmpl(y: &Yaml) -> Value {
    match y {
        Yaml::Null => Value::Nil,
        Yaml::Bool(b) => Value::Bool(*b),
        Yaml::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) => Value::from(f),
            _ => Value::Nil,
        },
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Sequence(s) => Value::Array(s.iter().map(to_gtmpl).collect()),
        Yaml::Mapping(m) => Value::Map(m.iter().map(|(k, v)| (key_text(k), to_gtmpl(v))).collect()),
        Yaml::Tagged(t) => to_gtmpl(&t.value),
    }
}

fn key_text(k: &Yaml) -> String {
    match k {
        Yaml::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

pub fn to_yaml(v: &Value) -> Yaml {
    match v {
        Value::NoValue | Value::Nil | Value::Function(_) => Yaml::Null,
        Value::Bool(b) => Yaml::Bool(*b),
        Value::String(s) => Yaml::String(s.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Yaml::Number(i.into()),
            (None, Some(f)) => Yaml::Number(f.into()),
            _ => Yaml::Null,
        },
        Value::Array(a) => Yaml::Sequence(a.iter().map(to_yaml).collect()),
        Value::Map(m) | Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            Yaml::Mapping(
                keys.into_iter()
                    .map(|k| (Yaml::String(k.clone()), to_yaml(&m[k])))
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Yaml {
        serde_yaml_ng::from_str(s).unwrap()
    }

    #[test]
    fn files_merge_maps_key_by_key_and_replace_the_rest() {
        let mut base = y("a: {b: 1, c: [1, 2]}\nd: x");
        merge(&mut base, y("a: {c: [3]}\nd: {e: 1}"));
        assert_eq!(base, y("a: {b: 1, c: [3]}\nd: {e: 1}"));
    }

    #[test]
    fn set_types_booleans_and_integers_and_makes_the_path() {
        let mut v = y("a: 1");
        set(&mut v, "b.c=true").unwrap();
        set(&mut v, "b.d=9394").unwrap();
        set(&mut v, "b.e=4Gi").unwrap();
        assert_eq!(v, y("a: 1\nb: {c: true, d: 9394, e: 4Gi}"));
        assert!(set(&mut v, "novalue").is_err());
        assert!(set(&mut v, "a..b=1").is_err());
    }

    #[test]
    fn values_go_through_the_engine_and_back_sorted() {
        let v = y("z: 1\na: [x, {k: true}]\nm: null");
        assert_eq!(
            serde_yaml_ng::to_string(&to_yaml(&to_gtmpl(&v))).unwrap(),
            "a:\n- x\n- k: true\nm: null\nz: 1\n"
        );
    }
}
