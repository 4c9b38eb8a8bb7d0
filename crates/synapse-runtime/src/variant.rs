//! A model with some tensors in other encodings: each chosen linear decoded from its current
//! encoding and re-encoded with a Synapse codec (`QuantMatrix::from_codec`), the precision
//! profile updated — so the profile hash, and with it the KV identity, changes: a cache made
//! for the source precision is refused by an executor of the variant. The untouched weights
//! are shared with the source model (`Arc`).
//!
//! This is what an ablation (one tensor group demoted at a time) and a budgeted profile run on.
//!
//! Re-encoding is deterministic (decode, then the codec's encoder), so its result is cached:
//! with a [`VariantCache`] each variant is stored once in a CAS object store under (blake3 of
//! the tensor's bytes in its current encoding, target encoding id, codec version) — the
//! store's variant index — and later starts memory-map the stored object instead of
//! quantizing (`VariantStats` counts both). A cached object is verified by its hash and by
//! the codec's own validation before use; a corrupt or unusable one is recomputed and
//! replaced, never used. The source key is the tensor's bytes alone, the same id an imported
//! package stores the tensor under, so `cas gc` keeps a package's variants while the package
//! lives (variants of a tensor no package holds — a model run straight from a GGUF — are
//! collected by the next gc and recomputed when needed).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use synapse_cas::{Index, IndexKey, ObjectId, Store};
use synapse_codecs::{EncodingId, codec_for};
use synapse_kernels::{QuantMatrix, WeightSource};

use crate::error::{Result, RuntimeError};
use crate::load::Model;

/// Where re-encoded tensors are kept across runs: a CAS object store and its variant index.
#[derive(Debug, Clone)]
pub struct VariantCache {
    store: Store,
}

/// What building a variant model did, tensor by tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct VariantStats {
    /// Tensors quantized here (no cache, a cache miss, or a cached object that was unusable).
    pub encoded: usize,
    /// Tensors memory-mapped from the cache (nothing quantized).
    pub reused: usize,
    /// Of `encoded`: cached objects found corrupt, missing or invalid and replaced.
    pub replaced: usize,
}

impl VariantCache {
    /// The cache in the object store at `dir` (created if absent).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(VariantCache {
            store: Store::open(dir)?,
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The key of `m` re-encoded as `id`.
    pub fn key(m: &QuantMatrix, id: EncodingId) -> IndexKey {
        IndexKey {
            source: ObjectId::of(m.raw_bytes()),
            encoding: id.to_string(),
            codec_version: synapse_codecs::id::VERSION,
        }
    }

    /// `m` as `id`: the cached object when there is a usable one (its hash and the codec's
    /// validation at this shape pass), else encoded and stored.
    fn get_or_encode(
        &self,
        m: &QuantMatrix,
        id: EncodingId,
        stats: &mut VariantStats,
    ) -> Result<QuantMatrix> {
        let key = Self::key(m, id);
        let (rows, cols) = (m.rows(), m.cols());
        let session = self.store.session()?;
        let (q, lookup) = session.cached_variant_with(
            &Index::open(&self.store),
            &key,
            |o| {
                let src: Arc<dyn WeightSource> = Arc::new(Mapped(o));
                QuantMatrix::from_codec_shared(&key.encoding, src, rows, cols)
                    .map_err(|e| tracing::warn!(encoding = %key.encoding, error = %e, "cached variant invalid"))
                    .ok()
            },
            || encode(m, id),
        )?;
        if lookup.produced {
            stats.encoded += 1;
            stats.replaced += usize::from(lookup.replaced);
        } else {
            stats.reused += 1;
        }
        Ok(q)
    }
}

/// A cached variant's memory map as a matrix's bytes.
struct Mapped(synapse_cas::Object);

impl WeightSource for Mapped {
    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn mapping(&self) -> Option<&[u8]> {
        Some(&self.0)
    }

    fn read_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        Some(self.0.read_at(at as u64, dst))
    }
}

/// The bytes of `m` re-encoded as `id`.
fn encode(m: &QuantMatrix, id: EncodingId) -> Result<Vec<u8>> {
    let (rows, cols) = (m.rows(), m.cols());
    let w = crate::importance::dequantize(m)?;
    Ok(codec_for(id)
        .encode_matrix(&w, rows, cols)
        .map_err(synapse_kernels::KernelError::from)?)
}

