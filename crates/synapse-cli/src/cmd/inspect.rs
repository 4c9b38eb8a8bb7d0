//! `synapse-cli inspect FILE [--json]`: format, version, metadata (long arrays summarized),
//! tensor table, type histogram, total parameters and bytes — for GGUF files and safetensors
//! files or checkpoint directories (sharded too).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args as ClapArgs;
use serde_json::{Value, json};
use synapse_formats::gguf::{GgufArray, GgufFile, GgufValue};
use synapse_formats::safetensors::SafetensorsModel;

/// Arguments of `inspect`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A `.gguf` file, a `.safetensors` file, or a checkpoint directory.
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Array elements shown before an array is summarized.
    #[arg(long, default_value_t = 8)]
    array_head: usize,
}

/// A model opened by content sniffing.
pub enum Model {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A safetensors file or checkpoint directory.
    Safetensors(SafetensorsModel),
}

/// Opens `path` as GGUF (magic `GGUF`) or safetensors (anything else, or a directory).
pub fn open_model(path: &Path) -> anyhow::Result<Model> {
    let path = &super::load::source_path(path)?;
    if !path.is_dir() {
        let mut magic = [0u8; 4];
        let mut f =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let n = std::io::Read::read(&mut f, &mut magic)?;
        if n == 4 && &magic == b"GGUF" {
            return Ok(Model::Gguf(GgufFile::open(path)?));
        }
    }
    Ok(Model::Safetensors(SafetensorsModel::open(path)?))
}

/// One row of the tensor table.
struct Row {
    name: String,
    ty: String,
    shape: Vec<u64>,
    offset: u64,
    bytes: u64,
    params: u64,
    shard: Option<String>,
}

fn array_json(a: &GgufArray, head: usize) -> Value {
    let n = a.len();
    let items: Vec<Value> = a
        .iter()
        .take(if n > head { head } else { n })
        .map(|v| value_json(&v, head))
        .collect();
    if n > head {
        json!({"type": format!("array<{}>", a.element_type().name()), "len": n, "head": items})
    } else {
        Value::Array(items)
    }
}

fn value_json(v: &GgufValue, head: usize) -> Value {
    match v {
        GgufValue::String(s) => json!(s),
        GgufValue::Bool(b) => json!(b),
        GgufValue::F32(x) => json!(x),
        GgufValue::F64(x) => json!(x),
        GgufValue::Array(a) => array_json(a, head),
        other => other
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| other.as_u64().map(|u| json!(u)))
            .unwrap_or(Value::Null),
    }
}

fn value_text(v: &GgufValue, head: usize) -> String {
    match v {
        GgufValue::Array(a) if a.len() > head => {
            let items: Vec<String> = a.iter().take(head).map(|x| value_text(&x, head)).collect();
            format!(
                "[{}; {}] [{}, ...]",
                a.element_type().name(),
                a.len(),
                items.join(", ")
            )
        }
        GgufValue::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| value_text(&x, head)).collect();
            format!("[{}]", items.join(", "))
        }
        GgufValue::String(s) => format!("{s:?}"),
        other => value_json(other, head).to_string(),
    }
}

/// Header JSON, metadata (key, JSON, text), tensor rows, and the shape-order note.
type Described = (Value, Vec<(String, Value, String)>, Vec<Row>, &'static str);

/// Prints the model's description.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = open_model(&args.file)?;
    let head = args.array_head;
    let (header, metadata, rows, shape_note): Described = match &model {
        Model::Gguf(f) => {
            let header = json!({
                "format": "gguf",
                "version": f.version(),
                "alignment": f.alignment(),
                "data_offset": f.data_start(),
                "file_bytes": f.file_len(),
                "architecture": f.architecture(),
            });
            let md = f
                .metadata()
                .iter()
                .map(|(k, v)| (k.clone(), value_json(v, head), value_text(v, head)))
                .collect();
            let rows = f
                .tensors()
                .iter()
                .map(|t| Row {
                    name: t.name.clone(),
                    ty: t.ty.name().to_string(),
                    shape: t.dims.clone(),
                    offset: t.offset,
                    bytes: t.n_bytes,
                    params: t.n_elements(),
                    shard: None,
                })
                .collect();
            (header, md, rows, "ggml order: ne0 (contiguous) first")
        }
        Model::Safetensors(m) => {
            let header = json!({
                "format": "safetensors",
                "version": Value::Null,
                "shards": m.shards().iter().map(|s| s.label().to_string()).collect::<Vec<_>>(),
            });
            let md = m
                .metadata()
                .into_iter()
                .map(|(k, v)| {
                    let t = format!("{v:?}");
                    (k, json!(v), t)
                })
                .collect();
            let rows = m
                .tensors()
                .map(|t| {
                    let entry = m
                        .shards()
                        .iter()
                        .find(|s| s.label() == t.shard)
                        .and_then(|s| s.entry(t.name));
                    Row {
                        name: t.name.to_string(),
                        ty: t.dtype.as_str().to_string(),
                        shape: t.shape.to_vec(),
                        offset: entry.map_or(0, |e| e.offset),
                        bytes: t.bytes.len() as u64,
                        params: t.shape.iter().product(),
                        shard: (m.shards().len() > 1).then(|| t.shard.to_string()),
                    }
                })
                .collect();
            (header, md, rows, "row-major: last dim contiguous")
        }
    };

    let mut hist: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for r in &rows {
        let e = hist.entry(r.ty.clone()).or_default();
        e.0 += 1;
        e.1 += r.params;
        e.2 += r.bytes;
    }
    let total_params: u64 = rows.iter().map(|r| r.params).sum();
    let total_bytes: u64 = rows.iter().map(|r| r.bytes).sum();

    if args.json {
        let v = json!({
            "header": header,
            "metadata": metadata.iter().map(|(k, v, _)| (k.clone(), v.clone())).collect::<serde_json::Map<_, _>>(),
            "shape_order": shape_note,
            "tensors": rows.iter().map(|r| {
                let mut o = json!({"name": r.name, "type": r.ty, "shape": r.shape, "offset": r.offset, "bytes": r.bytes});
                if let Some(s) = &r.shard { o["shard"] = json!(s); }
                o
            }).collect::<Vec<_>>(),
            "histogram": hist.iter().map(|(t, (n, p, b))| (t.clone(), json!({"tensors": n, "params": p, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "total_params": total_params,
            "total_bytes": total_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }

    println!("file: {}", args.file.display());
    if let Value::Object(h) = &header {
        for (k, v) in h {
            if !v.is_null() {
                println!("{k}: {v}");
            }
        }
    }
    println!("\nmetadata ({} keys):", metadata.len());
    for (k, _, t) in &metadata {
        println!("  {k} = {t}");
    }
    println!("\ntensors ({}; shape in {shape_note}):", rows.len());
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    println!(
        "  {:<w$}  {:<8} {:<24} {:>12} {:>12}",
        "name", "type", "shape", "offset", "bytes"
    );
    for r in &rows {
        let shape = format!("{:?}", r.shape);
        print!(
            "  {:<w$}  {:<8} {:<24} {:>12} {:>12}",
            r.name, r.ty, shape, r.offset, r.bytes
        );
        match &r.shard {
            Some(s) => println!("  {s}"),
            None => println!(),
        }
    }
    println!("\ntype histogram:");
    for (t, (n, p, b)) in &hist {
        println!("  {t:<8} {n:>5} tensors {p:>14} params {b:>14} bytes");
    }
    println!("\ntotal: {total_params} params, {total_bytes} bytes");
    Ok(())
}
