//! The import driver shared by `synapse-cli import` and `cargo xtask import`.

use crate::error::{ImportError, Result};
use crate::progress::Progress;
use std::path::{Path, PathBuf};
use std::time::Instant;
use synapse_cas::package::{BuildStats, ManifestTarget};
use synapse_cas::{ObjectId, Store};

/// The converter's name, recorded in every manifest.
pub const CONVERTER: &str = "synapse-import";
/// The converter's version (part of the conversion identity): the crate version.
pub const CONVERTER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where an import writes.
#[derive(Debug, Clone)]
pub enum Destination {
    /// The shared store at this root (`packages/<hash>.toml` + `objects/`).
    Store(PathBuf),
    /// A self-contained package directory (`manifest.toml` + `objects/`).
    Directory(PathBuf),
}

impl Destination {
    pub(crate) fn open(&self) -> Result<(Store, ManifestTarget)> {
        Ok(match self {
            Destination::Store(p) => (Store::open(p)?, ManifestTarget::Store),
            Destination::Directory(p) => (Store::open(p)?, ManifestTarget::Directory),
        })
    }
}

/// What an import did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    /// The package hash (blake3 of the manifest).
    pub package: ObjectId,
    /// Where the manifest was written.
    pub manifest: PathBuf,
    /// The family adapter that validated the model.
    pub family: String,
    /// The conversion identity.
    pub conversion_identity: String,
    /// Tensor, byte and dedup counts.
    pub stats: BuildStats,
    /// Total size of the source files.
    pub source_bytes: u64,
    /// Seconds spent validating (opening + family adapter).
    pub validate_s: f64,
    /// Seconds spent hashing source files.
    pub hash_s: f64,
    /// Seconds spent storing objects and writing the manifest.
    pub store_s: f64,
}

/// The kind of source a path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// A GGUF v3 file.
    Gguf,
    /// A safetensors checkpoint directory (`config.json` + one file or shards + index).
    Safetensors,
}

/// Detects the source format: a directory is a safetensors checkpoint, a file starting with
/// `GGUF` is GGUF.
pub fn detect(path: &Path) -> Result<SourceFormat> {
    if path.is_dir() {
        return Ok(SourceFormat::Safetensors);
    }
    let mut magic = [0u8; 4];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(ImportError::io(path))?;
        f.read_exact(&mut magic).map_err(ImportError::io(path))?;
    }
    if &magic == b"GGUF" {
        Ok(SourceFormat::Gguf)
    } else if path.extension().is_some_and(|e| e == "safetensors")
        || path
            .file_name()
            .is_some_and(|n| n == "model.safetensors.index.json")
    {
        Ok(SourceFormat::Safetensors)
    } else {
        Err(ImportError::NotAModel {
            path: path.to_path_buf(),
            reason: "neither a GGUF file nor a safetensors checkpoint".into(),
        })
    }
}

/// Imports `source` (GGUF file or safetensors checkpoint) into `dest`.
///
/// Order: open and validate everything against the family adapter (nothing written yet), hash
/// the source files, then store one object per tensor and the blobs, and write the manifest
/// last. A crash at any point leaves either no package or a whole one.
pub fn import(source: &Path, dest: &Destination, progress: &dyn Progress) -> Result<ImportReport> {
    match detect(source)? {
        SourceFormat::Gguf => crate::gguf::import_gguf(source, dest, progress),
        SourceFormat::Safetensors => {
            let dir = if source.is_dir() {
                source.to_path_buf()
            } else {
                source.parent().unwrap_or(Path::new(".")).to_path_buf()
            };
            crate::safetensors::import_safetensors(&dir, dest, progress)
        }
    }
}

/// The `ggml.<type>` encoding id of a ggml type (`ggml.q4_k`, `ggml.bf16`, ...).
pub fn encoding_id(t: synapse_formats::GgmlType) -> String {
    format!("ggml.{}", t.name().to_ascii_lowercase())
}

/// The ggml type of a `ggml.<type>` encoding id.
pub fn ggml_type_of(encoding: &str) -> Option<synapse_formats::GgmlType> {
    let name = encoding.strip_prefix("ggml.")?;
    synapse_formats::ALL_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
}

/// A file name without directories (manifests hold no machine-specific paths).
pub(crate) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Timer helper.
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock(Instant::now())
    }
    pub(crate) fn lap(&mut self) -> f64 {
        let s = self.0.elapsed().as_secs_f64();
        self.0 = Instant::now();
        s
    }
}

/// Records the IR's tied aliases. A name the source also stores as a tensor of its own keeps
/// its tensor (content addressing already stores identical bytes once).
pub(crate) fn add_aliases(
    b: &mut synapse_cas::PackageBuilder,
    ir: &synapse_model::ModelIr,
) -> Result<()> {
    for a in &ir.aliases {
        let target = &ir.weight(a.target).name;
        if b.has_tensor(&a.alias) {
            continue;
        }
        b.alias(&a.alias, target)?;
    }
    Ok(())
}

/// The human summary printed by `synapse-cli import` and `cargo xtask import`.
pub fn summary(r: &ImportReport) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let s = &r.stats;
    format!(
        "imported {family} model: {tensors} tensors + {aliases} tied alias(es)\n\
         \x20 package   {hash}\n\
         \x20 manifest  {manifest}\n\
         \x20 bytes     {bytes:.1} MiB in the package, {written:.1} MiB written, \
         {dedup:.1} MiB deduplicated, {alias:.1} MiB shared by tied aliases\n\
         \x20 source    {src:.1} MiB\n\
         \x20 time      validate {v:.2}s, hash {h:.2}s, store {st:.2}s",
        family = r.family,
        tensors = s.tensors,
        aliases = s.aliases,
        hash = r.package,
        manifest = r.manifest.display(),
        bytes = mib(s.bytes),
        written = mib(s.written_bytes),
        dedup = mib(s.deduplicated_bytes),
        alias = mib(s.alias_bytes),
        src = mib(r.source_bytes),
        v = r.validate_s,
        h = r.hash_s,
        st = r.store_s,
    )
}
