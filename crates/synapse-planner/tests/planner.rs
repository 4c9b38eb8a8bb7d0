//! Placement behaviour: objectives, kernel support, memory, floors, replicas, exact vs heuristic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use synapse_planner::{
    Device, EncodingCost, Layer, Link, LinkSpec, Objective, PlanError, PlanRequest, TensorSpec,
    compare_exact_and_heuristic, plan,
};

fn dev(name: &str, memory: u64, rates: &[(&str, f64)], overhead: f64) -> Device {
    Device {
        name: name.into(),
        memory_bytes: memory,
        stream_rate: rates
            .iter()
            .map(|(e, r)| (e.to_string(), *r))
            .collect::<BTreeMap<_, _>>(),
        dispatch_overhead_s: overhead,
    }
}

fn opt(e: &str, bytes: u64, d: f64) -> EncodingCost {
    EncodingCost {
        encoding: e.into(),
        bytes,
        distortion: d,
    }
}

fn uniform_layers(n: usize, options: &[EncodingCost], act: u64, kv: u64) -> Vec<Layer> {
    (0..n)
        .map(|i| Layer {
            tensors: vec![TensorSpec {
                name: format!("blk.{i}.w"),
                options: options.to_vec(),
            }],
            activation_bytes: act,
            kv_bytes_per_token: kv,
        })
        .collect()
}

fn all_links(devices: &[Device], link: Link) -> Vec<LinkSpec> {
    let mut v = Vec::new();
    for (i, a) in devices.iter().enumerate() {
        for b in &devices[i + 1..] {
            v.push(LinkSpec {
                a: a.name.clone(),
                b: b.name.clone(),
                link,
            });
        }
    }
    v
}

const LAN: Link = Link {
    latency_s: 1e-3,
    bandwidth_bytes_per_s: 1e9,
};

fn request(devices: Vec<Device>, layers: Vec<Layer>, objective: Objective) -> PlanRequest {
    PlanRequest {
        links: all_links(&devices, LAN),
        devices,
        layers,
        context_length: 0,
        objective,
        quality_floor: None,
        allow_approximation: false,
        max_replicas: 1,
    }
}

fn two_unequal() -> PlanRequest {
    let rates_a = [("bf16", 2e9), ("q8", 2e9)];
    let rates_b = [("bf16", 1e9), ("q8", 1e9)];
    let devices = vec![
        dev("fast", 10_000_000_000, &rates_a, 1e-3),
        dev("slow", 10_000_000_000, &rates_b, 1e-3),
    ];
    let layers = uniform_layers(
        12,
        &[opt("bf16", 200_000_000, 0.0), opt("q8", 100_000_000, 0.01)],
        4096,
        0,
    );
    request(devices, layers, Objective::Throughput)
}

#[test]
fn throughput_skews_the_split_and_latency_takes_the_fast_device() {
    let req = two_unequal();
    let p = plan(&req).unwrap();
    assert!(p.exact);
    let st = &p.pipelines[0].stages;
    assert_eq!(st.len(), 2);
    let count = |name: &str| {
        st.iter()
            .filter(|s| s.device == name)
            .map(|s| s.layers.len())
            .sum::<usize>()
    };
    assert_eq!(
        (count("fast"), count("slow")),
        (8, 4),
        "split proportional to measured speed"
    );
    assert!((p.pipelines[0].bottleneck_s - 0.801).abs() < 1e-9);
    assert!(
        st.iter().all(|s| s.encodings.values().all(|e| e == "bf16")),
        "memory allows full precision"
    );

    let p = plan(&PlanRequest {
        objective: Objective::Latency,
        ..req
    })
    .unwrap();
    let st = &p.pipelines[0].stages;
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].device, "fast");
    assert_eq!(st[0].layers, 0..12);
    assert!((p.latency_s - 1.201).abs() < 1e-9);
}

