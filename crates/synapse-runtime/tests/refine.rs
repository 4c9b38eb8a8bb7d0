//! Profiles refined by measurement (`synapse_runtime::refine`) on the tiny fixtures: the KL
//! probe is the perplexity protocol's KL bit for bit; a refined profile fits its budget,
//! measures no worse than the selector's profile and the uniform one that fits, reproduces its
//! measured KL when saved and run again, and every step it kept lowered the KL; bad inputs
//! (a budget below every profile, a profile of another model or naming foreign tensors, a file
//! of another format) are typed errors before anything is measured.

mod common;

use synapse_runtime::perplexity::{PerplexityParams, perplexity_against};
use synapse_runtime::precision::{Budget, Precision, SAVED_PROFILE_FORMAT, SavedProfile, apply};
use synapse_runtime::refine::{KlProbe, RefineParams, refine};
use synapse_runtime::{Executor, RuntimeError};

const CTX: usize = 32;

/// The tiny fixtures' sequences, three times over (two chunks need 64 tokens).
fn text(toks: &[u32]) -> Vec<u32> {
    toks.repeat(3)
}

fn params(chunks: usize) -> PerplexityParams {
    PerplexityParams {
        ctx: CTX,
        batch: 16,
        max_chunks: Some(chunks),
        bos: None,
    }
}

