//! Precision under a changing budget (`PrecisionController`): a larger budget only promotes,
//! most important tensors first; a smaller one demotes at once, least important first; a
//! budget oscillating inside the hysteresis band changes nothing, a wider oscillation changes
//! the profile at most twice per cooldown; every transition's model holds the bytes it says,
//! under a new profile hash; an impossible budget is an error that changes nothing.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use synapse_runtime::RuntimeError;
use synapse_runtime::promotion::{Direction, PrecisionController, PromotionPolicy};
use synapse_selector::{ChangeKind, Constraints, Selector};

fn setup() -> Option<(
    Arc<synapse_runtime::Model>,
    synapse_sensitivity::ImportanceMap,
    u64,
)> {
    let (m, toks) = common::tiny_q8_model("llama")?;
    let map = common::tiny_importance_map(&m, &toks);
    let source = m.weight_bytes() as u64;
    Some((m, map, source))
}

fn pct(source: u64, p: u64) -> u64 {
    source * p / 100
}

#[test]
fn a_larger_budget_only_promotes_most_important_first_and_a_smaller_demotes_at_once() {
    let Some((m, map, source)) = setup() else {
        return;
    };
    let policy = PromotionPolicy {
        hysteresis_bytes: source / 100,
        cooldown: Duration::from_secs(10),
    };
    let t0 = Instant::now();
    let mut c = PrecisionController::new(&m, &map, pct(source, 45), policy, t0).unwrap();
    assert!(c.resident_bytes() <= pct(source, 45));
    // Demotion order positions: (tensor, encoding reached) → k.
    let rank: BTreeMap<(String, String), usize> = Selector::new(&map, &Constraints::default())
        .unwrap()
        .demotion_order()
        .into_iter()
        .enumerate()
        .map(|(k, s)| ((s.item, s.to), k))
        .collect();
    let mut now = t0;
    let mut last_hash = c.profile().hash();
    let mut last_bytes = c.resident_bytes();
    let mut promotions = 0;
    for p in [55, 70, 85, 100] {
        now += Duration::from_secs(11);
        let before = c.profile().clone();
        let t = c.update(pct(source, p), now).unwrap().expect("a promotion");
        promotions += 1;
        assert_eq!(t.direction, Direction::Promote);
        assert_eq!(t.from, last_hash);
        assert!(t.resident_bytes > last_bytes, "{p}%: more bytes");
        assert!(t.resident_bytes + policy.hysteresis_bytes <= pct(source, p) || p == 100);
        assert!(!t.changes.is_empty());
        assert!(t.changes.iter().all(|ch| ch.kind == ChangeKind::Promotion));
        // Most important first: the steps undone come from the end of the demotion order.
        let ks: Vec<usize> = t
            .changes
            .iter()
            .map(|ch| {
                rank[&(
                    ch.tensor.clone(),
                    before.assignments[&ch.tensor].encoding.clone(),
                )]
            })
            .collect();
        assert!(ks.windows(2).all(|w| w[0] > w[1]), "{p}%: {ks:?}");
        // Every tensor at least as precise as before.
        for (name, a) in &t.profile.assignments {
            assert!(a.bytes >= before.assignments[name].bytes, "{name}");
        }
        // The transition's model holds what it says, under a new hash.
        let (model, _) = c.model(&t.profile, None).unwrap();
        assert_eq!(model.weight_bytes() as u64, t.resident_bytes);
        last_hash = t.profile.hash();
        last_bytes = t.resident_bytes;
        if p == 100 {
            // The whole source fits: back to the source itself.
            assert_eq!(t.resident_bytes, source);
            assert!(Arc::ptr_eq(&model, &m));
        } else {
            assert_ne!(model.profile.hash(), m.profile.hash(), "{p}%");
        }
    }
    assert_eq!(promotions, 4);
    // Nothing left to promote within the cooldown or at the same budget.
    assert!(c.update(source, now).unwrap().is_none());
    // A smaller budget demotes at once (no cooldown), least important first.
    let before = c.profile().clone();
    let t = c
        .update(pct(source, 50), now + Duration::from_millis(1))
        .unwrap()
        .expect("a demotion");
    assert_eq!(t.direction, Direction::Demote);
    assert!(t.resident_bytes <= pct(source, 50));
    assert!(t.changes.iter().all(|ch| ch.kind == ChangeKind::Demotion));
    let ks: Vec<usize> = t
        .changes
        .iter()
        .map(|ch| {
            rank[&(
                ch.tensor.clone(),
                t.profile.assignments[&ch.tensor].encoding.clone(),
            )]
        })
        .collect();
    assert!(ks.windows(2).all(|w| w[0] < w[1]), "{ks:?}");
    for (name, a) in &t.profile.assignments {
        assert!(a.bytes <= before.assignments[name].bytes, "{name}");
    }
}

#[test]
fn an_oscillating_budget_does_not_flap() {
    let Some((m, map, source)) = setup() else {
        return;
    };
    let policy = PromotionPolicy {
        hysteresis_bytes: source / 20,
        cooldown: Duration::from_secs(30),
    };
    let t0 = Instant::now();
    let base = pct(source, 60);
    let mut c = PrecisionController::new(&m, &map, base, policy, t0).unwrap();
    let start = c.profile().hash();
    // Inside the hysteresis band: nothing changes, ever.
    for s in 0..600u64 {
        let b = if s % 2 == 0 {
            base
        } else {
            base + policy.hysteresis_bytes / 2
        };
        let t = c.update(b, t0 + Duration::from_secs(s)).unwrap();
        assert!(t.is_none(), "second {s}");
    }
    assert_eq!(c.profile().hash(), start);
    // A wide oscillation every second for 10 minutes: the resident bytes always fit, and the
    // profile changes at most twice per cooldown.
    let t1 = t0 + Duration::from_secs(600);
    let (lo, hi) = (pct(source, 45), pct(source, 95));
    let mut changes = 0u64;
    let secs = 600u64;
    for s in 0..secs {
        let b = if s % 2 == 0 { lo } else { hi };
        if c.update(b, t1 + Duration::from_secs(s)).unwrap().is_some() {
            changes += 1;
        }
        assert!(c.resident_bytes() <= b, "second {s}");
    }
    let bound = 2 * (secs / policy.cooldown.as_secs() + 1);
    assert!(
        changes > 0 && changes <= bound,
        "{changes} changes > {bound}"
    );
}

#[test]
fn the_cooldown_delays_a_promotion_and_an_impossible_budget_changes_nothing() {
    let Some((m, map, source)) = setup() else {
        return;
    };
    let policy = PromotionPolicy::for_source_bytes(source);
    assert_eq!(policy.hysteresis_bytes, source / 50);
    let t0 = Instant::now();
    let mut c = PrecisionController::new(&m, &map, pct(source, 50), policy, t0).unwrap();
    let h = c.profile().hash();
    assert!(
        c.update(source, t0 + Duration::from_secs(29))
            .unwrap()
            .is_none()
    );
    assert_eq!(c.profile().hash(), h);
    let e = c.update(1000, t0 + Duration::from_secs(40));
    assert!(
        matches!(
            e,
            Err(RuntimeError::Selector(
                synapse_selector::SelectorError::BudgetTooSmall { budget: 1000, .. }
            ))
        ),
        "{e:?}"
    );
    assert_eq!(c.profile().hash(), h, "an error changes nothing");
    let t = c.update(source, t0 + Duration::from_secs(31)).unwrap();
    assert_eq!(t.map(|t| t.direction), Some(Direction::Promote));
    // Too small from the start: a typed error.
    assert!(PrecisionController::new(&m, &map, 1000, policy, t0).is_err());
}