#[test]
fn unsupported_encodings_are_never_placed() {
    // "fast" holds only 4 layers even at q4, so the q4-only device must take the rest.
    let devices = vec![
        dev("fast", 400, &[("bf16", 4e3), ("q8", 4e3), ("q4", 4e3)], 0.0),
        dev("q4only", 10_000, &[("q4", 1e3)], 0.0),
        dev("alien", 1_000_000, &[("syn.foreign.v9", 1e9)], 0.0),
    ];
    let layers = uniform_layers(
        10,
        &[
            opt("bf16", 400, 0.0),
            opt("q8", 200, 0.01),
            opt("q4", 100, 0.1),
        ],
        8,
        0,
    );
    for objective in [Objective::Latency, Objective::Throughput] {
        let p = plan(&request(devices.clone(), layers.clone(), objective)).unwrap();
        let mut covered = 0;
        for s in &p.pipelines[0].stages {
            let d = devices.iter().find(|d| d.name == s.device).unwrap();
            assert_ne!(s.device, "alien");
            for e in s.encodings.values() {
                assert!(d.stream_rate.contains_key(e), "{} got {e}", s.device);
            }
            covered += s.layers.len();
        }
        assert_eq!(covered, 10);
        assert!(p.pipelines[0].stages.iter().any(|s| s.device == "q4only"));
    }
}

#[test]
fn encodings_are_importance_aware_and_kv_is_reserved() {
    let layer = Layer {
        tensors: vec![
            TensorSpec {
                name: "a".into(),
                options: vec![opt("bf16", 100, 0.0), opt("q8", 50, 0.5)],
            },
            TensorSpec {
                name: "b".into(),
                options: vec![opt("bf16", 100, 0.0), opt("q8", 50, 0.01)],
            },
        ],
        activation_bytes: 0,
        kv_bytes_per_token: 1,
    };
    let d = dev("d", 160, &[("bf16", 1e3), ("q8", 1e3)], 0.0);
    let mut req = request(vec![d], vec![layer], Objective::Latency);
    // 160 bytes: both at bf16 (200) do not fit; demote the one that loses least per byte: b.
    let p = plan(&req).unwrap();
    let enc = &p.pipelines[0].stages[0].encodings;
    assert_eq!((enc["a"].as_str(), enc["b"].as_str()), ("bf16", "q8"));
    // a 20-token KV reservation leaves 140 bytes: both must be q8
    req.context_length = 20;
    let p = plan(&req).unwrap();
    let s = &p.pipelines[0].stages[0];
    assert_eq!(s.kv_bytes, 20);
    assert!(s.encodings.values().all(|e| e == "q8"));
    // a quality floor of 0.1 forbids a@q8 unless approximation is opted into
    req.quality_floor = Some(0.1);
    assert_eq!(
        plan(&req),
        Err(PlanError::ApproximationNotAllowed { floor: 0.1 })
    );
    req.allow_approximation = true;
    assert!(plan(&req).is_ok());
    // 70 tokens of KV leave 90 bytes: nothing fits
    req.context_length = 70;
    assert_eq!(
        plan(&req),
        Err(PlanError::InsufficientMemory {
            needed_bytes: 170,
            cluster_bytes: 160
        })
    );
}

#[test]
fn replicas_multiply_throughput_when_one_device_holds_the_model() {
    let devices: Vec<Device> = (0..4)
        .map(|i| dev(&format!("d{i}"), 1_000, &[("q8", 1e3)], 0.01))
        .collect();
    let layers = uniform_layers(4, &[opt("q8", 100, 0.0)], 64, 0);
    let mut req = request(devices, layers, Objective::Throughput);
    let single = plan(&req).unwrap();
    req.max_replicas = 4;
    let p = plan(&req).unwrap();
    assert_eq!(p.pipelines.len(), 4);
    assert!(
        p.pipelines
            .iter()
            .all(|q| q.stages.len() == 1 && q.stages[0].layers == (0..4))
    );
    assert!((p.tokens_per_s - 4.0 / 0.41).abs() < 1e-9);
    assert!(p.tokens_per_s > single.tokens_per_s);
}

