//! Safetensors checkpoint (`config.json` + one file or shards with an index) → package.
//!
//! Tensors keep their bytes (safetensors F32/F16/BF16/I* are byte-identical to the ggml types of
//! the same name); dims are written in ggml order (the safetensors shape reversed). The metadata
//! blob is `config.json`; `tokenizer.json` and `tokenizer_config.json` are stored as blobs.

use crate::error::{ImportError, Result};
use crate::gguf::GRAPH_MEDIA_TYPE;
use crate::import::{
    CONVERTER, CONVERTER_VERSION, Clock, Destination, ImportReport, encoding_id, file_name,
};
use crate::progress::Progress;
use std::path::{Path, PathBuf};
use synapse_cas::FileDigest;
use synapse_cas::package::{License, PackageBuilder, TokenizerInfo};
use synapse_formats::safetensors::{INDEX_FILE, SafetensorsModel};
use synapse_model::SourceDesc;

/// Side files recorded (and digested) when present, with their role.
const SIDE_FILES: &[(&str, &str)] = &[
    ("config.json", "config"),
    ("tokenizer.json", "tokenizer"),
    ("tokenizer_config.json", "tokenizer-config"),
    (INDEX_FILE, "safetensors-index"),
];
const LICENSE_FILES: &[&str] = &["LICENSE", "LICENSE.txt", "LICENSE.md"];

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(ImportError::io(path))
}

/// Imports a safetensors checkpoint directory.
pub fn import_safetensors(
    dir: &Path,
    dest: &Destination,
    progress: &dyn Progress,
) -> Result<ImportReport> {
    let mut clock = Clock::start();
    // 1. Validate.
    let config_path = dir.join("config.json");
    let config = read(&config_path)?;
    let config_text = std::str::from_utf8(&config).map_err(|e| ImportError::NotAModel {
        path: config_path.clone(),
        reason: format!("config.json is not UTF-8: {e}"),
    })?;
    let m = SafetensorsModel::open(dir)?;
    let desc = SourceDesc::from_safetensors(config_text, &m)?;
    let ir = synapse_model::build_ir(&desc)?;
    let graph = serde_json::to_vec(&ir).map_err(|e| ImportError::NotAModel {
        path: dir.to_path_buf(),
        reason: format!("serializing the IR: {e}"),
    })?;
    // BitNet projections are stored ternary: transcoded (so validated) before any write.
    let ternary = crate::ternary::ternary_projections(&ir, |n| m.tensor(n).map(|t| t.bytes))?;
    let validate_s = clock.lap();

    // 2. Hash every source file: shards in model order, then the side files.
    let mut files: Vec<(PathBuf, &str)> = m
        .shards()
        .iter()
        .map(|s| (dir.join(file_name(Path::new(s.label()))), "safetensors"))
        .collect();
    for (name, role) in SIDE_FILES {
        let p = dir.join(name);
        if p.is_file() {
            files.push((p, role));
        }
    }
    let mut total = 0u64;
    for (p, _) in &files {
        total += std::fs::metadata(p).map_err(ImportError::io(p))?.len();
    }
    progress.start("hashing", total, 0);
    let mut digests = Vec::with_capacity(files.len());
    for (p, role) in &files {
        digests.push((
            file_name(p),
            *role,
            FileDigest::of_file_with_progress(p, |n| progress.advance(n, 0))?,
        ));
    }
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
    for (name, role, d) in digests {
        b.source(name, role, d);
    }
    let (store, target) = dest.open()?;
    let session = store.session()?;
    b.metadata(&session, &config, "application/json")?;
    b.graph(&session, &graph, GRAPH_MEDIA_TYPE)?;

    let tok_path = dir.join("tokenizer.json");
    let tok_cfg_path = dir.join("tokenizer_config.json");
    let tok_cfg: Option<serde_json::Value> = if tok_cfg_path.is_file() {
        serde_json::from_slice(&read(&tok_cfg_path)?).ok()
    } else {
        None
    };
    if tok_path.is_file() {
        let bytes = read(&tok_path)?;
        let model = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|j| {
                j.pointer("/model/type")
                    .and_then(|t| t.as_str())
                    .map(str::to_ascii_lowercase)
            })
            .unwrap_or_else(|| "unknown".into());
        let file = b.put_blob(&session, &bytes, "application/json")?;
        let config = if tok_cfg_path.is_file() {
            Some(b.put_blob(&session, &read(&tok_cfg_path)?, "application/json")?)
        } else {
            None
        };
        b.tokenizer(TokenizerInfo {
            model,
            source: "file".into(),
            file: Some(file),
            config,
            chat_template: tok_cfg
                .as_ref()
                .and_then(|c| c.get("chat_template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
        });
    }
    if let Some(lic) = LICENSE_FILES
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
    {
        let text = b.put_blob(&session, &read(&lic)?, "text/plain")?;
        b.license(License {
            name: None,
            link: None,
            from: format!("file:{}", file_name(&lic)),
            text: Some(text),
        });
    }

    let tensor_bytes: u64 = m.tensors().map(|t| t.bytes.len() as u64).sum();
    progress.start("storing", tensor_bytes, m.len() as u64);
    // Each tensor's encoding as the description gave it (the one rule: BitNet's offline packed
    // `uint8` projections are `I8` bytes there).
    let encodings: std::collections::HashMap<&str, synapse_formats::GgmlType> = desc
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.encoding))
        .collect();
    for t in m.tensors() {
        let ty = encodings.get(t.name).copied().ok_or_else(|| {
            synapse_model::ModelError::UnsupportedEncoding {
                name: t.name.to_string(),
                encoding: t.dtype.as_str().to_string(),
                role: "any tensor".into(),
            }
        })?;
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        crate::ternary::add_tensor(
            &mut b,
            &session,
            &ternary,
            t.name,
            &encoding_id(ty),
            &dims,
            t.bytes,
        )?;
        progress.advance(t.bytes.len() as u64, 1);
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
        source_bytes: total,
        validate_s,
        hash_s,
        store_s,
    })
}
