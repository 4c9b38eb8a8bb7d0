//! Synapse packages: a TOML manifest plus content-addressed objects.
//!
//! A package is a manifest (`manifest.toml`, see docs/formats.md) naming every object it needs:
//! one object per tensor in its source encoding (tied weights once, the other names as
//! aliases; a transcoded tensor — BitNet projections stored ternary — carries its source form), the serialized model graph, the source metadata, the tokenizer, and optional
//! slots for later stages (an importance map with its calibration provenance, cached precision
//! variants). The package hash is the blake3 of the manifest's bytes; since the manifest names
//! every object by its blake3, the package hash covers every byte of the package.
//!
//! Determinism: the manifest holds no timestamps, host names or absolute paths, maps are
//! `BTreeMap`s and lists keep source order, so the same source imported with the same
//! converter and options gives byte-identical manifests on any machine.
//!
//! Reference rule: a string starting with `blake3:` anywhere in a manifest is a reference to a
//! stored object; digests of things that are not objects (source files, the conversion
//! identity, the model fingerprint) are written as bare hex. gc and verify rely on this rule
//! alone, so a manifest written by a newer Synapse never loses objects to an older gc.

use crate::error::{CasError, Result};
use crate::id::{FileDigest, ObjectId};
use crate::store::{
    MANIFEST_FILE, Object, PutOutcome, Store, VerifyProblem, VerifyReport, WriteSession,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The `format` field of every manifest.
pub const PACKAGE_FORMAT: &str = "synapse-package";
/// The package format version this build writes (and the newest it reads).
pub const PACKAGE_FORMAT_VERSION: u32 = 1;

/// A package manifest (`manifest.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`PACKAGE_FORMAT`].
    pub format: String,
    /// The package format version ([`PACKAGE_FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// What model this is.
    pub model: ModelInfo,
    /// How the package was produced.
    pub conversion: Conversion,
    /// The source files, with their digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceFile>,
    /// The license, carried from the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<License>,
    /// The tokenizer and chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerInfo>,
    /// The serialized model graph (IR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<Blob>,
    /// The source's own metadata (e.g. every GGUF key/value except the tensor table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Blob>,
    /// Optional slot: an importance map with its calibration provenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importance: Option<ImportanceSlot>,
    /// One entry per stored tensor, in source order.
    #[serde(default)]
    pub tensors: Vec<TensorEntry>,
    /// Names that share another tensor's object (tied weights).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<Alias>,
    /// Optional slot: cached precision variants of tensors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantEntry>,
}

/// The model a package holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The family adapter that validated it (e.g. `gemma3`).
    pub family: String,
    /// The source's architecture string (e.g. GGUF `general.architecture`).
    pub architecture: String,
    /// A human name, from the source when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// blake3 (bare hex) over the model's content: family, graph, metadata, tokenizer, and
    /// every tensor's name, encoding, dims and object. Independent of where it came from.
    pub fingerprint: String,
}

/// How a package was produced; `identity` is what makes two imports comparable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversion {
    /// blake3 (bare hex) over the source digests, the converter, its version and the options.
    pub identity: String,
    /// The converter's name (e.g. `synapse-import`).
    pub converter: String,
    /// The converter's version.
    pub converter_version: String,
    /// Options that change the output.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// A source file and its digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// The file name (no directories: manifests hold no machine-specific paths).
    pub name: String,
    /// What the file is (`gguf`, `safetensors`, `config`, `tokenizer`, ...).
    pub role: String,
    /// Size and digests.
    #[serde(flatten)]
    pub digest: FileDigest,
}

/// A license carried from the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct License {
    /// SPDX id or name as the source states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A link given by the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Where the source said it (e.g. `gguf:general.license`).
    pub from: String,
    /// The license text, when the source ships one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Blob>,
}

/// Tokenizer and chat template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// The tokenizer model (`llama` = SPM, `gpt2` = BPE, ...).
    pub model: String,
    /// Where its vocabulary lives: `metadata` (inside the metadata blob, as in GGUF) or an object.
    pub source: String,
    /// The tokenizer file (e.g. `tokenizer.json`) when it is not in the metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<Blob>,
    /// The tokenizer's configuration file (e.g. `tokenizer_config.json`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Blob>,
    /// The chat template (Jinja), when the source has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