#[test]
fn invalid_requests_are_typed_errors() {
    let mut req = two_unequal();
    req.devices[0].stream_rate.insert("q8".into(), 0.0);
    assert!(matches!(plan(&req), Err(PlanError::InvalidRequest { .. })));
    let mut req = two_unequal();
    req.layers[0].tensors[0].options = vec![opt("q3", 1, 0.0)];
    assert_eq!(
        plan(&req),
        Err(PlanError::UnsupportedEverywhere {
            tensor: "blk.0.w".into()
        })
    );
}

fn objective_cost(p: &synapse_planner::Plan) -> f64 {
    match p.objective {
        Objective::Latency => p.pipelines[0].latency_s,
        Objective::Throughput => p.pipelines[0].bottleneck_s,
    }
}

fn arb_device(i: usize) -> impl Strategy<Value = Device> {
    (
        100u64..2000,
        1.0f64..10.0,
        1.0f64..10.0,
        0.0f64..0.05,
        any::<bool>(),
    )
        .prop_map(move |(mem, r8, r4, o, has8)| {
            let mut rates = vec![("q4", r4 * 100.0)];
            if has8 {
                rates.push(("q8", r8 * 100.0));
            }
            dev(&format!("d{i}"), mem, &rates, o)
        })
}

fn arb_cluster() -> impl Strategy<Value = Vec<Device>> {
    (2usize..5).prop_flat_map(|n| (0..n).map(arb_device).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Identical layers and uniform links: the heuristic equals the exact search.
    #[test]
    fn heuristic_is_exact_on_identical_layers(
        devices in arb_cluster(), n_layers in 1usize..7, b8 in 50u64..300, kv in 0u64..20,
        lat in 0.0f64..0.1, throughput in any::<bool>(),
    ) {
        let objective = if throughput { Objective::Throughput } else { Objective::Latency };
        let layers = uniform_layers(n_layers, &[opt("q8", b8, 0.0), opt("q4", b8 / 2, 0.1)], 16, kv);
        let mut req = request(devices, layers, objective);
        req.links = all_links(&req.devices, Link { latency_s: lat, bandwidth_bytes_per_s: 1e4 });
        req.context_length = 4;
        let (e, h) = compare_exact_and_heuristic(&req).unwrap();
        match (e, h) {
            (Some(e), Some(h)) => prop_assert!((objective_cost(&e) - objective_cost(&h)).abs() <= 1e-9 * objective_cost(&e).max(1.0),
                "exact {} heuristic {}", objective_cost(&e), objective_cost(&h)),
            (None, None) => {}
            (e, h) => prop_assert!(false, "feasibility differs: exact {} heuristic {}", e.is_some(), h.is_some()),
        }
    }

    /// Arbitrary layers and links: the heuristic is never better than exact (it searches a
    /// subset), never worse than the best single-device plan, and every plan respects memory.
    #[test]
    fn heuristic_bounded_by_exact_and_single_device(
        devices in arb_cluster(),
        sizes in prop::collection::vec((20u64..300, 0u64..10, 1u64..64), 1..6),
        lats in prop::collection::vec(0.0f64..0.1, 6),
        throughput in any::<bool>(),
    ) {
        let objective = if throughput { Objective::Throughput } else { Objective::Latency };
        let layers: Vec<Layer> = sizes.iter().enumerate().map(|(i, &(b, kv, act))| Layer {
            tensors: vec![TensorSpec { name: format!("t{i}"), options: vec![opt("q8", b, 0.0), opt("q4", b / 2 + 1, 0.2)] }],
            activation_bytes: act,
            kv_bytes_per_token: kv,
        }).collect();
        let mut req = request(devices, layers, objective);
        for (k, l) in req.links.iter_mut().enumerate() {
            l.link.latency_s = lats[k % lats.len()];
        }
        req.context_length = 3;
        let (e, h) = compare_exact_and_heuristic(&req).unwrap();
        if let Some(h) = &h {
            let e = e.as_ref().expect("heuristic feasible implies exact feasible");
            prop_assert!(objective_cost(e) <= objective_cost(h) + 1e-12);
            for p in [e, h] {
                for s in &p.pipelines[0].stages {
                    let d = req.devices.iter().find(|d| d.name == s.device).unwrap();
                    prop_assert!(s.weight_bytes + s.kv_bytes <= d.memory_bytes);
                }
            }
        }
        // single-device plans bound the heuristic
        for d in &req.devices {
            let solo = PlanRequest { devices: vec![d.clone()], links: vec![], ..req.clone() };
            if let Ok(s) = plan(&solo) {
                let h = h.as_ref().expect("a feasible single device is in the heuristic's space");
                prop_assert!(objective_cost(h) <= objective_cost(&s) + 1e-12);
            }
        }
    }
}

/// A 32-layer model (7 tensors a layer, three encodings each) on the largest exact cluster and
/// on a cluster past it: both searches finish and place every layer once.
#[test]
fn realistic_sizes_finish() {
    let options = [
        opt("bf16", 4_000_000, 0.0),
        opt("q8", 2_100_000, 0.001),
        opt("q4", 1_100_000, 0.02),
    ];
    let layers: Vec<Layer> = (0..32)
        .map(|i| Layer {
            tensors: (0..7)
                .map(|t| TensorSpec {
                    name: format!("blk.{i}.t{t}"),
                    options: options.to_vec(),
                })
                .collect(),
            activation_bytes: 8192,
            kv_bytes_per_token: 1_024,
        })
        .collect();
    for n in [synapse_planner::EXACT_MAX_DEVICES, 12] {
        let devices: Vec<Device> = (0..n)
            .map(|i| {
                let r = 1e9 * (1.0 + i as f64 * 0.5);
                dev(
                    &format!("d{i}"),
                    150_000_000 + 20_000_000 * i as u64,
                    &[("bf16", r), ("q8", r * 1.8), ("q4", r * 3.0)],
                    2e-4,
                )
            })
            .collect();
        let mut req = request(devices, layers.clone(), Objective::Throughput);
        req.context_length = 4096;
        let p = plan(&req).unwrap();
        assert_eq!(p.exact, n <= synapse_planner::EXACT_MAX_DEVICES);
        let covered: usize = p.pipelines[0].stages.iter().map(|s| s.layers.len()).sum();
        assert_eq!(covered, 32);
        assert!(p.tokens_per_s > 0.0);
    }
}

/// One unsplittable heavy layer on the fast device sets the bottleneck; the two small layers
/// can follow on the slow or the medium device without changing it. The planner returns the
/// lower-latency plan (medium), not merely the first plan that reaches the bottleneck (the slow
/// device comes first in the search order).
#[test]
fn throughput_ties_are_broken_by_latency() {
    let devices = vec![
        dev("fast", 1_000_000, &[("q8", 1e3)], 0.001),
        dev("slow", 1_000_000, &[("q8", 250.0)], 0.001),
        dev("medium", 1_000_000, &[("q8", 900.0)], 0.001),
    ];
    let mut layers = uniform_layers(3, &[opt("q8", 100, 0.0)], 16, 0);
    layers[0].tensors[0].options = vec![opt("q8", 1000, 0.0)];
    let p = plan(&request(devices, layers, Objective::Throughput)).unwrap();
    let q = &p.pipelines[0];
    assert!((q.bottleneck_s - 1.001).abs() < 1e-12);
    let names: Vec<&str> = q.stages.iter().map(|s| s.device.as_str()).collect();
    assert_eq!(names, ["fast", "medium"]);
    assert!((q.latency_s - (1.001 + (200.0 / 900.0 + 0.001) + 1e-3 + 16e-9)).abs() < 1e-9);
}
