//! Log-probabilities of the sampled token and of the most likely ones, for clients that ask
//! (OpenAI's `logprobs` / `top_logprobs`): of the model's distribution, softmax of the raw
//! logits (after the final softcap, before penalties and temperature). Each step copies the
//! raw logits aside before the sampler rewrites them, takes their log-sum-exp and top N, and
//! after the sampler the sampled token's logit, copied with the step into a mappable buffer
//! kept for it; one small readback per step.

use wgemma_kernels::ops::{self, SampleKernel};
use wgemma_kernels::{DType, Dispatch, GpuContext, GpuError, Recorder, Tensor, View, wgpu};

/// The most likely tokens a step reports at most (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// A step's log-probabilities: of the sampled token, and the `top` most likely tokens with
/// theirs, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Where the output buffer keeps what is read back (words): the token, its logit, then
/// `row_stats`' (argmax, max, log-sum-exp, entropy) from word 4; the top pairs from byte
/// 256 (a binding's offset alignment).
const STATS_AT: u32 = 4;
const TOP_AT_BYTES: u64 = 256;

/// The dispatches of a session's log-probabilities for `top` tokens, built once.
pub(super) struct LogprobPlan {
    pub(super) top: u32,
    raw: View,
    out: View,
    /// Where each step copies `out` for the CPU to read.
    staging: wgpu::Buffer,
    stats: Dispatch,
    top_k: Option<ops::TopK>,
    pick: Dispatch,
}

impl LogprobPlan {
    /// The plan for logits of `vocab` values and the `top` most likely tokens; `scratch` is
    /// top-k's (`ops::TopK::scratch_words(vocab, top)` words at least).
    pub(super) fn new(
        ctx: &GpuContext,
        vocab: u32,
        top: u32,
        scratch: &View,
    ) -> Result<Self, GpuError> {
        let top = top.min(MAX_TOP_LOGPROBS);
        let raw = View::of(&ctx.storage("raw logits", u64::from(vocab) * 4));
        let out_bytes = TOP_AT_BYTES + 8 * u64::from(MAX_TOP_LOGPROBS);
        let out = View::of(&ctx.storage("logprobs", out_bytes));
        let staging = ctx.readback_buffer("logprobs readback", out_bytes);
        let logits = Tensor::of(&raw, DType::F32, &[1, vocab])?;
        let stats_out = Tensor::strided(&out, DType::F32, &[4], &[1], STATS_AT)?;
        let stats = ops::row_stats(ctx, &logits, 1.0, &stats_out)?;
        let top_k = if top > 0 {
            let pairs = out.slice(TOP_AT_BYTES, 8 * u64::from(top))?;
            Some(ops::top_k(ctx, &raw, vocab, top, scratch, &pairs)?)
        } else {
            None
        };
        let params = crate::sampling::SamplingParams::default().gpu_params(0, vocab);
        let pick = ops::sample_kernel(ctx, SampleKernel::Pick, &raw, &out, &params)?;
        Ok(Self {
            top,
            raw,
            out,
            staging,
            stats,
            top_k,
            pick,
        })
    }

    /// Before the sampler: the raw logits aside, their log-sum-exp and top tokens.
    pub(super) fn record_before(&self, rec: &mut Recorder<'_>, logits: &View) {
        rec.copy(logits, &self.raw, self.raw.size);
        rec.run(&self.stats);
        if let Some(t) = &self.top_k {
            rec.run(&t.partial);
            rec.run(&t.finish);
        }
    }

    /// After the sampler: the sampled token (from `result`) and its raw logit, and all of it
    /// into the staging buffer.
    pub(super) fn record_after(&self, rec: &mut Recorder<'_>, result: &View) {
        rec.copy(result, &self.out, 4);
        rec.run(&self.pick);
        rec.copy(&self.out, &View::of(&self.staging), self.out.size);
    }

    /// Reads what the last step recorded (once it has run).
    pub(super) async fn read(&self, ctx: &GpuContext) -> Result<TokenLogprobs, GpuError> {
        let bytes = ctx.map_and_copy(&self.staging, self.out.size).await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let word = |i: u64| words.get(i as usize).copied().unwrap_or(0);
        let lse = f32::from_bits(word(u64::from(STATS_AT) + 2));
        let top_at = TOP_AT_BYTES / 4;
        let top = (0..u64::from(self.top))
            .map(|r| {
                let id = word(top_at + 2 * r);
                (id, f32::from_bits(word(top_at + 2 * r + 1)) - lse)
            })
            .collect();
        Ok(TokenLogprobs {
            token: word(0),
            logprob: f32::from_bits(word(1)) - lse,
            top,
        })
    }
}
