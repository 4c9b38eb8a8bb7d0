//! Calibration capture inside real execution: the inputs of every linear layer, sampled from
//! the forward passes that run the calibration text.
//!
//! A [`CalibrationRecorder`] is a [`Tap`]: attached with [`crate::Executor::set_tap`], it
//! sees the stages that feed the model's linears — the attention norm (`q`, `k`, `v`), the
//! attention output (`o`), the FFN norm (`gate`, `up`), the gated activation (`down`) and the
//! final norm (the LM head, on the rows that want logits), and of a mixture of experts each
//! routed expert's own input rows and gated activation — and keeps a deterministic sample of
//! their rows: every input row gets an index in the order the passes produce it, and a row is
//! kept when a keyed hash of (site, index) falls below the rate that yields about `max_rows`
//! rows per site over `expected_rows` (a routed expert's sites: their share of both); each site
//! stops at its bound. The forward's results do
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
    /// A routed expert's own site (its index in the layer's mixture): at [`Stage::FfnNorm`]
    /// the rows routed to it (its gate and up input), at [`Stage::FfnAct`] its gated
    /// activation (its down input).
    pub expert: Option<u32>,
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
    /// Rows this site keeps at most.
    pub max_rows: usize,
    /// A row is kept when its hash is below this (of 2^64).
    threshold: u64,
}

impl SiteSamples {
    /// Rows kept.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.cols).unwrap_or(0)
    }
}

#[derive(Debug)]
struct Inner {
    sites: BTreeMap<Site, SiteSamples>,
}

/// Samples the inputs of every linear during forward passes (see the module docs). Clones
/// share one store: attach a clone to the executor, read the samples from the original.
#[derive(Debug, Clone)]
pub struct CalibrationRecorder {
    inner: Arc<Mutex<Inner>>,
}

