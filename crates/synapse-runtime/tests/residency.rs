//! Routed experts under a byte budget (`Executor::page_experts`): the same tokens and logits
//! as with every expert resident, the pager's counters, and the model file's resident pages —
//! read from `/proc/self/smaps` after every pass — within the weights outside the experts
//! plus the budget.

mod common;

use std::path::Path;
use std::sync::Arc;

use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, argmax};
use synapse_testdata::synthetic_moe::{MoeShape, write};

fn shape() -> MoeShape {
    MoeShape::small()
}

fn model(dir: &Path) -> (Arc<Model>, std::path::PathBuf) {
    let path = dir.join(shape().file_name());
    if !path.exists() {
        write(&shape(), &path).unwrap();
    }
    (Arc::new(Model::load(&path).unwrap()), path)
}

/// Bytes of `file` the non-expert tensors can keep mapped: each tensor's range rounded out
/// to the 2 MiB large folios the page cache may map whole, the union of those.
fn outside_folios(file: &Path) -> u64 {
    const FOLIO: u64 = 2 << 20;
    let g = synapse_formats::gguf::GgufFile::open(file).unwrap();
    let mut spans: Vec<(u64, u64)> = g
        .tensors()
        .iter()
        .filter(|t| !t.name.ends_with("_exps.weight"))
        .map(|t| {
            (
                t.offset / FOLIO * FOLIO,
                (t.offset + t.n_bytes).div_ceil(FOLIO) * FOLIO,
            )
        })
        .collect();
    spans.sort();
    let (mut total, mut end) = (0, 0);
    for (a, b) in spans {
        let a = a.max(end);
        if b > a {
            total += b - a;
            end = b;
        }
    }
    total
}

/// Greedy decode of `steps` tokens after `prompt`: every step's logits, and the largest
/// resident size of `file`'s mappings seen after any pass.
fn run(ex: &mut Executor, prompt: &[u32], steps: usize, file: &Path) -> (Vec<Vec<f32>>, u64) {
    let m = ex.model().clone();
    let mut kv = KvCache::new(&m, KvDtype::F32, 1, 128, 64).unwrap();
    kv.open(0).unwrap();
    let mut out = vec![
        ex.forward(&mut kv, &common::prompt_rows(prompt))
            .unwrap()
            .to_vec(),
    ];
    let mut peak = common::mapped_rss(file);
    for s in 0..steps {
        let next = argmax(out.last().unwrap());
        let row = Row::decode(0, (prompt.len() + s) as u32, next);
        out.push(ex.forward(&mut kv, &[row]).unwrap().to_vec());
        peak = peak.max(common::mapped_rss(file));
        if std::env::var("DBG").is_ok() {
            eprintln!(
                "DBG step {s}: mapped {} pager {:?}",
                common::mapped_rss(file),
                ex.expert_pager().map(|p| p.resident_bytes())
            );
        }
    }
    (out, peak)
}

const Q4: &str = "uniform:syn.q4.symmetric.g64.v1";

const PROMPT: [u32; 12] = [1, 40, 77, 300, 12, 9, 451, 38, 200, 17, 64, 5];

#[test]
fn budgeted_experts_give_the_same_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, path) = model(tmp.path());
    let mut full = Executor::new(m.clone(), 2).unwrap();
    let (want, _) = run(&mut full, &PROMPT, 24, &path);
    for (frac, file_reads) in [
        (1.0, true),
        (0.5, true),
        (0.25, true),
        (0.125, true),
        (0.25, false),
    ] {
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        ex.page_experts(Some(0)).unwrap_err();
        let total = {
            ex.page_experts(Some(u64::MAX)).unwrap();
            ex.expert_pager().unwrap().total_bytes()
        };
        let budget = (total as f64 * frac) as u64;
        ex.page_experts(Some(budget)).unwrap();
        ex.expert_pager_mut().unwrap().set_file_reads(file_reads);
        let (got, _) = run(&mut ex, &PROMPT, 24, &path);
        assert_eq!(
            got, want,
            "experts at {frac} of their bytes (file reads {file_reads}): other logits"
        );
        let p = ex.expert_pager().unwrap();
        let st = p.stats();
        assert!(p.resident_bytes() <= budget && p.held_bytes() <= budget);
        assert_eq!(st.hits + st.misses, ex.expert_stats().groups);
        assert!(st.misses > 0);
        if frac < 1.0 {
            assert!(st.evictions > 0, "{frac}: nothing paged out");
        } else {
            assert_eq!(st.evictions, 0);
            assert!(st.misses <= 64, "each expert pages in once");
        }
        eprintln!(
            "experts at {:>5.1}% ({:.1} of {:.1} MB, file reads {file_reads}): hit rate {:.3}, {} misses, {} evictions, \
             {:.1} MB paged in",
            frac * 100.0,
            budget as f64 / 1e6,
            total as f64 / 1e6,
            st.hit_rate(),
            st.misses,
            st.evictions,
            st.bytes_in as f64 / 1e6
        );
    }
}

