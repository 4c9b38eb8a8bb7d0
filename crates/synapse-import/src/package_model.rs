//! A package opened as a model: what a runtime needs to load it without the source file.
//!
//! [`PackageModel`] yields the same inventory the runtime reads from a GGUF file or a
//! safetensors checkpoint: a [`SourceDesc`] (metadata in the source's own key naming, and the
//! tensor table: name, row-major shape, encoding, byte length), the [`ModelIr`] the family
//! adapter built at import, and each tensor's bytes as a memory map of its verified object.
//! Byte offsets refer to the objects (always 0), not to the source file. A tensor stored
//! transcoded (BitNet projections, [`crate::ternary`]) is described in its source form and
//! read through [`PackageModel::transcoded`].

use crate::error::{ImportError, Result};
use crate::gguf::GGUF_METADATA_MEDIA_TYPE;
use crate::import::ggml_type_of;
use crate::ternary::TERNARY_ENCODING;
use std::collections::HashMap;
use std::path::Path;
use synapse_cas::{Object, Package};
use synapse_formats::gguf::GgufFile;
use synapse_model::{ModelIr, SourceDesc, SourceTensor};

/// Whether `path` is a self-contained package directory (it holds a `manifest.toml`).
pub fn is_package_dir(path: &Path) -> bool {
    path.is_dir() && path.join(synapse_cas::store::MANIFEST_FILE).is_file()
}

/// A package ready to be loaded by a runtime.
pub struct PackageModel {
    package: Package,
    desc: SourceDesc,
    ir: ModelIr,
    /// Shared so that weights can borrow an object's mapping instead of copying it.
    objects: HashMap<String, std::sync::Arc<Object>>,
    gguf_metadata: Option<GgufFile>,
}

impl std::fmt::Debug for PackageModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageModel")
            .field("package", &self.package.hash())
            .field("family", &self.ir.family)
            .field("tensors", &self.objects.len())
            .finish()
    }
}

impl PackageModel {
    /// Opens a package directory, or a package hash (prefix) in `store`.
    pub fn open(query: &str, store: &Path) -> Result<PackageModel> {
        PackageModel::from_package(Package::open(query, store)?)
    }

    /// Opens a self-contained package directory (`DIR/manifest.toml` + `DIR/objects/`).
    pub fn open_dir(dir: &Path) -> Result<PackageModel> {
        PackageModel::from_package(Package::open_dir(dir)?)
    }

    /// Opens every tensor object (verified) and rebuilds the source description.
    pub fn from_package(package: Package) -> Result<PackageModel> {
        PackageModel::from_package_with(package, None)
    }

    /// Like [`PackageModel::from_package`] but opens only the objects of the tensors named in
    /// `tensors` (aliases resolve to their target): the store may lack the others (a
    /// pipeline stage holds its layers' tensors only). The manifest, graph and metadata are
    /// read and validated whole; a named tensor the store lacks is an error, and
    /// [`PackageModel::tensor_bytes`] of a tensor not opened is `NoSuchTensor`.
    pub fn from_package_only(
        package: Package,
        tensors: &std::collections::BTreeSet<String>,
    ) -> Result<PackageModel> {
        PackageModel::from_package_with(package, Some(tensors))
    }

