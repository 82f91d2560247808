// Sampling that stays on the GPU, so a decode loop never waits for the CPU:
// DRAW          picks among the k sorted (index, logit) candidates of top_k.wgsl: softmax at
//               the temperature, min-p, top-p, then the token where the cumulative probability
//               passes a uniform number drawn from (seed, step); writes it to result[0] and
//               the top candidate's logit to result[1].
// RING_PUSH     appends result[0] (the token this step feeds) to the recent-token ring
//               ring[0] = count, ring[1 + i % CAP] = token i.
// PENALTY_RING  applies repetition/frequency/presence penalties to the logits of the last
//               `last_n` tokens of the ring, each distinct token once with its count.
// PICK          writes the logit of token out[0] to out[1] (-3.4e38 past the vocabulary): the
//               sampled token's logit, for its log-probability.

struct Params {
    k: u32,
    seed: u32,
    step: u32,
    last_n: u32,
    temperature: f32,
    top_p: f32,
    min_p: f32,
    repeat: f32,
    frequency: f32,
    presence: f32,
    vocab: u32,
    cap: u32,
}

#if DRAW
@group(0) @binding(0) var<storage, read> cand: array<u32>;
@group(0) @binding(1) var<storage, read_write> result: array<u32>;
#endif
#if RING_PUSH
@group(0) @binding(0) var<storage, read> result: array<u32>;
@group(0) @binding(1) var<storage, read_write> ring: array<u32>;
#endif
#if PENALTY_RING
@group(0) @binding(0) var<storage, read> ring: array<u32>;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
#endif
#if PICK
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
#endif
@group(0) @binding(2) var<uniform> p: Params;

fn hash(a: u32) -> u32 {
    var s = a * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// Uniform in (0, 1) for (seed, step, i): the same stream as the CPU's `cpu::uniform`.
fn uniform01(seed: u32, step: u32, i: u32) -> f32 {
    let h = hash(hash(hash(seed) ^ step) ^ i);
    return (f32(h >> 8u) + 0.5) / 16777216.0;
}

#if PENALTY_RING
// The ring slot of the j-th most recent token (j = 0: the latest).
fn recent(j: u32) -> u32 {
    let count = ring[0];
    return ring[1u + (count - 1u - j) % p.cap];
}
#endif

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
#if DRAW
    if (li != 0u) {
        return;
    }
    // Serial over at most 64 candidates: the same arithmetic, in the same order, as the CPU.
    let t = max(p.temperature, 1e-6);
    let top = bitcast<f32>(cand[1]) / t;
    var probs: array<f32, 64>;
    var total = 0.0;
    var n = 0u;
    for (var i = 0u; i < p.k; i++) {
        if (cand[2u * i] >= p.vocab) {
            break;
        }
        probs[i] = exp(bitcast<f32>(cand[2u * i + 1u]) / t - top);
        total += probs[i];
        n = i + 1u;
    }
    var keep = n;
    for (var i = 0u; i < n; i++) {
        probs[i] /= total;
    }
    if (p.min_p > 0.0) {
        let floor = probs[0] * p.min_p;
        var kept = 0u;
        for (var i = 0u; i < n; i++) {
            if (probs[i] >= floor) {
                kept = i + 1u;
            }
        }
        keep = kept;
    }
    if (p.top_p < 1.0) {
        var acc = 0.0;
        for (var i = 0u; i < keep; i++) {
            acc += probs[i];
            if (acc >= p.top_p) {
                keep = i + 1u;
                break;
            }
        }
    }
    keep = max(keep, 1u);
    var kept_total = 0.0;
    for (var i = 0u; i < keep; i++) {
        kept_total += probs[i];
    }
    let goal = uniform01(p.seed, p.step, 0xFFFFFFFFu) * kept_total;
    var acc = 0.0;
    var pick = cand[2u * (keep - 1u)];
    for (var i = 0u; i < keep; i++) {
        acc += probs[i];
        if (acc > goal) {
            pick = cand[2u * i];
            break;
        }
    }
    result[0] = pick;
    // The top candidate's logit: the reader checks it is finite (as argmax leaves its value).
    result[1] = cand[1];
#endif
#if PICK
    if (li == 0u) {
        let token = out[0];
        var v = -3.4e38;
        if (token < p.vocab) {
            v = logits[token];
        }
        out[1] = bitcast<u32>(v);
    }
#endif
#if RING_PUSH
    if (li == 0u) {
        let count = ring[0];
        ring[1u + count % p.cap] = result[0];
        ring[0] = count + 1u;
    }
#endif
#if PENALTY_RING
    let valid = min(ring[0], p.last_n);
    for (var j = li; j < valid; j += 64u) {
        let tok = recent(j);
        // Only the most recent occurrence applies the penalty, with the token's count.
        var first = true;
        for (var i = 0u; i < j; i++) {
            if (recent(i) == tok) {
                first = false;
                break;
            }
        }
        if (first && tok < p.vocab) {
            var count = 0u;
            for (var i = 0u; i < valid; i++) {
                if (recent(i) == tok) {
                    count += 1u;
                }
            }
            var l = logits[tok];
            if (l > 0.0) {
                l /= p.repeat;
            } else {
                l *= p.repeat;
            }
            logits[tok] = l - f32(count) * p.frequency - p.presence;
        }
    }
#endif
}