/// The stages that are linear inputs and the linears each feeds, for `model`.
/// With each site its linears, their input width and the share of the pass's rows it sees
/// (1 for a layer's own sites; `n_used / n_expert` for a routed expert's, on average).
fn site_weights(model: &Model) -> BTreeMap<Site, (Vec<String>, usize, f64)> {
    let ir = &model.ir;
    let name = |id| ir.weight(id).name.clone();
    let mut m = BTreeMap::new();
    for (il, l) in ir.layers.iter().enumerate() {
        let a = &l.attention;
        let site = |stage| Site {
            layer: Some(il),
            stage,
            expert: None,
        };
        m.insert(
            site(Stage::AttnNorm),
            (
                vec![name(a.q.weight), name(a.k.weight), name(a.v.weight)],
                a.q.in_features as usize,
                1.0,
            ),
        );
        m.insert(
            site(Stage::KqvOut),
            (vec![name(a.o.weight)], a.o.in_features as usize, 1.0),
        );
        match &l.ffn {
            synapse_model::FfnRegion::Dense(f) => {
                m.insert(
                    site(Stage::FfnNorm),
                    (
                        vec![name(f.gate.weight), name(f.up.weight)],
                        f.gate.in_features as usize,
                        1.0,
                    ),
                );
                m.insert(
                    site(Stage::FfnAct),
                    (vec![name(f.down.weight)], f.down.in_features as usize, 1.0),
                );
            }
            // A mixture's normed input feeds its router and shared expert; each routed
            // expert sees the rows routed to it, at sites of its own (the executor hands them
            // to `Tap::expert_tensor`).
            synapse_model::FfnRegion::Moe(moe) => {
                let mut w = vec![name(moe.router.weight)];
                if let Some(sh) = &moe.shared {
                    w.extend([name(sh.gate.weight), name(sh.up.weight)]);
                    w.extend(sh.gate_inp.as_ref().map(|g| name(g.weight)));
                }
                m.insert(
                    site(Stage::FfnNorm),
                    (w, moe.router.in_features as usize, 1.0),
                );
                if let Some(sh) = &moe.shared {
                    m.insert(
                        site(Stage::FfnAct),
                        (
                            vec![name(sh.down.weight)],
                            sh.down.in_features as usize,
                            1.0,
                        ),
                    );
                }
                let share = f64::from(moe.n_used) / moe.experts.len().max(1) as f64;
                for (e, x) in moe.experts.iter().enumerate() {
                    let at = |stage| Site {
                        layer: Some(il),
                        stage,
                        expert: Some(e as u32),
                    };
                    let (g, u) = (name(x.gate.weight), name(x.up.weight));
                    let mut w = vec![g.clone()];
                    if u != g {
                        w.push(u);
                    }
                    m.insert(at(Stage::FfnNorm), (w, x.gate.in_features as usize, share));
                    m.insert(
                        at(Stage::FfnAct),
                        (
                            vec![name(x.down.weight)],
                            x.down.in_features as usize,
                            share,
                        ),
                    );
                }
            }
        }
    }
    m.insert(
        Site {
            layer: None,
            stage: Stage::ResultNorm,
            expert: None,
        },
        (
            vec![name(ir.lm_head.linear.weight)],
            ir.lm_head.linear.in_features as usize,
            1.0,
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
    /// `expected_rows <= max_rows`). A routed expert's sites, which see about `n_used /
    /// n_expert` of the rows, keep that share of `max_rows` (at least 32, at most `max_rows`),
    /// sampled at the rate that keeps it out of their expected share of the rows: the experts
    /// of a layer together keep about `n_used · max_rows` rows.
    pub fn new(model: &Model, max_rows: usize, expected_rows: u64) -> Self {
        let sites = site_weights(model)
            .into_iter()
            .map(|(s, (weights, cols, share))| {
                let max_rows = if share < 1.0 {
                    ((max_rows as f64 * share).ceil() as usize).clamp(max_rows.min(32), max_rows)
                } else {
                    max_rows
                };
                let expected = expected_rows as f64 * share;
                let threshold = if expected <= max_rows as f64 {
                    u64::MAX
                } else {
                    ((max_rows as f64 / expected) * u64::MAX as f64) as u64
                };
                (
                    s,
                    SiteSamples {
                        weights,
                        cols,
                        data: Vec::new(),
                        seen: 0,
                        sq: vec![0.0; cols],
                        max_rows,
                        threshold,
                    },
                )
            })
            .collect();
        CalibrationRecorder {
            inner: Arc::new(Mutex::new(Inner { sites })),
        }
    }

    /// Records `rows` rows of `data` at `site`.
    fn record(&self, site: &Site, rows: usize, data: &[f32]) {
        if rows == 0 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = g.sites.get_mut(site) else {
            return;
        };
        let cols = data.len() / rows;
        if cols != s.cols {
            return;
        }
        let layer = site.layer.map_or(u32::MAX as u64, |l| l as u64);
        let expert = site.expert.map_or(0, |e| u64::from(e) + 1);
        let key = mix((layer << 8) ^ site.stage as u64 ^ (expert << 40));
        for r in 0..rows {
            let x = &data[r * cols..(r + 1) * cols];
            for (a, &v) in s.sq.iter_mut().zip(x) {
                *a += f64::from(v) * f64::from(v);
            }
            let i = s.seen;
            s.seen += 1;
            if s.data.len() >= s.max_rows * cols {
                continue;
            }
            if mix(key ^ i) <= s.threshold {
                s.data.extend_from_slice(x);
            }
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
        let site = Site {
            layer,
            stage,
            expert: None,
        };
        self.record(&site, rows, data);
    }

    fn expert_tensor(
        &mut self,
        stage: Stage,
        layer: usize,
        expert: usize,
        rows: usize,
        data: &[f32],
    ) {
        let site = Site {
            layer: Some(layer),
            stage,
            expert: Some(expert as u32),
        };
        self.record(&site, rows, data);
    }
}
