//! Mixture-of-experts adapters: the IR they build from the tiny fixtures (GGUF's stacked
//! experts and transformers' per-expert or fused layouts), typed errors for malformed MoE
//! sources, and the fingerprints of dense models unchanged by the MoE additions to the IR.

use std::path::{Path, PathBuf};

use synapse_formats::gguf::GgufFile;
use synapse_formats::safetensors::SafetensorsModel;
use synapse_model::{FfnRegion, ModelError, ModelIr, Routing, SourceDesc, build_ir};

fn tiny(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny")
        .join(family)
}

fn gguf_desc(family: &str, file: &str) -> SourceDesc {
    let f = GgufFile::open(&tiny(family).join(file)).unwrap();
    SourceDesc::from_gguf(&f).unwrap()
}

fn hf_desc(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> SourceDesc {
    let dir = tiny(family);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    let m = SafetensorsModel::open(&dir).unwrap();
    SourceDesc::from_safetensors(&cfg.to_string(), &m).unwrap()
}

fn moe(ir: &ModelIr, layer: usize) -> &synapse_model::Moe {
    match &ir.layers[layer].ffn {
        FfnRegion::Moe(m) => m,
        FfnRegion::Dense(_) => panic!("layer {layer} is dense"),
    }
}

#[test]
fn dense_fingerprints_are_unchanged_by_the_moe_ir() {
    // Computed by the IR before mixtures of experts existed (commit cb66181): packages,
    // prefix caches and importance maps keyed by these stay valid.
    for (family, want) in [
        (
            "llama",
            "7efef83c0ed8df97e1958bd280148f1bde2a1b8aaf1f0fc90f9d2b6ccd6f1d51",
        ),
        (
            "qwen2",
            "5fb0b8403b19721f5275b07737a6f025b66002dc98b4667d0e752d150cd0933b",
        ),
        (
            "gemma3",
            "7dd0eb738bf361e26d49a971d4a606a50ba0f2060aec8b1f4b1940ec962f3aa1",
        ),
    ] {
        let ir = build_ir(&gguf_desc(family, "model.q8_0.gguf")).unwrap();
        assert_eq!(ir.fingerprint, want, "{family}");
        let json = serde_json::to_string(&ir).unwrap();
        for key in ["residual_scale", "logit_scale", "\"router\"", "sub_norm"] {
            assert!(!json.contains(key), "{family}: {key} in a dense IR");
        }
        // And the JSON reads back to the same IR (the untagged FFN region).
        let back: ModelIr = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ir, "{family}");
    }
}

