//! The GGUF v3 reader: parses and validates the whole header at open, then hands out
//! zero-copy tensor views.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use super::strings::{Backing, GgufStrings};
use super::tensor::{BitnetType, TensorInfo, TensorType};
use super::value::{GgufArray, GgufValue, GgufValueType};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::error::{FormatError, Result};
use crate::types::GgmlType;

/// Bytes of one tensor info at minimum: name length, `n_dims`, type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
/// Bytes of one key/value pair at minimum: key length, value type, a one-byte value.
const MIN_KV: u64 = 8 + 4 + 1;

/// A validated GGUF v3 file. Every offset and size was checked at open; tensor data is a
/// zero-copy view into the mapping.
pub struct GgufFile {
    /// Shared with the string arrays of `metadata`, which borrow their bytes from it.
    backing: Arc<Backing>,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and validates the file at `path`.
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
            // SAFETY: the mapping is read-only; like every mmap-based model reader we assume the
            // file is not truncated or rewritten by another process while it is open.
            Backing::Mmap(unsafe { Mmap::map(&file) }.map_err(io)?, file)
        };
        Self::parse(backing)
    }

    /// Validates an in-memory GGUF image (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Backing::Bytes(bytes))
    }

    /// The format version (always 3 for a file that opened).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Tensor data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The whole file as mapped (`None` for an in-memory image): the extent within which
    /// a tensor's mapped pages may be dropped.
    pub fn mapped_bytes(&self) -> Option<&[u8]> {
        self.backing.mapping().map(|m| &m[..])
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// Metadata key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor's info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes (zero-copy). Bounds were checked at open; an info that does not
    /// belong to this file yields an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.backing.bytes();
        let (Ok(start), Ok(len)) = (usize::try_from(t.offset), usize::try_from(t.n_bytes)) else {
            return &[];
        };
        start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
            .unwrap_or(&[])
    }

    /// Reads `dst.len()` bytes of tensor `t`'s data from byte `at` of it into `dst` through
    /// the file (a positional read: the mapping's pages are not touched, so nothing of the
    /// tensor becomes mapped). `Ok(false)` when the file is an in-memory image or the range
    /// lies outside the tensor.
    pub fn read_tensor_at(&self, t: &TensorInfo, at: u64, dst: &mut [u8]) -> std::io::Result<bool> {
        self.backing.read_at(t.offset, t.n_bytes, at, dst)
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    fn parse(backing: Backing) -> Result<Self> {
        let backing = Arc::new(backing);
        let bytes = backing.bytes();
        let file_len = bytes.len() as u64;
        let mut c = Cursor {
            buf: bytes,
            pos: 0,
            backing: &backing,
        };

        let magic = c.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(FormatError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = c.u32("version")?;
        if version != GGUF_VERSION {
            return Err(FormatError::UnsupportedVersion { version });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        c.check_count("metadata key/value", n_kv, MIN_KV, 16)?;
        c.check_count("tensor info", n_tensors, MIN_TENSOR_INFO, 8)?;
        let budget = n_kv
            .checked_mul(MIN_KV)
            .and_then(|a| n_tensors.checked_mul(MIN_TENSOR_INFO)?.checked_add(a));
        if budget.is_none_or(|b| b > c.remaining()) {
            return Err(FormatError::CountTooLarge {
                what: "metadata + tensor info".into(),
                count: n_kv.saturating_add(n_tensors),
                offset: 16,
                remaining: c.remaining(),
            });
        }

        // ---- metadata ----
        let n_kv = n_kv as usize; // bounded by the file size above
        let mut metadata = Vec::with_capacity(n_kv);
        let mut key_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&format!("key of metadata pair #{i}"))?;
            let ty_id = c.u32("metadata value type")?;
            let ty =
                GgufValueType::from_id(ty_id).ok_or_else(|| FormatError::UnknownValueType {
                    key: key.clone(),
                    id: ty_id,
                })?;
            let value = c.value(ty, &key, 0)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(FormatError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }

        let alignment = match key_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1 {
                GgufValue::U32(a) => u64::from(a),
                ref other => {
                    return Err(FormatError::BadMetadata {
                        key: "general.alignment".into(),
                        reason: format!("must be u32, found {}", other.value_type().name()),
                    });
                }
            },
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(FormatError::BadAlignment { alignment });
        }
        let architecture = key_index
            .get("general.architecture")
            .and_then(|&i| metadata[i].1.as_str())
            .map(str::to_ascii_lowercase);
        let is_bitnet = architecture
            .as_deref()
            .is_some_and(|a| a.starts_with("bitnet"));

        // ---- tensor infos ----
        c.check_count("tensor info", n_tensors, MIN_TENSOR_INFO, c.pos as u64)?;
        let n_tensors = n_tensors as usize;
        let mut raw = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format!("name of tensor info #{i}"))?;
            let n_dims = c.u32("tensor n_dims")?;
            if n_dims as usize > MAX_DIMS {
                return Err(FormatError::BadShape {
                    tensor: name,
                    dims: vec![],
                    reason: format!("{n_dims} dimensions, at most {MAX_DIMS} allowed"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let type_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            if tensor_index.insert(name.clone(), i).is_some() {
                return Err(FormatError::DuplicateTensor { name });
            }
            raw.push(RawTensor {
                name,
                dims,
                type_id,
                offset,
            });
        }

        // ---- data section ----
        let header_end = c.pos as u64;
        let data_start =
            align_up(header_end, alignment).ok_or(FormatError::BadAlignment { alignment })?;
        if !raw.is_empty() && data_start > file_len {
            return Err(FormatError::Truncated {
                what: "padding before tensor data".into(),
                offset: header_end,
                needed: data_start - header_end,
                available: file_len - header_end,
            });
        }
        let data_len = file_len.saturating_sub(data_start);

        // Relative offsets sorted, to find each tensor's slot (the span up to the next one).
        let mut starts: Vec<u64> = raw.iter().map(|t| t.offset).collect();
        starts.sort_unstable();
        let slot_end = |off: u64| -> u64 {
            let k = starts.partition_point(|&s| s <= off);
            starts.get(k).copied().unwrap_or(data_len).max(off)
        };

        let mut tensors = Vec::with_capacity(raw.len());
        for t in raw {
            let n_elements = t.dims.iter().try_fold(1u64, |acc, &d| {
                if d > i64::MAX as u64 {
                    None
                } else {
                    acc.checked_mul(d).filter(|&p| p <= i64::MAX as u64)
                }
            });
            let Some(n_elements) = n_elements else {
                return Err(FormatError::BadShape {
                    tensor: t.name,
                    dims: t.dims,
                    reason: "element count overflows int64".into(),
                });
            };
            if t.offset % alignment != 0 {
                return Err(FormatError::Misaligned {
                    tensor: t.name,
                    offset: t.offset,
                    alignment,
                });
            }
            let slot = slot_end(t.offset).saturating_sub(t.offset);
            let ty = resolve_type(t.type_id, &t, n_elements, slot, alignment, is_bitnet)?;
            let n_bytes = match ty {
                TensorType::Ggml(g) => {
                    let ne0 = t.dims.first().copied().unwrap_or(1);
                    if ne0 % g.block_size() as u64 != 0 {
                        return Err(FormatError::BadShape {
                            tensor: t.name,
                            dims: t.dims,
                            reason: format!(
                                "ne0 is not a multiple of {g}'s block size {}",
                                g.block_size()
                            ),
                        });
                    }
                    g.bytes_for(n_elements)
                        .ok_or_else(|| FormatError::BadShape {
                            tensor: t.name.clone(),
                            dims: t.dims.clone(),
                            reason: "byte size overflows".into(),
                        })?
                }
                TensorType::Bitnet(_) => slot,
            };
            let start = data_start.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(n_bytes));
            let (Some(start), Some(end)) = (start, end) else {
                return Err(FormatError::OutOfBounds {
                    tensor: t.name,
                    start: data_start.saturating_add(t.offset),
                    len: n_bytes,
                    file_len,
                });
            };
            if end > file_len || usize::try_from(end).is_err() {
                return Err(FormatError::OutOfBounds {
                    tensor: t.name,
                    start,
                    len: n_bytes,
                    file_len,
                });
            }
            tensors.push(TensorInfo {
                name: t.name,
                dims: t.dims,
                ty,
                offset: start,
                n_bytes,
            });
        }

        // No two tensors may share bytes.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| (tensors[i].offset, tensors[i].n_bytes));
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.n_bytes > 0 && b.n_bytes > 0 && a.offset + a.n_bytes > b.offset {
                return Err(FormatError::Overlap {
                    first: a.name.clone(),
                    second: b.name.clone(),
                });
            }
        }

        Ok(GgufFile {
            version,
            alignment,
            data_start,
            metadata,
            key_index,
            tensors,
            tensor_index,
            backing,
        })
    }
}