/// The frequency filter: with it (the default) a miss of an expert used no more often than
/// the least used resident one runs from the pager's scratch slot and pages nothing out;
/// without it every miss replaces the LRU-2 victim. The same logits either way, every held
/// byte (the scratch slot included) within the budget, and far fewer experts paged out.
#[test]
fn a_miss_the_filter_does_not_admit_pages_nothing_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, path) = model(tmp.path());
    let mut full = Executor::new(m.clone(), 2).unwrap();
    let (want, _) = run(&mut full, &PROMPT, 48, &path);
    for frac in [0.5, 0.25] {
        let mut st = Vec::new();
        for admission in [true, false] {
            let mut ex = Executor::new(m.clone(), 2).unwrap();
            ex.page_experts(Some(u64::MAX)).unwrap();
            let total = ex.expert_pager().unwrap().total_bytes();
            let budget = (total as f64 * frac) as u64;
            ex.page_experts(Some(budget)).unwrap();
            let p = ex.expert_pager_mut().unwrap();
            assert!(p.admitting(), "on by default");
            p.set_admission(admission);
            let (got, _) = run(&mut ex, &PROMPT, 48, &path);
            assert_eq!(got, want, "{frac}, filter {admission}: other logits");
            let p = ex.expert_pager().unwrap();
            assert!(
                p.held_bytes() <= budget && p.resident_bytes() <= budget,
                "{frac}, filter {admission}: {} B held of {budget}",
                p.held_bytes()
            );
            let s = p.stats();
            assert_eq!(s.hits + s.misses, ex.expert_stats().groups);
            eprintln!(
                "experts at {:>4.1}%, filter {admission}: hit rate {:.3}, {} misses, {} of \
                 them bypassed, {} evictions, {:.1} MB read",
                frac * 100.0,
                s.hit_rate(),
                s.misses,
                s.bypassed,
                s.evictions,
                s.bytes_in as f64 / 1e6
            );
            st.push(s);
        }
        let (on, off) = (st[0], st[1]);
        assert!(on.bypassed > 0, "{frac}: {on:?}");
        assert_eq!(off.bypassed, 0, "{frac}: {off:?}");
        assert!(on.evictions > 0, "{frac}: the filter still admits: {on:?}");
        assert!(
            on.evictions * 2 < off.evictions,
            "{frac}: filter {on:?}, none {off:?}"
        );
    }
    // A budget that holds every expert keeps every expert: no scratch slot, nothing bypassed.
    let mut ex = Executor::new(m.clone(), 2).unwrap();
    ex.page_experts(Some(u64::MAX)).unwrap();
    let total = ex.expert_pager().unwrap().total_bytes();
    ex.page_experts(Some(total)).unwrap();
    let (got, _) = run(&mut ex, &PROMPT, 48, &path);
    assert_eq!(got, want);
    let s = ex.paging_stats().unwrap();
    assert_eq!((s.bypassed, s.evictions), (0, 0), "{s:?}");
}

