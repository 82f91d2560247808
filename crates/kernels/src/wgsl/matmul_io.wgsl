// The parameters, bindings and token bookkeeping both prefill product kernels share (each
// binds its input x, binding 1, in the width it loads; the weights, binding 0, are
// bytes.wgsl's).
//
// EXPERTS: the products of a mixture-of-experts layer's stacked experts (n rows each), grouped
// by expert (moe.wgsl's GROUP): wg.z is the tile's expert (from first_expert), its workgroups
// take the slots routed to it, a tile at a time (64, or 16 with SMALL_TILES); slot s reads
// input row s / x_group and writes output row s. Never split over k.

struct Params {
    k: u32,
    n: u32,
    row_bytes: u32,
    out_offset: u32,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    softcap: f32,
    // Split over k (wg.z is the part): each workgroup sums k_part values of k from
    // wg.z * k_part, into y from wg.z * part_stride (a multiple of 64; the whole row and 0
    // when the product is not split).
    k_part: u32,
    part_stride: u32,
    first_expert: u32,
    n_expert: u32,
    x_group: u32,
    slots: u32,
    // CLAMPED: y = clamp(W clamp(x, in_min, in_max), out_min, out_max).
    in_min: f32,
    in_max: f32,
    out_min: f32,
    out_max: f32,
}

@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

#if GELU_TIMES
// The other factor of a gate whose product this is (y's layout): y = gelu_tanh(out) * by.
@group(0) @binding(5) var<storage, read> by: array<f32>;
#endif

#if EXPERTS
// [slots, expert by expert | count of each expert | first entry of each]
@group(0) @binding(4) var<storage, read> groups: array<u32>;
#endif

// The tokens of a workgroup's tile: `count` in all, from entry `first` of the grouped slots
// (plain: tokens 0..m in order), multiplying weight rows from `w_row`.
struct Tokens {
    count: u32,
    first: u32,
    w_row: u32,
}

fn tile_tokens(z: u32) -> Tokens {
#if EXPERTS
    let e = p.first_expert + z;
    return Tokens(groups[p.slots + e], groups[p.slots + p.n_expert + e], z * p.n);
#else
    return Tokens(p.m, 0u, 0u);
#endif
}

#if EXPERTS
// The tile's token count, shared to make it uniform across the workgroup: the barriers and
// cooperative matrix products after the early return of an empty tile need every thread to
// take them or none. (Naga does not see through a helper function here, so each kernel loads
// it in its entry point.)
var<workgroup> tile_count: u32;
#endif

// The part over k that workgroup layer z sums.
fn k_part_of(z: u32) -> u32 {
#if EXPERTS
    return 0u;
#else
    return z;
#endif
}

// Rows of x and y of the tile's token t (< count).
fn x_row(tt: Tokens, t: u32) -> u32 {
#if EXPERTS
    return groups[tt.first + t] / p.x_group;
#else
    return t;
#endif
}

fn y_row(tt: Tokens, t: u32) -> u32 {
#if EXPERTS
    return groups[tt.first + t];
#else
    return t;
#endif
}

// An input as the product reads it, and an output as it stores it (CLAMPED: within the
// product's ranges).
fn input_value(v: f32) -> f32 {
#if CLAMPED
    return clamp(v, p.in_min, p.in_max);
#else
    return v;
#endif
}

fn input_vec(v: vec4<f32>) -> vec4<f32> {
#if CLAMPED
    return clamp(v, vec4<f32>(p.in_min), vec4<f32>(p.in_max));
#else
    return v;
#endif
}

fn output_value(v: f32) -> f32 {
#if CLAMPED
    return clamp(softcapped(v, p.softcap), p.out_min, p.out_max);
#else
    return softcapped(v, p.softcap);
#endif
}

#if GELU_TIMES
// An output's place that no output takes.
const NO_OUTPUT: u32 = 0xffffffffu;
#endif

#if !COOP
// A thread's outputs of token `tok` of the tile, rows row0..row0 + 3 (v), from column yb of
// y's rows: as they are, gated in pairs (GEGLU_OUT) or times their other factor (GELU_TIMES).
fn store_outputs(tt: Tokens, tok: u32, row0: u32, yb: u32, v: vec4<f32>) {
#if GEGLU_OUT
    // Rows 2c and 2c + 1 are gate and up of activation c.
    for (var j = 0u; j < 4u; j += 2u) {
        let row = row0 + j;
        if (tok < tt.count && row < p.n) {
            y[y_row(tt, tok) * p.y_stride + yb + row / 2u] = gelu_tanh(v[j]) * v[j + 1u];
        }
    }
#else
#if GELU_TIMES
    // The factors loaded before any store, so that they are in flight together.
    var at = array<u32, 4>();
    var factor = array<f32, 4>();
    for (var j = 0u; j < 4u; j++) {
        let row = row0 + j;
        at[j] = NO_OUTPUT;
        if (tok < tt.count && row < p.n) {
            at[j] = y_row(tt, tok) * p.y_stride + yb + row;
            factor[j] = by[at[j]];
        }
    }
    for (var j = 0u; j < 4u; j++) {
        if (at[j] != NO_OUTPUT) {
            y[at[j]] = gelu_tanh(output_value(v[j])) * factor[j];
        }
    }
#else
    for (var j = 0u; j < 4u; j++) {
        let row = row0 + j;
        if (tok < tt.count && row < p.n) {
            y[y_row(tt, tok) * p.y_stride + yb + row] = output_value(v[j]);
        }
    }
#endif
#endif
}
#endif
