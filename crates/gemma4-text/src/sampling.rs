//! Sampling settings and the parts of sampling that run on the CPU: the final draw among the
//! top-k candidates the GPU returns, and a full CPU reference sampler over whole logits.

use wgemma_kernels::cpu;
use wgemma_kernels::ops::{PenaltyParams, TOPK_MAX};

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

impl SamplingParams {
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

    /// The uniform number in [0, 1) for the CPU draw of step `step`.
    pub fn uniform(&self, step: u32) -> f32 {
        // The same counter hash as the GPU noise, on a stream the GPU never uses.
        let g = cpu::gumbel(self.seed32() ^ 0x5bd1_e995, step, u32::MAX);
        // Invert the Gumbel transform back to its uniform.
        (-(-g).exp()).exp()
    }
}

/// The (id, count) pairs the penalties apply to: the last `last_n` tokens of `history`.
pub fn penalty_tokens(history: &[u32], last_n: usize) -> Vec<(u32, u32)> {
    let recent = &history[history.len().saturating_sub(last_n)..];
    let mut counts: Vec<(u32, u32)> = Vec::new();
    for &t in recent {
        match counts.iter_mut().find(|(id, _)| *id == t) {
            Some(e) => e.1 += 1,
            None => counts.push((t, 1)),
        }
    }
    counts
}

/// Draws among candidates sorted best first: temperature, softmax, top-p, min-p, then the
/// token where the cumulative probability passes `u`.
pub fn draw(candidates: &[(u32, f32)], p: &SamplingParams, u: f32) -> Option<u32> {
    let first = candidates.first()?;
    let t = p.temperature.max(1e-6);
    let max = first.1 / t;
    let mut probs: Vec<(u32, f32)> = candidates
        .iter()
        .map(|&(id, l)| (id, ((l / t) - max).exp()))
        .collect();
    let total: f32 = probs.iter().map(|x| x.1).sum();
    probs.iter_mut().for_each(|x| x.1 /= total);
    if p.min_p > 0.0 {
        let floor = probs[0].1 * p.min_p;
        probs.retain(|x| x.1 >= floor);
    }
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, x) in probs.iter().enumerate() {
            acc += x.1;
            if acc >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep.max(1));
    }
    let total: f32 = probs.iter().map(|x| x.1).sum();
    let target = u * total;
    let mut acc = 0.0;
    for x in &probs {
        acc += x.1;
        if acc > target {
            return Some(x.0);
        }
    }
    probs.last().map(|x| x.0)
}

/// The whole sampling step on the CPU, over full logits (the reference of the GPU path).
pub fn sample_cpu(logits: &[f32], p: &SamplingParams, history: &[u32], step: u32) -> u32 {
    let mut logits = logits.to_vec();
    if let Some(pen) = p.penalties() {
        cpu::penalties(&mut logits, &penalty_tokens(history, p.penalty_last_n), pen);
    }
    match p.strategy() {
        Strategy::Greedy => cpu::argmax(&logits).0,
        Strategy::Gumbel => cpu::gumbel_argmax(&logits, p.seed32(), step, p.temperature),
        Strategy::TopK(k) => {
            let cands = cpu::top_k(&logits, k as usize);
            draw(&cands, p, p.uniform(step)).unwrap_or(0)
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
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        };
        // top_p 0.5 keeps only the first (p ~ 0.73).
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(draw(&cands, &p, u), Some(5));
        }
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            ..Default::default()
        };
        // min_p 0.2 keeps 5 and 7 (p(7)/p(5) = e^-1 = 0.37).
        assert_eq!(draw(&cands, &p, 0.99), Some(7));
        let p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        assert_eq!(draw(&cands, &p, 0.999_999), Some(2));
        let a = SamplingParams {
            seed: 7,
            ..Default::default()
        };
        assert_eq!(a.uniform(3), a.uniform(3));
        assert_ne!(a.uniform(3), a.uniform(4));
        let u = a.uniform(9);
        assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn penalty_tokens_count_recent_history() {
        assert_eq!(penalty_tokens(&[1, 2, 2, 3, 2], 3), vec![(2, 2), (3, 1)]);
        assert_eq!(penalty_tokens(&[], 3), vec![]);
    }
}