#[test]
fn mapped_experts_stay_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, path) = model(tmp.path());
    for file_reads in [true, false] {
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        ex.page_experts(Some(u64::MAX)).unwrap();
        let total = ex.expert_pager().unwrap().total_bytes();
        let budget = total / 4;
        ex.page_experts(Some(budget)).unwrap();
        ex.expert_pager_mut().unwrap().set_file_reads(file_reads);
        let outside = (m.weight_bytes() as u64).saturating_sub(total);
        // The mapping keeps the weights outside the experts, in the large folios they
        // share with experts' bytes. Reading misses through the file maps nothing more;
        // copying from the mapping touches at most the large folio at either end of each of
        // an expert's three ranges while it is being copied (dropped right after): 6 × 2 MiB.
        let allowed = outside_folios(&path) + if file_reads { 0 } else { 6 * (2 << 20) };
        let (_, peak) = run(&mut ex, &PROMPT, 32, &path);
        let st = ex.paging_stats().unwrap();
        eprintln!(
            "file reads {file_reads}: model file mapped (smaps): peak {:.1} MB, allowed {:.1} \
             MB (weights outside the experts {:.1} MB); expert copies {:.1} MB of a {:.1} MB \
             budget (experts in all {:.1} MB); {} misses, {} evictions",
            peak as f64 / 1e6,
            allowed as f64 / 1e6,
            outside as f64 / 1e6,
            ex.expert_pager().unwrap().resident_bytes() as f64 / 1e6,
            budget as f64 / 1e6,
            total as f64 / 1e6,
            st.misses,
            st.evictions
        );
        assert!(ex.expert_pager().unwrap().resident_bytes() <= budget);
        assert!(
            peak <= allowed,
            "file reads {file_reads}: the model file's mapped pages peaked at {peak} B; \
             allowed {allowed}"
        );
    }
}

/// The router lookahead (the next MoE layer's router over a layer's output) and the advised
/// reads of a layer's routed misses change no logit and map no page; they are counted — the
/// predictions and how many the layer then used, the reads advised and the misses whose
/// reads had been advised — and with prefetching off none happens.
#[test]
fn router_lookahead_prefetch_changes_nothing_but_when_bytes_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, path) = model(tmp.path());
    let mut full = Executor::new(m.clone(), 2).unwrap();
    let (want, _) = run(&mut full, &PROMPT, 24, &path);
    for prefetch in [true, false] {
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        ex.page_experts(Some(u64::MAX)).unwrap();
        let total = ex.expert_pager().unwrap().total_bytes();
        ex.page_experts(Some(total / 4)).unwrap();
        let p = ex.expert_pager_mut().unwrap();
        assert!(p.prefetching(), "on by default");
        p.set_prefetch(prefetch);
        let (got, peak) = run(&mut ex, &PROMPT, 24, &path);
        assert_eq!(got, want, "prefetch {prefetch}: other logits");
        // Advice maps nothing: the file's mapped pages stay what the weights outside the
        // experts keep.
        let allowed = outside_folios(&path);
        assert!(
            peak <= allowed,
            "prefetch {prefetch}: {peak} B mapped, allowed {allowed}"
        );
        let st = ex.paging_stats().unwrap();
        eprintln!(
            "prefetch {prefetch}: {} predicted, {} of them used; {} reads advised; {} of {} \
             misses advised ahead; mapped peak {:.1} MB (allowed {:.1})",
            st.predicted,
            st.predicted_used,
            st.prefetches,
            st.prefetched_misses,
            st.misses,
            peak as f64 / 1e6,
            allowed as f64 / 1e6
        );
        if prefetch {
            // Every pass predicts n_used experts per row for each MoE layer after the first.
            assert!(
                st.predicted > 0 && st.predicted_used <= st.predicted,
                "{st:?}"
            );
            assert!(st.prefetches > 0, "{st:?}");
            assert!(
                st.prefetched_misses > 0 && st.prefetched_misses <= st.misses,
                "{st:?}"
            );
            // A miss is advised at the latest when its layer routes, unless it was resident
            // then and a miss of the same layer paged it out before its group ran (rare).
            assert!(st.prefetched_misses * 10 >= st.misses * 9, "{st:?}");
        } else {
            assert_eq!(
                (
                    st.predicted,
                    st.predicted_used,
                    st.prefetches,
                    st.prefetched_misses
                ),
                (0, 0, 0, 0),
                "{st:?}"
            );
        }
    }
}

