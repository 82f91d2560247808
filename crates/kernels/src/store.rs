//! The weight store: a model asks for the GGUF tensors it needs — matrices (in GGUF blocks as
//! stored, tiled under the binding limit, several tensors stacked by rows or two interleaved
//! row by row), and vectors (dequantized to f32) — and gets their GPU buffers at once; then
//! [`WeightStore::upload`] reads every tensor's bytes from a range source (a mapped file, an
//! HTTP range reader in the browser) and writes them, reporting progress. Any set of tensors
//! of any GGUF (a text model, an mmproj's `v.*` and `a.*`, an Ollama blob holding both) loads
//! this way.

use wgemma_gguf::{
    GgmlType, Gguf, RangeSource, SourceError, TensorError, TensorInfo, dequantize_to_vec,
};

use crate::context::{GpuContext, GpuError};
use crate::gpu::View;
use crate::weights::GpuWeight;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("tensor {name}: {reason}")]
    Unsupported { name: String, reason: String },
}

/// Rows of a tensor read in groups: group `g`'s row `i` is row `g * stride + offset + i`.
#[derive(Clone, Copy, Debug)]
pub struct RowSource<'a> {
    pub tensor: &'a TensorInfo,
    pub stride: u64,
    pub offset: u64,
}

impl<'a> RowSource<'a> {
    /// All of `tensor`'s rows, in one group.
    pub fn whole(tensor: &'a TensorInfo) -> Self {
        Self {
            tensor,
            stride: 0,
            offset: 0,
        }
    }
}

/// What the store copies where.
enum Job<'a> {
    /// Tensors stacked by rows into one weight.
    Stacked(Vec<&'a TensorInfo>, GpuWeight),
    /// Gate and up rows alternating, in groups of `pairs` pairs (one group per expert).
    Interleaved {
        gate: RowSource<'a>,
        up: RowSource<'a>,
        pairs: u64,
        w: GpuWeight,
    },
    Vector {
        tensor: &'a TensorInfo,
        view: View,
        scale: f32,
    },
}

impl Job<'_> {
    fn bytes(&self) -> u64 {
        match self {
            Job::Stacked(parts, _) => parts.iter().map(|t| t.n_bytes).sum(),
            Job::Interleaved { w, .. } => w.rows * w.row_bytes,
            Job::Vector { tensor, .. } => tensor.n_bytes,
        }
    }
}

/// The tensors a model asked for, allocated on the GPU and waiting for their bytes.
pub struct WeightStore<'a, 'c> {
    ctx: &'c GpuContext,
    jobs: Vec<Job<'a>>,
    /// Weights several users share, one per (dtype, rows, cols).
    shared: Vec<GpuWeight>,
    /// Bytes read and written at a time ([`UPLOAD_CHUNK_BYTES`]).
    upload_chunk: u64,
}

impl<'a, 'c> WeightStore<'a, 'c> {
    pub fn new(ctx: &'c GpuContext) -> Self {
        Self {
            ctx,
            jobs: Vec::new(),
            shared: Vec::new(),
            upload_chunk: UPLOAD_CHUNK_BYTES,
        }
    }

    /// Uploads in pieces of about `bytes` (at least 4 rows each) instead of 64 MiB: less host
    /// memory held at once, more writes.
    pub fn set_upload_chunk(&mut self, bytes: u64) {
        self.upload_chunk = bytes;
    }