/// `m` re-encoded as `id`, through `cache` when there is one.
fn reencode(
    m: &QuantMatrix,
    id: EncodingId,
    cache: Option<&VariantCache>,
    stats: &mut VariantStats,
) -> Result<QuantMatrix> {
    let q = match cache {
        Some(c) => c.get_or_encode(m, id, stats)?,
        None => {
            let bytes = encode(m, id)?;
            stats.encoded += 1;
            QuantMatrix::from_codec(&id.to_string(), &bytes, m.rows(), m.cols())?
        }
    };
    // The source was read whole (hashed for the cache key, or decoded), and a cached variant
    // too (validated): their mapped pages would stay in the resident size, the source's
    // though the variant runs instead, the variant's before its first use — what a memory
    // budget measures after loading. A variant's pages map again as it runs (or its pager
    // reads it).
    crate::residency::release_mapped(m);
    crate::residency::release_mapped(&q);
    Ok(q)
}

impl Model {
    /// This model with the linears named in `changes` (IR weight names) re-encoded (see the
    /// module docs); the name of a stacked routed-expert tensor re-encodes every expert's
    /// slice of it. A name that is not a linear or expert tensor of the model is an error; so
    /// is an empty change set (it would be the source model under another name).
    pub fn with_encodings(&self, changes: &BTreeMap<String, EncodingId>) -> Result<Model> {
        Ok(self.with_encodings_cached(changes, None)?.0)
    }

    /// [`Model::with_encodings`] through a variant cache: tensors whose variant is cached are
    /// memory-mapped from it, the others quantized and stored.
    pub fn with_encodings_cached(
        &self,
        changes: &BTreeMap<String, EncodingId>,
        cache: Option<&VariantCache>,
    ) -> Result<(Model, VariantStats)> {
        let mut stats = VariantStats::default();
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
        let mut done = std::collections::BTreeSet::new();
        for (l, r) in layers.iter_mut().zip(&ir.layers) {
            for (wid, lin) in crate::load::layer_weight_ids(r)
                .into_iter()
                .zip(l.linears_mut())
            {
                let n = name(wid);
                if let Some(&id) = changes.get(&n) {
                    lin.m = Arc::new(reencode(&lin.m, id, cache, &mut stats)?);
                    profile.encodings.insert(n.clone(), id.to_string());
                    done.insert(n);
                }
            }
            // Routed experts: a stacked tensor's change re-encodes every expert's slice of it
            // (each its own matrix, cached by its own bytes).
            if let (crate::load::FfnW::Moe(mw), synapse_model::FfnRegion::Moe(mr)) =
                (&mut l.ffn, &r.ffn)
            {
                for (ew, er) in mw.experts.iter_mut().zip(&mr.experts) {
                    for (m, el) in [
                        (&mut ew.gate, &er.gate),
                        (&mut ew.up, &er.up),
                        (&mut ew.down, &er.down),
                    ] {
                        let n = name(el.weight);
                        if let Some(&id) = changes.get(&n) {
                            *m = Arc::new(reencode(m, id, cache, &mut stats)?);
                            profile.encodings.insert(n.clone(), id.to_string());
                            done.insert(n);
                        }
                    }
                }
            }
        }
        let hn = name(ir.lm_head.linear.weight);
        if let Some(&id) = changes.get(&hn) {
            let tied = Arc::ptr_eq(&self.embd, &self.head.m);
            head.m = Arc::new(reencode(&head.m, id, cache, &mut stats)?);
            if tied {
                // One table serves both: the lookup reads the re-encoded rows too.
                embd = head.m.clone();
            }
            profile.encodings.insert(hn.clone(), id.to_string());
            done.insert(hn);
        }
        if done.len() != changes.len() {
            let known: Vec<String> = crate::importance::linears(self)
                .into_iter()
                .map(|(n, _)| n)
                .chain(crate::importance::expert_tensors(self))
                .collect();
            let unknown: Vec<&String> = changes.keys().filter(|k| !known.contains(k)).collect();
            return Err(RuntimeError::InvalidParam {
                name: "encodings",
                reason: format!("not linears of this model: {unknown:?}"),
            });
        }
        let model = Model {
            ir: self.ir.clone(),
            profile,
            embd,
            embd_scale: self.embd_scale,
            layers,
            final_norm: self.final_norm.clone(),
            head,
            softcap: self.softcap,
            gelu_f16_table: self.gelu_f16_table,
            residual_scale: self.residual_scale,
            logit_scale: self.logit_scale,
            present: self.present.clone(),
            resident: self.resident,
        };
        Ok((model, stats))
    }
}