#[test]
fn an_engine_pages_experts_under_its_memory_budget_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, _) = model(tmp.path());
    let (want, free) = common::engine_greedy(&m, None, 4, &PROMPT, 20);
    assert_eq!(free.expert_misses, 0);
    // Weights and KV do not fit whole: the experts page in what is left.
    let whole = m.weight_bytes() as u64;
    let budget = whole - m.expert_bytes() as u64 / 2;
    let (got, st) = common::engine_greedy(&m, Some(budget), 4, &PROMPT, 20);
    assert_eq!(
        got, want,
        "4 sessions under a {budget} B budget: other tokens"
    );
    assert!(st.expert_misses > 0 && st.expert_evictions > 0, "{st:?}");
    eprintln!(
        "engine, 4 sessions, {:.1} MB budget for {:.1} MB of weights: {} expert hits, {} misses, \
         {} evictions",
        budget as f64 / 1e6,
        whole as f64 / 1e6,
        st.expert_hits,
        st.expert_misses,
        st.expert_evictions
    );
    // Too small for one expert beside the rest: refused at start.
    let cfg = synapse_runtime::engine::EngineConfig {
        slots: 4,
        ctx: 128,
        ubatch: 32,
        step_tokens: 64,
        memory: Some(whole - m.expert_bytes() as u64),
        ..Default::default()
    };
    let Err(e) = synapse_runtime::engine::Scheduler::new(m, Arc::new(common::Ids), cfg) else {
        panic!("a budget without room for an expert was taken");
    };
    assert!(
        matches!(e, synapse_runtime::RuntimeError::MemoryBudget { .. }),
        "{e}"
    );
}

/// A package borrows its objects' mappings as a GGUF does its file's, so its routed experts
/// page too: the GGUF's logits at a quarter of the experts.
#[test]
fn a_packages_experts_page_as_its_ggufs_do() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, path) = model(tmp.path());
    let (want, _) = run(
        &mut Executor::new(m.clone(), 2).unwrap(),
        &PROMPT,
        12,
        &path,
    );
    let dir = tmp.path().join("pkg");
    common::import_dir(&path, &dir);
    let p = Arc::new(Model::load(&dir).unwrap());
    let mut ex = Executor::new(p.clone(), 2).unwrap();
    let budget = p.expert_bytes() as u64 / 4;
    ex.page_experts(Some(budget)).unwrap();
    // The package's objects mapped while it runs: at most the weights outside the experts
    // (every expert is read into the pager's slots, none of its pages mapped).
    let (got, peak) = run(&mut ex, &PROMPT, 12, &dir);
    assert_eq!(got, want, "the package's paged experts: other logits");
    let others = (p.weight_bytes() - p.expert_bytes()) as u64;
    eprintln!(
        "package objects mapped: peak {:.2} MB, weights outside the experts {:.2} MB",
        peak as f64 / 1e6,
        others as f64 / 1e6
    );
    // (Each object's last page rounded up: a few KB of slack.)
    assert!(peak <= others + (64 << 10), "{peak} > {others}");
    let pg = ex.expert_pager().unwrap();
    assert!(pg.resident_bytes() <= budget && pg.held_bytes() <= budget);
    let st = pg.stats();
    assert!(st.misses > 0 && st.evictions > 0, "{st:?}");
}