#[test]
fn moe_irs_from_gguf_and_transformers_agree_on_structure() {
    for (family, n_expert, renorm_gguf, renorm_hf) in [
        ("olmoe", 4, false, Some(false)),
        ("granitemoe", 4, true, None),
        ("qwen2moe", 4, false, Some(false)),
        ("mixtral", 8, true, Some(true)),
    ] {
        let g = build_ir(&gguf_desc(family, "model.f32.gguf")).unwrap();
        let h = build_ir(&hf_desc(family, |_| {})).unwrap();
        assert!(g.is_moe() && h.is_moe(), "{family}");
        for (ir, src) in [(&g, "gguf"), (&h, "hf")] {
            let m = moe(ir, 1);
            assert_eq!(m.experts.len(), n_expert, "{family} {src}");
            assert_eq!(m.n_used, 2, "{family} {src}");
            assert_eq!(m.shared.is_some(), family == "qwen2moe", "{family} {src}");
            // Every expert's three projections are distinct and of the expert FFN width.
            for e in &m.experts {
                assert_eq!(e.gate.out_features, 64);
                assert_eq!(e.down.in_features, 64);
                assert_eq!(e.up.in_features, 64);
            }
            // The JSON round-trips (the untagged region picks the mixture).
            let back: ModelIr = serde_json::from_str(&serde_json::to_string(ir).unwrap()).unwrap();
            assert_eq!(&back, ir, "{family} {src}");
        }
        // GGUF: stacked experts; transformers: per-expert tensors, except GraniteMoE's fused
        // input_linear (gate rows, then up rows of each expert).
        let (mg, mh) = (moe(&g, 0), moe(&h, 0));
        assert_eq!(mg.experts[3].gate.expert, Some(3), "{family}");
        assert_eq!(
            mg.routing,
            Routing::SoftmaxTopK {
                renormalize: renorm_gguf
            },
            "{family}"
        );
        match renorm_hf {
            Some(r) => {
                assert_eq!(mh.routing, Routing::SoftmaxTopK { renormalize: r });
                assert_eq!(mh.experts[3].gate.expert, None, "{family}");
            }
            None => {
                assert_eq!(mh.routing, Routing::TopKSoftmax);
                let e = &mh.experts[3];
                assert_eq!((e.gate.weight, e.gate.row_offset), (e.up.weight, 0));
                assert_eq!(e.up.row_offset, 64);
            }
        }
    }
    // Granite's multipliers reach the IR from both sources (1/4 logit scale, ×0.22 residual).
    for ir in [
        build_ir(&gguf_desc("granitemoe", "model.f32.gguf")).unwrap(),
        build_ir(&hf_desc("granitemoe", |_| {})).unwrap(),
    ] {
        assert_eq!(ir.lm_head.logit_scale, Some(0.25));
        assert_eq!(ir.residual_scale, Some(0.22));
        assert_eq!(ir.embedding.scale, 12.0);
        assert_eq!(ir.layers[0].attention.scale, 0.0625);
    }
    // OLMoE's q/k norms span the whole projection.
    let o = build_ir(&gguf_desc("olmoe", "model.f32.gguf")).unwrap();
    let q_norm = o.layers[0].attention.q_norm.as_ref().unwrap();
    assert_eq!(o.weight(q_norm.weight).n_elements(), 64);
}

#[test]
fn malformed_moe_sources_are_typed_errors() {
    // More experts per token than experts.
    let e = build_ir(&hf_desc("mixtral", |c| c["num_experts_per_tok"] = 9.into())).unwrap_err();
    assert!(
        matches!(e, ModelError::InvalidValue { ref key, .. } if key.contains("expert")),
        "{e}"
    );
    // A config that says more or fewer experts than the checkpoint stores: the router's
    // shape gives it away.
    for (family, key, n) in [
        ("olmoe", "num_experts", 5),
        ("mixtral", "num_local_experts", 7),
    ] {
        let e = build_ir(&hf_desc(family, |c| c[key] = n.into())).unwrap_err();
        assert!(
            matches!(e, ModelError::ShapeMismatch { ref name, .. } if name.contains("gate")),
            "{e}"
        );
    }
    // OLMoE's q/k/v clamp is read (and must be positive); other families do not define it.
    let ir = build_ir(&hf_desc("olmoe", |c| c["clip_qkv"] = 8.0.into())).unwrap();
    assert!(ir.layers.iter().all(|l| l.attention.clip_qkv == Some(8.0)));
    let ir = build_ir(&hf_desc("olmoe", |c| {
        c["clip_qkv"] = serde_json::Value::Null
    }))
    .unwrap();
    assert!(ir.layers.iter().all(|l| l.attention.clip_qkv.is_none()));
    let e = build_ir(&hf_desc("olmoe", |c| c["clip_qkv"] = (-1.0).into())).unwrap_err();
    assert!(matches!(e, ModelError::InvalidValue { .. }), "{e}");
    let e = build_ir(&hf_desc("mixtral", |c| c["clip_qkv"] = 8.0.into())).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedFeature { .. }), "{e}");
    // A dense layer in Qwen2-MoE (`mlp_only_layers`) expects the dense MLP's tensors.
    let e = build_ir(&hf_desc("qwen2moe", |c| {
        c["mlp_only_layers"] = serde_json::json!([1])
    }))
    .unwrap_err();
    assert!(
        matches!(e, ModelError::MissingTensor { ref name, .. } if name.contains("mlp.gate_proj")),
        "{e}"
    );
}
