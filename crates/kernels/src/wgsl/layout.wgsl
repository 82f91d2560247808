// Strided addressing shared by the general ops: the buffer offset of logical element `i`
// (row-major over the four sizes `d`) of a tensor with strides `s` whose element 0 is at
// `base`.
fn at4(i: u32, d: vec4<u32>, s: vec4<u32>, base: u32) -> u32 {
    let i3 = i % d.w;
    let r2 = i / d.w;
    let i2 = r2 % d.z;
    let r1 = r2 / d.z;
    let i1 = r1 % d.y;
    let i0 = r1 / d.y;
    return base + i0 * s.x + i1 * s.y + i2 * s.z + i3 * s.w;
}