/// Experts re-encoded by a precision profile page like the file's own: through the variant
/// cache, each a memory-mapped object, read back into the pager's slots — the same logits as
/// the re-encoded model with every expert resident, within the budget; re-encoded without a
/// cache (copies in memory, nothing to page from) they are refused.
#[test]
fn re_encoded_experts_page_from_the_variant_cache() {
    use synapse_runtime::precision::{Precision, apply};
    let tmp = tempfile::tempdir().unwrap();
    let (m, _) = model(tmp.path());
    let q4 = common::through_cache(&m, Q4, &tmp.path().join("store"));
    assert!(q4.expert_bytes() < m.expert_bytes());
    let store = tmp.path().join("store");
    let mut full = Executor::new(q4.clone(), 2).unwrap();
    let (want, whole) = run(&mut full, &PROMPT, 16, &store);
    // What the variant objects outside the experts (every other linear) may keep mapped, and
    // what copying from a mapping may hold while it copies (see `mapped_experts_stay_within_the_budget`).
    let others = (q4.weight_bytes() - q4.expert_bytes()) as u64;
    for (frac, file_reads) in [(0.5, true), (0.25, true), (0.25, false)] {
        let mut ex = Executor::new(q4.clone(), 2).unwrap();
        ex.page_experts(Some(u64::MAX)).unwrap();
        let total = ex.expert_pager().unwrap().total_bytes();
        assert_eq!(total, q4.expert_bytes() as u64);
        let budget = (total as f64 * frac) as u64;
        ex.page_experts(Some(budget)).unwrap();
        ex.expert_pager_mut().unwrap().set_file_reads(file_reads);
        let (got, peak) = run(&mut ex, &PROMPT, 16, &store);
        assert_eq!(got, want, "q4 experts at {frac} (file reads {file_reads})");
        let allowed = others + if file_reads { 0 } else { 6 * (2 << 20) };
        eprintln!(
            "variant objects mapped: peak {:.2} MB, allowed {:.2} MB (whole model run: {:.2} MB)",
            peak as f64 / 1e6,
            allowed as f64 / 1e6,
            whole as f64 / 1e6
        );
        assert!(peak <= allowed, "{peak} > {allowed}");
        let p = ex.expert_pager().unwrap();
        let st = p.stats();
        assert!(p.resident_bytes() <= budget && p.held_bytes() <= budget);
        assert!(st.misses > 0 && st.evictions > 0, "{st:?}");
        eprintln!(
            "q4 experts at {:.0}% ({file_reads}): hit rate {:.3}, {} misses, {:.1} MB paged in",
            frac * 100.0,
            st.hit_rate(),
            st.misses,
            st.bytes_in as f64 / 1e6
        );
    }
    let owned = apply(&m, &Precision::parse_profile(Q4).unwrap(), None)
        .unwrap()
        .model;
    let mut ex = Executor::new(owned, 1).unwrap();
    let e = ex.page_experts(Some(u64::MAX)).unwrap_err().to_string();
    assert!(e.contains("without a variant cache"), "{e}");
}

/// An engine of `slots` sessions of 128 positions over `m` whose budget holds a quarter of the
/// source's experts beside the rest (the KV and scratch of this configuration probed first),
/// and that budget.
fn quarter_budget_engine(
    m: &Arc<Model>,
    slots: usize,
) -> (u64, synapse_runtime::engine::Scheduler) {
    use synapse_runtime::engine::{EngineConfig, Scheduler};
    let cfg = |memory| EngineConfig {
        slots,
        ctx: 128,
        ubatch: 32,
        step_tokens: 64,
        memory,
        ..EngineConfig::default()
    };
    let probe = Scheduler::new(m.clone(), Arc::new(common::Ids), cfg(Some(u64::MAX))).unwrap();
    let l = probe.ledger().unwrap();
    drop(probe);
    let src_exp = m.expert_bytes() as u64;
    let budget = m.weight_bytes() as u64 - src_exp + l.kv + l.scratch + src_exp / 4;
    let s = Scheduler::new(m.clone(), Arc::new(common::Ids), cfg(Some(budget))).unwrap();
    (budget, s)
}

