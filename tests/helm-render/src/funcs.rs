//! The Sprig/Helm functions the chart uses, over the engine's values. Each takes its piped value last, as
//! in Go templates (`{{ .Values.x | default "y" }}` is `default "y" .Values.x`).

use crate::values::to_yaml;
use gtmpl::{Template, Value};
use gtmpl_value::FuncError;
use std::cell::RefCell;

thread_local! {
    /// The chart's helper templates (`_*.tpl`), for `include`, which renders one of them by name.
    static HELPERS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Sets the helper templates `include` can name.
pub fn set_helpers(text: &str) {
    HELPERS.with(|h| *h.borrow_mut() = text.to_string());
}

pub fn add(t: &mut Template) {
    t.add_func("include", include);
    t.add_func("toYaml", to_yaml_fn);
    t.add_func("indent", indent);
    t.add_func("nindent", nindent);
    t.add_func("quote", quote);
    t.add_func("default", default);
    t.add_func("required", required);
}

/// `include NAME CONTEXT`: the named `define` rendered with CONTEXT, as a string (so it can be piped to
/// `nindent`, unlike the `template` action).
fn include(args: &[Value]) -> Result<Value, FuncError> {
    arity("include", args, 2)?;
    let Value::String(name) = &args[0] else {
        return Err(FuncError::UnableToConvertFromValue);
    };
    let helpers = HELPERS.with(|h| h.borrow().clone());
    let mut t = Template::default();
    add(&mut t);
    t.parse(format!("{helpers}{{{{- template {name:?} . -}}}}"))
        .map_err(|e| FuncError::Generic(e.to_string()))?;
    let out = t
        .render(&gtmpl::Context::from(args[1].clone()))
        .map_err(|e| FuncError::Generic(format!("include {name:?}: {e}")))?;
    Ok(Value::from(out))
}

fn arity(name: &str, args: &[Value], n: usize) -> Result<(), FuncError> {
    if args.len() != n {
        return Err(FuncError::ExactlyXArgs(name.into(), n));
    }
    Ok(())
}

/// The text a value prints as (strings as they are, the rest as YAML scalars).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::NoValue | Value::Nil => String::new(),
        other => serde_yaml_ng::to_string(&to_yaml(other))
            .unwrap_or_default()
            .trim_end()
            .to_string(),
    }
}

fn empty(v: &Value) -> bool {
    match v {
        Value::NoValue | Value::Nil => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Map(m) | Value::Object(m) => m.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Function(_) => false,
    }
}

fn to_yaml_fn(args: &[Value]) -> Result<Value, FuncError> {
    arity("toYaml", args, 1)?;
    let s = serde_yaml_ng::to_string(&to_yaml(&args[0]))
        .map_err(|e| FuncError::Generic(e.to_string()))?;
    Ok(Value::from(s.trim_end().to_string()))
}

fn spaces(args: &[Value], name: &str) -> Result<usize, FuncError> {
    arity(name, args, 2)?;
    match &args[0] {
        Value::Number(n) => n
            .as_u64()
            .map(|n| n as usize)
            .ok_or(FuncError::UnableToConvertFromValue),
        _ => Err(FuncError::UnableToConvertFromValue),
    }
}

fn indent(args: &[Value]) -> Result<Value, FuncError> {
    let pad = " ".repeat(spaces(args, "indent")?);
    let body = text(&args[1]);
    Ok(Value::from(
        body.lines()
            .map(|l| format!("{pad}{l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    ))
}

fn nindent(args: &[Value]) -> Result<Value, FuncError> {
    let Value::String(s) = indent(args)? else {
        unreachable!("indent returns a string")
    };
    Ok(Value::from(format!("\n{s}")))
}

fn quote(args: &[Value]) -> Result<Value, FuncError> {
    arity("quote", args, 1)?;
    // A JSON string is a valid double-quoted YAML scalar.
    Ok(Value::from(
        format!("{:?}", text(&args[0])).replace("\\'", "'"),
    ))
}

fn default(args: &[Value]) -> Result<Value, FuncError> {
    arity("default", args, 2)?;
    Ok(if empty(&args[1]) {
        args[0].clone()
    } else {
        args[1].clone()
    })
}

fn required(args: &[Value]) -> Result<Value, FuncError> {
    arity("required", args, 2)?;
    if empty(&args[1]) {
        return Err(FuncError::Generic(text(&args[0])));
    }
    Ok(args[1].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(src: &str) -> Result<String, String> {
        let mut t = Template::default();
        add(&mut t);
        t.parse(src).map_err(|e| e.to_string())?;
        let mut m = std::collections::HashMap::new();
        m.insert("n".to_string(), Value::from(9394i64));
        m.insert("off".to_string(), Value::Bool(false));
        m.insert("s".to_string(), Value::from("a \"b\""));
        let mut inner = std::collections::HashMap::new();
        inner.insert("k".to_string(), Value::from("v"));
        inner.insert("a".to_string(), Value::Array(vec![Value::from(1i64)]));
        m.insert("map".to_string(), Value::Map(inner));
        t.render(&gtmpl::Context::from(Value::Map(m)))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn include_renders_a_helper_by_name_as_a_string() {
        set_helpers(
            r#"{{- define "l" }}a: {{ .k }}
b: 2{{ end }}"#,
        );
        assert_eq!(
            run(r#"x:{{ include "l" .map | nindent 2 }}"#).unwrap(),
            "x:\n  a: v\n  b: 2"
        );
        assert!(run(r#"{{ include "nosuch" . }}"#).is_err());
    }

    #[test]
    fn the_functions_do_what_helm_does() {
        assert_eq!(
            run("x:{{ .map | toYaml | nindent 2 }}").unwrap(),
            "x:\n  a:\n  - 1\n  k: v"
        );
        assert_eq!(
            run("{{ .missing | toYaml }}").unwrap(),
            "null",
            "as Helm's toYaml of nil"
        );
        assert_eq!(
            run("{{ .s | quote }} {{ .n | quote }}").unwrap(),
            r#""a \"b\"" "9394""#
        );
        assert_eq!(
            run(r#"{{ .missing | default "d" }} {{ .n | default 1 }}"#).unwrap(),
            "d 9394"
        );
        assert_eq!(run(r#"{{ .off | default true }}"#).unwrap(), "true");
        assert!(run(r#"{{ required "set x" .missing }}"#)
            .unwrap_err()
            .contains("set x"));
        assert!(
            run("{{ .n | nosuchfunc }}").is_err(),
            "an unknown function is refused"
        );
    }
}
