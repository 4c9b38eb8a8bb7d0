//! What precision a model runs at, as users ask for it: the source encodings, one Synapse
//! encoding for every linear (`uniform:ENCODING`), or a weight budget that the selector
//! (`synapse-selector`) meets from the model's importance map — the cheapest-distortion profile
//! whose resident weight bytes fit (`Selector::select_best`: an exact knapsack over the
//! ladders, or the greedy prefix with its slack filled back when that costs less). [`apply`]
//! turns the request into the model that runs ([`Model::with_encodings_cached`]: re-encoded
//! tensors quantized once and kept in a [`VariantCache`]), refusing a map measured on another model (typed error) before
//! anything is re-encoded.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use synapse_codecs::EncodingId;
use synapse_kernels::QuantMatrix;
use synapse_selector::{Constraints, Profile, Selector};
use synapse_sensitivity::ImportanceMap;

use crate::error::{Result, RuntimeError};
use crate::load::Model;
use crate::variant::{VariantCache, VariantStats};

/// A weight budget: resident weight bytes, absolute or as a share of the source model's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Bytes (`188743680`, `180MB`, `180MiB`, `1.5GB`).
    Bytes(u64),
    /// Percent of the source model's weight bytes (`75%`), in `(0, 100]`.
    Percent(f64),
}

impl Budget {
    /// The budget in bytes for a model whose source weights take `source_bytes`.
    pub fn bytes(&self, source_bytes: u64) -> u64 {
        match *self {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => (source_bytes as f64 * p / 100.0).floor() as u64,
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{b} bytes"),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

fn bad_budget(s: &str, why: &str) -> RuntimeError {
    RuntimeError::InvalidParam {
        name: "budget",
        reason: format!(
            "{s:?}: {why} (a byte count such as 188743680 or 180MB, or a percentage such as 75%)"
        ),
    }
}

impl FromStr for Budget {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| bad_budget(s, "not a number"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad_budget(s, "a percentage must be in (0, 100]"));
            }
            return Ok(Budget::Percent(v));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = (&t[..split], t[split..].trim());
        let scale: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" | "k" => 1_000,
            "mb" | "m" => 1_000_000,
            "gb" | "g" => 1_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            _ => return Err(bad_budget(s, "unknown unit")),
        };
        let v: f64 = num.parse().map_err(|_| bad_budget(s, "not a number"))?;
        let bytes = v * scale as f64;
        if !(1.0..1e18).contains(&bytes) {
            return Err(bad_budget(s, "out of range"));
        }
        if unit.is_empty() && num.contains('.') {
            return Err(bad_budget(s, "a plain byte count is a whole number"));
        }
        Ok(Budget::Bytes(bytes.floor() as u64))
    }
}

/// The precision a model is asked to run at.
#[derive(Debug, Clone)]
pub enum Precision {
    /// The source encodings.
    Source,
    /// One Synapse encoding for every linear and routed expert.
    Uniform(EncodingId),
    /// A profile saved to a file (`synapse-cli refine -o`), checked against the model.
    Saved(Box<SavedProfile>),
    /// The selector's profile for a budget, from the model's importance map.
    Budget {
        /// The budget.
        budget: Budget,
        /// The importance map (checked against the model).
        map: Box<ImportanceMap>,
    },
}

impl Precision {
    /// Parses `--profile`'s value: `source` or `uniform:ENCODING`.
    pub fn parse_profile(spec: &str) -> Result<Self> {
        if spec == "source" {
            return Ok(Precision::Source);
        }
        let Some(id) = spec.strip_prefix("uniform:") else {
            return Err(RuntimeError::InvalidParam {
                name: "profile",
                reason: format!(
                    "{spec:?}: expected `source` or uniform:ENCODING (e.g. uniform:syn.q4.symmetric.g64.v1)"
                ),
            });
        };
        let id = EncodingId::parse(id).map_err(|e| RuntimeError::InvalidParam {
            name: "profile",
            reason: format!("{id:?}: {e}"),
        })?;
        Ok(Precision::Uniform(id))
    }
}