#[test]
fn the_probe_is_the_perplexity_protocols_kl_bit_for_bit() {
    let Some((m, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let toks = text(&toks);
    let chunks = toks.len() / CTX;
    assert!(chunks >= 2, "{} tokens", toks.len());
    let p = params(chunks);
    let probe = KlProbe::new(&m, &toks, &p, 2).unwrap();
    assert_eq!(probe.rows(), chunks * (CTX - 1 - CTX / 2));
    assert_eq!(probe.kl(&m).unwrap(), 0.0);
    for spec in [
        "uniform:syn.q4.symmetric.g64.v1",
        "uniform:syn.q3.symmetric.g64.v1",
    ] {
        let v = apply(&m, &Precision::parse_profile(spec).unwrap(), None)
            .unwrap()
            .model;
        let mut exec = Executor::new(v.clone(), 2).unwrap();
        let mut reference = Executor::new(m.clone(), 2).unwrap();
        let want = perplexity_against(&mut exec, Some(&mut reference), &toks, &p, |_, _| {})
            .unwrap()
            .kl
            .unwrap();
        let got = probe.kl(&v).unwrap();
        assert!(got > 0.0, "{spec}");
        assert_eq!(got.to_bits(), want.to_bits(), "{spec}: {got} vs {want}");
    }
    // Another model is refused.
    let (other, _) = common::tiny_q8_model("qwen2").unwrap();
    assert!(matches!(
        probe.kl(&other),
        Err(RuntimeError::InvalidParam { name: "model", .. })
    ));
}

#[test]
fn a_refined_profile_fits_beats_its_candidates_and_reproduces_when_saved() {
    let Some((m, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let map = common::tiny_importance_map(&m, &toks);
    let source = m.weight_bytes() as u64;
    let toks = text(&toks);
    let probe = KlProbe::new(&m, &toks, &params(toks.len() / CTX), 2).unwrap();
    let budget = Budget::Percent(50.0).bytes(source);
    let max_evals = 60;
    let mut seen = 0;
    let r = refine(
        &m,
        &map,
        budget,
        &probe,
        RefineParams { max_evals },
        None,
        |_, done, max| {
            assert_eq!(max, max_evals);
            seen = done;
        },
    )
    .unwrap();
    assert_eq!(seen, r.evaluations.len());
    assert!(r.evaluations.len() <= max_evals);
    assert!(
        r.resident_bytes <= budget,
        "{} > {budget}",
        r.resident_bytes
    );
    // The selector's profile is measured first; the result is no worse than it or any
    // uniform candidate.
    assert_eq!(r.evaluations[0].what, "select_best");
    assert_eq!(r.evaluations[0].kl, r.select_best_kl);
    assert!(r.kl <= r.select_best_kl);
    for e in &r.evaluations {
        if e.what.starts_with("select_best") || e.what.starts_with("uniform") {
            assert!(e.bytes <= budget, "{}", e.what);
            assert!(r.kl <= e.kl, "{}: {} < {}", e.what, e.kl, r.kl);
        }
    }
    assert!(
        r.evaluations.iter().any(|e| e.what.starts_with("uniform")),
        "a uniform encoding fits 50%"
    );
    assert!(
        r.evaluations.iter().any(|e| e.what.ends_with(" down")),
        "sensitivities were measured"
    );
    // Every kept step lowered the KL and fit; the last kept is the result.
    let kept: Vec<_> = r.evaluations.iter().filter(|e| e.kept).collect();
    assert!(!kept.is_empty());
    assert!(kept.windows(2).all(|w| w[1].kl < w[0].kl), "{kept:?}");
    assert!(kept.iter().all(|e| e.bytes <= budget));
    assert_eq!(kept.last().unwrap().kl, r.kl);

    // Saved and run again: the same bytes and, measured again, the same KL.
    let saved = SavedProfile {
        format: SAVED_PROFILE_FORMAT.into(),
        model_fingerprint: m.ir.fingerprint.clone(),
        profile: r.profile.clone(),
        resident_bytes: r.resident_bytes,
        made_by: "test".into(),
        measured_kl: Some(r.kl),
    };
    let json = serde_json::to_vec(&saved).unwrap();
    let back = SavedProfile::from_json(&json).unwrap();
    assert_eq!(back, saved);
    let a = apply(&m, &Precision::Saved(Box::new(back)), None).unwrap();
    assert_eq!(a.model.weight_bytes() as u64, r.resident_bytes);
    assert_eq!(a.fixed_bytes + r.profile.total_bytes, r.resident_bytes);
    for (name, asg) in &r.profile.assignments {
        assert_eq!(a.model.profile.encoding(name), Some(asg.encoding.as_str()));
    }
    assert_eq!(probe.kl(&a.model).unwrap().to_bits(), r.kl.to_bits());
}

#[test]
fn bad_budgets_and_foreign_profiles_are_typed_errors() {
    let Some((m, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let map = common::tiny_importance_map(&m, &toks);
    let probe = KlProbe::new(&m, &text(&toks), &params(2), 2).unwrap();
    let mut measured = 0;
    let e = refine(
        &m,
        &map,
        1000,
        &probe,
        RefineParams::default(),
        None,
        |_, _, _| measured += 1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::Selector(synapse_selector::SelectorError::BudgetTooSmall { .. })
        ),
        "{e}"
    );
    assert_eq!(measured, 0);
    assert!(matches!(
        refine(
            &m,
            &map,
            m.weight_bytes() as u64,
            &probe,
            RefineParams { max_evals: 0 },
            None,
            |_, _, _| {}
        ),
        Err(RuntimeError::InvalidParam { name: "evals", .. })
    ));
    // Too few tokens for two chunks.
    assert!(KlProbe::new(&m, &toks[..CTX], &params(2), 2).is_err());

    // A saved profile of another model, or naming a tensor this model lacks.
    let profile = apply(
        &m,
        &Precision::Budget {
            budget: Budget::Percent(60.0),
            map: Box::new(map.clone()),
        },
        None,
    )
    .unwrap()
    .profile
    .unwrap();
    let saved = |fp: &str, p: synapse_selector::Profile| {
        Precision::Saved(Box::new(SavedProfile {
            format: SAVED_PROFILE_FORMAT.into(),
            model_fingerprint: fp.into(),
            profile: p,
            resident_bytes: 0,
            made_by: "test".into(),
            measured_kl: None,
        }))
    };
    let e = apply(&m, &saved("not-this-model", profile.clone()), None).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::InvalidParam {
                name: "profile",
                ..
            }
        ),
        "{e}"
    );
    let mut foreign = profile.clone();
    let a = foreign.assignments.values().next().unwrap().clone();
    foreign.assignments.insert("blk.99.ffn_up.weight".into(), a);
    let e = apply(&m, &saved(&m.ir.fingerprint, foreign), None).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::InvalidParam {
                name: "profile",
                ..
            }
        ),
        "{e}"
    );
    // Another format, or not JSON.
    let mut j = serde_json::to_value(SavedProfile {
        format: SAVED_PROFILE_FORMAT.into(),
        model_fingerprint: m.ir.fingerprint.clone(),
        profile,
        resident_bytes: 0,
        made_by: "test".into(),
        measured_kl: None,
    })
    .unwrap();
    j["format"] = "synapse.saved-profile.v0".into();
    assert!(SavedProfile::from_json(&serde_json::to_vec(&j).unwrap()).is_err());
    assert!(SavedProfile::from_json(b"{\"assignments\": {}}").is_err());
    assert!(SavedProfile::from_json(b"\x00\x01").is_err());
}
