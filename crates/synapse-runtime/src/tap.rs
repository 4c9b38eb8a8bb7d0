//! Taps: an observer of the intermediate tensors of a forward pass.
//!
//! An [`Executor`](crate::Executor) with a tap hands it every stage's activations of every
//! layer, rows × width, as the pass computes them (diagnosis against llama.cpp's own
//! intermediates, calibration capture). A tap only reads: a pass with a tap computes the same
//! bits as one without. Without a tap the executor pays one branch per stage.

/// A point of the forward pass, named after the tensor llama.cpp's graph computes there (see
/// [`Stage::llama_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The scaled token embeddings (`embd`).
    Embd,
    /// The attention input norm (`attn_norm-L`).
    AttnNorm,
    /// The query projection, bias added (`Qcur-L` before RoPE).
    Q,
    /// The key projection, bias added (`Kcur-L` before RoPE).
    K,
    /// The value projection, bias added (`Vcur-L`).
    V,
    /// Queries after the per-head norm and RoPE (`Qcur-L`, last form).
    QRope,
    /// Keys after the per-head norm and RoPE (`Kcur-L`, last form).
    KRope,
    /// The attention output before the output projection (`kqv_out-L`).
    KqvOut,
    /// The output projection (`attn_out-L`; before a post-attention norm).
    AttnOut,
    /// The residual after attention (`ffn_inp-L`).
    FfnInp,
    /// The FFN input norm (`ffn_norm-L`).
    FfnNorm,
    /// The gate projection (`ffn_gate-L`).
    FfnGate,
    /// The up projection (`ffn_up-L`).
    FfnUp,
    /// The gated activation (`ffn_swiglu-L` / `ffn_geglu-L`).
    FfnAct,
    /// The down projection (`ffn_out-L`; before a post-FFN norm).
    FfnOut,
    /// The layer's output residual (`l_out-L`).
    LOut,
    /// The final norm of the rows that want logits (`result_norm`).
    ResultNorm,
    /// The logits (`result_output`).
    ResultOutput,
}

impl Stage {
    /// The name llama.cpp's graph gives this tensor (without the `-L` layer suffix; for
    /// [`Stage::FfnAct`] the SwiGLU name).
    pub fn llama_name(self) -> &'static str {
        match self {
            Stage::Embd => "embd",
            Stage::AttnNorm => "attn_norm",
            Stage::Q | Stage::QRope => "Qcur",
            Stage::K | Stage::KRope => "Kcur",
            Stage::V => "Vcur",
            Stage::KqvOut => "kqv_out",
            Stage::AttnOut => "attn_out",
            Stage::FfnInp => "ffn_inp",
            Stage::FfnNorm => "ffn_norm",
            Stage::FfnGate => "ffn_gate",
            Stage::FfnUp => "ffn_up",
            Stage::FfnAct => "ffn_swiglu",
            Stage::FfnOut => "ffn_out",
            Stage::LOut => "l_out",
            Stage::ResultNorm => "result_norm",
            Stage::ResultOutput => "result_output",
        }
    }

    /// A short stable name of the stage (file names of dumps).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Embd => "embd",
            Stage::AttnNorm => "attn_norm",
            Stage::Q => "q",
            Stage::K => "k",
            Stage::V => "v",
            Stage::QRope => "q_rope",
            Stage::KRope => "k_rope",
            Stage::KqvOut => "kqv_out",
            Stage::AttnOut => "attn_out",
            Stage::FfnInp => "ffn_inp",
            Stage::FfnNorm => "ffn_norm",
            Stage::FfnGate => "ffn_gate",
            Stage::FfnUp => "ffn_up",
            Stage::FfnAct => "ffn_act",
            Stage::FfnOut => "ffn_out",
            Stage::LOut => "l_out",
            Stage::ResultNorm => "result_norm",
            Stage::ResultOutput => "result_output",
        }
    }
}

/// Receives a pass's intermediate tensors.
pub trait Tap: Send {
    /// Stage `stage` of layer `layer` (`None` outside the layers) computed `data`: `rows`
    /// rows of `data.len() / rows` values, in the pass's row order (for
    /// [`Stage::ResultNorm`] and [`Stage::ResultOutput`], only the rows that want logits).
    fn tensor(&mut self, stage: Stage, layer: Option<usize>, rows: usize, data: &[f32]);

    /// Routed expert `expert` of layer `layer`'s mixture computed from `data`: `rows` rows, in
    /// the order of the expert's group — at [`Stage::FfnNorm`] the normed rows routed to it
    /// (its gate and up projections' input), at [`Stage::FfnAct`] its gated activation (its
    /// down projection's input). Ignored unless a tap asks for it.
    fn expert_tensor(
        &mut self,
        stage: Stage,
        layer: usize,
        expert: usize,
        rows: usize,
        data: &[f32],
    ) {
        let _ = (stage, layer, expert, rows, data);
    }
}