/// The format tag of a [`SavedProfile`] this build writes and reads.
pub const SAVED_PROFILE_FORMAT: &str = "synapse.saved-profile.v1";

/// A precision profile kept in a file, for the model it was made for: what `synapse-cli
/// refine` writes and `--profile FILE` runs. Tensors it does not name stay at the source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedProfile {
    /// [`SAVED_PROFILE_FORMAT`].
    pub format: String,
    /// The IR fingerprint of the model the profile is for.
    pub model_fingerprint: String,
    /// The profile.
    pub profile: Profile,
    /// Resident weight bytes when it runs (the profile's and every weight outside it).
    pub resident_bytes: u64,
    /// How it was made (`refine`: the budget, the text, the measurements), for people.
    pub made_by: String,
    /// Its KL divergence from the source measured where it was made, when it was.
    pub measured_kl: Option<f64>,
}

impl SavedProfile {
    /// Parses a saved profile's JSON; another format or a malformed file is an error.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let bad = |why: String| RuntimeError::InvalidParam {
            name: "profile",
            reason: format!("not a saved precision profile: {why}"),
        };
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        match v.get("format").and_then(|f| f.as_str()) {
            Some(SAVED_PROFILE_FORMAT) => {}
            Some(f) => {
                return Err(bad(format!(
                    "format {f:?}, this build reads {SAVED_PROFILE_FORMAT:?}"
                )));
            }
            None => return Err(bad("no \"format\" field".into())),
        }
        serde_json::from_value(v).map_err(|e| bad(e.to_string()))
    }
}

/// What [`apply`] made.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The model to run (the source model itself at the source precision).
    pub model: Arc<Model>,
    /// The selector's profile (budget requests only).
    pub profile: Option<Profile>,
    /// Weight bytes outside the map's tensors (embeddings of untied heads …), counted in the
    /// budget but never demoted.
    pub fixed_bytes: u64,
    /// Tensors quantized vs taken from the variant cache.
    pub variants: VariantStats,
}

/// Every tensor a profile can assign — the linears and the routed experts' tensors — with its
/// source bytes (a stacked expert tensor: all its experts').
pub fn assignable(model: &Model) -> BTreeMap<String, u64> {
    let experts = crate::importance::expert_projections(model)
        .into_iter()
        .map(|(n, parts)| (n, parts.iter().map(|p| p.m.weight_bytes() as u64).sum()));
    crate::importance::linears(model)
        .into_iter()
        .map(|(n, m)| (n, m.weight_bytes() as u64))
        .chain(experts)
        .collect()
}

/// The tensors of `model` that `map` covers, with their source bytes; an error if the map was
/// measured on another model, or misses one of the model's linears. A map measured before its
/// routed experts were (one without any of them) leaves them at their source encoding, fixed
/// bytes of the budget; one that has some of them must have all.
pub(crate) fn mapped_bytes(model: &Model, map: &ImportanceMap) -> Result<u64> {
    map.check_applies_to(&model.ir.fingerprint)?;
    let experts: std::collections::BTreeSet<String> = crate::importance::expert_tensors(model)
        .into_iter()
        .collect();
    let with_experts = experts.iter().any(|n| map.tensors.contains_key(n));
    let mut total = 0u64;
    for (name, bytes) in assignable(model) {
        let expert = experts.contains(&name);
        let t = match map.tensors.get(&name) {
            Some(t) => t,
            None if expert && !with_experts => continue,
            None => {
                return Err(RuntimeError::InvalidParam {
                    name: "importance map",
                    reason: format!(
                        "has no entry for the model's {} {name:?}",
                        if expert { "expert tensor" } else { "linear" }
                    ),
                });
            }
        };
        if t.source_bytes != bytes {
            return Err(RuntimeError::InvalidParam {
                name: "importance map",
                reason: format!(
                    "{name:?}: {} source bytes in the map, {bytes} in the model",
                    t.source_bytes,
                ),
            });
        }
        total += t.source_bytes;
    }
    Ok(total)
}

