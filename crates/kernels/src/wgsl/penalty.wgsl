// Repetition, frequency and presence penalties on the logits of the given token ids (each id
// listed once, with how often it occurred): a positive logit is divided by `repeat`, a
// negative one multiplied, then count * frequency + presence is subtracted.

struct Params {
    n: u32,
    vocab: u32,
    repeat: f32,
    frequency: f32,
    presence: f32,
}

@group(0) @binding(0) var<storage, read> tokens: array<u32>;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n) {
        return;
    }
    let id = tokens[2u * i];
    let count = f32(tokens[2u * i + 1u]);
    if (id >= p.vocab) {
        return;
    }
    var l = logits[id];
    if (l > 0.0) {
        l /= p.repeat;
    } else {
        l *= p.repeat;
    }
    logits[id] = l - count * p.frequency - p.presence;
}
