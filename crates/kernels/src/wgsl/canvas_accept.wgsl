// The entropy-bound acceptance of one denoising step over a canvas of `rows` positions, in
// one workgroup: positions sorted by ascending entropy (ties by position) are accepted while
// the entropy of those before them stays within the bound (so the lowest always is); the
// next canvas takes the drawn token where accepted and the renoise token elsewhere. Then the
// stop: the argmax canvas equal to the previous step's for `stability` steps running, and the
// mean entropy below the confidence threshold.
//
// stats[row] = (argmax, max, lse, entropy); state: [0] steps the argmax canvas has stayed the
// same, then per row the previous step's argmax (0xffffffff before a block's first step).
// status = (accepted count, mean entropy, steps the same, done).

struct Params {
    rows: u32,
    bound: f32,
    stability: u32,
    confidence: f32,
}

@group(0) @binding(0) var<storage, read> stats: array<f32>;
@group(0) @binding(1) var<storage, read> drawn: array<u32>;
@group(0) @binding(2) var<storage, read> renoise: array<u32>;
@group(0) @binding(3) var<storage, read_write> next: array<u32>;
@group(0) @binding(4) var<storage, read_write> accepted: array<u32>;
@group(0) @binding(5) var<storage, read_write> state: array<u32>;
@group(0) @binding(6) var<storage, read_write> status: array<u32>;
@group(0) @binding(7) var<uniform> p: Params;

const MAX_ROWS: u32 = 1024u;

var<workgroup> key: array<u32, MAX_ROWS>;
var<workgroup> idx: array<u32, MAX_ROWS>;
var<workgroup> changed: atomic<u32>;
var<workgroup> count: u32;

fn entropy(row: u32) -> f32 {
    return max(stats[4u * row + 3u], 0.0);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    var n = 1u;
    while (n < p.rows) {
        n <<= 1u;
    }
    if (li == 0u) {
        atomicStore(&changed, 0u);
    }
    // Non-negative f32s sort as their bits; padding sorts last.
    for (var i = li; i < n; i += 256u) {
        if (i < p.rows) {
            key[i] = bitcast<u32>(entropy(i));
        } else {
            key[i] = 0xffffffffu;
        }
        idx[i] = i;
    }
    workgroupBarrier();
    // Bitonic sort of (key, idx) pairs.
    for (var size = 2u; size <= n; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var i = li; i < n; i += 256u) {
                let j = i ^ stride;
                if (j > i) {
                    let up = (i & size) == 0u;
                    let a = vec2<u32>(key[i], idx[i]);
                    let b = vec2<u32>(key[j], idx[j]);
                    let a_first = a.x < b.x || (a.x == b.x && a.y < b.y);
                    if (a_first != up) {
                        key[i] = b.x;
                        idx[i] = b.y;
                        key[j] = a.x;
                        idx[j] = a.y;
                    }
                }
            }
            workgroupBarrier();
        }
    }
    if (li == 0u) {
        // Entropy of the positions before, in sorted order, as transformers' cumulative sum.
        var before = 0.0;
        var k = 0u;
        for (var i = 0u; i < p.rows; i++) {
            if (before > p.bound) {
                break;
            }
            before += bitcast<f32>(key[i]);
            k = i + 1u;
        }
        count = k;
    }
    workgroupBarrier();
    let k = count;
    // The keys are done with: they become the acceptance flags, by position.
    for (var i = li; i < p.rows; i += 256u) {
        key[idx[i]] = select(0u, 1u, i < k);
    }
    workgroupBarrier();
    for (var i = li; i < p.rows; i += 256u) {
        let arg = bitcast<u32>(stats[4u * i]);
        if (arg != state[1u + i]) {
            atomicStore(&changed, 1u);
        }
        accepted[i] = key[i];
        next[i] = select(renoise[i], drawn[i], key[i] == 1u);
    }
    workgroupBarrier();
    let same = select(state[0] + 1u, 0u, atomicLoad(&changed) == 1u);
    workgroupBarrier();
    for (var i = li; i < p.rows; i += 256u) {
        state[1u + i] = bitcast<u32>(stats[4u * i]);
    }
    if (li == 0u) {
        var total = 0.0;
        for (var i = 0u; i < p.rows; i++) {
            total += entropy(i);
        }
        let mean = total / f32(p.rows);
        state[0] = same;
        status[0] = k;
        status[1] = bitcast<u32>(mean);
        status[2] = same;
        status[3] = select(0u, 1u, same >= p.stability && mean < p.confidence);
    }
}
