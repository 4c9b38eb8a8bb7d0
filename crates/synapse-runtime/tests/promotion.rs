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

/// `serve --budget free`'s follower: readings of free memory become budgets (the weights now,
/// plus what is free, less the reserve and the KV the slots may still take). Memory freeing
/// promotes, memory taken demotes, too little holds the smallest profile ("pressed"); no
/// reading is applied while sessions still run on a profile the engine has left; the thread
/// form applies a probe's readings until it is dropped.
#[test]
fn the_budget_follows_free_memory() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use synapse_runtime::engine::{Engine, EngineConfig, Event, Request};
    use synapse_runtime::promotion::{
        BudgetDriver, FollowOutcome, FollowPolicy, MemoryReading, follow_budget,
    };
    let Some((m, map, source)) = setup() else {
        return;
    };
    let policy = PromotionPolicy {
        hysteresis_bytes: source / 100,
        cooldown: Duration::ZERO,
    };
    let c = PrecisionController::new(&m, &map, pct(source, 50), policy, Instant::now()).unwrap();
    let (minimum, start_bytes) = (c.minimum_bytes(), c.resident_bytes());
    assert_eq!(c.maximum_bytes(), source);
    let start_model = c.model(c.profile(), None).unwrap().0;
    let cfg = EngineConfig {
        slots: 1,
        ctx: 256,
        ubatch: 32,
        step_tokens: 64,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::start(start_model, Arc::new(common::Ids), cfg).unwrap());
    let driver = Arc::new(BudgetDriver::new(c, engine.clone(), None));
    let kv_total = engine.stats().kv_budget_bytes;
    assert!(kv_total > 0);
    let fp = FollowPolicy {
        reserve: 4096,
        cap: source,
        interval: Duration::from_millis(20),
    };
    let reading = |free: u64| MemoryReading {
        available: free + 1000,
        own_file_rss: 1000,
        cgroup_room: None,
    };
    let source_hash = synapse_runtime::PrecisionProfile::source(&m.ir).hash();

    // As much free as the budget it runs at needs: nothing changes.
    match driver
        .follow_step(&fp, &reading(fp.reserve + kv_total))
        .unwrap()
    {
        FollowOutcome::Applied {
            budget,
            pressed,
            transition,
        } => {
            assert_eq!(budget, start_bytes);
            assert!(!pressed);
            assert!(transition.is_none(), "no room to promote into");
        }
        o => panic!("{o:?}"),
    }
    // Memory frees: promoted to the source.
    let o = driver
        .follow_step(&fp, &reading(source + fp.reserve + kv_total))
        .unwrap();
    let FollowOutcome::Applied {
        budget,
        transition: Some(t),
        ..
    } = o
    else {
        panic!("{o:?}")
    };
    assert_eq!(budget, source);
    assert_eq!(t.direction, Direction::Promote);
    assert_eq!(engine.info().profile, source_hash);
    assert_eq!(driver.following().unwrap().changes, 1);

    // A session runs on the source while the budget is cut to 60% (a cap: the same budget
    // whether or not the session's slot is still open when the reading is taken): demoted at
    // once; until that session ends, its profile's weights stay, so readings wait.
    let mut s = engine
        .submit(Request {
            stop_at_eog: false,
            ..Request::greedy(vec![1, 5, 9, 13], 240)
        })
        .unwrap();
    let mut n = 0;
    let next = |s: &mut synapse_runtime::engine::Session, n: &mut usize| match s.blocking_next() {
        Some(Event::Token(_)) => {
            *n += 1;
            true
        }
        Some(Event::Admitted { .. }) => false,
        Some(Event::Done(_)) | None => true,
        Some(Event::Error(e)) => panic!("{e}"),
    };
    while !next(&mut s, &mut n) {}
    let want = pct(source, 60);
    let taken = FollowPolicy { cap: want, ..fp };
    let o = driver
        .follow_step(&taken, &reading(source + fp.reserve + kv_total))
        .unwrap();
    assert!(
        matches!(&o, FollowOutcome::Applied { transition: Some(t), .. } if t.direction == Direction::Demote),
        "{o:?}"
    );
    assert!(engine.info().weight_bytes <= want);
    // Far less than the smallest profile free: held there, "pressed".
    let tight = FollowPolicy {
        reserve: source,
        ..fp
    };
    let mut settling = 0;
    loop {
        let before = engine.stats().retired_profiles;
        let o = driver.follow_step(&tight, &reading(0)).unwrap();
        match o {
            FollowOutcome::Settling => {
                assert!(before > 0 || engine.stats().retired_profiles > 0);
                settling += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            FollowOutcome::Applied {
                budget,
                pressed,
                transition,
            } => {
                // A left profile's session alive from before the reading to after it: the
                // reading must have waited.
                let after = engine.stats().retired_profiles;
                assert!(
                    before == 0 || after == 0,
                    "applied while a left profile ran"
                );
                assert_eq!(budget, minimum);
                assert!(pressed);
                assert_eq!(transition.map(|t| t.direction), Some(Direction::Demote));
                break;
            }
        }
    }
    while let Some(e) = s.blocking_next() {
        match e {
            Event::Token(_) => n += 1,
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    assert_eq!(n, 240, "the session finished on its own profile");
    eprintln!("{settling} readings waited for the left profile's session");
    assert!(engine.info().weight_bytes <= minimum);
    assert!(driver.following().unwrap().pressed);

    // The thread: a probe's readings applied until the follower is dropped.
    let free = Arc::new(AtomicU64::new(0));
    let f2 = free.clone();
    let follower = driver.follow_memory(fp, move || Ok(reading(f2.load(Ordering::Relaxed))));
    free.store(source + fp.reserve + kv_total, Ordering::Relaxed);
    let t0 = Instant::now();
    while engine.info().profile != source_hash {
        assert!(t0.elapsed() < Duration::from_secs(30), "never promoted");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(follower);
    let readings = driver.following().unwrap().readings;
    free.store(0, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(driver.following().unwrap().readings, readings, "stopped");
    assert_eq!(engine.info().profile, source_hash);
    // The budget formula itself.
    let d = synapse_runtime::promotion::Demand {
        weights: 10,
        kv_total: 5,
        kv_open: 5,
    };
    assert_eq!(follow_budget(100, &d, &fp, 0), 0, "the reserve comes first");
}
