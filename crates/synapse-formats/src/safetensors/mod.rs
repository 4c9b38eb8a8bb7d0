//! The safetensors reader: single files, and checkpoints sharded through
//! `model.safetensors.index.json`.
//!
//! # Reading rules
//! - the first 8 bytes are the little-endian JSON header length; it must be at most
//!   [`MAX_HEADER_LEN`] (100 MB, as the reference library) and fit in the file;
//! - the header must be UTF-8 JSON starting with `{`: an object mapping tensor names to
//!   `{dtype, shape, data_offsets: [begin, end]}`, plus an optional `__metadata__` string map;
//! - dtypes are the 15 of [`Dtype`] (unknown strings: [`FormatError::UnknownDtype`]);
//! - `end - begin` must equal `product(shape) · size(dtype)` (overflow-checked), offsets are
//!   relative to the end of the header and must lie in the file;
//! - the tensors must tile the data section exactly: no overlap, no hole, nothing left over
//!   (the reference library's rule).
//!
//! A directory opens `model.safetensors.index.json` when present (every shard named in its
//! `weight_map` must exist, be a plain file name inside the directory, and hold the tensors
//! the map assigns to it), otherwise `model.safetensors`.

mod dtype;
mod file;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use dtype::Dtype;
pub use file::{MAX_HEADER_LEN, SafetensorsEntry, SafetensorsFile};

use crate::error::{FormatError, Result};

/// Name of the shard index in a sharded checkpoint directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of the single file in an unsharded checkpoint directory.
pub const SINGLE_FILE: &str = "model.safetensors";

/// A borrowed view of one tensor of a [`SafetensorsModel`].
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, row-major as stored.
    pub shape: &'a [u64],
    /// The tensor's bytes (zero-copy from the mapping).
    pub bytes: &'a [u8],
    /// Which shard file holds it.
    pub shard: &'a str,
}

/// A safetensors checkpoint: one file or several shards, presented as one tensor set.
#[derive(Debug)]
pub struct SafetensorsModel {
    shards: Vec<SafetensorsFile>,
    /// (shard index, entry index) in the model's tensor order.
    order: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

impl SafetensorsModel {
    /// Opens a `.safetensors` file, or a directory holding `model.safetensors.index.json`
    /// (sharded) or `model.safetensors`.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let index = path.join(INDEX_FILE);
            if index.is_file() {
                return Self::open_index(&index);
            }
            let single = path.join(SINGLE_FILE);
            if single.is_file() {
                return Ok(Self::from_file(SafetensorsFile::open(&single)?));
            }
            return Err(FormatError::NotAModel {
                path: path.display().to_string(),
                reason: format!("directory has neither {INDEX_FILE} nor {SINGLE_FILE}"),
            });
        }
        if path.file_name().and_then(|n| n.to_str()) == Some(INDEX_FILE) {
            return Self::open_index(path);
        }
        Ok(Self::from_file(SafetensorsFile::open(path)?))
    }

    /// Wraps one already-validated file.
    pub fn from_file(f: SafetensorsFile) -> Self {
        let order: Vec<_> = (0..f.entries().len()).map(|i| (0, i)).collect();
        let by_name = f
            .entries()
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        SafetensorsModel {
            shards: vec![f],
            order,
            by_name,
        }
    }

    /// Opens a sharded checkpoint from its index file.
    pub fn open_index(index_path: &Path) -> Result<Self> {
        let label = index_path.display().to_string();
        let bad = |reason: String| FormatError::BadIndex {
            index: label.clone(),
            reason,
        };
        let text = std::fs::read_to_string(index_path).map_err(|source| FormatError::Io {
            path: label.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));

        // Shards in file-name order (`model-00001-of-…` first), each name checked.
        let mut entries: Vec<(&str, &str)> = Vec::with_capacity(map.len());
        for (tensor, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("weight_map[`{tensor}`] is not a string")))?;
            let p = Path::new(shard);
            let plain = p.components().count() == 1
                && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
            if !plain {
                return Err(bad(format!(
                    "shard name `{shard}` is not a plain file name in the checkpoint directory"
                )));
            }
            entries.push((tensor.as_str(), shard));
        }
        let mut shard_names: Vec<String> = entries.iter().map(|(_, s)| s.to_string()).collect();
        shard_names.sort();
        shard_names.dedup();
        let assign: BTreeMap<&str, usize> = entries
            .iter()
            .map(|(t, s)| (*t, shard_names.partition_point(|n| n.as_str() < *s)))
            .collect();
        let mut shards = Vec::with_capacity(shard_names.len());
        for name in &shard_names {
            let p: PathBuf = dir.join(name);
            if !p.is_file() {
                return Err(FormatError::MissingShard {
                    shard: name.clone(),
                    index: label.clone(),
                });
            }
            shards.push(SafetensorsFile::open(&p)?);
        }
        let mut order = Vec::with_capacity(assign.len());
        let mut by_name = HashMap::with_capacity(assign.len());
        // Model order: shard by shard, each in its file order.
        for (k, shard) in shards.iter().enumerate() {
            for (i, e) in shard.entries().iter().enumerate() {
                if assign.get(e.name.as_str()) == Some(&k) {
                    by_name.insert(e.name.clone(), order.len());
                    order.push((k, i));
                }
            }
        }
        if let Some((t, &k)) = assign.iter().find(|(t, _)| !by_name.contains_key(**t)) {
            return Err(bad(format!(
                "tensor `{t}` is mapped to `{}` but that shard does not hold it",
                shard_names[k]
            )));
        }
        Ok(SafetensorsModel {
            shards,
            order,
            by_name,
        })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when the model has no tensors.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The shard files (one for an unsharded checkpoint).
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    fn view(&self, (k, i): (usize, usize)) -> TensorView<'_> {
        let shard = &self.shards[k];
        let e = &shard.entries()[i];
        TensorView {
            name: &e.name,
            dtype: e.dtype,
            shape: &e.shape,
            bytes: shard.data(e),
            shard: shard.label(),
        }
    }

    /// All tensors: shard by shard, each in data-offset order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        self.order.iter().map(|&ki| self.view(ki))
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.by_name.get(name).map(|&j| self.view(self.order[j]))
    }

    /// Where a tensor lives: the index of its shard in [`Self::shards`] and its entry there.
    pub fn locate(&self, name: &str) -> Option<(usize, &SafetensorsEntry)> {
        let &j = self.by_name.get(name)?;
        let (k, i) = self.order[j];
        Some((k, &self.shards[k].entries()[i]))
    }

    /// The union of the shards' `__metadata__` maps (first shard wins on conflicts).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for s in self.shards.iter().rev() {
            m.extend(s.metadata().iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        m
    }
}
