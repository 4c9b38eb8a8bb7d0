//! One `.safetensors` file: an 8-byte little-endian header length, a JSON header, then the
//! tensor bytes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use serde_json::Value;

use super::dtype::Dtype;
use crate::backing::Backing;
use crate::error::{FormatError, Result};

/// Largest JSON header accepted (the reference `safetensors` library's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// A tensor entry of a safetensors header, validated against its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsEntry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, row-major as stored (`shape[last]` is contiguous).
    pub shape: Vec<u64>,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Byte length.
    pub n_bytes: u64,
}

impl SafetensorsEntry {
    /// Number of elements (product of the shape; validated at open).
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// A validated single safetensors file.
pub struct SafetensorsFile {
    backing: Backing,
    label: String,
    entries: Vec<SafetensorsEntry>,
    index: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("label", &self.label)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Maps and validates a `.safetensors` file.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| FormatError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let backing = if len == 0 {
            Backing::Bytes(Vec::new())
        } else {
            // SAFETY: read-only mapping; the file is assumed not to change while open.
            Backing::Mmap(unsafe { Mmap::map(&file) }.map_err(io)?, file)
        };
        Self::parse(backing, path.display().to_string())
    }

    /// Validates an in-memory safetensors image (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Backing::Bytes(bytes), "<bytes>".into())
    }

    /// Tensor entries sorted by data offset (the file's order).
    pub fn entries(&self) -> &[SafetensorsEntry] {
        &self.entries
    }

    /// An entry by name.
    pub fn entry(&self, name: &str) -> Option<&SafetensorsEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// The header's `__metadata__` string map.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The entry's bytes (zero-copy; an entry of another file gives an empty slice).
    pub fn data(&self, e: &SafetensorsEntry) -> &[u8] {
        let b = self.backing.bytes();
        let (Ok(s), Ok(n)) = (usize::try_from(e.offset), usize::try_from(e.n_bytes)) else {
            return &[];
        };
        s.checked_add(n)
            .and_then(|end| b.get(s..end))
            .unwrap_or(&[])
    }

    /// Where this file came from (path or `<bytes>`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The whole file mapping, for a file opened from disk (`None` for an in-memory image):
    /// the extent within which a caller may drop an entry's mapped pages.
    pub fn mapped_bytes(&self) -> Option<&[u8]> {
        self.backing.mapping().map(|m| &m[..])
    }

    /// Reads `dst.len()` bytes from byte `at` of entry `e` into `dst` through the file (a
    /// positional read: the mapping's pages are not touched, so none becomes mapped).
    /// `Ok(false)` for an in-memory image or a range outside the entry.
    pub fn read_entry_at(
        &self,
        e: &SafetensorsEntry,
        at: u64,
        dst: &mut [u8],
    ) -> std::io::Result<bool> {
        self.backing.read_at(e.offset, e.n_bytes, at, dst)
    }

    fn parse(backing: Backing, label: String) -> Result<Self> {
        let bytes = backing.bytes();
        let bad = |reason: String| FormatError::SafetensorsHeader {
            path: label.clone(),
            reason,
        };
        let file_len = bytes.len() as u64;
        let Some(len_bytes) = bytes.get(..8) else {
            return Err(bad(format!(
                "{file_len} bytes is too short for the header length"
            )));
        };
        let mut a = [0u8; 8];
        a.copy_from_slice(len_bytes);
        let header_len = u64::from_le_bytes(a);
        if header_len > MAX_HEADER_LEN {
            return Err(bad(format!(
                "header length {header_len} exceeds the {MAX_HEADER_LEN}-byte limit"
            )));
        }
        if header_len > file_len - 8 {
            return Err(bad(format!(
                "header length {header_len} exceeds the {} bytes after it",
                file_len - 8
            )));
        }
        let data_start = 8 + header_len;
        let header = &bytes[8..data_start as usize];
        let header =
            std::str::from_utf8(header).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
        if !header.starts_with('{') {
            return Err(bad("header does not start with `{`".into()));
        }
        let json: serde_json::Map<String, Value> =
            serde_json::from_str(header).map_err(|e| bad(format!("header JSON: {e}")))?;
        let data_len = file_len - data_start;

        let mut metadata = BTreeMap::new();
        let mut entries = Vec::with_capacity(json.len());
        for (name, v) in json {
            if name == "__metadata__" {
                let Value::Object(m) = v else {
                    return Err(bad("`__metadata__` is not an object".into()));
                };
                for (k, v) in m {
                    let Value::String(s) = v else {
                        return Err(bad(format!("`__metadata__.{k}` is not a string")));
                    };
                    metadata.insert(k, s);
                }
                continue;
            }
            let Value::Object(obj) = v else {
                return Err(bad(format!("entry `{name}` is not an object")));
            };
            let dtype_str = obj
                .get("dtype")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("entry `{name}` has no string `dtype`")))?;
            let dtype = Dtype::parse(dtype_str).ok_or_else(|| FormatError::UnknownDtype {
                tensor: name.clone(),
                dtype: dtype_str.to_string(),
            })?;
            let shape = obj
                .get("shape")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("entry `{name}` has no `shape` array")))?
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| bad(format!("entry `{name}`: shape has a non-integer")))?;
            let offs = obj
                .get("data_offsets")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("entry `{name}` has no `data_offsets` array")))?;
            let (begin, end) = match offs.as_slice() {
                [b, e] => match (b.as_u64(), e.as_u64()) {
                    (Some(b), Some(e)) => (b, e),
                    _ => {
                        return Err(bad(format!(
                            "entry `{name}`: data_offsets are not integers"
                        )));
                    }
                },
                _ => {
                    return Err(bad(format!(
                        "entry `{name}`: data_offsets is not [begin, end]"
                    )));
                }
            };
            if begin > end || end > data_len {
                return Err(bad(format!(
                    "entry `{name}`: data_offsets [{begin}, {end}) outside the {data_len}-byte data section"
                )));
            }
            let n_bytes = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype.size() as u64));
            if n_bytes != Some(end - begin) {
                return Err(bad(format!(
                    "entry `{name}`: {dtype:?} shape {shape:?} needs {n_bytes:?} bytes, data_offsets give {}",
                    end - begin
                )));
            }
            entries.push(SafetensorsEntry {
                name,
                dtype,
                shape,
                offset: data_start + begin,
                n_bytes: end - begin,
            });
        }

        // The data section must be covered exactly, without overlaps or holes (as the
        // reference library requires).
        entries.sort_by_key(|e| (e.offset, e.n_bytes));
        let mut expected = data_start;
        for e in &entries {
            if e.offset != expected {
                let what = if e.offset < expected {
                    "overlaps the previous tensor"
                } else {
                    "leaves a hole before it"
                };
                return Err(bad(format!(
                    "entry `{}` at {} {what}",
                    e.name,
                    e.offset - data_start
                )));
            }
            expected += e.n_bytes;
        }
        if expected != file_len {
            return Err(bad(format!(
                "tensors cover {} of the {data_len} data bytes",
                expected - data_start
            )));
        }
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            backing,
            label,
            entries,
            index,
            metadata,
        })
    }
}
