//! `synapse-cli export-gguf`: a precision profile written out as a GGUF that llama.cpp (and
//! anything else that reads GGUF) loads — the source file's metadata and tensors, each
//! re-encoded matrix in its ggml type with the profile's bytes.
//!
//! Only ggml's own types can be written (a `syn.*` codec has no GGUF type): `--budget`
//! selects among the importance map's ggml-type candidates alone (`ggml.q8_0.v1` …
//! `ggml.q4_k.v1`, the source's own encodings always allowed), and a `--profile` that assigns
//! a Synapse codec is refused, naming the tensor, before anything is written. Routed experts
//! re-encoded by a profile are refused too (their stacked tensors are not assembled here).
//! The file is written next to its destination and renamed into place, so a failed export
//! leaves nothing behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_formats::gguf::{GgufFile, GgufValue, GgufWriter, TensorType};
use synapse_kernels::Encoding;

use super::load::{ModelArgs, PrecisionArgs, source_gguf};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Where to write the GGUF.
    #[arg(short, long)]
    out: PathBuf,
    /// Replace `--out` when it exists.
    #[arg(long)]
    force: bool,
}

/// The metadata key the export records its profile's hash under.
pub const PROFILE_KEY: &str = "synapse.profile";

/// Runs `export-gguf`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.out.exists() && !a.force {
        bail!("{} exists (pass --force to replace it)", a.out.display());
    }
    let src_path = source_gguf(a.model.model.as_deref())?;
    let (model, _) = a.model.load()?;
    let model = Arc::new(model);
    // `--budget` selects among the map's ggml types only.
    let only_ggml = |map: &mut synapse_sensitivity::ImportanceMap| {
        let mut kept = 0usize;
        for t in map.tensors.values_mut() {
            t.options.retain(|o| o.encoding.starts_with("ggml."));
            kept += t.options.len();
        }
        if kept == 0 {
            bail!(
                "the importance map measured no ggml type (its candidates are Synapse codecs \
                 only): run `synapse-cli importance` with the default ladder or `--ladder ggml`"
            );
        }
        Ok(())
    };
    let prepared = a.precision.apply_narrowed(
        &model,
        a.model.model.as_deref(),
        a.model.store.as_deref(),
        only_ggml,
    )?;
    write(&a, &src_path, &model, &prepared.applied.model)
}

/// Writes `m` (a profile of `source`, loaded from `src_path`) as a GGUF at `a.out`.
fn write(
    a: &Args,
    src_path: &Path,
    source: &synapse_runtime::Model,
    m: &synapse_runtime::Model,
) -> anyhow::Result<()> {
    let changed = |name: &str| m.profile.encoding(name) != source.profile.encoding(name);
    if let Some(e) = synapse_runtime::importance::expert_tensors(m)
        .into_iter()
        .find(|n| changed(n))
    {
        bail!(
            "{e}: the profile re-encodes routed experts, which export-gguf does not write (their \
             stacked tensors); export a profile that keeps them at the source"
        );
    }
    let file =
        GgufFile::open(src_path).with_context(|| format!("opening {}", src_path.display()))?;
    // The profile's matrices by the GGUF's tensor names (a tied head is the embedding table).
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    let mut re: BTreeMap<String, (TensorType, Arc<synapse_kernels::QuantMatrix>)> = BTreeMap::new();
    for (name, mat) in synapse_runtime::importance::linears(m) {
        if !changed(&name) {
            continue;
        }
        let Encoding::Ggml(ty) = mat.encoding() else {
            bail!(
                "{name}: the profile assigns {}, a Synapse codec, which has no GGUF type; \
                 export-gguf writes profiles of ggml types only (`--budget` picks among them, \
                 `--profile uniform:ggml.q4_k.v1` …)",
                m.profile.encoding(&name).unwrap_or("?")
            );
        };
        let name = if name == "output.weight" && tied {
            "token_embd.weight".to_string()
        } else {
            name
        };
        re.insert(name, (TensorType::from(ty), mat));
    }
    let mut w = GgufWriter::new();
    if file.alignment() != 32 {
        w.set_alignment(u32::try_from(file.alignment())?)?;
    }
    for (k, v) in file.metadata() {
        if k == "general.alignment" || k == PROFILE_KEY {
            continue;
        }
        w.add_metadata(k.clone(), v.clone())?;
    }
    w.add_metadata(PROFILE_KEY, GgufValue::String(m.profile.hash()))?;
    let (mut n_re, mut bytes) = (0usize, 0u64);
    for t in file.tensors() {
        let (ty, data) = match re.remove(&t.name) {
            Some((ty, mat)) => {
                n_re += 1;
                (ty, mat.raw_bytes().to_vec())
            }
            None => (t.ty, file.tensor_data(t).to_vec()),
        };
        bytes += data.len() as u64;
        w.add_tensor(t.name.clone(), &t.dims, ty, data)?;
    }
    if let Some(name) = re.keys().next() {
        bail!("{name}: the profile re-encodes a tensor the source GGUF does not hold");
    }
    let dir = a
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(tmp.as_file());
        w.write_to(&mut out)?;
        out.flush()?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(&a.out)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "export-gguf: {} ({} tensors, {n_re} re-encoded, {bytes} tensor bytes; profile {})",
        a.out.display(),
        file.tensors().len(),
        m.profile.hash()
    );
    Ok(())
}
