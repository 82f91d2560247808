// cache[positions[m] * row + e] = src[m * src_stride + e]: writes the K or V rows of the
// tokens of a step into the cache slots of their positions.

struct Params {
    row: u32,
    m: u32,
    src_stride: u32,
    capacity: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cache: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let m = wg.y;
    let e = wg.x * 256u + li;
    if (m >= p.m || e >= p.row) {
        return;
    }
    let pos = positions[m];
    if (pos >= p.capacity) {
        return;
    }
    cache[pos * p.row + e] = src[m * p.src_stride + e];
}
