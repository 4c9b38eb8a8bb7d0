//! Monotonicity, budgets, constraints, hashing and diffs of precision profiles.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use synapse_selector::{ChangeKind, Constraints, Profile, Selector, SelectorError, diff};
use synapse_sensitivity::{
    EncodingOption, FORMAT_VERSION, ImportanceMap, Provenance, TensorImportance,
};

const ENCODINGS: [&str; 5] = [
    "syn.q8.symmetric.g64.v1",
    "syn.q6.symmetric.g64.v1",
    "syn.q4.symmetric.g64.v1",
    "syn.q2.symmetric.g64.v1",
    "syn.ternary.absmean.g64.v1",
];

/// (tensor name, source bytes, options as (index into ENCODINGS, bytes, distortion)).
type TensorSpec = (String, u64, Vec<(usize, u64, f64)>);

fn map_of(tensors: Vec<TensorSpec>) -> ImportanceMap {
    let mut map = BTreeMap::new();
    let mut versions = BTreeSet::new();
    for (name, source_bytes, opts) in tensors {
        let options = opts
            .into_iter()
            .map(|(e, bytes, distortion)| {
                versions.insert(ENCODINGS[e].to_owned());
                EncodingOption {
                    encoding: ENCODINGS[e].to_owned(),
                    bytes,
                    distortion,
                }
            })
            .collect();
        map.insert(
            name,
            TensorImportance {
                source_encoding: "bf16".into(),
                source_bytes,
                options,
                kl_weight: 1.0,
            },
        );
    }
    ImportanceMap {
        format_version: FORMAT_VERSION,
        provenance: Provenance {
            model_fingerprint: "m".into(),
            calibration_hash: "c".into(),
            sample_count: 1,
            codec_versions: versions.into_iter().collect(),
            kl_weights: None,
        },
        tensors: map,
    }
}

/// Random maps: each tensor gets a source size and up to five options with decreasing sizes
/// and random (not necessarily monotone) distortions.
fn arb_map() -> impl Strategy<Value = ImportanceMap> {
    prop::collection::vec(
        (
            500u64..5000,
            prop::collection::vec((1u64..400, 0.0f64..1.0), 0..5),
        ),
        1..8,
    )
    .prop_map(|ts| {
        map_of(
            ts.into_iter()
                .enumerate()
                .map(|(i, (src, opts))| {
                    let mut bytes = src;
                    let opts = opts
                        .into_iter()
                        .enumerate()
                        .filter_map(|(e, (cut, d))| {
                            bytes = bytes.checked_sub(cut)?.max(1);
                            Some((e, bytes, d))
                        })
                        .collect::<Vec<_>>();
                    // make sizes strictly decreasing (cut ≥ 1 already) and drop duplicates
                    let mut seen = BTreeSet::new();
                    let opts = opts.into_iter().filter(|o| seen.insert(o.1)).collect();
                    (format!("blk.{i}.w"), src, opts)
                })
                .collect(),
        )
    })
}

fn arb_constraints() -> impl Strategy<Value = Constraints> {
    (
        prop::option::of(prop::collection::btree_set(0usize..5, 1..5)),
        prop::collection::btree_set(0usize..8, 0..3),
        prop::option::of(0.05f64..1.0),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(sup, pins, floor, allow, source_ok, fuse)| {
            let supported = sup.map(|s| {
                let mut set: BTreeSet<String> =
                    s.into_iter().map(|e| ENCODINGS[e].to_owned()).collect();
                if source_ok {
                    set.insert("bf16".into());
                }
                set
            });
            Constraints {
                supported,
                pinned: pins.into_iter().map(|i| format!("blk.{i}.w")).collect(),
                quality_floor: floor,
                allow_approximation: allow,
                // q/k/v-style joint item over the first two tensors, when asked
                fused: if fuse {
                    vec![vec!["blk.0.w".into(), "blk.1.w".into()]]
                } else {
                    vec![]
                },
            }
        })
}

