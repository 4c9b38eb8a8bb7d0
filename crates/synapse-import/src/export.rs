//! Package → GGUF: rebuilds the source GGUF from a GGUF-sourced package (metadata blob + one
//! object per tensor, in manifest order). For a file written with the usual layout (metadata,
//! tensor infos, data aligned in order) the result is byte-identical to the source, which the
//! manifest's sha256 then confirms.

use crate::error::{ImportError, Result};
use crate::gguf::GGUF_METADATA_MEDIA_TYPE;
use crate::import::ggml_type_of;
use synapse_cas::Package;
use synapse_formats::gguf::{GgufFile, GgufWriter};

/// Serializes a GGUF-sourced package back to a GGUF image.
pub fn export_gguf(package: &Package) -> Result<Vec<u8>> {
    let bad = |reason: String| ImportError::BadPackage {
        package: package.hash().to_string(),
        reason,
    };
    let m = package.manifest();
    let meta = m
        .metadata
        .as_ref()
        .filter(|b| b.media_type == GGUF_METADATA_MEDIA_TYPE)
        .ok_or_else(|| bad("not a GGUF-sourced package (no GGUF metadata blob)".into()))?;
    let f = GgufFile::from_bytes(package.blob(meta)?.to_vec())?;
    let mut w = GgufWriter::new();
    w.set_alignment(u32::try_from(f.alignment()).unwrap_or(32))?;
    for (k, v) in f.metadata() {
        if k != "general.alignment" {
            w.add_metadata(k.clone(), v.clone())?;
        }
    }
    for t in &m.tensors {
        if let Some(f) = &t.source {
            return Err(bad(format!(
                "tensor `{}` is stored as {} (its source held {}): the package cannot give \
                 back its source file",
                t.name, t.encoding, f.encoding
            )));
        }
        let ty = ggml_type_of(&t.encoding)
            .ok_or_else(|| bad(format!("tensor `{}` has encoding {}", t.name, t.encoding)))?;
        let data = package.store().get(&t.object)?;
        w.add_tensor(t.name.clone(), &t.dims, ty, data.to_vec())?;
    }
    Ok(w.to_bytes()?)
}
