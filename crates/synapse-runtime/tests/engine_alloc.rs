//! Steady decode steps allocate nothing: a counting global allocator around
//! `Scheduler::step` with several sessions decoding at once (one forward pass each step,
//! sampling, event delivery), after the first steps have grown every buffer.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use synapse_runtime::Model;
use synapse_runtime::engine::{EngineConfig, Event, Request, Scheduler, TokenPieces};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Count only the allocations of threads that set `HERE` (`false`: every thread's).
static ONLY_HERE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether an allocation now counts.
fn counts() -> bool {
    COUNTING.load(Ordering::Relaxed)
        && (!ONLY_HERE.load(Ordering::Relaxed) || HERE.try_with(|h| h.get()).unwrap_or(false))
}
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if counts() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if counts() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Token text is not what this test measures (a token's text is a new `String` in its event
/// by design): these pieces are empty.
struct NoText;

impl TokenPieces for NoText {
    fn piece(&self, _: u32) -> Vec<u8> {
        Vec::new()
    }
    fn piece_into(&self, _: u32, _: &mut Vec<u8>) {}
}

#[test]
fn steady_decode_steps_allocate_nothing() {
    let path = common::default_model();
    if !common::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let model = Arc::new(Model::load(&path).unwrap());
    steady_steps_allocate_nothing(model, |i| vec![2, 818 + i, 5279, 529]);
}

/// The mixture-of-experts blocks too (routing changes from step to step; the group buffers
/// are sized for the largest group a pass can have).
#[test]
fn steady_moe_decode_steps_allocate_nothing() {
    for family in ["mixtral", "qwen2moe"] {
        let Some((model, _)) = common::tiny_q8_model(family) else {
            return;
        };
        steady_steps_allocate_nothing(model, |i| vec![1, 40 + 13 * i, 300, 7]);
    }
}

fn steady_steps_allocate_nothing(model: Arc<Model>, prompt: impl Fn(u32) -> Vec<u32>) {
    let cfg = EngineConfig {
        slots: 6,
        ctx: 256,
        ubatch: 64,
        step_tokens: 64,
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(model, Arc::new(NoText), cfg).unwrap();
    let mut sessions: Vec<_> = (0..6u32)
        .map(|i| {
            let mut r = Request::greedy(prompt(i), 200);
            r.stop_at_eog = false;
            if i % 2 == 1 {
                r.sampling.temperature = 0.7;
                r.sampling.top_k = 20;
                r.sampling.seed = i as u64;
            }
            r
        })
        .map(|r| s.submit(r).unwrap())
        .collect();
    let drain = |sessions: &mut Vec<synapse_runtime::engine::Session>| {
        let mut n = 0;
        for ss in sessions.iter_mut() {
            while let Some(e) = ss.try_next() {
                assert!(!matches!(e, Event::Error(_)), "{e:?}");
                n += 1;
            }
        }
        n
    };
    // Warm-up: prefill, first decode steps (buffers grow to their steady size).
    for _ in 0..40 {
        s.step();
        drain(&mut sessions);
    }
    let mut events = 0;
    let mut worst = 0;
    let mut per_step = Vec::new();
    for _ in 0..64 {
        ALLOCS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        s.step();
        COUNTING.store(false, Ordering::Relaxed);
        worst = worst.max(ALLOCS.load(Ordering::Relaxed));
        per_step.push(ALLOCS.load(Ordering::Relaxed));
        events += drain(&mut sessions);
    }
    assert_eq!(events, 64 * 6, "one token event per session per step");
    assert_eq!(worst, 0, "steady decode steps allocated {per_step:?} times");
}

/// The same with exact escalation: steady rounds (draft passes, then the verify pass that
/// takes and truncates) allocate nothing either. On one compute thread, counting that
/// thread's allocations only: this test runs past 60 s on a loaded machine, and the test
/// harness's "has been running for over 60 seconds" line (82 bytes, and a 512-byte buffer,
/// on its own thread) would otherwise land in a counted step.
#[test]
fn steady_drafted_rounds_allocate_nothing() {
    let path = common::default_model();
    if !common::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let model = Arc::new(Model::load(&path).unwrap());
    let spec =
        synapse_runtime::precision::Precision::parse_profile("uniform:syn.q8.symmetric.g64.v1")
            .unwrap();
    let draft = synapse_runtime::precision::apply(&model, &spec, None)
        .unwrap()
        .model;
    let cfg = EngineConfig {
        slots: 6,
        ctx: 1024,
        ubatch: 64,
        step_tokens: 96,
        threads: 1,
        draft: Some(draft),
        draft_k: 4,
        draft_adaptive: false,
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(model, Arc::new(NoText), cfg).unwrap();
    let mut sessions: Vec<_> = (0..6u32)
        .map(|i| {
            let mut r = Request::greedy(vec![2, 818 + i, 5279, 529], 900);
            r.stop_at_eog = false;
            r.escalation = true;
            r
        })
        .map(|r| s.submit(r).unwrap())
        .collect();
    let (per_step, events) = steady_counts(&mut s, &mut sessions, 15, 20);
    let worst = per_step.iter().copied().max().unwrap_or(0);
    let st = s.stats();
    assert!(st.draft_accepted > 0, "{st:?}");
    assert!(
        events > 20 * 6,
        "drafting committed more than a token per step: {events}"
    );
    assert_eq!(
        worst, 0,
        "steady drafted rounds allocated {per_step:?} times"
    );
}

/// Head-drafted rounds (`EngineConfig::head_draft`: body passes in the sessions' own slots,
/// the shortlist's choices, the full head over the stored rows, taking and truncating)
/// allocate nothing either once the shortlist holds every token the sessions choose (a
/// token chosen off the list joins it: that gather allocates, by design). A tiny model with
/// its whole vocabulary on the list, beside plain decoding sessions.
#[test]
fn steady_head_drafted_rounds_allocate_nothing() {
    let Some((model, _)) = common::tiny_q8_model("llama") else {
        return;
    };
    let cfg = EngineConfig {
        slots: 4,
        ctx: 512,
        ubatch: 64,
        step_tokens: 64,
        threads: 1,
        head_draft: Some((0..model.vocab() as u32).collect()),
        draft_k: 4,
        draft_adaptive: false,
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(model, Arc::new(NoText), cfg).unwrap();
    let mut sessions: Vec<_> = (0..4u32)
        .map(|i| {
            let mut r = Request::greedy(vec![1, 40 + 13 * i, 300, 7], 450);
            r.stop_at_eog = false;
            r.escalation = i != 3;
            if i == 1 {
                r.sampling.repetition_penalty = 1.1;
            }
            r
        })
        .map(|r| s.submit(r).unwrap())
        .collect();
    // Warm-up past each stream's first channel block (32 events) and the penalty window
    // (64 tokens), whose buffers grow once.
    let (per_step, events) = steady_counts(&mut s, &mut sessions, 45, 30);
    let worst = per_step.iter().copied().max().unwrap_or(0);
    let st = s.stats();
    assert!(st.draft_accepted > 0, "{st:?}");
    assert!(
        events > 30 * 4,
        "drafting committed more than a token per step: {events}"
    );
    assert_eq!(
        worst, 0,
        "steady head-drafted rounds allocated {per_step:?} times"
    );
}

/// Steps `s` `warm` times, then `steps` times counting the allocations of this thread in
/// each step (the scheduler runs on it; on one compute thread nothing else of a step runs
/// elsewhere); returns the per-step counts and the events the sessions received meanwhile
/// (none may be an error).
fn steady_counts(
    s: &mut Scheduler,
    sessions: &mut [synapse_runtime::engine::Session],
    warm: usize,
    steps: usize,
) -> (Vec<u64>, usize) {
    let drain = |sessions: &mut [synapse_runtime::engine::Session]| {
        let mut n = 0;
        for ss in sessions.iter_mut() {
            while let Some(e) = ss.try_next() {
                assert!(!matches!(e, Event::Error(_)), "{e:?}");
                n += 1;
            }
        }
        n
    };
    for _ in 0..warm {
        s.step();
        drain(sessions);
    }
    let mut per_step = Vec::new();
    let mut events = 0;
    ONLY_HERE.store(true, Ordering::Relaxed);
    HERE.with(|h| h.set(true));
    for _ in 0..steps {
        ALLOCS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        s.step();
        COUNTING.store(false, Ordering::Relaxed);
        per_step.push(ALLOCS.load(Ordering::Relaxed));
        events += drain(sessions);
    }
    (per_step, events)
}