    /// The tensors of the package (their stored names, aliases resolved) named in `tensors`,
    /// with the object each is stored in.
    pub fn stored_tensors<'a>(
        package: &'a Package,
        tensors: &std::collections::BTreeSet<String>,
    ) -> Result<Vec<&'a synapse_cas::package::TensorEntry>> {
        tensors.iter().map(|n| Ok(package.tensor(n)?)).collect()
    }

    /// The objects a [`PackageModel::from_package_only`] over `tensors` reads: every object
    /// the manifest references that is not a tensor's (metadata, graph, tokenizer, …) and
    /// the objects of the named tensors.
    pub fn objects_for(
        package: &Package,
        tensors: &std::collections::BTreeSet<String>,
    ) -> Result<std::collections::BTreeSet<synapse_cas::ObjectId>> {
        let m = package.manifest();
        let tensor_objects: std::collections::BTreeSet<_> =
            m.tensors.iter().map(|t| t.object).collect();
        let mut out: std::collections::BTreeSet<_> = m
            .objects()
            .into_iter()
            .filter(|o| !tensor_objects.contains(o))
            .collect();
        for t in PackageModel::stored_tensors(package, tensors)? {
            out.insert(t.object);
        }
        Ok(out)
    }

    fn from_package_with(
        package: Package,
        only: Option<&std::collections::BTreeSet<String>>,
    ) -> Result<PackageModel> {
        let bad = |reason: String| ImportError::BadPackage {
            package: package.hash().to_string(),
            reason,
        };
        let m = package.manifest();
        let meta_blob = m
            .metadata
            .as_ref()
            .ok_or_else(|| bad("no metadata blob".into()))?;
        let meta = package.blob(meta_blob)?;
        let mut tensors = Vec::with_capacity(m.tensors.len());
        for t in &m.tensors {
            // A transcoded tensor is described in its source form (the family adapter sees the
            // source's tensor table); its stored encoding must be one this build reads.
            let (encoding, dims, size) = match &t.source {
                Some(f) => {
                    if t.encoding != TERNARY_ENCODING {
                        return Err(bad(format!(
                            "tensor `{}` is stored as {}, which this build cannot read",
                            t.name, t.encoding
                        )));
                    }
                    (&f.encoding, &f.dims, f.size)
                }
                None => (&t.encoding, &t.dims, t.size),
            };
            let encoding = ggml_type_of(encoding)
                .ok_or_else(|| bad(format!("tensor `{}` has encoding {encoding}", t.name)))?;
            tensors.push(SourceTensor {
                name: t.name.clone(),
                shape: dims.iter().rev().copied().collect(),
                encoding,
                file: 0,
                offset: 0,
                n_bytes: size,
            });
        }
        let (desc, gguf_metadata) = if meta_blob.media_type == GGUF_METADATA_MEDIA_TYPE {
            let f = GgufFile::from_bytes(meta.to_vec())?;
            let mut desc = SourceDesc::from_gguf(&f)?;
            desc.tensors = tensors;
            (desc, Some(f))
        } else {
            let text = std::str::from_utf8(&meta)
                .map_err(|e| bad(format!("config.json blob is not UTF-8: {e}")))?;
            (SourceDesc::from_hf_config(text, tensors)?, None)
        };
        // The stored graph is the IR built at import; re-running the adapter on the rebuilt
        // description must accept it too (a package never bypasses validation).
        let rebuilt = synapse_model::build_ir(&desc)?;
        let ir = match &m.graph {
            Some(g) => {
                let bytes = package.blob(g)?;
                match serde_json::from_slice::<ModelIr>(&bytes) {
                    Ok(ir) => ir,
                    Err(e) => {
                        tracing::warn!(
                            "stored graph unreadable by this build ({e}); using the rebuilt IR"
                        );
                        rebuilt
                    }
                }
            }
            None => rebuilt,
        };
        let wanted = match only {
            Some(names) => Some(
                PackageModel::stored_tensors(&package, names)?
                    .into_iter()
                    .map(|t| t.name.clone())
                    .collect::<std::collections::HashSet<_>>(),
            ),
            None => None,
        };
        let mut objects = HashMap::with_capacity(m.tensors.len());
        for t in &m.tensors {
            if wanted.as_ref().is_some_and(|w| !w.contains(&t.name)) {
                continue;
            }
            let o = package.store().get(&t.object)?;
            if o.len() as u64 != t.size {
                return Err(bad(format!(
                    "tensor `{}` is {} bytes, manifest says {}",
                    t.name,
                    o.len(),
                    t.size
                )));
            }
            // Verifying read every page: dropped again, so that what stays mapped is what is
            // used (a model borrowing the object maps the pages it reads).
            o.release_pages();
            objects.insert(t.name.clone(), std::sync::Arc::new(o));
        }
        Ok(PackageModel {
            package,
            desc,
            ir,
            objects,
            gguf_metadata,
        })
    }

    /// The package.
    pub fn package(&self) -> &Package {
        &self.package
    }

    /// Metadata and tensor table, as `SourceDesc::from_gguf` / `from_safetensors` give them
    /// for the source (offsets aside).
    pub fn desc(&self) -> &SourceDesc {
        &self.desc
    }

    /// The model graph built by the family adapter at import.
    pub fn ir(&self) -> &ModelIr {
        &self.ir
    }

    /// A tensor's bytes in its source encoding by name (aliases resolve to their target),
    /// memory-mapped. A tensor stored transcoded is [`ImportError::Transcoded`]: its bytes
    /// are [`PackageModel::transcoded`]'s.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        self.source_object(name).map(|o| &o[..])
    }

    /// A tensor stored transcoded: its stored encoding ([`TERNARY_ENCODING`]) and bytes,
    /// memory-mapped; `None` for a tensor stored in its source encoding.
    pub fn transcoded(&self, name: &str) -> Result<Option<(&str, &[u8])>> {
        let t = self.package.tensor(name)?;
        if t.source.is_none() {
            return Ok(None);
        }
        Ok(Some((
            t.encoding.as_str(),
            self.stored_bytes(name, &t.name)?,
        )))
    }

    /// The object holding a tensor stored in its source encoding (its bytes are
    /// [`PackageModel::tensor_bytes`]), shared: a weight can borrow its mapping and read
    /// through its file ([`Object::read_at`]) instead of copying it.
    pub fn tensor_object(&self, name: &str) -> Result<std::sync::Arc<Object>> {
        self.source_object(name).cloned()
    }

    /// The object of a tensor stored in its source encoding; [`ImportError::Transcoded`] for
    /// one stored transcoded.
    fn source_object(&self, name: &str) -> Result<&std::sync::Arc<Object>> {
        let t = self.package.tensor(name)?;
        if let Some(f) = &t.source {
            return Err(ImportError::Transcoded {
                tensor: name.to_string(),
                encoding: t.encoding.clone(),
                source_encoding: f.encoding.clone(),
            });
        }
        self.objects
            .get(&t.name)
            .ok_or_else(|| synapse_cas::CasError::NoSuchTensor(name.to_string()).into())
    }

    fn stored_bytes(&self, name: &str, stored: &str) -> Result<&[u8]> {
        self.objects
            .get(stored)
            .map(|o| &o[..])
            .ok_or_else(|| synapse_cas::CasError::NoSuchTensor(name.to_string()).into())
    }

    /// For GGUF-sourced packages: the metadata as a (tensor-less) GGUF file, from which the
    /// tokenizer and chat template load exactly as from the source.
    pub fn gguf_metadata(&self) -> Option<&GgufFile> {
        self.gguf_metadata.as_ref()
    }

    /// For safetensors-sourced packages: `tokenizer.json` and `tokenizer_config.json` bytes.
    pub fn hf_tokenizer(&self) -> Result<Option<(Object, Option<Object>)>> {
        let Some(t) = &self.package.manifest().tokenizer else {
            return Ok(None);
        };
        let Some(file) = &t.file else {
            return Ok(None);
        };
        let config = match &t.config {
            Some(c) => Some(self.package.blob(c)?),
            None => None,
        };
        Ok(Some((self.package.blob(file)?, config)))
    }
}