/// Drops pins of tensors the map lacks, and (when `fused` names tensors the map lacks) the
/// fused group, then builds the selector; `None` when the constraints leave an item empty.
fn selector(map: &ImportanceMap, c: &Constraints) -> Option<Selector> {
    let mut c = c.clone();
    c.pinned.retain(|p| map.tensors.contains_key(p));
    c.fused
        .retain(|g| g.iter().all(|t| map.tensors.contains_key(t)));
    Selector::new(map, &c).ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn larger_budget_only_promotes(map in arb_map(), c in arb_constraints(), b1 in 0u64..40_000, extra in 0u64..20_000) {
        let Some(s) = selector(&map, &c) else { return Ok(()) };
        let b2 = b1 + extra;
        match (s.select(b1), s.select(b2)) {
            (Ok(p1), Ok(p2)) => {
                for (name, a1) in &p1.assignments {
                    prop_assert!(p2.assignments[name].bytes >= a1.bytes, "{} demoted by a larger budget", name);
                }
                prop_assert!(diff(&p1, &p2).iter().all(|ch| ch.kind == ChangeKind::Promotion));
                prop_assert!(p2.total_distortion <= p1.total_distortion + 1e-12);
            }
            (Ok(_), Err(e)) => prop_assert!(false, "smaller budget fit but larger failed: {e}"),
            _ => {}
        }
    }

    #[test]
    fn budget_respected_and_supported_only(map in arb_map(), c in arb_constraints(), budget in 0u64..40_000) {
        let Some(s) = selector(&map, &c) else { return Ok(()) };
        match s.select(budget) {
            Ok(p) => {
                prop_assert!(p.total_bytes <= budget);
                prop_assert_eq!(p.total_bytes, p.assignments.values().map(|a| a.bytes).sum::<u64>());
                prop_assert_eq!(p.assignments.len(), map.tensors.len());
                for g in &c.fused {
                    if g.iter().all(|t| p.assignments.contains_key(t)) {
                        prop_assert_eq!(&p.assignments[&g[0]].encoding, &p.assignments[&g[1]].encoding);
                    }
                }
                for (name, a) in &p.assignments {
                    if let Some(sup) = &c.supported { prop_assert!(sup.contains(&a.encoding)); }
                    if let (Some(f), false) = (c.quality_floor, c.allow_approximation) {
                        prop_assert!(a.distortion <= f);
                    }
                    if c.pinned.contains(name) {
                        prop_assert_eq!(a.bytes, s.select(u64::MAX).unwrap().assignments[name].bytes);
                    }
                }
            }
            Err(SelectorError::BudgetTooSmall { minimum, .. }) => prop_assert!(minimum > budget),
            Err(SelectorError::ApproximationNotAllowed { min_within_floor, .. }) => {
                prop_assert!(!c.allow_approximation && c.quality_floor.is_some());
                prop_assert!(min_within_floor > budget);
                let mut c2 = c.clone();
                c2.allow_approximation = true;
                prop_assert!(selector(&map, &c2).unwrap().select(budget).is_ok());
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn filling_the_slack_fits_and_never_adds_distortion(map in arb_map(), c in arb_constraints(), budget in 0u64..40_000) {
        let Some(s) = selector(&map, &c) else { return Ok(()) };
        match (s.select(budget), s.select_filled(budget)) {
            (Ok(p), Ok(f)) => {
                prop_assert!(f.total_bytes <= budget);
                prop_assert!(f.total_bytes >= p.total_bytes);
                prop_assert_eq!(f.total_bytes, f.assignments.values().map(|a| a.bytes).sum::<u64>());
                prop_assert!(f.total_distortion <= p.total_distortion + 1e-12);
                // Only promotions relative to the prefix, each to a level the prefix passed.
                prop_assert!(diff(&p, &f).iter().all(|ch| ch.kind == ChangeKind::Promotion));
                // No single undo left that would still fit.
                let slack = budget - f.total_bytes;
                for st in s.demotion_order() {
                    let at: Vec<&String> = st.item.split('+').map(|m| &f.assignments[m].encoding).collect();
                    if at.iter().all(|e| **e == st.to) {
                        prop_assert!(st.saved_bytes > slack, "{} could come back", st.item);
                    }
                }
            }
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "select {:?} vs select_filled {:?}", a.is_ok(), b.is_ok()),
        }
    }

    #[test]
    fn the_knapsack_fits_and_is_never_worse_than_the_greedy(map in arb_map(), c in arb_constraints(), budget in 0u64..40_000) {
        let Some(s) = selector(&map, &c) else { return Ok(()) };
        match (s.select_filled(budget), s.select_best(budget)) {
            (Ok(f), Ok(b)) => {
                prop_assert!(b.total_bytes <= budget);
                prop_assert_eq!(b.total_bytes, b.assignments.values().map(|a| a.bytes).sum::<u64>());
                prop_assert!(b.total_distortion <= f.total_distortion + 1e-12);
                prop_assert_eq!(b.assignments.len(), map.tensors.len());
                for (name, a) in &b.assignments {
                    if let Some(sup) = &c.supported { prop_assert!(sup.contains(&a.encoding)); }
                    if c.pinned.contains(name) {
                        prop_assert_eq!(a.bytes, s.select(u64::MAX).unwrap().assignments[name].bytes);
                    }
                }
            }
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "select_filled {:?} vs select_best {:?}", a.is_ok(), b.is_ok()),
        }
    }

    #[test]
    fn identical_assignments_share_a_hash(map in arb_map(), budget in 0u64..40_000) {
        let s = Selector::new(&map, &Constraints::default()).unwrap();
        if let Ok(p) = s.select(budget) {
            let tight = s.select(p.total_bytes).unwrap();
            prop_assert_eq!(tight.hash(), p.hash());
            prop_assert_eq!(&tight.assignments, &p.assignments);
            // hash survives a JSON round trip and ignores totals
            let mut back: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
            back.total_distortion += 1.0;
            prop_assert_eq!(back.hash(), p.hash());
        }
    }
}

fn three() -> ImportanceMap {
    // a: very sensitive, b: moderately, c: barely. Each: bf16 1000 bytes → q8 500 → q4 250.
    map_of(vec![
        ("a".into(), 1000, vec![(0, 500, 0.10), (2, 250, 0.90)]),
        ("b".into(), 1000, vec![(0, 500, 0.01), (2, 250, 0.20)]),
        ("c".into(), 1000, vec![(0, 500, 0.001), (2, 250, 0.002)]),
    ])
}

#[test]
fn promotion_restores_the_most_important_first() {
    let s = Selector::new(&three(), &Constraints::default()).unwrap();
    let order: Vec<(String, String)> = s
        .demotion_order()
        .into_iter()
        .map(|d| (d.item, d.to))
        .collect();
    assert_eq!(
        order.first().unwrap(),
        &("c".to_string(), ENCODINGS[0].to_string())
    );
    let all_small = s.select(750).unwrap();
    assert!(all_small.assignments.values().all(|a| a.bytes == 250));
    // 250 more bytes: the one promotion worth most per byte is a's q4 → q8
    let p = s.select(1000).unwrap();
    let ch = diff(&all_small, &p);
    assert_eq!(ch.len(), 1);
    assert_eq!(ch[0].tensor, "a");
    assert_eq!(ch[0].kind, ChangeKind::Promotion);
    assert_eq!(ch[0].to.as_deref(), Some(ENCODINGS[0]));
    // the last demotion taken is the first one undone
    assert_eq!(s.demotion_order().last().unwrap().item, "a");
    assert_eq!(s.select(3000).unwrap().total_distortion, 0.0);
}

#[test]
fn pinned_fused_and_supported_constraints() {
    let mut c = Constraints::default();
    c.pinned.insert("a".into());
    let s = Selector::new(&three(), &c).unwrap();
    let p = s.select(1500).unwrap();
    assert_eq!(p.assignments["a"].encoding, "bf16");
    assert_eq!(
        s.select(1499),
        Err(SelectorError::BudgetTooSmall {
            budget: 1499,
            minimum: 1500
        })
    );

    let c = Constraints {
        fused: vec![vec!["b".into(), "c".into()]],
        ..Default::default()
    };
    let s = Selector::new(&three(), &c).unwrap();
    for budget in [750, 1000, 1250, 1500, 2000, 3000] {
        let p = s.select(budget).unwrap();
        assert_eq!(
            p.assignments["b"].encoding, p.assignments["c"].encoding,
            "budget {budget}"
        );
    }
    let c = Constraints {
        fused: vec![vec!["b".into(), "zz".into()]],
        ..Default::default()
    };
    assert_eq!(
        Selector::new(&three(), &c).unwrap_err(),
        SelectorError::UnknownTensor { name: "zz".into() }
    );

    // a device with only 4-bit kernels never gets bf16 or q8
    let c = Constraints {
        supported: Some([ENCODINGS[2].to_string()].into()),
        ..Default::default()
    };
    let p = Selector::new(&three(), &c)
        .unwrap()
        .select(u64::MAX)
        .unwrap();
    assert!(p.assignments.values().all(|a| a.encoding == ENCODINGS[2]));
    let c = Constraints {
        supported: Some(["f32".to_string()].into()),
        ..Default::default()
    };
    assert!(matches!(
        Selector::new(&three(), &c),
        Err(SelectorError::NoSupportedEncoding { .. })
    ));
}

#[test]
fn quality_floor_needs_explicit_opt_in() {
    let c = Constraints {
        quality_floor: Some(0.5),
        ..Default::default()
    };
    let s = Selector::new(&three(), &c).unwrap();
    // within the floor, a stops at q8 (500): minimum 500 + 250 + 250
    assert!(s.select(1000).is_ok());
    assert_eq!(
        s.select(750),
        Err(SelectorError::ApproximationNotAllowed {
            budget: 750,
            min_within_floor: 1000
        })
    );
    let c = Constraints {
        quality_floor: Some(0.5),
        allow_approximation: true,
        ..Default::default()
    };
    let p = Selector::new(&three(), &c).unwrap().select(750).unwrap();
    assert_eq!(p.assignments["a"].bytes, 250);
    assert_eq!(
        Selector::new(&three(), &Constraints::default())
            .unwrap()
            .select(100),
        Err(SelectorError::BudgetTooSmall {
            budget: 100,
            minimum: 750
        })
    );
}

#[test]
fn a_map_from_another_model_is_refused() {
    let map = three();
    assert!(Selector::for_model(&map, "m", &Constraints::default()).is_ok());
    assert!(matches!(
        Selector::for_model(&map, "other-model", &Constraints::default()),
        Err(SelectorError::Map(
            synapse_sensitivity::SensitivityError::ProvenanceMismatch { .. }
        ))
    ));
}

#[test]
fn diff_lists_exact_changes_and_hash_is_stable() {
    let s = Selector::new(&three(), &Constraints::default()).unwrap();
    let lo = s.select(750).unwrap();
    let hi = s.select(3000).unwrap();
    let d = diff(&hi, &lo);
    assert_eq!(d.len(), 3);
    assert!(
        d.iter()
            .all(|c| c.kind == ChangeKind::Demotion && c.to.as_deref() == Some(ENCODINGS[2]))
    );
    assert_ne!(lo.hash(), hi.hash());
    assert_eq!(
        s.select(3000).unwrap().hash(),
        s.select(1_000_000).unwrap().hash()
    );
    assert_eq!(hi.hash().to_string().len(), 64);
}

#[test]
fn the_knapsack_finds_what_the_greedy_order_misses() {
    // 60 bytes must go. The big tensor's step is the cheapest per byte (0.06 for 600 bytes),
    // so the greedy prefix takes it and its 600 bytes cannot come back within the slack; the
    // small tensor's step alone (0.05 for 70 bytes) is enough and costs less.
    let m = map_of(vec![
        ("big".into(), 1000, vec![(0, 400, 0.06)]),
        ("s".into(), 300, vec![(0, 230, 0.05)]),
    ]);
    let s = Selector::new(&m, &Constraints::default()).unwrap();
    let (f, b) = (s.select_filled(1240).unwrap(), s.select_best(1240).unwrap());
    assert_eq!(
        f.assignments["big"].bytes, 400,
        "the greedy demotes the big one"
    );
    assert!((f.total_distortion - 0.06).abs() < 1e-12);
    assert_eq!(b.assignments["big"].bytes, 1000);
    assert_eq!(b.assignments["s"].bytes, 230);
    assert!((b.total_distortion - 0.05).abs() < 1e-12);
    assert_eq!(b.total_bytes, 1230);
}

#[test]
fn kl_weights_scale_what_a_demotion_costs() {
    // Unweighted, c is demoted first; weighted 1000× (its demotion measured as that harmful),
    // it is demoted last and its cost in the profile is the weighted one.
    let mut m = three();
    let first = |m: &ImportanceMap| {
        Selector::new(m, &Constraints::default())
            .unwrap()
            .demotion_order()
            .first()
            .unwrap()
            .item
            .clone()
    };
    assert_eq!(first(&m), "c");
    let w: BTreeMap<String, f64> = [("c".to_string(), 1000.0)].into();
    m.set_kl_weights(&w, "test").unwrap();
    assert_eq!(m.provenance.kl_weights.as_deref(), Some("test"));
    assert_ne!(first(&m), "c");
    let s = Selector::new(&m, &Constraints::default()).unwrap();
    assert_eq!(s.demotion_order().last().unwrap().item, "c");
    let all_small = s.select(750).unwrap();
    assert!((all_small.assignments["c"].distortion - 2.0).abs() < 1e-12);
    // The weights survive JSON; invalid ones are refused.
    let back = ImportanceMap::from_json(&m.to_json().unwrap()).unwrap();
    assert_eq!(back, m);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let w: BTreeMap<String, f64> = [("a".to_string(), bad)].into();
        assert!(m.clone().set_kl_weights(&w, "bad").is_err(), "{bad}");
    }
    let unknown: BTreeMap<String, f64> = [("zz".to_string(), 2.0)].into();
    assert!(m.clone().set_kl_weights(&unknown, "x").is_err());
    // An unweighted map's JSON has no kl fields (maps written before them read the same).
    assert!(!three().to_json().unwrap().contains("kl_weight"));
}