/// A stored byte blob with its media type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    /// The object.
    pub object: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// What the bytes are (e.g. `application/json`).
    pub media_type: String,
}

/// One tensor, stored in its source encoding — or transcoded, with its source form beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// The tensor's name in the source (GGUF names for GGUF sources, HF names for safetensors).
    pub name: String,
    /// Its stored encoding: `ggml.<type>` (e.g. `ggml.q4_k`, `ggml.bf16`; byte layout as in
    /// ggml), the source's own — or, for a transcoded tensor, a Synapse encoding
    /// (`syn.ternary.absmean.tensor.v1`: BitNet projections stored ternary).
    pub encoding: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (innermost) one. For a transcoded
    /// tensor the logical matrix (`[in, out]`).
    pub dims: Vec<u64>,
    /// The object holding its bytes.
    pub object: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// For a transcoded tensor: what the source held (the model's description is rebuilt
    /// from it, so the family adapter sees the source's tensor table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceForm>,
}

/// A transcoded tensor's form in the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceForm {
    /// The source encoding (`ggml.<type>`).
    pub encoding: String,
    /// The source dims, ggml order.
    pub dims: Vec<u64>,
    /// The source size in bytes.
    pub size: u64,
}

/// A name that shares another tensor's object (tied weights).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alias {
    /// The alias.
    pub name: String,
    /// The tensor it shares.
    pub target: String,
}

/// Optional slot: an importance map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportanceSlot {
    /// The map.
    pub map: Blob,
    /// Calibration provenance (data set, sample count, tool version, ...).
    #[serde(default)]
    pub calibration: BTreeMap<String, String>,
}

/// Optional slot: a cached precision variant of a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantEntry {
    /// The tensor it encodes.
    pub tensor: String,
    /// The encoding id (e.g. `syn.q4.symmetric.g64.v1`).
    pub encoding: String,
    /// The codec version.
    pub codec_version: u32,
    /// The object.
    pub object: ObjectId,
    /// Its size in bytes.
    pub size: u64,
}

impl Manifest {
    /// Parses and validates a manifest's text.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest> {
        let bad = |message: String| CasError::Manifest {
            path: path.to_path_buf(),
            message,
        };
        // Check the version first, so a newer format is reported as such, not as a parse error.
        let raw: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if raw.get("format").and_then(|v| v.as_str()) != Some(PACKAGE_FORMAT) {
            return Err(bad(format!("`format` is not \"{PACKAGE_FORMAT}\"")));
        }
        let version = raw
            .get("format_version")
            .and_then(|v| v.as_integer())
            .ok_or_else(|| bad("missing `format_version`".into()))?;
        if version < 1 || version > i64::from(PACKAGE_FORMAT_VERSION) {
            return Err(CasError::UnsupportedVersion {
                found: u32::try_from(version).unwrap_or(u32::MAX),
                supported: PACKAGE_FORMAT_VERSION,
            });
        }
        let m: Manifest = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        m.validate().map_err(|e| bad(e.to_string()))?;
        Ok(m)
    }

    /// Serializes to the canonical TOML text.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self)
            .map_err(|e| CasError::InvalidPackage(format!("serializing manifest: {e}")))
    }

    /// Checks internal consistency: unique names, aliases to existing tensors.
    pub fn validate(&self) -> Result<()> {
        let mut names = BTreeSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(CasError::InvalidPackage(format!(
                    "tensor `{}` appears twice",
                    t.name
                )));
            }
        }
        for a in &self.aliases {
            if names.contains(a.name.as_str()) {
                return Err(CasError::InvalidPackage(format!(
                    "alias `{}` collides with a tensor of that name",
                    a.name
                )));
            }
            if !self.tensors.iter().any(|t| t.name == a.target) {
                return Err(CasError::InvalidPackage(format!(
                    "alias `{}` points to `{}`, which is not a tensor",
                    a.name, a.target
                )));
            }
        }
        for v in &self.variants {
            if !names.contains(v.tensor.as_str()) {
                return Err(CasError::InvalidPackage(format!(
                    "variant for `{}`, which is not a tensor",
                    v.tensor
                )));
            }
        }
        Ok(())
    }

    /// Every object this manifest references.
    pub fn objects(&self) -> BTreeSet<ObjectId> {
        // One rule for everything: the same scan gc uses.
        match self.to_toml() {
            Ok(t) => referenced_ids(&t).unwrap_or_default(),
            Err(_) => BTreeSet::new(),
        }
    }

    /// The tensor or alias named `name`, resolved to its stored entry.
    pub fn resolve(&self, name: &str) -> Option<&TensorEntry> {
        let target = self
            .aliases
            .iter()
            .find(|a| a.name == name)
            .map_or(name, |a| a.target.as_str());
        self.tensors.iter().find(|t| t.name == target)
    }
}

