//! Sampling settings and the parts of sampling that run on the CPU: the final draw among the
//! top-k candidates the GPU returns, and a full CPU reference sampler over whole logits.

use std::fmt;

use wgemma_kernels::cpu;
use wgemma_kernels::ops::{PenaltyParams, RING_CAP, TOPK_MAX};

/// How the next token is chosen. The defaults are greedy decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: no limit). At most 64 candidates go through the
    /// top-p / min-p stage; a full-vocabulary draw (no top-k, top-p or min-p) is exact.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to `top_p` (1: off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// Subtract this times a recent token's count from its logit.
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every recent token.
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Same seed, same input: same output.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

/// Which GPU path a step takes for given settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Greedy,
    /// Exact sampling from the whole softmax by the Gumbel-max trick, on the GPU.
    Gumbel,
    /// The GPU returns the top `k` candidates; the CPU does top-p/min-p and the draw.
    TopK(u32),
}

/// A sampling setting outside the range where it means something.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{name} {value}: {rule}")]
pub struct SamplingError {
    /// The setting, as the CLI spells it (`temperature`, `top-p`).
    pub name: &'static str,
    /// The value given, as text.
    pub value: String,
    /// What is allowed, and why.
    pub rule: &'static str,
}

impl SamplingParams {
    /// Gemma's published sampling settings (temperature 1.0, top-k 64, top-p 0.95), which
    /// Ollama and the model cards use; `seed` picks the draw.
    pub fn gemma(seed: u64) -> Self {
        Self {
            temperature: 1.0,
            top_k: 64,
            top_p: 0.95,
            seed,
            ..Self::default()
        }
    }

    /// Checks every setting: NaN, infinities and values that select nothing (a negative
    /// temperature, a repeat penalty of 0 or below, top-p above 1) are errors rather than
    /// something silently different.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let err = |name, value: &dyn fmt::Display, rule| SamplingError {
            name,
            value: value.to_string(),
            rule,
        };
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(err(
                "temperature",
                &t,
                "must be 0 (greedy) or above, and finite",
            ));
        }
        if self.top_k > TOPK_MAX as usize {
            return Err(err(
                "top-k",
                &self.top_k,
                "must be at most 64, the candidates the GPU keeps (0: the whole vocabulary)",
            ));
        }
        let unit = "must be from 0 to 1";
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(err("top-p", &self.top_p, unit));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(err("min-p", &self.min_p, unit));
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(err(
                "repeat-penalty",
                &r,
                "must be above 0 and finite (1: off, above 1: fewer repeats)",
            ));
        }
        let finite = "must be a finite number";
        if !self.frequency_penalty.is_finite() {
            return Err(err("frequency-penalty", &self.frequency_penalty, finite));
        }
        if !self.presence_penalty.is_finite() {
            return Err(err("presence-penalty", &self.presence_penalty, finite));
        }
        if self.penalty_last_n > RING_CAP as usize {
            return Err(err(
                "penalty-last-n",
                &self.penalty_last_n,
                "must be at most 1024, the recent tokens the GPU keeps",
            ));
        }
        Ok(())
    }

    pub fn strategy(&self) -> Strategy {
        if self.temperature <= 0.0 || self.top_k == 1 {
            Strategy::Greedy
        } else if self.top_k == 0 && self.top_p >= 1.0 && self.min_p <= 0.0 {
            Strategy::Gumbel
        } else {
            let k = if self.top_k == 0 {
                TOPK_MAX as usize
            } else {
                self.top_k.min(TOPK_MAX as usize)
            };
            Strategy::TopK(k as u32)
        }
    }

    pub fn penalties(&self) -> Option<PenaltyParams> {
        let on = self.repeat_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0;
        (on && self.penalty_last_n > 0).then_some(PenaltyParams {
            repeat: self.repeat_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        })
    }

    /// The 32-bit seed the GPU's Gumbel noise uses.
    pub fn seed32(&self) -> u32 {
        (self.seed ^ (self.seed >> 32)) as u32
    }

    /// The seed of the candidate draw's stream (distinct from the Gumbel noise's).
    pub fn draw_seed(&self) -> u32 {
        self.seed32() ^ 0x5bd1_e995
    }

    /// The settings of the GPU sampling kernels at `step`.
    pub fn gpu_params(&self, step: u32, vocab: u32) -> wgemma_kernels::ops::SampleParams {
        wgemma_kernels::ops::SampleParams {
            k: match self.strategy() {
                Strategy::TopK(k) => k,
                _ => 1,
            },
            seed: self.draw_seed(),
            step,
            temperature: self.temperature,
            top_p: self.top_p,
            min_p: self.min_p,
            last_n: self.penalty_last_n as u32,
            penalties: self.penalties().unwrap_or(PenaltyParams {
                repeat: 1.0,
                frequency: 0.0,
                presence: 0.0,
            }),
            vocab,
        }
    }

    /// The uniform number of the candidate draw at `step`.
    pub fn uniform(&self, step: u32) -> f32 {
        cpu::uniform(self.draw_seed(), step, u32::MAX)
    }
}

/// The whole sampling step on the CPU, over full logits (the reference of the GPU path).
pub fn sample_cpu(logits: &[f32], p: &SamplingParams, history: &[u32], step: u32) -> u32 {
    let mut logits = logits.to_vec();
    if let Some(pen) = p.penalties() {
        let last_n = p.penalty_last_n.min(wgemma_kernels::ops::RING_CAP as usize);
        cpu::penalties(&mut logits, &cpu::recent_counts(history, last_n), pen);
    }
    match p.strategy() {
        Strategy::Greedy => cpu::argmax(&logits).0,
        Strategy::Gumbel => cpu::gumbel_argmax(&logits, p.seed32(), step, p.temperature),
        Strategy::TopK(k) => {
            let cands = cpu::top_k(&logits, k as usize);
            cpu::draw(&cands, p.temperature, p.top_p, p.min_p, p.uniform(step)).unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_follow_the_settings() {
        let greedy = SamplingParams::default();
        assert_eq!(greedy.strategy(), Strategy::Greedy);
        let t = SamplingParams {
            temperature: 0.8,
            ..Default::default()
        };
        assert_eq!(t.strategy(), Strategy::Gumbel);
        let k = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            ..Default::default()
        };
        assert_eq!(k.strategy(), Strategy::TopK(40));
        let pp = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            ..Default::default()
        };
        assert_eq!(pp.strategy(), Strategy::TopK(64));
        assert!(greedy.penalties().is_none());
    }

    #[test]
    fn draws_respect_top_p_min_p_and_the_seed() {
        let cands = [(5u32, 10.0f32), (7, 9.0), (1, 5.0), (2, 1.0)];
        // top_p 0.5 keeps only the first (p ~ 0.73).
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(cpu::draw(&cands, 1.0, 0.5, 0.0, u), Some(5));
        }
        // min_p 0.2 keeps 5 and 7 (p(7)/p(5) = e^-1 = 0.37).
        assert_eq!(cpu::draw(&cands, 1.0, 1.0, 0.2, 0.99), Some(7));
        assert_eq!(cpu::draw(&cands, 1.0, 1.0, 0.0, 0.999_999), Some(2));
        let a = SamplingParams {
            seed: 7,
            ..Default::default()
        };
        assert_eq!(a.uniform(3), a.uniform(3));
        assert_ne!(a.uniform(3), a.uniform(4));
        assert!((0.0..1.0).contains(&a.uniform(9)));
        assert_eq!(
            cpu::recent_counts(&[1, 2, 2, 3, 2], 3),
            vec![(2, 2), (3, 1)]
        );
    }
}