/// A whole-model budget of `want` bytes split for `sel` (the selector of `map`): the bytes of
/// the weights `map` does not cover (fixed), and what is left for the mapped linears — at
/// least `sel`'s smallest profile, so selecting within it cannot fail for want of bytes; a
/// budget below that is [`SelectorError::BudgetTooSmall`] with the whole-model minimum.
///
/// [`SelectorError::BudgetTooSmall`]: synapse_selector::SelectorError::BudgetTooSmall
pub(crate) fn linear_budget(
    model: &Model,
    map: &ImportanceMap,
    sel: &Selector,
    want: u64,
) -> Result<(u64, u64)> {
    let all = model.weight_bytes() as u64;
    let mapped = mapped_bytes(model, map)?;
    let fixed = all - mapped.min(all);
    let minimum = sel.minimum_bytes();
    match want.checked_sub(fixed) {
        Some(linear) if linear >= minimum => Ok((fixed, linear)),
        _ => Err(synapse_selector::SelectorError::BudgetTooSmall {
            budget: want,
            minimum: fixed + minimum,
        }
        .into()),
    }
}

/// `model` running `profile`: every assignment that is not the tensor's source encoding
/// (`source_encoding`) re-encoded through `cache`; the model itself when there is none.
pub(crate) fn model_for_profile<'a>(
    model: &Arc<Model>,
    profile: &Profile,
    source_encoding: impl Fn(&str) -> Option<&'a String>,
    cache: Option<&VariantCache>,
) -> Result<(Arc<Model>, VariantStats)> {
    let mut changes = BTreeMap::new();
    for (name, a) in &profile.assignments {
        if source_encoding(name) == Some(&a.encoding) {
            continue;
        }
        let id = EncodingId::parse(&a.encoding).map_err(|e| RuntimeError::InvalidParam {
            name: "importance map",
            reason: format!("{name:?}: {e}"),
        })?;
        changes.insert(name.clone(), id);
    }
    if changes.is_empty() {
        return Ok((model.clone(), VariantStats::default()));
    }
    let (m, v) = model.with_encodings_cached(&changes, cache)?;
    Ok((Arc::new(m), v))
}

/// A uniform profile's changes: every linear and every routed expert tensor that `id` can
/// hold (ggml's block types need rows of whole 32-element blocks; the others stay at the
/// source, as llama-quantize leaves them unquantized). An error when none can.
pub(crate) fn uniform_changes(
    model: &Model,
    id: EncodingId,
) -> Result<BTreeMap<String, EncodingId>> {
    let tensors = crate::importance::linears(model)
        .into_iter()
        .map(|(n, m)| (n, vec![m]))
        .chain(
            crate::importance::expert_projections(model)
                .into_iter()
                .map(|(n, parts)| (n, parts.into_iter().map(|p| p.m).collect())),
        );
    uniform_over(id, tensors)
}

/// [`uniform_changes`] over named tensors, each one or more matrices (a stacked expert
/// tensor's experts): those whose every matrix `id` can hold.
fn uniform_over(
    id: EncodingId,
    tensors: impl Iterator<Item = (String, Vec<Arc<QuantMatrix>>)>,
) -> Result<BTreeMap<String, EncodingId>> {
    let codec = synapse_codecs::codec_for(id);
    let fits = |m: &QuantMatrix| codec.matrix_size(m.rows(), m.cols()).is_ok();
    let changes: BTreeMap<String, EncodingId> = tensors
        .filter(|(_, ms)| ms.iter().all(|m| fits(m)))
        .map(|(n, _)| (n, id))
        .collect();
    if changes.is_empty() {
        return Err(RuntimeError::InvalidParam {
            name: "profile",
            reason: format!("no tensor of this model can be held in {id}"),
        });
    }
    Ok(changes)
}

