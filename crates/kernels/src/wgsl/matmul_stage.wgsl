// What the two tiled kernels on f32 inputs (matmul.wgsl, matmul_sgmat.wgsl) share: their
// input x read a float at a time, and a step's 32 values of k of one weight row and of one
// token, as each stages them in workgroup memory. The loads and the arithmetic on what they
// return come apart (weight_raw then decode_unit, raw_input then staged_input) so that a
// kernel can issue the next step's loads before this step's products.

@group(0) @binding(1) var<storage, read> x: array<f32>;

// Unit u of the tile's weight row `row` as loaded (dtypes.wgsl's fetch_unit; decode_unit
// gives its values); zero, which decodes to zeros, past the weight's rows or the row's end.
fn weight_raw(tt: Tokens, row: u32, u: u32) -> RawUnit {
    if (row < p.n && u * 32u < p.k) {
        return fetch_unit((tt.w_row + row) * p.row_bytes, u);
    }
    return RawUnit();
}

// That unit's values.
fn weight_unit(tt: Tokens, row: u32, u: u32) -> array<vec4<f32>, 8> {
    return decode_unit(weight_raw(tt, row, u), u);
}

// Whether value kk of unit u of the tile's token `tok` is an input: not past the tile's
// tokens nor past the row's end.
fn has_input(tt: Tokens, tok: u32, u: u32, kk: u32) -> bool {
    return tok < tt.count && u * 32u + kk < p.k;
}

// That value as loaded (zero where there is none).
fn raw_input(tt: Tokens, tok: u32, u: u32, kk: u32) -> f32 {
    if (has_input(tt, tok, u, kk)) {
        return x[x_row(tt, tok) * p.x_stride + u * 32u + kk];
    }
    return 0.0;
}

// A loaded value as the product reads it (input_value); zero where there is none: float rows
// may end inside their last unit, and the weights read there (the next row's, finite) then
// add nothing.
fn staged_input(raw: f32, tt: Tokens, tok: u32, u: u32, kk: u32) -> f32 {
    return select(0.0, input_value(raw), has_input(tt, tok, u, kk));
}

fn unit_input(tt: Tokens, tok: u32, u: u32, kk: u32) -> f32 {
    return staged_input(raw_input(tt, tok, u, kk), tt, tok, u, kk);
}
