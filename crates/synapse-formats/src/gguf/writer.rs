//! The GGUF v3 writer: metadata of every value type, tensors padded to the alignment.
//! What it writes, [`super::GgufFile`] reads back unchanged (round-trip tested).

use std::io::Write;
use std::path::Path;

use super::tensor::TensorType;
use super::value::{GgufArray, GgufValue};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_DIMS};
use crate::error::{FormatError, Result};

/// One tensor queued for writing.
#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory and writes it out.
///
/// ```
/// use synapse_formats::gguf::{GgufFile, GgufValue, GgufWriter};
/// use synapse_formats::GgmlType;
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", GgufValue::String("llama".into()))?;
/// w.add_tensor("x", &[4], GgmlType::F32, 1.0f32.to_le_bytes().repeat(4))?;
/// let f = GgufFile::from_bytes(w.to_bytes()?)?;
/// assert_eq!(f.architecture(), Some("llama"));
/// assert_eq!(f.tensor_data(f.tensor("x").unwrap()).len(), 16);
/// # Ok::<(), synapse_formats::FormatError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the tensor data alignment; writes `general.alignment` when it differs from 32.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        let a = u64::from(alignment);
        if a == 0 || !a.is_power_of_two() {
            return Err(FormatError::BadAlignment { alignment: a });
        }
        self.alignment = a;
        self.metadata.retain(|(k, _)| k != "general.alignment");
        if a != DEFAULT_ALIGNMENT {
            self.metadata
                .push(("general.alignment".into(), GgufValue::U32(alignment)));
        }
        Ok(())
    }

    /// Appends a metadata pair (keys must be unique; use [`GgufWriter::set_alignment`] for
    /// `general.alignment`).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: GgufValue) -> Result<()> {
        let key = key.into();
        if key == "general.alignment" {
            let a = match value {
                GgufValue::U32(a) => a,
                ref v => {
                    return Err(FormatError::BadMetadata {
                        key,
                        reason: format!("must be u32, found {}", v.value_type().name()),
                    });
                }
            };
            return self.set_alignment(a);
        }
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(FormatError::DuplicateKey { key });
        }
        self.metadata.push((key, value));
        Ok(())
    }

    /// Appends a tensor; `dims` are in ggml order (`dims[0]` fastest-varying). For upstream
    /// types `data` must be exactly the type's byte size for that shape.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: impl Into<TensorType>,
        data: Vec<u8>,
    ) -> Result<()> {
        let name = name.into();
        let ty = ty.into();
        if dims.len() > MAX_DIMS {
            return Err(FormatError::Write {
                reason: format!("tensor `{name}` has {} dims (max {MAX_DIMS})", dims.len()),
            });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(FormatError::DuplicateTensor { name });
        }
        if let TensorType::Ggml(g) = ty {
            let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let ne0 = dims.first().copied().unwrap_or(1);
            let expect = n
                .filter(|_| ne0 % g.block_size() as u64 == 0)
                .and_then(|n| g.bytes_for(n));
            if expect != Some(data.len() as u64) {
                return Err(FormatError::Write {
                    reason: format!(
                        "tensor `{name}` ({g}, dims {dims:?}) needs {expect:?} bytes, got {}",
                        data.len()
                    ),
                });
            }
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// Serializes the whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out).map_err(|source| FormatError::Io {
            path: "<memory>".into(),
            source,
        })?;
        Ok(out)
    }

    /// Writes the file to `path` (created or truncated).
    pub fn write_file(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| FormatError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Streams the file into `w`.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut head = Vec::new();
        head.extend_from_slice(GGUF_MAGIC);
        head.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            encode_string(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            encode_value(&mut head, v);
        }
        let mut rel = 0u64;
        for t in &self.tensors {
            encode_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&rel.to_le_bytes());
            rel = pad_to(rel + t.data.len() as u64, self.alignment);
        }
        let a = self.alignment;
        let zeros = vec![0u8; a as usize];
        let n = head.len() as u64;
        head.extend_from_slice(&zeros[..(pad_to(n, a) - n) as usize]);
        w.write_all(&head)?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let n = t.data.len() as u64;
            w.write_all(&zeros[..(pad_to(n, a) - n) as usize])?;
        }
        Ok(())
    }
}

fn pad_to(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn encode_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn encode_value(buf: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => buf.push(*x),
        GgufValue::I8(x) => buf.push(*x as u8),
        GgufValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => buf.push(u8::from(*x)),
        GgufValue::String(s) => encode_string(buf, s),
        GgufValue::Array(a) => encode_array(buf, a),
        GgufValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn encode_array(buf: &mut Vec<u8>, a: &GgufArray) {
    buf.extend_from_slice(&a.element_type().id().to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        GgufArray::U8(v) => buf.extend_from_slice(v),
        GgufArray::I8(v) => buf.extend(v.iter().map(|&x| x as u8)),
        GgufArray::U16(v) => le!(v),
        GgufArray::I16(v) => le!(v),
        GgufArray::U32(v) => le!(v),
        GgufArray::I32(v) => le!(v),
        GgufArray::F32(v) => le!(v),
        GgufArray::Bool(v) => buf.extend(v.iter().map(|&x| u8::from(x))),
        GgufArray::String(v) => buf.extend_from_slice(v.encoded()),
        GgufArray::Array(v) => {
            for inner in v {
                encode_array(buf, inner);
            }
        }
        GgufArray::U64(v) => le!(v),
        GgufArray::I64(v) => le!(v),
        GgufArray::F64(v) => le!(v),
    }
}
