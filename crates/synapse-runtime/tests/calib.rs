//! Calibration capture (`CalibrationRecorder`) on the tiny fixtures: it does not change the
//! forward's results, covers every linear of the model once, keeps exactly the rows the
//! stages produced (all of them when the bound allows), respects its bound, and is a
//! deterministic function of the passes.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use synapse_runtime::calib::CalibrationRecorder;
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Stage, Tap};

fn model(family: &str) -> Option<(Arc<Model>, Vec<Vec<u32>>)> {
    let dir = common::workspace_root().join("fixtures/tiny").join(family);
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return None;
    }
    let seqs = common::tiny_sequences(&dir);
    Some((
        Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap()),
        seqs,
    ))
}

/// Runs every sequence in one pass each (all rows want logits); returns the logits.
fn run(model: &Arc<Model>, seqs: &[Vec<u32>], tap: Option<Box<dyn Tap>>) -> Vec<f32> {
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    exec.set_tap(tap);
    let mut out = Vec::new();
    for s in seqs {
        let mut kv = KvCache::new(model, KvDtype::F32, 1, 64, 64).unwrap();
        kv.open(0).unwrap();
        out.extend_from_slice(exec.forward(&mut kv, &common::all_logit_rows(s)).unwrap());
    }
    out
}

/// Every row of one stage of one layer, as the executor produced it.
#[derive(Clone, Default)]
struct Raw(
    Arc<std::sync::Mutex<Vec<f32>>>,
    Option<usize>,
    Option<Stage>,
);

impl Tap for Raw {
    fn tensor(&mut self, stage: Stage, layer: Option<usize>, _: usize, d: &[f32]) {
        if Some(stage) == self.2 && layer == self.1 {
            self.0.lock().unwrap().extend_from_slice(d);
        }
    }
}

#[test]
fn capture_changes_nothing_covers_every_linear_and_keeps_the_rows() {
    for family in ["gemma3", "llama", "qwen2"] {
        let Some((m, seqs)) = model(family) else {
            return;
        };
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        let plain = run(&m, &seqs, None);
        let rec = CalibrationRecorder::new(&m, 10_000, total as u64);
        let with = run(&m, &seqs, Some(Box::new(rec.clone())));
        assert!(
            plain
                .iter()
                .zip(&with)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{family}: the recorder changed the logits"
        );
        let sites = rec.sites();
        // Every linear once (q, k, v, o, gate, up, down per layer, and the LM head).
        let names: Vec<&String> = sites.iter().flat_map(|(_, s)| &s.weights).collect();
        let unique: BTreeSet<&String> = names.iter().copied().collect();
        assert_eq!(names.len(), unique.len(), "{family}: a linear in two sites");
        assert_eq!(names.len(), 7 * m.layers.len() + 1, "{family}: {names:?}");
        assert!(sites.last().unwrap().0.layer.is_none(), "LM head last");
        for (site, s) in &sites {
            assert_eq!(s.seen as usize, total, "{family} {site:?}: rows seen");
            assert_eq!(s.rows(), total, "{family} {site:?}: every row kept");
            // The imatrix sums: Σ x² of each column over every row (here, the kept rows).
            assert_eq!(s.sq.len(), s.cols);
            for (j, &v) in s.sq.iter().enumerate() {
                let want: f64 = s
                    .data
                    .chunks_exact(s.cols)
                    .map(|r| f64::from(r[j]) * f64::from(r[j]))
                    .sum();
                assert!(
                    (v - want).abs() <= 1e-12 * want.max(1.0),
                    "{family} {site:?} col {j}"
                );
            }
        }
        // The rows are the stage's own.
        let raw = Raw(Default::default(), Some(1), Some(Stage::FfnAct));
        run(&m, &seqs, Some(Box::new(raw.clone())));
        let (_, s) = sites
            .iter()
            .find(|(x, _)| x.layer == Some(1) && x.stage == Stage::FfnAct)
            .unwrap();
        let want = raw.0.lock().unwrap();
        assert_eq!(s.data.len(), want.len());
        assert!(
            s.data
                .iter()
                .zip(want.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}

#[test]
fn a_bounded_capture_is_deterministic_and_bounded() {
    let Some((m, seqs)) = model("llama") else {
        return;
    };
    let total: usize = seqs.iter().map(|s| s.len()).sum();
    let max = total / 4;
    let a = CalibrationRecorder::new(&m, max, total as u64);
    let b = CalibrationRecorder::new(&m, max, total as u64);
    run(&m, &seqs, Some(Box::new(a.clone())));
    run(&m, &seqs, Some(Box::new(b.clone())));
    let (sa, sb) = (a.sites(), b.sites());
    assert_eq!(sa, sb, "the same passes, the same sample");
    for (site, s) in &sa {
        assert!(
            s.rows() <= max,
            "{site:?}: {} rows over the bound {max}",
            s.rows()
        );
        // About a quarter sampled (hash-thresholded over the whole stream).
        assert!(s.rows() >= max / 3, "{site:?}: only {} rows", s.rows());
    }
    // The kept rows of a site are a subsequence of its rows in pass order, spread over the
    // stream (not its first rows).
    let raw = Raw(Default::default(), Some(0), Some(Stage::AttnNorm));
    run(&m, &seqs, Some(Box::new(raw.clone())));
    let all = raw.0.lock().unwrap();
    let (_, s) = sa
        .iter()
        .find(|(x, _)| x.layer == Some(0) && x.stage == Stage::AttnNorm)
        .unwrap();
    let c = s.cols;
    let mut at = 0;
    let mut last = 0;
    for row in s.data.chunks_exact(c) {
        while at < total && all[at * c..(at + 1) * c] != *row {
            at += 1;
        }
        assert!(at < total, "a kept row that the stage did not produce");
        last = at;
        at += 1;
    }
    assert!(last >= s.rows(), "the sample is the stream's first rows");
    assert_eq!(
        a.bytes(),
        sa.iter().map(|(_, s)| 4 * s.data.len()).sum::<usize>()
    );
}
