//! `vgpu-helm-render CHART [-f VALUES]... [--set KEY=VALUE]...`: renders vgpu's Helm chart
//! (`packaging/helm/vgpu`) to a stream of YAML documents, as `helm template` would, so that `make test` can
//! validate what the chart produces (`kubernetes-validate --strict`) on a machine where no `helm` binary
//! can be installed. The templates are Go `text/template`, executed by `gtmpl` (a Rust port of it); on top,
//! the few Sprig/Helm functions the chart uses: `include`, `toYaml`, `indent`, `nindent`, `quote`,
//! `default`, `required`. The chart keeps to that subset (it renders the same under real `helm`), and this tool refuses
//! what it does not know (an unknown function is a parse error), so a template that grows past the subset
//! fails the test rather than rendering wrong.
//!
//! The values are the chart's `values.yaml`, then each `-f` file merged over it (maps merge key by key,
//! anything else replaces), then each `--set` (dotted key; `true`/`false`/integers typed, else a string).

mod funcs;
mod values;

use anyhow::{bail, Context, Result};
use clap::Parser;
use gtmpl::{Template, Value};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(about = "Render vgpu's Helm chart offline (helm template's subset the chart uses)")]
struct Args {
    /// The chart's folder (holding Chart.yaml, values.yaml, templates/).
    chart: PathBuf,
    /// A values file merged over the chart's values.yaml (repeatable).
    #[arg(short = 'f', long = "values")]
    values: Vec<PathBuf>,
    /// KEY=VALUE with a dotted key (repeatable), over the values files.
    #[arg(long)]
    set: Vec<String>,
    /// The release's name (`.Release.Name`).
    #[arg(long, default_value = "vgpu")]
    release: String,
    /// The release's namespace (`.Release.Namespace`).
    #[arg(long, default_value = "kube-system")]
    namespace: String,
}

fn main() {
    let args = Args::parse();
    match render(&args) {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("vgpu-helm-render: {e:#}");
            std::process::exit(1);
        }
    }
}

fn yaml_file(p: &Path) -> Result<serde_yaml_ng::Value> {
    let text = fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", p.display()))
}

fn render(a: &Args) -> Result<String> {
    let chart = yaml_file(&a.chart.join("Chart.yaml"))?;
    let mut vals = yaml_file(&a.chart.join("values.yaml"))?;
    for f in &a.values {
        values::merge(&mut vals, yaml_file(f)?);
    }
    for s in &a.set {
        values::set(&mut vals, s)?;
    }
    let field = |k: &str| {
        chart
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let mut chart_ctx = HashMap::new();
    for (ours, theirs) in [
        ("Name", "name"),
        ("Version", "version"),
        ("AppVersion", "appVersion"),
    ] {
        chart_ctx.insert(ours.to_string(), Value::from(field(theirs)));
    }
    let mut release = HashMap::new();
    release.insert("Name".to_string(), Value::from(a.release.clone()));
    release.insert("Namespace".to_string(), Value::from(a.namespace.clone()));
    release.insert("Service".to_string(), Value::from("Helm"));
    let mut root = HashMap::new();
    root.insert("Values".to_string(), values::to_gtmpl(&vals));
    root.insert("Chart".to_string(), Value::Object(chart_ctx));
    root.insert("Release".to_string(), Value::Object(release));
    let ctx = gtmpl::Context::from(Value::Object(root));

    let dir = a.chart.join("templates");
    let mut names: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    // Helpers (`_*.tpl`) hold only `define`s: every template sees them.
    let mut helpers = String::new();
    for n in names.iter().filter(|n| n.starts_with('_')) {
        helpers += &fs::read_to_string(dir.join(n))?;
    }
    funcs::set_helpers(&helpers);
    let chart_name = field("name");
    let mut out = String::new();
    for n in names.iter().filter(|n| n.ends_with(".yaml")) {
        let text = fs::read_to_string(dir.join(n))?;
        let mut t = Template::default();
        funcs::add(&mut t);
        if let Err(e) = t.parse(format!("{helpers}{text}")) {
            bail!("templates/{n}: {e}");
        }
        let doc = t
            .render(&ctx)
            .map_err(|e| anyhow::anyhow!("templates/{n}: {e}"))?;
        if doc.trim().is_empty() {
            continue;
        }
        out += &format!(
            "---\n# Source: {chart_name}/templates/{n}\n{}\n",
            doc.trim_matches('\n')
        );
    }
    Ok(out)
}
