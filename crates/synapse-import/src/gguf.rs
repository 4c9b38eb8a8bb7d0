//! GGUF → package.
//!
//! The package keeps everything the GGUF had: each tensor's bytes as one object (encoding
//! `ggml.<type>`, dims in ggml order), and every metadata pair, typed and in order, as a
//! metadata blob that is itself a GGUF file with no tensors (`application/x-gguf`; so the
//! tokenizer, chat template and hyperparameters are read back by the same reader).

use crate::error::Result;
use crate::import::{
    CONVERTER, CONVERTER_VERSION, Clock, Destination, ImportReport, encoding_id, file_name,
};
use crate::progress::Progress;
use std::path::Path;
use synapse_cas::FileDigest;
use synapse_cas::package::{License, PackageBuilder, TokenizerInfo};
use synapse_formats::gguf::{GgufFile, GgufWriter};
use synapse_model::SourceDesc;

/// Media type of the metadata blob of GGUF-sourced packages.
pub const GGUF_METADATA_MEDIA_TYPE: &str = "application/x-gguf";
/// Media type of the serialized IR.
pub const GRAPH_MEDIA_TYPE: &str = "application/vnd.synapse.model-ir+json";

/// Every metadata pair of `f`, in order, as a tensor-less GGUF image.
pub fn metadata_gguf(f: &GgufFile) -> Result<Vec<u8>> {
    let mut w = GgufWriter::new();
    w.set_alignment(u32::try_from(f.alignment()).unwrap_or(32))?;
    for (k, v) in f.metadata() {
        if k == "general.alignment" {
            continue; // set above
        }
        w.add_metadata(k.clone(), v.clone())?;
    }
    Ok(w.to_bytes()?)
}

/// Imports one GGUF file.
pub fn import_gguf(
    path: &Path,
    dest: &Destination,
    progress: &dyn Progress,
) -> Result<ImportReport> {
    let mut clock = Clock::start();
    // 1. Validate: the family adapter must accept every tensor, shape and alias.
    let f = GgufFile::open(path)?;
    let desc = SourceDesc::from_gguf(&f)?;
    let ir = synapse_model::build_ir(&desc)?;
    let graph = serde_json::to_vec(&ir).map_err(|e| crate::ImportError::NotAModel {
        path: path.to_path_buf(),
        reason: format!("serializing the IR: {e}"),
    })?;
    let metadata = metadata_gguf(&f)?;
    // BitNet projections (bitnet.cpp's I2_S) are stored ternary: transcoded before any write.
    let ternary =
        crate::ternary::ternary_projections(&ir, |n| f.tensor(n).map(|t| f.tensor_data(t)))?;
    let validate_s = clock.lap();

    // 2. Hash the source.
    let size = std::fs::metadata(path)
        .map_err(crate::ImportError::io(path))?
        .len();
    progress.start("hashing", size, 0);
    let digest = FileDigest::of_file_with_progress(path, |n| progress.advance(n, 0))?;
    progress.finish();
    let hash_s = clock.lap();

    // 3. Store.
    let mut b = PackageBuilder::new(
        ir.family.name(),
        desc.arch.clone(),
        CONVERTER,
        CONVERTER_VERSION,
    );
    b.option("tensors", "source-encoding");
    if !ternary.is_empty() {
        b.option("bitnet-projections", crate::ternary::TERNARY_ENCODING);
    }
    b.source(file_name(path), "gguf", digest);
    if let Some(name) = f.get("general.name").and_then(|v| v.as_str()) {
        b.name(name);
    }
    let license = f.get("general.license").and_then(|v| v.as_str());
    let link = f.get("general.license.link").and_then(|v| v.as_str());
    if license.is_some() || link.is_some() {
        b.license(License {
            name: license.map(str::to_string),
            link: link.map(str::to_string),
            from: "gguf:general.license".into(),
            text: None,
        });
    }
    b.tokenizer(TokenizerInfo {
        model: f
            .get("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .unwrap_or("none")
            .to_string(),
        source: "metadata".into(),
        file: None,
        config: None,
        chat_template: f
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    });

    let (store, target) = dest.open()?;
    let session = store.session()?;
    b.metadata(&session, &metadata, GGUF_METADATA_MEDIA_TYPE)?;
    b.graph(&session, &graph, GRAPH_MEDIA_TYPE)?;
    let tensor_bytes: u64 = f.tensors().iter().map(|t| t.n_bytes).sum();
    progress.start("storing", tensor_bytes, f.tensors().len() as u64);
    // Each tensor's encoding as the description gave it (bitnet.cpp's I2_S is `I8` bytes there,
    // and transcoded).
    let encodings: std::collections::HashMap<&str, synapse_formats::GgmlType> = desc
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.encoding))
        .collect();
    for t in f.tensors() {
        let ty = match encodings.get(t.name.as_str()) {
            Some(&ty) => ty,
            None => t.ty.ggml()?,
        };
        let data = f.tensor_data(t);
        if ternary.contains_key(&t.name) {
            // Its source form as described: I2_S bytes, `I8` of shape `[bytes]`.
            let dims = [data.len() as u64];
            crate::ternary::add_tensor(
                &mut b,
                &session,
                &ternary,
                &t.name,
                &encoding_id(ty),
                &dims,
                data,
            )?;
        } else {
            b.add_tensor(&session, &t.name, &encoding_id(ty), &t.dims, data)?;
        }
        progress.advance(t.n_bytes, 1);
    }
    progress.finish();
    crate::import::add_aliases(&mut b, &ir)?;
    let built = b.finish()?;
    let manifest = built.commit(&session, target)?;
    drop(session);
    let store_s = clock.lap();
    Ok(ImportReport {
        package: built.hash,
        manifest,
        family: ir.family.name().to_string(),
        conversion_identity: built.manifest.conversion.identity.clone(),
        stats: built.stats,
        source_bytes: size,
        validate_s,
        hash_s,
        store_s,
    })
}