struct RawTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

/// Decides what a raw type id means (see the module docs for the bitnet rule).
fn resolve_type(
    id: u32,
    t: &RawTensor,
    n_elements: u64,
    slot: u64,
    alignment: u64,
    is_bitnet: bool,
) -> Result<TensorType> {
    let unknown = || FormatError::UnknownType {
        id,
        tensor: t.name.clone(),
    };
    if is_bitnet && (36..=39).contains(&id) {
        if id == GgmlType::MXFP4.id()
            && fits_upstream(GgmlType::MXFP4, t, n_elements, slot, alignment)
        {
            return Ok(TensorType::Ggml(GgmlType::MXFP4));
        }
        return BitnetType::from_id(id)
            .map(TensorType::Bitnet)
            .ok_or_else(unknown);
    }
    GgmlType::from_id(id)
        .map(TensorType::Ggml)
        .ok_or_else(unknown)
}

/// True when the tensor's slot holds exactly the upstream type's bytes (plus at most the
/// alignment padding).
fn fits_upstream(g: GgmlType, t: &RawTensor, n_elements: u64, slot: u64, alignment: u64) -> bool {
    let ne0 = t.dims.first().copied().unwrap_or(1);
    if ne0 % g.block_size() as u64 != 0 {
        return false;
    }
    match g.bytes_for(n_elements) {
        Some(n) => n <= slot && slot - n < alignment,
        None => false,
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1).map(|v| v & !(alignment - 1))
}