/// Every `blake3:` object reference in a manifest's text (see the module docs).
pub fn referenced_ids(text: &str) -> std::result::Result<BTreeSet<ObjectId>, String> {
    let value: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut out = BTreeSet::new();
    fn walk(v: &toml::Value, out: &mut BTreeSet<ObjectId>) -> std::result::Result<(), String> {
        match v {
            toml::Value::String(s) if s.starts_with(ObjectId::PREFIX) => {
                out.insert(ObjectId::parse(s).map_err(|e| e.to_string())?);
            }
            toml::Value::Array(a) => {
                for x in a {
                    walk(x, out)?;
                }
            }
            toml::Value::Table(t) => {
                for x in t.values() {
                    walk(x, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    for v in value.values() {
        walk(v, &mut out)?;
    }
    Ok(out)
}

/// Counts from building a package.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BuildStats {
    /// Tensors stored (aliases not counted).
    pub tensors: u64,
    /// Aliases (tied weights).
    pub aliases: u64,
    /// Logical bytes of every tensor and blob of the package.
    pub bytes: u64,
    /// Bytes actually written to the store.
    pub written_bytes: u64,
    /// Bytes not written because an identical object was already present (dedup savings).
    pub deduplicated_bytes: u64,
    /// Bytes of tensors not stored at all because they are aliases.
    pub alias_bytes: u64,
}

impl BuildStats {
    fn count(&mut self, out: &PutOutcome) {
        self.bytes += out.size;
        if out.written {
            self.written_bytes += out.size;
        } else {
            self.deduplicated_bytes += out.size;
        }
    }
}

/// Builds a package: puts objects through a [`WriteSession`] and assembles the manifest.
#[derive(Debug)]
pub struct PackageBuilder {
    family: String,
    architecture: String,
    name: Option<String>,
    converter: String,
    converter_version: String,
    options: BTreeMap<String, String>,
    sources: Vec<SourceFile>,
    license: Option<License>,
    tokenizer: Option<TokenizerInfo>,
    graph: Option<Blob>,
    metadata: Option<Blob>,
    tensors: Vec<TensorEntry>,
    aliases: Vec<Alias>,
    stats: BuildStats,
}

/// A finished package: its manifest, the manifest's canonical bytes and its hash.
#[derive(Debug, Clone)]
pub struct BuiltPackage {
    /// The manifest.
    pub manifest: Manifest,
    /// Its canonical TOML bytes (what is written).
    pub bytes: Vec<u8>,
    /// The package hash: blake3 of `bytes`.
    pub hash: ObjectId,
    /// Build counts.
    pub stats: BuildStats,
}

/// Where [`BuiltPackage::commit`] writes the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestTarget {
    /// `packages/<hash>.toml` in a shared store (one of many packages).
    Store,
    /// `manifest.toml` at the root of a self-contained package directory.
    Directory,
}

impl PackageBuilder {
    /// Starts a package of `family`/`architecture`, produced by `converter` at `converter_version`.
    pub fn new(
        family: impl Into<String>,
        architecture: impl Into<String>,
        converter: impl Into<String>,
        converter_version: impl Into<String>,
    ) -> PackageBuilder {
        PackageBuilder {
            family: family.into(),
            architecture: architecture.into(),
            name: None,
            converter: converter.into(),
            converter_version: converter_version.into(),
            options: BTreeMap::new(),
            sources: Vec::new(),
            license: None,
            tokenizer: None,
            graph: None,
            metadata: None,
            tensors: Vec::new(),
            aliases: Vec::new(),
            stats: BuildStats::default(),
        }
    }

    /// Sets the model's human name.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// Records a conversion option (part of the conversion identity).
    pub fn option(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// Records a source file (part of the conversion identity).
    pub fn source(
        &mut self,
        name: impl Into<String>,
        role: impl Into<String>,
        digest: FileDigest,
    ) -> &mut Self {
        self.sources.push(SourceFile {
            name: name.into(),
            role: role.into(),
            digest,
        });
        self
    }

    /// Sets the license.
    pub fn license(&mut self, license: License) -> &mut Self {
        self.license = Some(license);
        self
    }

    /// Sets the tokenizer section.
    pub fn tokenizer(&mut self, tokenizer: TokenizerInfo) -> &mut Self {
        self.tokenizer = Some(tokenizer);
        self
    }

    /// Stores a blob and returns its manifest entry (for tokenizer files, license texts, ...).
    pub fn put_blob(
        &mut self,
        session: &WriteSession<'_>,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<Blob> {
        let out = session.put(bytes)?;
        self.stats.count(&out);
        Ok(Blob {
            object: out.id,
            size: out.size,
            media_type: media_type.to_string(),
        })
    }

    /// Stores the serialized model graph.
    pub fn graph(
        &mut self,
        session: &WriteSession<'_>,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<&mut Self> {
        self.graph = Some(self.put_blob(session, bytes, media_type)?);
        Ok(self)
    }

    /// Stores the source metadata.
    pub fn metadata(
        &mut self,
        session: &WriteSession<'_>,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<&mut Self> {
        self.metadata = Some(self.put_blob(session, bytes, media_type)?);
        Ok(self)
    }

    /// Stores one tensor's bytes in its source encoding.
    pub fn add_tensor(
        &mut self,
        session: &WriteSession<'_>,
        name: &str,
        encoding: &str,
        dims: &[u64],
        bytes: &[u8],
    ) -> Result<PutOutcome> {
        self.put_tensor(session, name, encoding, dims, bytes, None)
    }

    /// Stores one tensor transcoded: `bytes` in `encoding` (logical `dims`), with the form
    /// the source held it in.
    pub fn add_transcoded_tensor(
        &mut self,
        session: &WriteSession<'_>,
        name: &str,
        encoding: &str,
        dims: &[u64],
        bytes: &[u8],
        source: SourceForm,
    ) -> Result<PutOutcome> {
        if source.encoding == encoding {
            return Err(CasError::InvalidPackage(format!(
                "tensor `{name}`: transcoded into its own source encoding {encoding}"
            )));
        }
        self.put_tensor(session, name, encoding, dims, bytes, Some(source))
    }

    fn put_tensor(
        &mut self,
        session: &WriteSession<'_>,
        name: &str,
        encoding: &str,
        dims: &[u64],
        bytes: &[u8],
        source: Option<SourceForm>,
    ) -> Result<PutOutcome> {
        if self.tensors.iter().any(|t| t.name == name)
            || self.aliases.iter().any(|a| a.name == name)
        {
            return Err(CasError::InvalidPackage(format!(
                "tensor `{name}` added twice"
            )));
        }
        let out = session.put(bytes)?;
        self.stats.count(&out);
        self.stats.tensors += 1;
        self.tensors.push(TensorEntry {
            name: name.to_string(),
            encoding: encoding.to_string(),
            dims: dims.to_vec(),
            object: out.id,
            size: out.size,
            source,
        });
        Ok(out)
    }

    /// True if a tensor (not an alias) named `name` was added.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.iter().any(|t| t.name == name)
    }

    /// Declares `name` as sharing the stored tensor `target` (tied weights).
    pub fn alias(&mut self, name: &str, target: &str) -> Result<()> {
        let Some(t) = self.tensors.iter().find(|t| t.name == target) else {
            return Err(CasError::InvalidPackage(format!(
                "alias `{name}` → `{target}`: no such tensor (add the target first)"
            )));
        };
        if self.tensors.iter().any(|t| t.name == name)
            || self.aliases.iter().any(|a| a.name == name)
        {
            return Err(CasError::InvalidPackage(format!(
                "alias `{name}` already defined"
            )));
        }
        self.stats.aliases += 1;
        self.stats.alias_bytes += t.size;
        self.aliases.push(Alias {
            name: name.to_string(),
            target: target.to_string(),
        });
        Ok(())
    }

    /// Computes the conversion identity, the fingerprint and the canonical manifest bytes.
    pub fn finish(self) -> Result<BuiltPackage> {
        #[derive(Serialize)]
        struct IdentityInput<'a> {
            sources: Vec<(&'a str, &'a str, u64, String, &'a str)>,
            converter: &'a str,
            converter_version: &'a str,
            options: &'a BTreeMap<String, String>,
        }
        let identity = IdentityInput {
            sources: self
                .sources
                .iter()
                .map(|s| {
                    (
                        s.name.as_str(),
                        s.role.as_str(),
                        s.digest.size,
                        s.digest.blake3.hex(),
                        s.digest.sha256.as_str(),
                    )
                })
                .collect(),
            converter: &self.converter,
            converter_version: &self.converter_version,
            options: &self.options,
        };
        let identity = canonical_hash(&identity)?;

        #[derive(Serialize)]
        struct FingerprintInput<'a> {
            family: &'a str,
            architecture: &'a str,
            graph: Option<ObjectId>,
            metadata: Option<ObjectId>,
            tokenizer: &'a Option<TokenizerInfo>,
            tensors: Vec<(&'a str, &'a str, &'a [u64], ObjectId)>,
            aliases: &'a [Alias],
            // Absent when nothing is transcoded, so those fingerprints are what they were.
            #[serde(skip_serializing_if = "Vec::is_empty")]
            transcoded: Vec<(&'a str, &'a SourceForm)>,
        }
        let fingerprint = canonical_hash(&FingerprintInput {
            family: &self.family,
            architecture: &self.architecture,
            graph: self.graph.as_ref().map(|b| b.object),
            metadata: self.metadata.as_ref().map(|b| b.object),
            tokenizer: &self.tokenizer,
            tensors: self
                .tensors
                .iter()
                .map(|t| {
                    (
                        t.name.as_str(),
                        t.encoding.as_str(),
                        t.dims.as_slice(),
                        t.object,
                    )
                })
                .collect(),
            aliases: &self.aliases,
            transcoded: self
                .tensors
                .iter()
                .filter_map(|t| Some((t.name.as_str(), t.source.as_ref()?)))
                .collect(),
        })?;

        let manifest = Manifest {
            format: PACKAGE_FORMAT.to_string(),
            format_version: PACKAGE_FORMAT_VERSION,
            model: ModelInfo {
                family: self.family,
                architecture: self.architecture,
                name: self.name,
                fingerprint,
            },
            conversion: Conversion {
                identity,
                converter: self.converter,
                converter_version: self.converter_version,
                options: self.options,
            },
            sources: self.sources,
            license: self.license,
            tokenizer: self.tokenizer,
            graph: self.graph,
            metadata: self.metadata,
            importance: None,
            tensors: self.tensors,
            aliases: self.aliases,
            variants: Vec::new(),
        };
        manifest.validate()?;
        let bytes = manifest.to_toml()?.into_bytes();
        let hash = ObjectId::of(&bytes);
        Ok(BuiltPackage {
            manifest,
            bytes,
            hash,
            stats: self.stats,
        })
    }
}

/// blake3 (bare hex) of the canonical JSON of `value` (struct fields in declaration order,
/// maps sorted: deterministic).
fn canonical_hash(value: &impl Serialize) -> Result<String> {
    let json =
        serde_json::to_vec(value).map_err(|e| CasError::InvalidPackage(format!("hashing: {e}")))?;
    Ok(ObjectId::of(&json).hex())
}

impl BuiltPackage {
    /// Writes the manifest atomically, last (after every object it names is durable), so a
    /// crash before this leaves no package, only unreferenced objects for gc.
    pub fn commit(&self, session: &WriteSession<'_>, target: ManifestTarget) -> Result<PathBuf> {
        for id in self.manifest.objects() {
            if !session.store().contains(&id) {
                return Err(CasError::Missing {
                    id,
                    store: session.store().root().to_path_buf(),
                });
            }
        }
        let rel = match target {
            ManifestTarget::Store => {
                PathBuf::from("packages").join(format!("{}.toml", self.hash.hex()))
            }
            ManifestTarget::Directory => PathBuf::from(MANIFEST_FILE),
        };
        session.write_file(&rel, &self.bytes)
    }
}

/// An opened package: its manifest and the store holding its objects.
#[derive(Debug, Clone)]
pub struct Package {
    store: Store,
    manifest: Manifest,
    hash: ObjectId,
    manifest_path: PathBuf,
}

impl Package {
    /// Opens the package whose manifest is at `manifest_path`, with objects in `store`.
    pub fn open_manifest(store: Store, manifest_path: &Path) -> Result<Package> {
        let bytes = std::fs::read(manifest_path).map_err(CasError::io(manifest_path))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| CasError::Manifest {
            path: manifest_path.to_path_buf(),
            message: e.to_string(),
        })?;
        let manifest = Manifest::parse(text, manifest_path)?;
        Ok(Package {
            store,
            manifest,
            hash: ObjectId::of(&bytes),
            manifest_path: manifest_path.to_path_buf(),
        })
    }

    /// Opens a self-contained package directory (`DIR/manifest.toml` + `DIR/objects/`).
    pub fn open_dir(dir: &Path) -> Result<Package> {
        let store = Store::open_existing(dir)?;
        Package::open_manifest(store, &dir.join(MANIFEST_FILE))
    }

    /// Opens the package in `store` whose hash is `hash_or_prefix` (hex, with or without
    /// `blake3:`; at least 8 digits).
    pub fn open_in_store(store: &Store, hash_or_prefix: &str) -> Result<Package> {
        let q = hash_or_prefix
            .strip_prefix(ObjectId::PREFIX)
            .unwrap_or(hash_or_prefix);
        let not_found = |reason: &str| CasError::PackageNotFound {
            query: hash_or_prefix.to_string(),
            reason: reason.to_string(),
        };
        if q.len() < 8 || !q.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_found(
                "not a directory, and not a package hash of at least 8 hex digits",
            ));
        }
        let q = q.to_ascii_lowercase();
        let dir = store.packages_dir();
        let mut hits = Vec::new();
        if dir.is_dir() {
            for e in std::fs::read_dir(&dir).map_err(CasError::io(&dir))? {
                let p = e.map_err(CasError::io(&dir))?.path();
                let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                if p.extension().is_some_and(|x| x == "toml") && stem.starts_with(&q) {
                    hits.push(p);
                }
            }
        }
        match hits.len() {
            0 => Err(not_found(&format!(
                "no such package in the store at {}",
                store.root().display()
            ))),
            1 => Package::open_manifest(store.clone(), &hits[0]),
            n => Err(CasError::AmbiguousPackage {
                query: hash_or_prefix.to_string(),
                count: n,
            }),
        }
    }

    /// Opens `query`: a package directory, a manifest file inside a store's `packages/`, or a
    /// package hash (prefix) in `user_store`.
    pub fn open(query: &str, user_store: &Path) -> Result<Package> {
        let p = Path::new(query);
        if p.is_dir() && p.join(MANIFEST_FILE).is_file() {
            return Package::open_dir(p);
        }
        if p.is_file() && p.extension().is_some_and(|e| e == "toml") {
            let root = p
                .parent()
                .and_then(|d| {
                    if d.file_name().is_some_and(|n| n == "packages") {
                        d.parent()
                    } else {
                        Some(d)
                    }
                })
                .unwrap_or(Path::new("."));
            return Package::open_manifest(Store::open_existing(root)?, p);
        }
        let store = Store::open_existing(user_store).map_err(|_| CasError::PackageNotFound {
            query: query.to_string(),
            reason: format!(
                "not a package directory, and no store at {}",
                user_store.display()
            ),
        })?;
        Package::open_in_store(&store, query)
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The package hash (blake3 of the manifest file).
    pub fn hash(&self) -> ObjectId {
        self.hash
    }

    /// The store holding the objects.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Where the manifest was read from.
    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    /// Every tensor name, stored tensors in source order then aliases.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.manifest
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .chain(self.manifest.aliases.iter().map(|a| a.name.as_str()))
    }

    /// The stored entry for a tensor or alias.
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry> {
        self.manifest
            .resolve(name)
            .ok_or_else(|| CasError::NoSuchTensor(name.to_string()))
    }

    /// A tensor's bytes (memory-mapped, verified against its id).
    pub fn tensor_data(&self, name: &str) -> Result<Object> {
        let t = self.tensor(name)?;
        self.store.get(&t.object)
    }

    /// A blob's bytes (verified).
    pub fn blob(&self, blob: &Blob) -> Result<Object> {
        self.store.get(&blob.object)
    }

    /// This package with `map` (JSON bytes) in its importance slot, replacing any earlier map:
    /// the map is stored as an object first, then a new manifest is written atomically — over
    /// a package directory's `manifest.toml` (the directory's package hash changes), or as
    /// `packages/<new hash>.toml` in a store, beside the manifest it was made from (which
    /// stays a valid package). The model fingerprint does not change: the map is not part of
    /// the model. Returns the new package.
    pub fn with_importance(
        &self,
        map_json: &[u8],
        calibration: BTreeMap<String, String>,
    ) -> Result<Package> {
        let session = self.store.session()?;
        let put = session.put(map_json)?;
        let mut manifest = self.manifest.clone();
        manifest.importance = Some(ImportanceSlot {
            map: Blob {
                object: put.id,
                size: map_json.len() as u64,
                media_type: "application/json".into(),
            },
            calibration,
        });
        manifest.validate()?;
        let bytes = manifest.to_toml()?.into_bytes();
        let hash = ObjectId::of(&bytes);
        let in_place = self
            .manifest_path
            .file_name()
            .is_some_and(|n| n == MANIFEST_FILE)
            && self.manifest_path.parent() == Some(self.store.root());
        let rel = if in_place {
            PathBuf::from(MANIFEST_FILE)
        } else {
            PathBuf::from("packages").join(format!("{}.toml", hash.hex()))
        };
        let manifest_path = session.write_file(&rel, &bytes)?;
        Ok(Package {
            store: self.store.clone(),
            manifest,
            hash,
            manifest_path,
        })
    }

    /// The importance map's JSON bytes (verified), when the package carries one.
    pub fn importance_map(&self) -> Result<Option<Object>> {
        match &self.manifest.importance {
            Some(slot) => Ok(Some(self.blob(&slot.map)?)),
            None => Ok(None),
        }
    }

    /// Checks every object this package references; `progress` gets each object's size.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport> {
        let mut report = VerifyReport {
            manifests_checked: 1,
            ..VerifyReport::default()
        };
        for id in self.manifest.objects() {
            match self.store.get(&id) {
                Ok(o) => {
                    report.objects_checked += 1;
                    report.bytes_checked += o.len() as u64;
                    progress(o.len() as u64);
                }
                Err(CasError::Corrupt { actual, .. }) => {
                    report.problems.push(VerifyProblem::Corrupt { id, actual })
                }
                Err(CasError::Missing { .. }) => report.problems.push(VerifyProblem::Missing {
                    id,
                    manifest: self.manifest_path.clone(),
                }),
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }
}