    fn allocate(
        &self,
        name: &str,
        t: &TensorInfo,
        rows: u64,
        group: u64,
    ) -> Result<GpuWeight, StoreError> {
        GpuWeight::allocate_in_groups(self.ctx, name, t.dtype, t.row_len(), rows, group, None)
            .map_err(|e| StoreError::Unsupported {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }

    /// One weight of `parts` stacked by rows (one dtype and row length), tiled in whole
    /// groups of `group` rows.
    pub fn matrix(
        &mut self,
        parts: Vec<&'a TensorInfo>,
        group: u64,
    ) -> Result<GpuWeight, StoreError> {
        let first = *parts.first().ok_or_else(|| StoreError::Unsupported {
            name: String::new(),
            reason: "a matrix of no tensors".into(),
        })?;
        if let Some(t) = parts
            .iter()
            .find(|t| t.dtype != first.dtype || t.row_len() != first.row_len())
        {
            return Err(StoreError::Unsupported {
                name: t.name.clone(),
                reason: format!("stacked under {} of another dtype or width", first.name),
            });
        }
        let rows = parts.iter().map(|t| t.n_rows()).sum();
        let name = parts
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        let w = self.allocate(&name, first, rows, group)?;
        self.jobs.push(Job::Stacked(parts, w.clone()));
        Ok(w)
    }

    /// Gate and up rows interleaved (gate row i, up row i, ...), in `groups` groups of `pairs`
    /// pairs (one group per expert); a tile holds whole groups (or, for one group, whole
    /// pairs).
    pub fn interleaved(
        &mut self,
        gate: RowSource<'a>,
        up: RowSource<'a>,
        pairs: u64,
        groups: u64,
    ) -> Result<GpuWeight, StoreError> {
        let name = format!("{}+{}", gate.tensor.name, up.tensor.name);
        let group = if groups > 1 { 2 * pairs } else { 2 };
        let w = self.allocate(&name, gate.tensor, 2 * pairs * groups, group)?;
        self.jobs.push(Job::Interleaved {
            gate,
            up,
            pairs,
            w: w.clone(),
        });
        Ok(w)
    }

    /// A weight shaped like `t`'s `rows` rows (in groups of `group`) that several users share
    /// and fill themselves (streamed experts), allocated by the first that needs its shape.
    pub fn shared(
        &mut self,
        t: &TensorInfo,
        rows: u64,
        group: u64,
    ) -> Result<GpuWeight, StoreError> {
        let same = |w: &&GpuWeight| w.dtype == t.dtype && w.rows == rows && w.cols == t.row_len();
        if let Some(w) = self.shared.iter().find(same) {
            return Ok(w.clone());
        }
        let name = format!("shared {} {rows}x{}", t.dtype, t.row_len());
        let w = self.allocate(&name, t, rows, group)?;
        self.shared.push(w.clone());
        Ok(w)
    }

    /// `tensor`'s values as f32 times `scale`.
    pub fn vector_scaled(&mut self, tensor: &'a TensorInfo, scale: f32) -> View {
        let view = View::of(&self.ctx.storage(&tensor.name, tensor.n_elements() * 4));
        self.jobs.push(Job::Vector {
            tensor,
            view: view.clone(),
            scale,
        });
        view
    }

    /// `tensor`'s values as f32.
    pub fn vector(&mut self, tensor: &'a TensorInfo) -> View {
        self.vector_scaled(tensor, 1.0)
    }

    /// Bytes the upload reads.
    pub fn bytes(&self) -> u64 {
        self.jobs.iter().map(Job::bytes).sum()
    }

    /// Forgets the bytes: the buffers stay, unwritten (for plans built without weights).
    pub fn skip_bytes(&mut self) {
        self.jobs.clear();
    }

    /// Reads every tensor's bytes from `src` (the file `g` describes) and writes them,
    /// calling `progress(done, total)` in bytes after each piece.
    pub async fn upload<R: RangeSource + ?Sized>(
        &self,
        (g, src): (&Gguf, &R),
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<(), StoreError> {
        let total = self.bytes();
        let mut done = 0;
        for job in &self.jobs {
            match job {
                Job::Stacked(parts, w) => {
                    for (i, rows) in upload_chunks(w, self.upload_chunk) {
                        let bytes = stacked_rows(g, src, parts, rows.clone()).await?;
                        write_chunk(self.ctx, w, i, rows, &bytes)?;
                        done += bytes.len() as u64;
                        progress(done, total);
                    }
                }
                Job::Interleaved { gate, up, pairs, w } => {
                    // Pieces of whole gate and up pairs (4 rows at a time), which
                    // `interleaved_rows` reads from any pair of a group.
                    for (i, rows) in upload_chunks(w, self.upload_chunk) {
                        let bytes =
                            interleaved_rows(g, src, *gate, *up, *pairs, rows.clone()).await?;
                        write_chunk(self.ctx, w, i, rows, &bytes)?;
                        done += bytes.len() as u64;
                        progress(done, total);
                    }
                }
                Job::Vector {
                    tensor,
                    view,
                    scale,
                } => {
                    let values = read_f32(g, src, tensor).await?;
                    let scaled: Vec<f32> = values.iter().map(|v| v * scale).collect();
                    self.ctx
                        .write(&view.buffer, 0, bytemuck::cast_slice(&scaled));
                    done += tensor.n_bytes;
                    progress(done, total);
                }
            }
        }
        Ok(())
    }
}

/// Bytes of weights read and written at a time: the host memory an upload holds, whatever
/// the size of a weight's tiles (a tile may be gigabytes where the device binds that much;
/// the browser's wasm heap holds 4 GB in all).
const UPLOAD_CHUNK_BYTES: u64 = 64 << 20;

/// Rows a piece of an upload holds a multiple of: every write then starts 4-byte aligned
/// whatever the row size, and interleaved gate/up pieces hold whole pairs.
const UPLOAD_UNIT_ROWS: u64 = 4;

/// `w`'s rows in pieces of about `bytes`, as (tile, absolute rows) pairs, tile by tile.
fn upload_chunks(w: &GpuWeight, bytes: u64) -> Vec<(usize, std::ops::Range<u64>)> {
    let tiles: Vec<(u64, u64)> = w.tiles.iter().map(|t| (t.first_row, t.rows)).collect();
    chunk_rows(&tiles, w.row_bytes, bytes)
}

/// The rows of `tiles` (first row, rows) in pieces of at most `chunk_bytes` (but at least
/// [`UPLOAD_UNIT_ROWS`] rows), each starting a multiple of that into its tile.
fn chunk_rows(
    tiles: &[(u64, u64)],
    row_bytes: u64,
    chunk_bytes: u64,
) -> Vec<(usize, std::ops::Range<u64>)> {
    let unit = UPLOAD_UNIT_ROWS;
    let step = (chunk_bytes / row_bytes.max(1) / unit).max(1) * unit;
    let mut out = Vec::new();
    for (i, &(first, rows)) in tiles.iter().enumerate() {
        let end = first + rows;
        let mut row = first;
        while row < end {
            let next = (row + step).min(end);
            out.push((i, row..next));
            row = next;
        }
    }
    out
}

/// Writes absolute rows `rows` of `w` into tile `i`.
fn write_chunk(
    ctx: &GpuContext,
    w: &GpuWeight,
    i: usize,
    rows: std::ops::Range<u64>,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let first = w.tiles[i].first_row;
    w.write_tile_rows(ctx, i, rows.start - first..rows.end - first, bytes)?;
    Ok(())
}

/// `tensor`'s values as f32.
pub async fn read_f32<R: RangeSource + ?Sized>(
    g: &Gguf,
    src: &R,
    tensor: &TensorInfo,
) -> Result<Vec<f32>, StoreError> {
    let bytes = src
        .read_range(g.tensor_range(tensor).start, tensor.n_bytes)
        .await?;
    Ok(match tensor.dtype {
        GgmlType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes),
        dt => dequantize_to_vec(dt, &bytes)?,
    })
}

/// Rows `rows` of `parts` stacked, as stored.
pub async fn stacked_rows<R: RangeSource + ?Sized>(
    g: &Gguf,
    src: &R,
    parts: &[&TensorInfo],
    rows: std::ops::Range<u64>,
) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    let mut first = 0;
    for t in parts {
        let (lo, hi) = (rows.start.max(first), rows.end.min(first + t.n_rows()));
        if lo < hi {
            let start = g.tensor_range(t).start + (lo - first) * t.row_bytes();
            out.extend(src.read_range(start, (hi - lo) * t.row_bytes()).await?);
        }
        first += t.n_rows();
    }
    Ok(out)
}

/// Rows `rows` of gate and up interleaved in groups of `pairs` pairs, as stored.
pub async fn interleaved_rows<R: RangeSource + ?Sized>(
    g: &Gguf,
    src: &R,
    gate: RowSource<'_>,
    up: RowSource<'_>,
    pairs: u64,
    rows: std::ops::Range<u64>,
) -> Result<Vec<u8>, StoreError> {
    let rb = gate.tensor.row_bytes();
    let mut out = Vec::with_capacity(((rows.end - rows.start) * rb) as usize);
    let mut row = rows.start;
    while row < rows.end {
        let group = row / (2 * pairs);
        let p0 = (row % (2 * pairs)) / 2;
        let p1 = pairs.min(p0 + (rows.end - row) / 2);
        let read = |s: RowSource<'_>| {
            let first = group * s.stride + s.offset + p0;
            src.read_range(g.tensor_range(s.tensor).start + first * rb, (p1 - p0) * rb)
        };
        let (a, b) = (read(gate).await?, read(up).await?);
        for (x, y) in a.chunks_exact(rb as usize).zip(b.chunks_exact(rb as usize)) {
            out.extend_from_slice(x);
            out.extend_from_slice(y);
        }
        row += 2 * (p1 - p0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{UPLOAD_UNIT_ROWS, chunk_rows};

    /// Every row of every tile lands in exactly one piece, in order; pieces stay within the
    /// byte bound (but hold at least one unit) and start a whole number of units into their
    /// tile, so their writes are 4-byte aligned for rows of any size.
    #[test]
    fn chunks_cover_each_tile_once_within_the_bound() {
        let tiles = [(0, 1000), (1000, 38), (1038, 4)];
        let unit = UPLOAD_UNIT_ROWS;
        for (row_bytes, bound) in [(7350, 64 << 10), (144, 4096), (9520, 100), (1, 7), (2, 64)] {
            let chunks = chunk_rows(&tiles, row_bytes, bound);
            let mut next = 0;
            for (i, rows) in &chunks {
                let (first, n) = tiles[*i];
                assert_eq!(rows.start, next, "pieces follow each other");
                assert!(
                    rows.start >= first && rows.end <= first + n,
                    "inside tile {i}"
                );
                assert_eq!((rows.start - first) % unit, 0, "starts on a unit");
                let bytes = (rows.end - rows.start) * row_bytes;
                assert!(
                    bytes <= bound.max(unit * row_bytes),
                    "{bytes} bytes > {bound}"
                );
                next = rows.end;
            }
            assert_eq!(next, 1042, "every row");
        }
    }
}
