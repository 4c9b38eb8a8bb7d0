//! A model with some tensors in other encodings: each chosen linear decoded from its current
//! encoding and re-encoded with a Synapse codec (`QuantMatrix::from_codec`), the precision
//! profile updated — so the profile hash, and with it the KV identity, changes: a cache made
//! for the source precision is refused by an executor of the variant. The untouched weights
//! are shared with the source model (`Arc`).
//!
//! This is what an ablation (one tensor group demoted at a time) and a budgeted profile run on;
//! the codecs' own `linear` is the kernel path until their SIMD kernels exist.

use std::collections::BTreeMap;
use std::sync::Arc;

use synapse_codecs::{EncodingId, codec_for};
use synapse_kernels::QuantMatrix;

use crate::error::{Result, RuntimeError};
use crate::load::Model;

/// `m` re-encoded as `id`.
fn reencode(m: &QuantMatrix, id: EncodingId) -> Result<QuantMatrix> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut w = vec![0f32; rows * cols];
    for (r, out) in w.chunks_exact_mut(cols).enumerate() {
        m.dequantize_row(r, out)?;
    }
    let bytes = codec_for(id)
        .encode_matrix(&w, rows, cols)
        .map_err(synapse_kernels::KernelError::from)?;
    Ok(QuantMatrix::from_codec(
        &id.to_string(),
        &bytes,
        rows,
        cols,
    )?)
}

impl Model {
    /// This model with the linears named in `changes` (IR weight names) re-encoded (see the
    /// module docs). A name that is not a linear of the model is an error; so is an empty
    /// change set (it would be the source model under another name).
    pub fn with_encodings(&self, changes: &BTreeMap<String, EncodingId>) -> Result<Model> {
        if changes.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "encodings",
                reason: "no tensor to re-encode".into(),
            });
        }
        let ir = &self.ir;
        let name = |id| ir.weight(id).name.clone();
        let mut layers = self.layers.clone();
        let mut head = self.head.clone();
        let mut embd = self.embd.clone();
        let mut profile = self.profile.clone();
        let mut done = 0;
        for (l, r) in layers.iter_mut().zip(&ir.layers) {
            for (wid, lin) in crate::load::layer_weight_ids(r)
                .into_iter()
                .zip(l.linears_mut())
            {
                let n = name(wid);
                if let Some(&id) = changes.get(&n) {
                    lin.m = Arc::new(reencode(&lin.m, id)?);
                    profile.encodings.insert(n, id.to_string());
                    done += 1;
                }
            }
        }
        let hn = name(ir.lm_head.linear.weight);
        if let Some(&id) = changes.get(&hn) {
            let tied = Arc::ptr_eq(&self.embd, &self.head.m);
            head.m = Arc::new(reencode(&head.m, id)?);
            if tied {
                // One table serves both: the lookup reads the re-encoded rows too.
                embd = head.m.clone();
            }
            profile.encodings.insert(hn, id.to_string());
            done += 1;
        }
        if done != changes.len() {
            let known: Vec<String> = crate::importance::linears(self)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            let unknown: Vec<&String> = changes.keys().filter(|k| !known.contains(k)).collect();
            return Err(RuntimeError::InvalidParam {
                name: "encodings",
                reason: format!("not linears of this model: {unknown:?}"),
            });
        }
        Ok(Model {
            ir: self.ir.clone(),
            profile,
            embd,
            embd_scale: self.embd_scale,
            layers,
            final_norm: self.final_norm.clone(),
            head,
            softcap: self.softcap,
            gelu_f16_table: self.gelu_f16_table,
        })
    }
}
