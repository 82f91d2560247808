// What the two tiled kernels on f32 inputs (matmul.wgsl, matmul_sgmat.wgsl) share: their
// input x read a float at a time, and a step's 32 values of k of one weight row and of one
// token, as each stages them in workgroup memory.

@group(0) @binding(1) var<storage, read> x: array<f32>;

// Unit u of the tile's weight row `row`, dequantized (dtypes.wgsl's load_unit); zero past the
// weight's last row.
fn weight_unit(tt: Tokens, row: u32, u: u32) -> array<vec4<f32>, 8> {
    if (row < p.n) {
        return load_unit((tt.w_row + row) * p.row_bytes, u);
    }
    return array<vec4<f32>, 8>();
}

// Value kk of unit u of the tile's token `tok` as the product reads it (input_value); zero
// past the tile's tokens and past the row's end: float rows may end inside their last unit,
// and the weights read there (the next row's, finite) then add nothing.
fn unit_input(tt: Tokens, tok: u32, u: u32, kk: u32) -> f32 {
    if (tok < tt.count && u * 32u + kk < p.k) {
        return input_value(x[x_row(tt, tok) * p.x_stride + u * 32u + kk]);
    }
    return 0.0;
}
