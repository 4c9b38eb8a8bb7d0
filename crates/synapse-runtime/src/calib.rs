//! Calibration capture inside real execution: the inputs of every linear layer, sampled from
//! the forward passes that run the calibration text.
//!
//! A [`CalibrationRecorder`] is a [`Tap`]: attached with [`crate::Executor::set_tap`], it
//! sees the stages that feed the model's linears — the attention norm (`q`, `k`, `v`), the
//! attention output (`o`), the FFN norm (`gate`, `up`), the gated activation (`down`) and the
//! final norm (the LM head, on the rows that want logits) — and keeps a deterministic sample of
//! their rows: every input row gets an index in the order the passes produce it, and a row is
//! kept when a keyed hash of (site, index) falls below the rate that yields about `max_rows`
//! rows per site over `expected_rows`; each site stops at `max_rows`. The forward's results do
//! not change (the tap only reads), and the sample is a function of the text, the model and the
//! two bounds alone (tested), so a map built from it is reproducible.
//!
//! The rows kept are the activation-aware distortion's `X` (`synapse_sensitivity::Calibration`
//! takes them as `samples × cols`); [`CalibrationRecorder::sites`] lists which weights each
//! site feeds, by the IR's tensor names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::load::Model;
use crate::tap::{Stage, Tap};

/// One capture site: the input of one or more linears of one layer (or of the LM head).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Site {
    /// Layer index (`None`: the LM head's input, the final norm).
    pub layer: Option<usize>,
    /// The stage whose output is the linears' input.
    pub stage: Stage,
}

/// The rows captured at one site.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteSamples {
    /// Tensor names of the linears this site feeds (the IR's weight names).
    pub weights: Vec<String>,
    /// Row width (the linears' input features).
    pub cols: usize,
    /// Kept rows, `rows × cols` row-major.
    pub data: Vec<f32>,
    /// Input rows this site saw (kept or not).
    pub seen: u64,
    /// `Σ x²` of each input column over every row seen (kept or not): with `seen`, llama.cpp's
    /// importance matrix (`imatrix`) of the linears this site feeds.
    pub sq: Vec<f64>,
}

impl SiteSamples {
    /// Rows kept.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.cols).unwrap_or(0)
    }
}

#[derive(Debug)]
struct Inner {
    max_rows: usize,
    /// Keep a row when its hash is below this (of 2^64).
    threshold: u64,
    sites: BTreeMap<Site, SiteSamples>,
}

/// Samples the inputs of every linear during forward passes (see the module docs). Clones
/// share one store: attach a clone to the executor, read the samples from the original.
#[derive(Debug, Clone)]
pub struct CalibrationRecorder {
    inner: Arc<Mutex<Inner>>,
}

/// The stages that are linear inputs and the linears each feeds, for `model`.
fn site_weights(model: &Model) -> BTreeMap<Site, (Vec<String>, usize)> {
    let ir = &model.ir;
    let name = |id| ir.weight(id).name.clone();
    let mut m = BTreeMap::new();
    for (il, l) in ir.layers.iter().enumerate() {
        let a = &l.attention;
        let site = |stage| Site {
            layer: Some(il),
            stage,
        };
        m.insert(
            site(Stage::AttnNorm),
            (
                vec![name(a.q.weight), name(a.k.weight), name(a.v.weight)],
                a.q.in_features as usize,
            ),
        );
        m.insert(
            site(Stage::KqvOut),
            (vec![name(a.o.weight)], a.o.in_features as usize),
        );
        match &l.ffn {
            synapse_model::FfnRegion::Dense(f) => {
                m.insert(
                    site(Stage::FfnNorm),
                    (
                        vec![name(f.gate.weight), name(f.up.weight)],
                        f.gate.in_features as usize,
                    ),
                );
                m.insert(
                    site(Stage::FfnAct),
                    (vec![name(f.down.weight)], f.down.in_features as usize),
                );
            }
            // A mixture's normed input feeds its router and shared expert; the routed
            // experts see subsets of the rows, which the stage taps do not separate (their
            // weights keep the source encoding).
            synapse_model::FfnRegion::Moe(moe) => {
                let mut w = vec![name(moe.router.weight)];
                if let Some(sh) = &moe.shared {
                    w.extend([name(sh.gate.weight), name(sh.up.weight)]);
                    w.extend(sh.gate_inp.as_ref().map(|g| name(g.weight)));
                }
                m.insert(site(Stage::FfnNorm), (w, moe.router.in_features as usize));
            }
        }
    }
    m.insert(
        Site {
            layer: None,
            stage: Stage::ResultNorm,
        },
        (
            vec![name(ir.lm_head.linear.weight)],
            ir.lm_head.linear.in_features as usize,
        ),
    );
    m
}

/// SplitMix64 finaliser: a keyed, well-mixed hash of a row's (site, index).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl CalibrationRecorder {
    /// A recorder for `model` keeping up to `max_rows` rows per site, sampling at the rate
    /// that keeps about that many out of `expected_rows` input rows (every row when
    /// `expected_rows <= max_rows`).
    pub fn new(model: &Model, max_rows: usize, expected_rows: u64) -> Self {
        let threshold = if expected_rows <= max_rows as u64 {
            u64::MAX
        } else {
            ((max_rows as f64 / expected_rows as f64) * u64::MAX as f64) as u64
        };
        let sites = site_weights(model)
            .into_iter()
            .map(|(s, (weights, cols))| {
                (
                    s,
                    SiteSamples {
                        weights,
                        cols,
                        data: Vec::new(),
                        seen: 0,
                        sq: vec![0.0; cols],
                    },
                )
            })
            .collect();
        CalibrationRecorder {
            inner: Arc::new(Mutex::new(Inner {
                max_rows,
                threshold,
                sites,
            })),
        }
    }

    /// The samples of every site so far (sites in layer order, the LM head's last).
    pub fn sites(&self) -> Vec<(Site, SiteSamples)> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = g
            .sites
            .iter()
            .map(|(s, x)| (s.clone(), x.clone()))
            .collect();
        // BTreeMap order puts `None` first; the LM head's input goes last.
        let head_first = v.first().is_some_and(|(s, _)| s.layer.is_none());
        v.rotate_left(usize::from(head_first));
        v
    }

    /// Bytes held by the kept rows.
    pub fn bytes(&self) -> usize {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.sites.values().map(|s| 4 * s.data.len()).sum()
    }
}

impl Tap for CalibrationRecorder {
    fn tensor(&mut self, stage: Stage, layer: Option<usize>, rows: usize, data: &[f32]) {
        if rows == 0 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (max_rows, threshold) = (g.max_rows, g.threshold);
        let Some(s) = g.sites.get_mut(&Site { layer, stage }) else {
            return;
        };
        let cols = data.len() / rows;
        if cols != s.cols {
            return;
        }
        let key = mix(((layer.map_or(u32::MAX as usize, |l| l) as u64) << 8) ^ stage as u64);
        for r in 0..rows {
            for (a, &x) in s.sq.iter_mut().zip(&data[r * cols..(r + 1) * cols]) {
                *a += f64::from(x) * f64::from(x);
            }
            let i = s.seen;
            s.seen += 1;
            if s.data.len() >= max_rows * cols {
                continue;
            }
            if mix(key ^ i) <= threshold {
                s.data.extend_from_slice(&data[r * cols..(r + 1) * cols]);
            }
        }
    }
}