/// A precision profile installed in an engine whose experts page (a budget below its
/// weights) pages its own experts in what the rest leaves: the same tokens as an unbudgeted
/// engine at that profile, the ledger on the new profile, its experts paged.
#[test]
fn a_profile_installed_under_a_memory_budget_pages_its_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, _) = model(tmp.path());
    let q4 = common::through_cache(&m, Q4, &tmp.path().join("store"));
    let (want, _) = common::engine_greedy(&q4, None, 4, &PROMPT, 20);
    let (budget, mut s) = quarter_budget_engine(&m, 4);
    assert!(
        s.ledger().unwrap().experts_budget.is_some(),
        "the source pages"
    );
    s.install(q4.clone()).unwrap();
    let l = s.ledger().unwrap();
    assert_eq!(l.experts, q4.expert_bytes() as u64);
    let eb = l
        .experts_budget
        .expect("q4's experts do not all fit: they page");
    assert!(eb >= q4.expert_bytes() as u64 / 2 && eb < q4.expert_bytes() as u64);
    let got = common::engine_greedy_on(&mut s, 4, &PROMPT, 20);
    assert_eq!(got, want, "q4 installed under {budget} B: other tokens");
    let st = s.stats();
    assert!(st.expert_misses > 0 && st.expert_evictions > 0, "{st:?}");
    eprintln!(
        "q4 installed under {:.1} MB: experts page in {:.1} of {:.1} MB; {} misses",
        budget as f64 / 1e6,
        eb as f64 / 1e6,
        q4.expert_bytes() as f64 / 1e6,
        st.expert_misses
    );
}

/// Under a memory budget two profiles never run at once: a profile installed while a session
/// runs on the source is accepted at once, the running session finishes on the source with the
/// source's tokens, and a session submitted after the install is admitted only once that one
/// has finished (its executor dropped), then runs on the new profile with that profile's
/// tokens. The paging counters, summed over the executors, never go down across the switch.
#[test]
fn a_profile_installed_while_sessions_run_waits_for_them_under_a_budget() {
    use synapse_runtime::engine::{Event, Request};
    let tmp = tempfile::tempdir().unwrap();
    let (m, _) = model(tmp.path());
    let q4 = common::through_cache(&m, Q4, &tmp.path().join("store"));
    let (want_src, _) = common::engine_greedy(&m, None, 1, &PROMPT, 20);
    let (want_q4, _) = common::engine_greedy(&q4, None, 1, &PROMPT, 20);
    assert_ne!(
        want_src, want_q4,
        "the profiles must differ for the test to say anything"
    );
    let (_, mut s) = quarter_budget_engine(&m, 2);
    let request = || {
        let mut r = Request::greedy(PROMPT.to_vec(), 20);
        r.stop_at_eog = false;
        r
    };
    let mut a = s.submit(request()).unwrap();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    while ta.len() < 3 {
        s.step();
        while let Some(e) = a.try_next() {
            if let Event::Token(t) = e {
                ta.push(t.id);
            }
        }
    }
    s.install(q4.clone()).unwrap();
    assert_eq!(s.executor().model().profile.hash(), q4.profile.hash());
    let mut b = s.submit(request()).unwrap();
    let (mut a_done, mut b_done, mut b_admitted) = (false, false, false);
    let mut misses = s.stats().expert_misses;
    let mut steps = 0;
    while !(a_done && b_done) {
        s.step();
        steps += 1;
        assert!(steps < 1000, "no progress");
        while let Some(e) = a.try_next() {
            match e {
                Event::Token(t) => ta.push(t.id),
                Event::Done(_) => a_done = true,
                Event::Error(e) => panic!("{e}"),
                _ => {}
            }
        }
        while let Some(e) = b.try_next() {
            match e {
                Event::Admitted { .. } => {
                    assert!(a_done, "admitted on the new profile while the old one ran");
                    b_admitted = true;
                }
                Event::Token(t) => tb.push(t.id),
                Event::Done(_) => b_done = true,
                Event::Error(e) => panic!("{e}"),
            }
        }
        let st = s.stats();
        assert!(
            !b_admitted || st.retired_profiles == 0,
            "the old profile's executor outlived its sessions: {st:?}"
        );
        assert!(
            st.expert_misses >= misses,
            "paging counters went down: {st:?}"
        );
        misses = st.expert_misses;
    }
    assert_eq!(ta, want_src[0], "the running session changed profile");
    assert_eq!(
        tb, want_q4[0],
        "the new session did not run on the installed profile"
    );
    assert!(s.stats().expert_misses > 0);
}
