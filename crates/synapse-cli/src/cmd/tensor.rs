//! `synapse-cli tensor FILE NAME --out PATH [--json]`: one tensor decoded to little-endian
//! f32, row-major in the file's own dimension order (for GGUF: outermost dim first, `ne0`
//! contiguous, i.e. the storage order; for safetensors: the stored shape).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use serde_json::json;

use super::inspect::{Model, open_model};

/// Arguments of `tensor`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A `.gguf` file, a `.safetensors` file, or a checkpoint directory.
    file: PathBuf,
    /// The tensor's name.
    name: String,
    /// Where to write the f32 values.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the tensor's shape and type as JSON.
    #[arg(long)]
    json: bool,
}

/// Elements decoded per chunk (bounds memory for 100M-element tensors).
const CHUNK_ELEMS: usize = 1 << 20;

/// Decodes the tensor and writes it.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.out.is_none() && !args.json {
        bail!("nothing to do: give --out PATH and/or --json");
    }
    let model = open_model(&args.file)?;
    let mut out = match &args.out {
        Some(p) => Some(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut buf = Vec::new();
    let mut bytes = Vec::new();
    let (ty, shape, n): (String, Vec<u64>, u64) = match &model {
        Model::Gguf(f) => {
            let t = f
                .tensor(&args.name)
                .with_context(|| format!("no tensor `{}` in {}", args.name, args.file.display()))?;
            let g = t.ty.ggml()?;
            let data = f.tensor_data(t);
            let ne0 = t.dims.first().copied().unwrap_or(1) as usize;
            let row_bytes = ne0 / g.block_size() * g.type_size();
            if let Some(w) = out.as_mut() {
                if ne0 == 0 || row_bytes == 0 {
                    // empty tensor: nothing to write
                } else {
                    let rows_per_chunk = (CHUNK_ELEMS / ne0).max(1);
                    for chunk in data.chunks(rows_per_chunk * row_bytes) {
                        buf.resize(chunk.len() / row_bytes * ne0, 0.0f32);
                        synapse_formats::decode::dequantize(g, chunk, &mut buf)?;
                        write_f32(w, &buf, &mut bytes)?;
                    }
                }
            }
            (t.ty.name().to_string(), t.shape_row_major(), t.n_elements())
        }
        Model::Safetensors(m) => {
            let t = m
                .tensor(&args.name)
                .with_context(|| format!("no tensor `{}` in {}", args.name, args.file.display()))?;
            if let Some(w) = out.as_mut() {
                let es = t.dtype.size();
                for chunk in t.bytes.chunks(CHUNK_ELEMS * es) {
                    buf.resize(chunk.len() / es, 0.0f32);
                    t.dtype.decode_to_f32(chunk, &mut buf)?;
                    write_f32(w, &buf, &mut bytes)?;
                }
            }
            (
                t.dtype.as_str().to_string(),
                t.shape.to_vec(),
                t.shape.iter().product(),
            )
        }
    };
    if let Some(mut w) = out {
        w.flush()?;
    }
    if args.json {
        let v = json!({
            "name": args.name,
            "type": ty,
            "shape": shape,
            "elements": n,
            "out": args.out.as_ref().map(|p| p.display().to_string()),
            "out_bytes": args.out.as_ref().map(|_| n * 4),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

fn write_f32(w: &mut impl Write, v: &[f32], scratch: &mut Vec<u8>) -> std::io::Result<()> {
    scratch.clear();
    scratch.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    w.write_all(scratch)
}
