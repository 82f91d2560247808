//! The kernels' uniform parameter blocks, one `#[repr(C)]` Pod struct per WGSL `struct Params`,
//! its fields the WGSL members in order (`crate::reflect` checks every kernel variant the
//! plans use against its WGSL with naga: member names, offsets and the block's size).

use bytemuck::{Pod, Zeroable};

/// A kernel's parameter block.
pub trait KernelParams: Pod {
    /// The WGSL member names in order, with their byte offsets.
    const FIELDS: &'static [(&'static str, usize)];
}

/// A parameter block's layout as a dispatch carries it, for the reflection test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamsLayout {
    pub fields: &'static [(&'static str, usize)],
    pub size: usize,
}

/// A parameter block as bytes, with its layout: what [`crate::Bind::Params`] binds.
#[derive(Clone, Debug)]
pub struct Params {
    words: Vec<u32>,
    layout: ParamsLayout,
}

impl Params {
    pub fn of<P: KernelParams>(p: &P) -> Self {
        Self {
            words: bytemuck::pod_collect_to_vec(bytemuck::bytes_of(p)),
            layout: ParamsLayout {
                fields: P::FIELDS,
                size: std::mem::size_of::<P>(),
            },
        }
    }

    pub fn layout(&self) -> ParamsLayout {
        self.layout
    }

    /// The words to upload: a uniform struct's size is a multiple of 16 bytes.
    pub(crate) fn words(&self) -> Vec<u32> {
        let mut w = self.words.clone();
        while w.is_empty() || !w.len().is_multiple_of(4) {
            w.push(0);
        }
        w
    }
}

/// Declares a parameter struct and its [`KernelParams::FIELDS`]. Every field is 4 bytes
/// (`u32` or `f32`), as every WGSL member is: no padding.
macro_rules! kernel_params {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl KernelParams for $name {
            const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($field), std::mem::offset_of!($name, $field))),*];
        }
    };
}

kernel_params!(
    /// `argmax.wgsl`.
    ArgmaxParams {
        n: u32,
        parts: u32,
        seed: u32,
        step: u32,
        inv_temp: f32,
    }
);

kernel_params!(
    /// `attention.wgsl`.
    AttentionParams {
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        m: u32,
        window: u32,
        scale: f32,
        softcap: f32,
        capacity: u32,
        q_stride: u32,
        slot_rows: u32,
    }
);

kernel_params!(
    /// `attention_parts.wgsl`.
    AttentionPartsParams {
        rows: u32,
        head_dim: u32,
        parts: u32,
    }
);

kernel_params!(
    /// `attn_combine.wgsl`.
    AttnCombineParams {
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        window: u32,
        max_chunks: u32,
        capacity: u32,
        slot_rows: u32,
    }
);

kernel_params!(
    /// `attn_split.wgsl`.
    AttnSplitParams {
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        window: u32,
        max_chunks: u32,
        capacity: u32,
        scale: f32,
        softcap: f32,
        q_offset: u32,
        n_rot: u32,
        eps: f32,
        base: f32,
        freq_scale: f32,
        q_stride: u32,
        slot_rows: u32,
    }
);

kernel_params!(
    /// `elementwise.wgsl`.
    ElementwiseParams {
        n: u32,
        cols: u32,
        a_stride: u32,
        b_stride: u32,
        s: f32,
        b_offset: u32,
    }
);

impl ElementwiseParams {
    /// `n` values in one row, with the scalar `s`.
    pub fn over(n: u32, s: f32) -> Self {
        Self {
            n,
            cols: n,
            s,
            ..Self::default()
        }
    }
}

kernel_params!(
    /// `embed.wgsl`.
    EmbedParams {
        k: u32,
        row_bytes: u32,
        first_row: u32,
        rows: u32,
        m: u32,
        scale: f32,
    }
);

kernel_params!(
    /// `head_post.wgsl`.
    HeadPostParams {
        n_head: u32,
        n_kv: u32,
        head_dim: u32,
        n_rot: u32,
        stride: u32,
        tokens: u32,
        capacity: u32,
        eps: f32,
        base: f32,
        freq_scale: f32,
        slot_rows: u32,
    }
);

kernel_params!(
    /// `copy_within.wgsl`.
    CopyWithinParams {
        src: u32,
        dst: u32,
        n: u32,
    }
);

kernel_params!(
    /// `kv_store.wgsl`.
    KvStoreParams {
        row: u32,
        m: u32,
        src_stride: u32,
        capacity: u32,
    }
);

kernel_params!(
    /// `matmul_io.wgsl` (the tiled products, `matmul.wgsl` and `matmul_coop.wgsl`).
    MatmulParams {
        k: u32,
        n: u32,
        row_bytes: u32,
        out_offset: u32,
        m: u32,
        x_stride: u32,
        y_stride: u32,
        softcap: f32,
        k_part: u32,
        part_stride: u32,
        first_expert: u32,
        n_expert: u32,
        x_group: u32,
        slots: u32,
        in_min: f32,
        in_max: f32,
        out_min: f32,
        out_max: f32,
    }
);

kernel_params!(
    /// `matmul_parts.wgsl`.
    MatmulPartsParams {
        m: u32,
        n: u32,
        parts: u32,
        part_stride: u32,
        y_stride: u32,
        out_offset: u32,
        softcap: f32,
        /// CLAMPED: the sum's range (a clamped product's output clamp).
        out_min: f32,
        out_max: f32,
    }
);

