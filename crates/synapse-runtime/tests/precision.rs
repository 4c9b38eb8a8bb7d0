//! Budgeted precision end to end on the tiny fixtures: the importance map → the selector's
//! profile for a budget → the model that runs. The resident weight bytes fit the budget, a
//! larger budget never adds distortion, the whole source budget is the source model itself,
//! and a map of another model or a budget below every profile is a typed error before
//! anything runs.

mod common;

use std::sync::Arc;

use synapse_runtime::RuntimeError;
use synapse_runtime::precision::{Budget, Precision, apply};

#[test]
fn a_budget_is_met_by_the_selected_profile() {
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((m, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let map = common::tiny_importance_map(&m, &toks);
        let source = m.weight_bytes() as u64;
        let mut last: Option<(u64, f64)> = None;
        for pct in [100.0, 90.0, 75.0, 60.0, 45.0] {
            let p = Precision::Budget {
                budget: Budget::Percent(pct),
                map: Box::new(map.clone()),
            };
            let a = apply(&m, &p, None).unwrap();
            let prof = a.profile.as_ref().unwrap();
            let want = Budget::Percent(pct).bytes(source);
            let resident = a.model.weight_bytes() as u64;
            assert!(resident <= want, "{family} {pct}%: {resident} > {want}");
            // What the selector counted is what the model holds.
            assert_eq!(
                resident,
                a.fixed_bytes + prof.total_bytes,
                "{family} {pct}%"
            );
            if pct == 100.0 {
                assert!(Arc::ptr_eq(&a.model, &m), "{family}: the source itself");
                assert_eq!(prof.total_distortion, 0.0);
            } else {
                assert!(!Arc::ptr_eq(&a.model, &m));
                assert_ne!(a.model.profile.hash(), m.profile.hash(), "{family} {pct}%");
            }
            // Every tensor runs in the encoding the profile names.
            for (name, asg) in &prof.assignments {
                assert_eq!(
                    a.model.profile.encoding(name),
                    Some(asg.encoding.as_str()),
                    "{family} {name}"
                );
            }
            if let Some((b, d)) = last {
                assert!(
                    prof.total_bytes <= b && prof.total_distortion >= d,
                    "{family} {pct}%"
                );
            }
            last = Some((prof.total_bytes, prof.total_distortion));
            // And it runs: finite logits.
            let logits = common::alone_logits(&a.model, &toks[..8]);
            assert!(logits.iter().all(|v| v.is_finite()), "{family} {pct}%");
        }
    }
}

#[test]
fn a_map_of_another_model_or_an_impossible_budget_is_refused() {
    let (Some((llama, lt)), Some((qwen, _))) = (
        common::tiny_q8_model("llama"),
        common::tiny_q8_model("qwen2"),
    ) else {
        return;
    };
    let map = common::tiny_importance_map(&llama, &lt);
    let other = apply(
        &qwen,
        &Precision::Budget {
            budget: Budget::Percent(50.0),
            map: Box::new(map.clone()),
        },
        None,
    );
    assert!(
        matches!(other, Err(RuntimeError::Sensitivity(_))),
        "{other:?}"
    );
    let tiny = apply(
        &llama,
        &Precision::Budget {
            budget: Budget::Bytes(1000),
            map: Box::new(map),
        },
        None,
    );
    match tiny {
        Err(RuntimeError::Selector(synapse_selector::SelectorError::BudgetTooSmall {
            budget,
            minimum,
        })) => {
            assert_eq!(budget, 1000);
            assert!(minimum > 1000 && minimum < llama.weight_bytes() as u64);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn budgets_parse_as_users_write_them() {
    let ok = [
        ("188743680", Budget::Bytes(188_743_680)),
        ("180MB", Budget::Bytes(180_000_000)),
        ("180 MiB", Budget::Bytes(180 << 20)),
        ("1.5GB", Budget::Bytes(1_500_000_000)),
        ("75%", Budget::Percent(75.0)),
        ("12.5%", Budget::Percent(12.5)),
    ];
    for (s, want) in ok {
        assert_eq!(s.parse::<Budget>().unwrap(), want, "{s}");
    }
    for bad in [
        "", "0", "-5", "150%", "0%", "12XB", "1.5", "MB", "1e30", "nan%",
    ] {
        assert!(bad.parse::<Budget>().is_err(), "{bad:?} parsed");
    }
    assert_eq!(Budget::Percent(50.0).bytes(1001), 500);
    assert!(Precision::parse_profile("uniform:syn.q4.symmetric.g64.v1").is_ok());
    assert!(matches!(
        Precision::parse_profile("source"),
        Ok(Precision::Source)
    ));
    assert!(Precision::parse_profile("uniform:nope").is_err());
    assert!(Precision::parse_profile("q4").is_err());
}
