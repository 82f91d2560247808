//! Weights on the GPU in their GGUF block layout, split into row tiles that each fit one
//! storage binding.

use wgemma_gguf::GgmlType;

use crate::context::{GpuContext, GpuError};

/// The dtypes the GPU kernels read directly (the same set the CPU dequantizer handles).
pub const GPU_DTYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// The shader flag selecting `load_unit` for `dtype`.
pub(crate) fn dtype_flag(dtype: GgmlType) -> Result<&'static str, GpuError> {
    Ok(match dtype {
        GgmlType::F32 => "DT_F32",
        GgmlType::F16 => "DT_F16",
        GgmlType::Bf16 => "DT_BF16",
        GgmlType::Q4_0 => "DT_Q4_0",
        GgmlType::Q4_1 => "DT_Q4_1",
        GgmlType::Q5_0 => "DT_Q5_0",
        GgmlType::Q5_1 => "DT_Q5_1",
        GgmlType::Q8_0 => "DT_Q8_0",
        GgmlType::Q2K => "DT_Q2_K",
        GgmlType::Q3K => "DT_Q3_K",
        GgmlType::Q4K => "DT_Q4_K",
        GgmlType::Q5K => "DT_Q5_K",
        GgmlType::Q6K => "DT_Q6_K",
        GgmlType::Iq4Nl => "DT_IQ4_NL",
        GgmlType::Iq4Xs => "DT_IQ4_XS",
        other => {
            return Err(GpuError::Shape(format!(
                "weights of dtype {other} cannot be read by the GPU kernels"
            )));
        }
    })
}

/// Rows `first_row .. first_row + rows` of a weight, in one buffer.
#[derive(Clone, Debug)]
pub struct WeightTile {
    pub buffer: wgpu::Buffer,
    pub first_row: u64,
    pub rows: u64,
}

/// A 2-D weight (`rows` x `cols`, ggml's `dims = [cols, rows]`) resident on the GPU.
#[derive(Clone, Debug)]
pub struct GpuWeight {
    pub name: String,
    pub dtype: GgmlType,
    pub cols: u64,
    pub rows: u64,
    pub row_bytes: u64,
    pub tiles: Vec<WeightTile>,
}

/// Padding after each tile so kernels may read the word after the last byte.
const TILE_PAD: u64 = 16;

impl GpuWeight {
    /// Creates the tile buffers for a `rows` x `cols` weight of `dtype` without filling them;
    /// each tile holds at most `max_tile_bytes` (or the device's binding limit). Fill them with
    /// [`GpuWeight::write_tile`] in any order (a streaming loader reads one tile at a time).
    pub fn allocate(
        ctx: &GpuContext,
        name: &str,
        dtype: GgmlType,
        cols: u64,
        rows: u64,
        max_tile_bytes: Option<u64>,
    ) -> Result<Self, GpuError> {
        // Even tile sizes keep interleaved row pairs (gate/up) together.
        Self::allocate_in_groups(ctx, name, dtype, cols, rows, 2, max_tile_bytes)
    }

    /// [`GpuWeight::allocate`] with every tile holding whole groups of `group_rows` rows (one
    /// expert's rows, so an expert never straddles two bindings).
    pub fn allocate_in_groups(
        ctx: &GpuContext,
        name: &str,
        dtype: GgmlType,
        cols: u64,
        rows: u64,
        group_rows: u64,
        max_tile_bytes: Option<u64>,
    ) -> Result<Self, GpuError> {
        dtype_flag(dtype)?;
        // Inputs are read as vec4s; quantized rows are whole blocks (checked below).
        if !cols.is_multiple_of(4) {
            return Err(GpuError::Shape(format!(
                "{name}: row length {cols} is not a multiple of 4"
            )));
        }
        let row_bytes = dtype.bytes_for(cols).ok_or_else(|| {
            GpuError::Shape(format!("{name}: {cols} is not whole {dtype} blocks"))
        })?;
        let limit = max_tile_bytes
            .unwrap_or(u64::MAX)
            .min(ctx.max_binding_size())
            .saturating_sub(TILE_PAD);
        let group = group_rows.max(1);
        let rows_per_tile = match limit / row_bytes {
            n if n >= group => n / group * group,
            n if n >= rows => n,
            _ => 0,
        };
        if rows_per_tile == 0 {
            return Err(GpuError::Shape(format!(
                "{name}: {group} rows of {row_bytes} bytes exceed the binding limit"
            )));
        }
        let mut tiles = Vec::new();
        let mut first_row = 0;
        while first_row < rows {
            let n = rows_per_tile.min(rows - first_row);
            let buffer = ctx.storage(name, n * row_bytes + TILE_PAD);
            tiles.push(WeightTile {
                buffer,
                first_row,
                rows: n,
            });
            first_row += n;
        }
        Ok(Self {
            name: name.to_string(),
            dtype,
            cols,
            rows,
            row_bytes,
            tiles,
        })
    }

    /// Byte range of tile `i` within the tensor's data.
    pub fn tile_range(&self, i: usize) -> std::ops::Range<u64> {
        let t = &self.tiles[i];
        t.first_row * self.row_bytes..(t.first_row + t.rows) * self.row_bytes
    }

    /// Fills tile `i` with its bytes (exactly `tile_range(i)` of the tensor).
    pub fn write_tile(&self, ctx: &GpuContext, i: usize, bytes: &[u8]) -> Result<(), GpuError> {
        self.write_tile_rows(ctx, i, 0..self.tiles[i].rows, bytes)
    }

    /// Fills rows `rows` of tile `i` (counted from the tile's first row) with `bytes`. A
    /// range that starts past the tile's first row starts at a multiple of 4 rows, so that
    /// the write lands 4-byte aligned whatever the row size.
    pub fn write_tile_rows(
        &self,
        ctx: &GpuContext,
        i: usize,
        rows: std::ops::Range<u64>,
        bytes: &[u8],
    ) -> Result<(), GpuError> {
        let tile = &self.tiles[i];
        let want = (rows.end.saturating_sub(rows.start)) * self.row_bytes;
        if rows.end > tile.rows
            || bytes.len() as u64 != want
            || !(rows.start * self.row_bytes).is_multiple_of(4)
        {
            return Err(GpuError::Shape(format!(
                "{}: rows {rows:?} of tile {i} ({} rows) take {want} bytes at a 4-byte boundary, got {}",
                self.name,
                tile.rows,
                bytes.len()
            )));
        }
        ctx.write(&tile.buffer, rows.start * self.row_bytes, bytes);
        Ok(())
    }

    /// Allocates and fills a weight from all its bytes (rows x cols of `dtype`, GGUF layout).
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        dtype: GgmlType,
        cols: u64,
        rows: u64,
        bytes: &[u8],
        max_tile_bytes: Option<u64>,
    ) -> Result<Self, GpuError> {
        let w = Self::allocate(ctx, name, dtype, cols, rows, max_tile_bytes)?;
        if bytes.len() as u64 != w.row_bytes * rows {
            return Err(GpuError::Shape(format!(
                "{name}: {} bytes for {rows} rows of {}",
                bytes.len(),
                w.row_bytes
            )));
        }
        for i in 0..w.tiles.len() {
            let r = w.tile_range(i);
            w.write_tile(ctx, i, &bytes[r.start as usize..r.end as usize])?;
        }
        Ok(w)
    }

    /// Bytes held on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.tiles.iter().map(|t| t.buffer.size()).sum()
    }
}
