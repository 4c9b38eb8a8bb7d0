//! `synapse-cli export-gguf`: a precision profile written out as a GGUF that llama.cpp (and
//! anything else that reads GGUF) loads — the source file's metadata and tensors, each
//! re-encoded matrix in its ggml type with the profile's bytes.
//!
//! Only ggml's own types can be written (a `syn.*` codec has no GGUF type): `--budget`
//! selects among the importance map's ggml-type candidates alone (`ggml.q8_0.v1` …
//! `ggml.q4_k.v1`, the source's own encodings always allowed), and a `--profile` that assigns
//! a Synapse codec is refused, naming the tensor, before anything is written. A mixture of
//! experts' re-encoded routed experts are written as the source stores them: each stacked
//! `ffn_*_exps` tensor is its experts' re-encoded matrices one after the other, in expert
//! order, in their one ggml type (a profile encodes a stacked tensor as a whole).
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

/// The one ggml type of a re-encoded tensor's matrices (a stacked expert tensor's experts
/// share the profile's encoding); an error naming the tensor when the profile gave it a
/// Synapse codec, which no GGUF type holds.
fn ggml_type_of(
    name: &str,
    mats: &[Arc<synapse_kernels::QuantMatrix>],
    assigned: Option<&str>,
) -> anyhow::Result<synapse_formats::GgmlType> {
    let mut ty = None;
    for mat in mats {
        let Encoding::Ggml(t) = mat.encoding() else {
            bail!(
                "{name}: the profile assigns {}, a Synapse codec, which has no GGUF type; \
                 export-gguf writes profiles of ggml types only (`--budget` picks among them, \
                 `--profile uniform:ggml.q4_k.v1` …)",
                assigned.unwrap_or("?")
            );
        };
        if ty.is_some_and(|x| x != t) {
            bail!(
                "{name}: its experts are in different ggml types, which one GGUF tensor cannot hold"
            );
        }
        ty = Some(t);
    }
    ty.with_context(|| format!("{name}: no matrix to write"))
}

/// Writes `m` (a profile of `source`, loaded from `src_path`) as a GGUF at `a.out`.
fn write(
    a: &Args,
    src_path: &Path,
    source: &synapse_runtime::Model,
    m: &synapse_runtime::Model,
) -> anyhow::Result<()> {
    let changed = |name: &str| m.profile.encoding(name) != source.profile.encoding(name);
    let file =
        GgufFile::open(src_path).with_context(|| format!("opening {}", src_path.display()))?;
    // The profile's bytes by the GGUF's tensor names (a tied head is the embedding table; a
    // stacked expert tensor is its experts' matrices in expert order).
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    let mut re: BTreeMap<String, (TensorType, Vec<u8>)> = BTreeMap::new();
    let experts = synapse_runtime::importance::expert_matrices(m);
    let linears = synapse_runtime::importance::linears(m)
        .into_iter()
        .map(|(n, mat)| (n, vec![mat]));
    for (name, mats) in linears.chain(experts) {
        if !changed(&name) {
            continue;
        }
        let ty = ggml_type_of(&name, &mats, m.profile.encoding(&name))?;
        let mut bytes = Vec::with_capacity(mats.iter().map(|x| x.raw_bytes().len()).sum());
        for mat in &mats {
            bytes.extend_from_slice(mat.raw_bytes());
        }
        let name = if name == "output.weight" && tied {
            "token_embd.weight".to_string()
        } else {
            name
        };
        re.insert(name, (TensorType::from(ty), bytes));
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
            Some((ty, data)) => {
                n_re += 1;
                (ty, data)
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