/// The model `p` asks for (see the module docs); re-encoded tensors come from `cache` when it
/// holds them and are stored there otherwise.
pub fn apply(model: &Arc<Model>, p: &Precision, cache: Option<&VariantCache>) -> Result<Applied> {
    let all = model.weight_bytes() as u64;
    match p {
        Precision::Source => Ok(Applied {
            model: model.clone(),
            profile: None,
            fixed_bytes: all,
            variants: VariantStats::default(),
        }),
        Precision::Uniform(id) => {
            let changes = uniform_changes(model, *id)?;
            let (m, variants) = model.with_encodings_cached(&changes, cache)?;
            Ok(Applied {
                model: Arc::new(m),
                profile: None,
                fixed_bytes: 0,
                variants,
            })
        }
        Precision::Saved(saved) => {
            if saved.model_fingerprint != model.ir.fingerprint {
                return Err(RuntimeError::InvalidParam {
                    name: "profile",
                    reason: format!(
                        "the saved profile was made for the model with fingerprint {}, not \
                         this one ({})",
                        saved.model_fingerprint, model.ir.fingerprint
                    ),
                });
            }
            let lin = assignable(model);
            let mut mapped = 0u64;
            for name in saved.profile.assignments.keys() {
                mapped += lin.get(name).ok_or_else(|| RuntimeError::InvalidParam {
                    name: "profile",
                    reason: format!(
                        "the saved profile names {name:?}, not a linear or expert tensor of this \
                         model"
                    ),
                })?;
            }
            let (run, variants) = model_for_profile(
                model,
                &saved.profile,
                |n| model.profile.encodings.get(n),
                cache,
            )?;
            Ok(Applied {
                model: run,
                profile: Some(saved.profile.clone()),
                fixed_bytes: all - mapped.min(all),
                variants,
            })
        }
        Precision::Budget { budget, map } => {
            // Every option the map holds is a codec this build runs (checked with the
            // fingerprint in `mapped_bytes`), and the source encodings are the model's own: no
            // constraint beyond the map.
            let sel = Selector::new(map, &Constraints::default())?;
            let (fixed, linear_budget) = linear_budget(model, map, &sel, budget.bytes(all))?;
            let profile = sel.select_best(linear_budget)?;
            let (run, variants) = model_for_profile(
                model,
                &profile,
                |n| Some(&map.tensors[n].source_encoding),
                cache,
            )?;
            Ok(Applied {
                model: run,
                profile: Some(profile),
                fixed_bytes: fixed,
                variants,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use synapse_formats::GgmlType;

    fn f32_matrix(rows: usize, cols: usize) -> Arc<QuantMatrix> {
        let w: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
            .collect();
        Arc::new(QuantMatrix::from_ggml(GgmlType::F32, &w, rows, cols).unwrap())
    }

    /// A uniform profile takes every tensor its encoding can hold: ggml's block types skip a
    /// tensor whose rows are not whole 32-element blocks (any part of it), Synapse's grouped
    /// codecs take every one; none that fits is an error.
    #[test]
    fn a_uniform_profile_leaves_the_tensors_its_encoding_cannot_hold() {
        let tensors = || {
            vec![
                ("a".to_string(), vec![f32_matrix(4, 48)]),
                ("b".to_string(), vec![f32_matrix(4, 64)]),
                ("c".to_string(), vec![f32_matrix(4, 64), f32_matrix(4, 64)]),
                ("d".to_string(), vec![f32_matrix(4, 64), f32_matrix(4, 48)]),
            ]
            .into_iter()
        };
        let q4_0 = EncodingId::parse("ggml.q4_0.v1").unwrap();
        let got: Vec<String> = uniform_over(q4_0, tensors()).unwrap().into_keys().collect();
        assert_eq!(got, ["b", "c"]);
        let syn = EncodingId::Symmetric { bits: 4, group: 64 };
        assert_eq!(uniform_over(syn, tensors()).unwrap().len(), 4);
        let odd = vec![("a".to_string(), vec![f32_matrix(4, 48)])].into_iter();
        assert!(uniform_over(q4_0, odd).is_err());
    }
}
