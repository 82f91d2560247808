//! Typed dispatchers: each binds exactly the buffers its kernel needs, checks shapes, and
//! returns prepared [`Dispatch`]es to record as often as needed. One module per kernel family;
//! the WGSL sources and the limits the families share are here.

use crate::context::{GpuContext, GpuError, GpuFeatures, Pipeline};
use crate::gpu::{Bind, Dispatch, View, kernel_bindings};
use crate::params::*;
use crate::shader::{BYTES_WGSL, DTYPES_WGSL, ShaderSource};
use crate::tensor::{DType, Layout4, Tensor};
use crate::weights::{GpuWeight, dtype_flag};
use std::sync::OnceLock;
use wgemma_gguf::GgmlType;

const ACTIVATIONS_WGSL: &str = include_str!("../wgsl/activations.wgsl");
const MATVEC_WGSL: &str = include_str!("../wgsl/matvec.wgsl");
const MATMUL_IO_WGSL: &str = include_str!("../wgsl/matmul_io.wgsl");
const MATMUL_WGSL: &str = include_str!("../wgsl/matmul.wgsl");
const MATMUL_INT8_WGSL: &str = include_str!("../wgsl/matmul_int8.wgsl");
const MATMUL_COOP_WGSL: &str = include_str!("../wgsl/matmul_coop.wgsl");
const MATMUL_SGMAT_WGSL: &str = include_str!("../wgsl/matmul_sgmat.wgsl");
const MATMUL_STAGE_WGSL: &str = include_str!("../wgsl/matmul_stage.wgsl");
const MATMUL_PARTS_WGSL: &str = include_str!("../wgsl/matmul_parts.wgsl");
const REDUCE_WGSL: &str = include_str!("../wgsl/reduce.wgsl");
const NORM_WGSL: &str = include_str!("../wgsl/norm.wgsl");
const ROPE_WGSL: &str = include_str!("../wgsl/rope.wgsl");
const ROPE_MATH_WGSL: &str = include_str!("../wgsl/rope_math.wgsl");
const KV_STORE_WGSL: &str = include_str!("../wgsl/kv_store.wgsl");
const ATTENTION_WGSL: &str = include_str!("../wgsl/attention.wgsl");
const ATTENTION_KEYS_WGSL: &str = include_str!("../wgsl/attention_keys.wgsl");
const ATTENTION_COOP_WGSL: &str = include_str!("../wgsl/attention_coop.wgsl");
const ATTENTION_PARTS_WGSL: &str = include_str!("../wgsl/attention_parts.wgsl");
const ELEMENTWISE_WGSL: &str = include_str!("../wgsl/elementwise.wgsl");
const EMBED_WGSL: &str = include_str!("../wgsl/embed.wgsl");
const ARGMAX_WGSL: &str = include_str!("../wgsl/argmax.wgsl");
const TOPK_WGSL: &str = include_str!("../wgsl/topk.wgsl");
const PENALTY_WGSL: &str = include_str!("../wgsl/penalty.wgsl");
const HEAD_POST_WGSL: &str = include_str!("../wgsl/head_post.wgsl");
const HEAD_MATH_WGSL: &str = include_str!("../wgsl/head_math.wgsl");
const ATTN_SPLIT_WGSL: &str = include_str!("../wgsl/attn_split.wgsl");
const ATTN_COMBINE_WGSL: &str = include_str!("../wgsl/attn_combine.wgsl");
const ATTN_MERGE_WGSL: &str = include_str!("../wgsl/attn_merge.wgsl");
const SAMPLE_WGSL: &str = include_str!("../wgsl/sample.wgsl");
const MOE_WGSL: &str = include_str!("../wgsl/moe.wgsl");
const ROUTE_WGSL: &str = include_str!("../wgsl/route.wgsl");

/// Token counts up to this use the matrix-vector kernel on a GPU; more use the tiled matmul.
pub const MATVEC_MAX_TOKENS: u32 = 4;
/// Workgroup memory of `matmul_coop.wgsl`: f16 tiles of 64 tokens' inputs and 128 rows'
/// weights (rows padded to 72 halves) and one 16 x 16 f32 stage per subgroup; with
/// [`CoopTile::Wide128`], 128 tokens' inputs ([`COOP_MATMUL_128_BYTES`]).
pub const COOP_MATMUL_BYTES: u32 = (64 + 128) * 72 * 2 + 8 * 256 * 4;
pub const COOP_MATMUL_128_BYTES: u32 = (128 + 128) * 72 * 2 + 8 * 256 * 4;
/// Workgroup memory of `matmul_sgmat.wgsl`: f16 tiles of 64 tokens' inputs and 64 rows'
/// weights (rows padded to 40 halves) and the f32 stage of the 64 x 64 outputs.
pub const SGMAT_MATMUL_BYTES: u32 = 2 * 64 * 40 * 2 + 64 * 64 * 4;
/// The largest head dimension the attention kernel handles.
pub const MAX_HEAD_DIM: u32 = 512;
/// Most query heads per KV head that batched attention takes (Gemma has 2 to 8).
pub const MAX_QUERY_GROUP: u32 = 8;
/// Values per workgroup in the first stage of argmax.
pub const ARGMAX_CHUNK: u32 = 1024;
/// Values per workgroup in the first stage of top-k.
pub const TOPK_CHUNK: u32 = 4096;
/// The largest k top-k supports.
pub const TOPK_MAX: u32 = 64;

fn shape(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

/// A grid of `groups` workgroups, folded into y when x would exceed the per-dimension limit.
pub fn grid(ctx: &GpuContext, groups: u32, z: u32) -> [u32; 3] {
    let max = ctx.limits.max_compute_workgroups_per_dimension.max(1);
    if groups <= max {
        [groups, 1, z]
    } else {
        [max, groups.div_ceil(max), z]
    }
}

mod attend;
mod attention;
mod canvas;
mod conv;
mod elementwise;
mod embed;
mod few_tokens;
mod head;
mod layout;
mod matmul;
mod matvec;
mod moe;
mod norm;
mod pointwise;
mod product;
mod rope;
mod rows;
mod sample;
mod tuning;

pub use attend::*;
pub use attention::*;
pub use canvas::*;
pub use conv::*;
pub use elementwise::*;
pub use embed::*;
pub use few_tokens::*;
pub use head::*;
pub use matmul::*;
pub use matvec::*;
pub use moe::*;
pub use norm::*;
pub use pointwise::*;
pub use product::*;
pub use rope::*;
pub use rows::*;
pub use sample::*;
pub use tuning::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// What a device must bind for the experts' mix in front of a product and for routing
    /// inside one, as counted in the WGSL: a change here changes which devices run them.
    #[test]
    fn fused_expert_steps_bind_as_many_buffers_as_devices_are_asked_for() {
        assert_eq!(moe_delta_buffers(), 12);
        assert_eq!(routed_expert_buffers(), 8);
    }
}