/// A bounds-checked little-endian reader over the file image.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// What `buf` is the bytes of (string arrays keep a handle to it).
    backing: &'a Arc<Backing>,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(FormatError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in the rest of the file.
    fn check_count(&self, what: &str, count: u64, min_size: u64, offset: u64) -> Result<()> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(FormatError::CountTooLarge {
                what: what.to_string(),
                count,
                offset,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        self.str(what).map(str::to_owned)
    }

    /// The next string, borrowed from the file image.
    fn str(&mut self, what: &str) -> Result<&'a str> {
        let len_off = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(FormatError::CountTooLarge {
                what: format!("{what} (string length)"),
                count: len,
                offset: len_off,
                remaining: self.remaining(),
            });
        }
        let off = self.pos as u64;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(_) => Err(FormatError::InvalidUtf8 {
                what: what.to_string(),
                offset: off,
            }),
        }
    }

    fn value(&mut self, ty: GgufValueType, key: &str, depth: usize) -> Result<GgufValue> {
        use GgufValueType as T;
        Ok(match ty {
            T::U8 => GgufValue::U8(self.array::<1>(key)?[0]),
            T::I8 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            T::U16 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            T::I16 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            T::U32 => GgufValue::U32(u32::from_le_bytes(self.array(key)?)),
            T::I32 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            T::F32 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            T::Bool => GgufValue::Bool(self.array::<1>(key)?[0] != 0),
            T::String => GgufValue::String(self.string(key)?),
            T::Array => GgufValue::Array(self.array_value(key, depth)?),
            T::U64 => GgufValue::U64(u64::from_le_bytes(self.array(key)?)),
            T::I64 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            T::F64 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(FormatError::NestingTooDeep {
                key: key.to_string(),
                limit: MAX_ARRAY_DEPTH,
            });
        }
        let elem_id = self.u32(key)?;
        let elem =
            GgufValueType::from_id(elem_id).ok_or_else(|| FormatError::UnknownValueType {
                key: key.to_string(),
                id: elem_id,
            })?;
        let count_off = self.pos as u64;
        let count = self.u64(key)?;
        self.check_count(
            &format!("array `{key}` element"),
            count,
            elem.min_encoded_size(),
            count_off,
        )?;
        let n = count as usize; // bounded by the remaining bytes

        fn fixed<'a, const N: usize, T>(
            c: &mut Cursor<'a>,
            n: usize,
            key: &str,
            f: impl Fn([u8; N]) -> T,
        ) -> Result<Vec<T>> {
            let bytes = c.take((n * N) as u64, key)?;
            Ok(bytes
                .chunks_exact(N)
                .map(|ch| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(ch);
                    f(a)
                })
                .collect())
        }

        use GgufValueType as T;
        Ok(match elem {
            T::U8 => GgufArray::U8(self.take(n as u64, key)?.to_vec()),
            T::I8 => GgufArray::I8(fixed(self, n, key, |a: [u8; 1]| a[0] as i8)?),
            T::U16 => GgufArray::U16(fixed(self, n, key, u16::from_le_bytes)?),
            T::I16 => GgufArray::I16(fixed(self, n, key, i16::from_le_bytes)?),
            T::U32 => GgufArray::U32(fixed(self, n, key, u32::from_le_bytes)?),
            T::I32 => GgufArray::I32(fixed(self, n, key, i32::from_le_bytes)?),
            T::F32 => GgufArray::F32(fixed(self, n, key, f32::from_le_bytes)?),
            T::Bool => GgufArray::Bool(fixed(self, n, key, |a: [u8; 1]| a[0] != 0)?),
            T::U64 => GgufArray::U64(fixed(self, n, key, u64::from_le_bytes)?),
            T::I64 => GgufArray::I64(fixed(self, n, key, i64::from_le_bytes)?),
            T::F64 => GgufArray::F64(fixed(self, n, key, f64::from_le_bytes)?),
            T::String => {
                // Validate every string (length in bounds, UTF-8) before allocating anything,
                // then index them in place: no per-string allocation, nothing sized by `count`
                // until the data behind it has been seen.
                let start = self.pos;
                for _ in 0..n {
                    self.str(key)?;
                }
                // SAFETY: the loop just read `n` strings from `start` in `self.backing`'s
                // bytes, each checked to be UTF-8 by `str`.
                let span = self.pos - start;
                let strings =
                    unsafe { GgufStrings::from_validated(self.backing.clone(), start, span, n) };
                GgufArray::String(strings)
            }
            T::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                GgufArray::Array(v)
            }
        })
    }
}
