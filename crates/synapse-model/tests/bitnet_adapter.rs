//! The BitNet b1.58 adapter on the tiny fixtures: both layouts' sub-norms and activations, the
//! GGUF's tied head, BitNet's W1.58A8 `quantization_config` read, every other one refused.

use std::path::{Path, PathBuf};

use synapse_formats::gguf::GgufFile;
use synapse_formats::safetensors::SafetensorsModel;
use synapse_model::{Activation, Family, FfnRegion, ModelError, ModelIr, SourceDesc, build_ir};

fn tiny(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny")
        .join(family)
}

fn hf(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelIr, ModelError> {
    let dir = tiny(family);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    let m = SafetensorsModel::open(&dir).unwrap();
    build_ir(&SourceDesc::from_safetensors(&cfg.to_string(), &m).unwrap())
}

fn dense_ffn(ir: &ModelIr, layer: usize) -> &synapse_model::Ffn {
    match &ir.layers[layer].ffn {
        FfnRegion::Dense(f) => f,
        FfnRegion::Moe(_) => panic!("layer {layer} is a MoE"),
    }
}

#[test]
fn both_layouts_build_with_their_sub_norms_and_activations() {
    for (family, act, tied) in [
        ("bitnet", Activation::Silu, true),
        ("bitnet-relu2", Activation::Relu2, false),
    ] {
        let ir = hf(family, |_| {}).unwrap();
        assert_eq!(ir.family, Family::Bitnet, "{family}");
        assert_eq!(ir.lm_head.tied, tied, "{family}");
        for l in 0..ir.layers.len() {
            let a = &ir.layers[l].attention;
            let sub = a.sub_norm.as_ref().expect("attn_sub_norm");
            assert_eq!(
                ir.weight(sub.weight).shape,
                vec![u64::from(a.n_heads * a.head_dim)]
            );
            let f = dense_ffn(&ir, l);
            assert_eq!(f.activation, act, "{family}");
            let fs = f.sub_norm.as_ref().expect("ffn_sub_norm");
            assert_eq!(ir.weight(fs.weight).shape, vec![512]);
        }
    }
    // transformers' BitNetConfig defaults to relu2 when hidden_act is absent.
    let ir = hf("bitnet-relu2", |c| {
        c.as_object_mut().unwrap().remove("hidden_act");
    })
    .unwrap();
    assert_eq!(dense_ffn(&ir, 0).activation, Activation::Relu2);
    // An activation BitNet does not define is refused.
    let e = hf("bitnet", |c| c["hidden_act"] = "gelu".into()).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedFeature { .. }), "{e}");
}

#[test]
fn ggufs_are_silu_with_a_tied_head_and_neox_rope() {
    for file in ["model.f32.gguf", "model.tq1_0.gguf", "model.tq2_0.gguf"] {
        let f = GgufFile::open(&tiny("bitnet").join(file)).unwrap();
        let ir = build_ir(&SourceDesc::from_gguf(&f).unwrap()).unwrap();
        assert_eq!(ir.family, Family::Bitnet);
        assert!(ir.lm_head.tied, "{file}");
        assert_eq!(dense_ffn(&ir, 1).activation, Activation::Silu);
        assert_eq!(
            ir.layers[0].attention.rope.style,
            synapse_model::RopeStyle::Neox
        );
        assert!(ir.layers[1].attention.sub_norm.is_some());
    }
}

#[test]
fn w158a8_is_read_and_other_quantization_configs_are_refused() {
    let ir = hf("bitnet-w158a8", |_| {}).unwrap();
    assert_eq!(
        ir.projection_quant,
        Some(synapse_model::ProjectionQuant::BitnetW158A8)
    );
    assert_eq!(hf("bitnet-relu2", |_| {}).unwrap().projection_quant, None);
    for (what, edit) in [
        (
            "offline",
            serde_json::json!({"quantization_mode": "offline"}),
        ),
        ("rms norm", serde_json::json!({"use_rms_norm": true})),
        (
            "bitlinear",
            serde_json::json!({"linear_class": "bitlinear"}),
        ),
        ("gptq", serde_json::json!({"quant_method": "gptq"})),
    ] {
        let e = hf("bitnet-w158a8", |c| {
            for (k, v) in edit.as_object().unwrap() {
                c["quantization_config"][k] = v.clone();
            }
        })
        .unwrap_err();
        match e {
            ModelError::UnsupportedFeature { what: w, .. } => {
                assert!(w.contains("quantization_config"), "{what}: {w}")
            }
            e => panic!("{what}: {e}"),
        }
    }
    // Another family with any quantization_config is refused.
    let e = hf("bitnet-w158a8", |c| c["model_type"] = "llama".into());
    assert!(e.is_err());
}