kernel_params!(
    /// `matvec.wgsl` (its comments say which flags read which members).
    MatvecParams {
        k: u32,
        n: u32,
        row_bytes: u32,
        out_offset: u32,
        m: u32,
        x_stride: u32,
        y_stride: u32,
        softcap: f32,
        first_expert: u32,
        experts_here: u32,
        x_group: u32,
        eps: f32,
        scale: f32,
        times_offset: u32,
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        window: u32,
        max_chunks: u32,
        capacity: u32,
        xs_words: u32,
        accumulate: u32,
        n_expert: u32,
        has_scale: u32,
        lora_rank: u32,
        lora_t_stride: u32,
        lora_seg1: u32,
        lora_seg2: u32,
        lora_pairs: u32,
        lora_first_row: u32,
    }
);

kernel_params!(
    /// `moe.wgsl`.
    MoeParams {
        n_expert: u32,
        k: u32,
        dim: u32,
        has_scale: u32,
        eps: f32,
    }
);

kernel_params!(
    /// `norm.wgsl`.
    NormParams {
        dim: u32,
        rows: u32,
        eps: f32,
        x_stride: u32,
        scale: f32,
    }
);

kernel_params!(
    /// `penalty.wgsl`.
    PenaltyKernelParams {
        n: u32,
        vocab: u32,
        repeat: f32,
        frequency: f32,
        presence: f32,
    }
);

kernel_params!(
    /// `rope.wgsl`.
    RopeParams {
        heads: u32,
        head_dim: u32,
        n_rot: u32,
        rows: u32,
        base: f32,
        freq_scale: f32,
    }
);

kernel_params!(
    /// `sample.wgsl`.
    SampleKernelParams {
        k: u32,
        seed: u32,
        step: u32,
        last_n: u32,
        temperature: f32,
        top_p: f32,
        min_p: f32,
        repeat: f32,
        frequency: f32,
        presence: f32,
        vocab: u32,
        cap: u32,
    }
);

kernel_params!(
    /// `topk.wgsl`.
    TopKParams {
        n: u32,
        k: u32,
        row_stride: u32,
        x_at: u32,
    }
);

kernel_params!(
    /// `pointwise.wgsl`: four sizes, then each operand's four strides and offset.
    PointwiseParams {
        n: u32,
        d0: u32,
        d1: u32,
        d2: u32,
        d3: u32,
        y0: u32,
        y1: u32,
        y2: u32,
        y3: u32,
        y_at: u32,
        a0: u32,
        a1: u32,
        a2: u32,
        a3: u32,
        a_at: u32,
        b0: u32,
        b1: u32,
        b2: u32,
        b3: u32,
        b_at: u32,
        lo: f32,
        hi: f32,
    }
);

kernel_params!(
    /// `rows.wgsl`.
    RowsParams {
        rows: u32,
        n: u32,
        r1: u32,
        r2: u32,
        x0: u32,
        x1: u32,
        x2: u32,
        x3: u32,
        x_at: u32,
        y0: u32,
        y1: u32,
        y2: u32,
        y3: u32,
        y_at: u32,
        w_at: u32,
        bias_at: u32,
        eps: f32,
        scale: f32,
        n_rot: u32,
        section: u32,
        axes: u32,
        base: f32,
        freq_scale: f32,
    }
);

kernel_params!(
    /// `product.wgsl`.
    ProductParams {
        m: u32,
        n: u32,
        k: u32,
        a0: u32,
        a1: u32,
        a2: u32,
        a_at: u32,
        b0: u32,
        b1: u32,
        b2: u32,
        b_at: u32,
        y0: u32,
        y1: u32,
        y2: u32,
        y_at: u32,
        bias_at: u32,
        alpha: f32,
    }
);

kernel_params!(
    /// `conv.wgsl`.
    ConvParams {
        n: u32,
        c: u32,
        h: u32,
        w: u32,
        oh: u32,
        ow: u32,
        kh: u32,
        kw: u32,
        sh: u32,
        sw: u32,
        ph: u32,
        pw: u32,
        x0: u32,
        x1: u32,
        x2: u32,
        x_at: u32,
        y0: u32,
        y1: u32,
        y2: u32,
        y_at: u32,
        w_at: u32,
        bias_at: u32,
    }
);

kernel_params!(
    /// `row_stats.wgsl`.
    RowStatsParams {
        rows: u32,
        n: u32,
        x0: u32,
        x1: u32,
        x_at: u32,
        out_at: u32,
        inv_temp: f32,
    }
);

kernel_params!(
    /// `attend.wgsl`.
    AttendParams {
        tq: u32,
        tk: u32,
        heads: u32,
        kv_heads: u32,
        d: u32,
        q_pos0: u32,
        window: u32,
        prefix: u32,
        back: u32,
        ahead: u32,
        rel_len: u32,
        scale: f32,
        softcap: f32,
        q0: u32,
        q1: u32,
        q_at: u32,
        k0: u32,
        k1: u32,
        k_at: u32,
        v0: u32,
        v1: u32,
        v_at: u32,
        o0: u32,
        o1: u32,
        o_at: u32,
        r0: u32,
        r1: u32,
        r_at: u32,
        q2: u32,
        k2: u32,
        v2: u32,
        o2: u32,
        r2: u32,
    }
);

kernel_params!(
    /// `rope_axes.wgsl`.
    RopeAxesParams {
        pairs: u32,
        heads: u32,
        head_dim: u32,
        axes: u32,
        n_rot: u32,
        x0: u32,
        x1: u32,
        x2: u32,
        x_at: u32,
        base: f32,
        freq_scale: f32,
    }
);

kernel_params!(
    /// `canvas_sample.wgsl`.
    CanvasSampleParams {
        rows: u32,
        n: u32,
        x_stride: u32,
        inv_temp: f32,
    }
);

kernel_params!(
    /// `canvas_accept.wgsl`.
    CanvasAcceptParams {
        rows: u32,
        bound: f32,
        stability: u32,
        confidence: f32,
    }
);
