//! Fitting a layer range onto one device: choose encodings, reserve KV, predict time.
//!
//! Each tensor's supported options form a convex ladder (Pareto front of bytes vs distortion,
//! then its lower convex hull). The stage starts every tensor at its most precise option and
//! demotes, across all tensors of the range, the step with the least distortion added per
//! byte saved, until the weights fit in memory minus the KV reservation minus the largest
//! activation buffer. So the least important bytes go first and every tensor keeps the highest
//! encoding the budget allows.

use std::collections::BTreeMap;

use crate::types::{Device, EncodingCost, Layer, Stage};

/// One option on a ladder.
#[derive(Debug, Clone)]
pub(crate) struct Rung {
    pub encoding: String,
    pub bytes: u64,
    pub distortion: f64,
}

/// Convex ladder of the options of one tensor that `device` supports (and, with `floor`, that
/// stay within it). Empty if none.
pub(crate) fn ladder(options: &[EncodingCost], device: &Device, floor: Option<f64>) -> Vec<Rung> {
    let mut opts: Vec<Rung> = options
        .iter()
        .filter(|o| device.stream_rate.contains_key(&o.encoding))
        .filter(|o| floor.is_none_or(|f| o.distortion <= f))
        .map(|o| Rung {
            encoding: o.encoding.clone(),
            bytes: o.bytes,
            distortion: o.distortion,
        })
        .collect();
    opts.sort_by(|a, b| {
        a.distortion
            .total_cmp(&b.distortion)
            .then(a.bytes.cmp(&b.bytes))
            .then_with(|| a.encoding.cmp(&b.encoding))
    });
    let mut front: Vec<Rung> = Vec::new();
    for o in opts {
        if front.last().is_none_or(|l| o.bytes < l.bytes) {
            front.push(o);
        }
    }
    let slope = |a: &Rung, b: &Rung| (b.distortion - a.distortion) / (a.bytes - b.bytes) as f64;
    let mut hull: Vec<Rung> = Vec::new();
    for o in front {
        while hull.len() >= 2
            && slope(&hull[hull.len() - 2], &hull[hull.len() - 1])
                >= slope(&hull[hull.len() - 1], &o)
        {
            hull.pop();
        }
        hull.push(o);
    }
    hull
}

/// Per layer, per tensor: (name, ladder on this device); `None` for a layer holding a tensor
/// with no supported option (within the floor).
pub(crate) type LayerLadders = Option<Vec<(String, Vec<Rung>)>>;

/// Ladders of every layer on one device.
pub(crate) fn device_ladders(
    device: &Device,
    layers: &[Layer],
    floor: Option<f64>,
) -> Vec<LayerLadders> {
    layers
        .iter()
        .map(|l| {
            l.tensors
                .iter()
                .map(|t| {
                    let lad = ladder(&t.options, device, floor);
                    (!lad.is_empty()).then(|| (t.name.clone(), lad))
                })
                .collect()
        })
        .collect()
}

/// Fits layers `range` on `device`; `None` if they cannot fit (or a tensor has no supported
/// option within the floor).
pub(crate) fn fit_stage(
    device: &Device,
    ladders: &[LayerLadders],
    layers: &[Layer],
    range: std::ops::Range<usize>,
    context_length: u64,
) -> Option<Stage> {
    let slice = &layers[range.clone()];
    let kv = slice.iter().try_fold(0u64, |a, l| {
        a.checked_add(l.kv_bytes_per_token.checked_mul(context_length)?)
    })?;
    let act = slice.iter().map(|l| l.activation_bytes).max().unwrap_or(0);
    let available = device.memory_bytes.checked_sub(kv)?.checked_sub(act)?;

    let mut tensors: Vec<&(String, Vec<Rung>)> = Vec::new();
    for l in &ladders[range.clone()] {
        tensors.extend(l.as_ref()?);
    }
    let mut level = vec![0usize; tensors.len()];
    let mut total: u64 = tensors.iter().map(|t| t.1[0].bytes).sum();
    if total > available {
        let mut steps: Vec<(f64, usize, usize)> = Vec::new();
        for (t, (_, lad)) in tensors.iter().enumerate() {
            for l in 1..lad.len() {
                let r = (lad[l].distortion - lad[l - 1].distortion)
                    / (lad[l - 1].bytes - lad[l].bytes) as f64;
                steps.push((r, t, l));
            }
        }
        steps.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (_, t, l) in steps {
            let lad = &tensors[t].1;
            total -= lad[l - 1].bytes - lad[l].bytes;
            level[t] = l;
            if total <= available {
                break;
            }
        }
        if total > available {
            return None;
        }
    }
    let mut encodings = BTreeMap::new();
    let mut time = device.dispatch_overhead_s;
    for ((name, lad), &l) in tensors.iter().map(|t| (&t.0, &t.1)).zip(&level) {
        let r = &lad[l];
        // Rates are validated positive and finite by the request check.
        time += r.bytes as f64 / device.stream_rate[&r.encoding];
        encodings.insert(name.clone(), r.encoding.clone());
    }
    Some(Stage {
        device: device.name.clone(),
        layers: range,
        encodings,
        weight_bytes: total,
        kv_bytes: kv,
        time_s: time,
    })
}
