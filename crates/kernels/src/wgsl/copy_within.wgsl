// Copies a span of a buffer to another place in the same buffer (a KV cache's rows from one
// slot of a pool to another): WebGPU copies no buffer onto itself, and one dispatch cannot
// bind a buffer both read-only and read-write. The spans do not overlap (the dispatcher
// checks). Offsets and length in 16-byte units from the binding's start.

struct Params {
    src: u32,
    dst: u32,
    n: u32,
}

@group(0) @binding(0) var<storage, read_write> buf: array<vec4<u32>>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.n) {
        buf[p.dst + i] = buf[p.src + i];
    }
}
