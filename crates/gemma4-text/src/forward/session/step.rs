//! The ops of one step, built block by block. Each block says what it computes (norms,
//! products, attention, the experts, the per-layer inputs); where one dispatch can do the work
//! of several — the residual step and the next norm in a product's prologue, the attention
//! merge in front of the output product, int8 activations between the gate/up and down
//! products, the router's norm and the routing inside the experts' products — the builder
//! fuses them, under the `ops::*_fits` predicates. Between blocks it holds where the residual
//! stream is and the block output still to join it.

use wgemma_kernels::ops::{
    self, Delta, Elementwise, EmbedOut, ExpertGroups, ExpertSlots, InputNorm, MatmulArgs,
    MatvecOut, MoeMix, NormOut, ResidualStep,
};
use wgemma_kernels::{Dispatch, GpuContext, GpuError, GpuWeight, View, WeightTile};

use super::{
    GpuSession, LogitsFor, MERGE_IN_FRONT_HEADS, Op, StepInput, TILED_SLOTS_PER_EXPERT, delta_row,
};
use crate::forward::model::{Experts, GateUp, Layer, PleLayer};

/// The fusions a step may use: all by default, each still under its kernels' fit predicates.
/// Turning one off gives the unfused ops for the same computation, which must agree with the
/// fused ones (that is how each rule is tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fusions {
    /// One token's residual step and the next block's norm in the prologue of the block's
    /// first product (and, behind it, the gated activations as 8-bit integers where the
    /// device has them).
    pub residual_prologue: bool,
    /// The experts' mix computed in the prologue of the product that reads it.
    pub experts_mix_in_product: bool,
    /// One token's split attention merged (and its K and V stored) in front of the output
    /// product.
    pub merge_in_front: bool,
    /// One token's gated activations rounded to 8-bit integers for the down product.
    pub int8_activations: bool,
    /// One token's router input norm inside the router's product.
    pub router_norm_in_product: bool,
    /// The experts' input norm inside their gate/up product.
    pub expert_norm_in_product: bool,
    /// The routing inside the experts' gate/up product.
    pub route_in_product: bool,
    /// One token's residual add, per-layer gate product and its GELU times the per-layer
    /// input in one dispatch.
    pub per_layer_gate: bool,
}

impl Fusions {
    /// Every fusion (the default).
    pub const ALL: Self = Self {
        residual_prologue: true,
        experts_mix_in_product: true,
        merge_in_front: true,
        int8_activations: true,
        router_norm_in_product: true,
        expert_norm_in_product: true,
        route_in_product: true,
        per_layer_gate: true,
    };

    /// No fusion: one dispatch per op.
    pub const NONE: Self = Self {
        residual_prologue: false,
        experts_mix_in_product: false,
        merge_in_front: false,
        int8_activations: false,
        router_norm_in_product: false,
        expert_norm_in_product: false,
        route_in_product: false,
        per_layer_gate: false,
    };

    /// Each fusion alone turned off, by name.
    pub fn each_off() -> Vec<(&'static str, Self)> {
        let all = Self::ALL;
        vec![
            (
                "residual_prologue",
                Self {
                    residual_prologue: false,
                    ..all
                },
            ),
            (
                "experts_mix_in_product",
                Self {
                    experts_mix_in_product: false,
                    ..all
                },
            ),
            (
                "merge_in_front",
                Self {
                    merge_in_front: false,
                    ..all
                },
            ),
            (
                "int8_activations",
                Self {
                    int8_activations: false,
                    ..all
                },
            ),
            (
                "router_norm_in_product",
                Self {
                    router_norm_in_product: false,
                    ..all
                },
            ),
            (
                "expert_norm_in_product",
                Self {
                    expert_norm_in_product: false,
                    ..all
                },
            ),
            (
                "route_in_product",
                Self {
                    route_in_product: false,
                    ..all
                },
            ),
            (
                "per_layer_gate",
                Self {
                    per_layer_gate: false,
                    ..all
                },
            ),
        ]
    }
}

impl Default for Fusions {
    fn default() -> Self {
        Self::ALL
    }
}

/// The products whose rows are the output as they are.
const PLAIN: MatvecOut<'static> = MatvecOut::Rows { softcap: 0.0 };

/// A block's output still to join the stream: (delta, post-norm weight, scale).
type Pending<'s> = (Delta<'s>, &'s View, f32);

/// The first product of a block, which the residual step and the block's norm can run in
/// front of: (weight, output, output column, output kind).
type First<'s> = (&'s GpuWeight, &'s View, u32, MatvecOut<'s>);

pub(super) struct StepBuilder<'s> {
    session: &'s GpuSession,
    ctx: &'s GpuContext,
    /// Tokens of the step.
    m: u32,
    /// One token whose stream fits in a workgroup's memory: the one-token fusions can run.
    one_token: bool,
    fusions: Fusions,
    ops: Vec<Op>,
    pending: Option<Pending<'s>>,
    /// Where the stream is: `x`, or `x_alt` after an odd number of fused residual steps.
    alt: bool,
    table_rows_added: bool,
}

impl<'s> StepBuilder<'s> {
    pub(super) fn new(session: &'s GpuSession, m: u32) -> Self {
        let ctx = &*session.model.ctx;
        let d = session.model.cfg.n_embd as u32;
        Self {
            session,
            ctx,
            m,
            one_token: m == 1 && ops::matvec_input_fits(ctx, d),
            fusions: session.fusions,
            ops: Vec::new(),
            pending: None,
            alt: false,
            table_rows_added: false,
        }
    }

    pub(super) fn finish(self) -> Vec<Op> {
        self.ops
    }

    fn run(&mut self, ds: Vec<Dispatch>) {
        self.ops.extend(ds.into_iter().map(Op::Run));
    }

    fn width(&self) -> u32 {
        self.session.model.cfg.n_embd as u32
    }

    fn eps(&self) -> f32 {
        self.session.model.cfg.eps
    }

    /// The stream, and its other home (where a fused residual step writes).
    fn streams(&self) -> (&'s View, &'s View) {
        let s = &self.session.s;
        if self.alt {
            (&s.x_alt, &s.x)
        } else {
            (&s.x, &s.x_alt)
        }
    }

    /// `y[:, y_offset..] = x W^T` over the step's tokens.
    fn product(
        &self,
        w: &GpuWeight,
        x: &View,
        y: &View,
        y_stride: u32,
        out: MatvecOut<'_>,
    ) -> Result<Vec<Dispatch>, GpuError> {
        self.product_at(w, x, (y, y_stride, 0), out)
    }

    /// [`StepBuilder::product`] into `y` (row stride, column offset).
    fn product_at(
        &self,
        w: &GpuWeight,
        x: &View,
        (y, y_stride, y_offset): (&View, u32, u32),
        out: MatvecOut<'_>,
    ) -> Result<Vec<Dispatch>, GpuError> {
        let args = MatmulArgs {
            x,
            y,
            m: self.m,
            x_stride: w.cols as u32,
            y_stride,
            out,
            y_offset,
            partials: Some(&self.session.s.partials),
        };
        ops::matmul(self.ctx, w, &args)
    }

    /// RMS norm of the step's rows of `x` as `out` says.
    fn norm(&self, x: &View, out: NormOut<'_>, weight: &View) -> Result<Dispatch, GpuError> {
        let d = self.width();
        ops::rms_norm(self.ctx, x, out, Some(weight), self.m, d, d, self.eps())
    }

    /// The token embeddings (and soft tokens over some), then every layer's per-layer input:
    /// `(norm(proj x / sqrt(d)) + table row * sqrt(n)) / sqrt(2)`. The projection's part here
    /// (the norm's weight is loaded times 1 / sqrt(2)); the table rows' where the first layer
    /// needs them. The norm of `proj x / sqrt(d)` is the norm of `proj x` with `eps * d` in
    /// place of `eps`: no dispatch scales it first.
    pub(super) fn embed(&mut self, input: StepInput<'_>) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, &self.session.s);
        let cfg = &model.cfg;
        let d = self.width();
        let embed = ops::embed(
            self.ctx,
            &model.token_embd,
            input.ids,
            &s.x,
            self.m,
            cfg.embed_scale,
            EmbedOut::Write,
        )?;
        self.run(embed);
        for c in input.soft {
            let row_bytes = u64::from(d) * 4;
            self.ops.push(Op::Copy {
                from: c.rows.clone(),
                to: s.x.slice(u64::from(c.row) * row_bytes, c.rows.size)?,
                bytes: c.rows.size,
            });
        }
        if let Some(ple) = &model.ple {
            let (n, l) = (cfg.n_ple as u32, cfg.n_layer as u32);
            let proj = self.product(&ple.proj, &s.x, &s.ple.all, n * l, PLAIN)?;
            self.run(proj);
            let norm = ops::rms_norm(
                self.ctx,
                &s.ple.all,
                NormOut::InPlace,
                Some(&ple.proj_norm),
                self.m * l,
                n,
                n,
                self.eps() * d as f32,
            )?;
            self.run(vec![norm]);
        }
        Ok(())
    }

    /// The table rows staged for this step's tokens join the per-layer inputs: after
    /// `Op::TokenRows`, so that a decode step can start before its token is on the CPU.
    fn add_table_rows(&mut self) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, &self.session.s);
        let Some(ple) = &model.ple else {
            return Ok(());
        };
        let n = model.cfg.n_ple as u32;
        let staged = GpuWeight {
            name: "per_layer_token_embd rows".into(),
            dtype: ple.info.dtype,
            cols: ple.info.row_len(),
            rows: u64::from(self.m),
            row_bytes: ple.info.row_bytes(),
            tiles: vec![WeightTile {
                buffer: s.ple.rows.buffer.clone(),
                first_row: 0,
                rows: u64::from(self.m),
            }],
        };
        self.ops.push(Op::TokenRows);
        // row * sqrt(n), times the sum's 1 / sqrt(2).
        let add = ops::embed(
            self.ctx,
            &staged,
            &s.ple.iota,
            &s.ple.all,
            self.m,
            (n as f32 / 2.0).sqrt(),
            EmbedOut::Add,
        )?;
        self.run(add);
        Ok(())
    }

    /// Enters a block with norm weight `weight`: the pending residual step and the norm into
    /// `xn`, fused with `first` where it can. Returns whether `first` ran.
    fn enter(&mut self, weight: &'s View, first: Option<First<'s>>) -> Result<bool, GpuError> {
        let s = &self.session.s;
        let (res, other) = self.streams();
        let (d, eps) = (self.width(), self.eps());
        let mut ds = Vec::new();
        let done = match (self.pending.take(), first) {
            (None, _) => {
                ds.push(self.norm(res, NormOut::To(&s.xn), weight)?);
                false
            }
            (Some((delta, post, scale)), Some((w, y, col, out)))
                if self.one_token && self.fusions.residual_prologue =>
            {
                let delta = match delta {
                    Delta::Moe(_)
                        if self.fusions.experts_mix_in_product && ops::moe_delta_fits(self.ctx) =>
                    {
                        delta
                    }
                    _ => Delta::Row(delta_row(self.ctx, delta, &s.moe.ffn_out, &mut ds)?),
                };
                let step = ResidualStep {
                    res,
                    delta,
                    post,
                    scale,
                    eps,
                    res_out: other,
                    next_norm: Some((weight, &s.xn)),
                };
                self.alt = !self.alt;
                ds.extend(ops::matvec_after_residual(self.ctx, w, &step, y, col, out)?);
                true
            }
            (Some((delta, post, scale)), _) => {
                let delta = delta_row(self.ctx, delta, &s.moe.ffn_out, &mut ds)?;
                ds.push(ops::residual_norm(
                    self.ctx, res, delta, post, weight, &s.xn, self.m, d, scale, eps,
                )?);
                false
            }
        };
        self.run(ds);
        Ok(done)
    }

    /// Layer `il`'s attention block: the q/k/v products (the first behind the residual step),
    /// per-head norms, rope and the KV store, attention, the output product.
    pub(super) fn attention(&mut self, il: usize, l: &'s Layer) -> Result<(), GpuError> {
        let (session, s) = (self.session, &self.session.s);
        let q = &l.qkv[0];
        let done = self.enter(&l.attn_norm, Some((&q.w, &s.qkv, q.offset, PLAIN)))?;
        for p in &l.qkv[usize::from(done)..] {
            let ds = self.product_at(&p.w, &s.xn, (&s.qkv, l.qkv_width, p.offset), PLAIN)?;
            self.run(ds);
        }
        let d = self.width();
        let att = session.attention_args(il, self.m)?;
        let heads = session.head_post_args(il, self.m);
        if self.m == 1 {
            // The split kernel does the per-head norms and RoPE itself; the merge of its
            // chunks and the cache store run in front of the output product where its input
            // fits in a workgroup's memory and its heads are few (`MERGE_IN_FRONT_HEADS`):
            // every workgroup of the product repeats the merge of every head.
            let (split, merge) =
                ops::attention_split(self.ctx, &att, 0, &s.attn_part, Some(&heads))?;
            self.run(vec![split]);
            if self.fusions.merge_in_front
                && session.model.cfg.n_head <= MERGE_IN_FRONT_HEADS
                && ops::matvec_input_fits(self.ctx, l.o.cols as u32)
            {
                let ds = ops::matvec_after_attention(self.ctx, &l.o, &merge, &s.o, 0, PLAIN)?;
                self.run(ds);
            } else {
                let combine = ops::attention_combine(self.ctx, &merge)?;
                self.run(vec![combine]);
                let ds = self.product(&l.o, &s.attn, &s.o, d, PLAIN)?;
                self.run(ds);
            }
        } else {
            let ds = vec![
                ops::head_post(self.ctx, &heads)?,
                ops::attention(self.ctx, &att)?,
            ];
            self.run(ds);
            let ds = self.product(&l.o, &s.attn, &s.o, d, PLAIN)?;
            self.run(ds);
        }
        self.pending = Some((Delta::Row(&s.o), &l.post_attn_norm, 1.0));
        Ok(())
    }

    /// Layer `il`'s feed-forward block (GeGLU), and its experts where it has them: the block's
    /// output, still to join the stream.
    pub(super) fn ffn(&mut self, il: usize, l: &'s Layer) -> Result<Delta<'s>, GpuError> {
        let s = &self.session.s;
        let (d, ff) = (self.width(), self.session.model.cfg.layers[il].n_ff as u32);
        // One token's gated activations go to the down product as 8-bit integers where
        // both products can: every workgroup of the down product reads its long input row.
        let mut act_int8 = false;
        match &l.gate_up {
            GateUp::Interleaved(w) => {
                let int8 = self.one_token
                    && self.fusions.int8_activations
                    && ops::int8_activations_fit(self.ctx, w, &l.down, true);
                let first = if int8 {
                    (w, &s.act_q, 0, MatvecOut::GegluInt8)
                } else {
                    (w, &s.act, 0, MatvecOut::Geglu)
                };
                let done = self.enter(&l.ffn_norm, Some(first))?;
                act_int8 = int8 && done;
                if !done {
                    let ds = self.product(w, &s.xn, &s.act, ff, MatvecOut::Geglu)?;
                    self.run(ds);
                }
            }
            GateUp::Separate { gate, up } => {
                let done = self.enter(&l.ffn_norm, Some((gate, &s.gate, 0, PLAIN)))?;
                if !done {
                    let ds = self.product(gate, &s.xn, &s.gate, ff, PLAIN)?;
                    self.run(ds);
                }
                let ds = self.product(up, &s.xn, &s.up, ff, PLAIN)?;
                self.run(ds);
                let op = Elementwise::Geglu {
                    gate: &s.gate,
                    up: &s.up,
                    cols: ff,
                    gate_stride: ff,
                    up_stride: ff,
                    up_offset: 0,
                };
                let geglu = ops::elementwise(self.ctx, op, &s.act, self.m * ff)?;
                self.run(vec![geglu]);
            }
        }
        let down = if act_int8 {
            ops::matvec_int8_input(self.ctx, &l.down, &s.act_q, &s.down, 0, PLAIN)?
        } else {
            self.product(&l.down, &s.act, &s.down, d, PLAIN)?
        };
        self.run(down);
        match &l.experts {
            Some(x) => self.experts(x),
            None => Ok(Delta::Row(&s.down)),
        }
    }

    /// The dense branch's output plus the experts' mix: each token's router picks its experts,
    /// whose products run per (token, expert) slot: one product per slot, the input norms
    /// inside them where the row fits; or with many slots per expert, the slots grouped by
    /// expert and each expert's tiled product (its weights read once per 64 of its slots, not
    /// once per slot).
    fn experts(&mut self, x: &'s Experts) -> Result<Delta<'s>, GpuError> {
        let (session, s) = (self.session, &self.session.s);
        let Some(mc) = session.model.cfg.moe else {
            return Ok(Delta::Row(&s.down));
        };
        let (m, d, eps) = (self.m, self.width(), self.eps());
        let (k, ne) = (mc.n_used as u32, mc.n_expert as u32);
        let mo = &s.moe;
        let tiled = m > ops::MATVEC_MAX_TOKENS && m * k >= TILED_SLOTS_PER_EXPERT * ne;
        let f = self.fusions;
        let normed_in = f.expert_norm_in_product && ops::matvec_input_fits(self.ctx, d) && !tiled;
        let stream = self.streams().0;
        if self.one_token && f.router_norm_in_product {
            let norm = InputNorm {
                weight: &x.router_scale,
                eps,
            };
            let ds = ops::matvec_normed(self.ctx, &x.router, stream, &norm, &mo.logits, 0, PLAIN)?;
            self.run(ds);
        } else {
            let norm = self.norm(stream, NormOut::To(&mo.normed), &x.router_scale)?;
            self.run(vec![norm]);
            let ds = self.product(&x.router, &mo.normed, &mo.logits, ne, PLAIN)?;
            self.run(ds);
        }
        // The per-slot gate/up product routes its slots itself where it can: one dispatch
        // fewer between the router and the experts. Not with streamed experts, whose copy
        // needs the route first.
        let route = ops::ExpertRoute {
            logits: &mo.logits,
            weight: &mo.weight,
            expert_scale: x.down_scale.as_ref(),
            n_expert: ne,
        };
        let route_in = (f.route_in_product && !tiled && normed_in && x.host.is_none())
            .then_some(&route)
            .filter(|_| ops::expert_route_fits(self.ctx, d));
        if route_in.is_none() {
            let scale = x.down_scale.as_ref();
            let r = ops::moe_route(self.ctx, &mo.logits, &mo.sel, &mo.weight, scale, m, ne, k)?;
            self.run(vec![r]);
        }
        if !normed_in {
            let norm = self.norm(stream, NormOut::To(&mo.normed), &x.pre_norm)?;
            self.run(vec![norm]);
        }
        if let Some(host) = &x.host {
            // Fewer slots than experts: copying the chosen ones is cheaper than all, even
            // with the wait for the router.
            let slots = m * k;
            let routed = (slots < ne).then(|| (mo.sel.clone(), slots));
            self.ops.push(Op::Upload {
                host: host.clone(),
                routed,
            });
        }
        if tiled {
            self.experts_tiled(x, mc.n_ff as u32, k, ne)?;
        } else {
            let (input, norm) = if normed_in {
                (stream, Some((&x.pre_norm, eps)))
            } else {
                (&mo.normed, None)
            };
            self.experts_per_slot(x, (input, norm), mc.n_ff as u32, k, route_in)?;
        }
        Ok(Delta::Moe(MoeMix {
            experts: &mo.out,
            weight: tiled.then_some(&mo.weight),
            experts_post: &x.post_norm_experts,
            dense: &s.down,
            dense_post: &x.post_norm_dense,
            tokens: m,
            k: if tiled { k } else { 1 },
            dim: d,
            eps,
        }))
    }

    /// The slots of a gate/up (2 ff rows an expert) and a down product (d rows).
    fn expert_slots(&self, ff: u32, k: u32) -> [ExpertSlots<'s>; 2] {
        let mo = &self.session.s.moe;
        let slots = self.m * k;
        [
            ExpertSlots {
                sel: &mo.sel,
                slots,
                rows_per_expert: 2 * ff,
                x_group: k,
            },
            ExpertSlots {
                sel: &mo.sel,
                slots,
                rows_per_expert: self.width(),
                x_group: 1,
            },
        ]
    }

    /// The experts' products over slots grouped by expert, each expert's tiled product.
    fn experts_tiled(&mut self, x: &'s Experts, ff: u32, k: u32, ne: u32) -> Result<(), GpuError> {
        let mo = &self.session.s.moe;
        let [gate_up, down] = self.expert_slots(ff, k);
        let groups = ExpertGroups {
            groups: &mo.groups,
            n_expert: ne,
            tokens: self.m,
        };
        let group = ops::moe_group(self.ctx, &gate_up, &groups)?;
        self.run(vec![group]);
        let ds = ops::expert_matmul(
            self.ctx,
            &x.gate_up,
            &mo.normed,
            &mo.act,
            ff,
            &gate_up,
            &groups,
            MatvecOut::Geglu,
        )?;
        self.run(ds);
        let d = self.width();
        let ds = ops::expert_matmul(
            self.ctx, &x.down, &mo.act, &mo.out, d, &down, &groups, PLAIN,
        )?;
        self.run(ds);
        Ok(())
    }

    /// The experts' products one slot at a time: gate/up (its input normed inside where
    /// `norm` is given, routed inside with `route_in`), then down with the slots' outputs
    /// weighted and summed in the product (one row a token).
    fn experts_per_slot(
        &mut self,
        x: &'s Experts,
        (input, norm): (&'s View, Option<(&'s View, f32)>),
        ff: u32,
        k: u32,
        route_in: Option<&ops::ExpertRoute<'_>>,
    ) -> Result<(), GpuError> {
        let mo = &self.session.s.moe;
        let [gate_up, down] = self.expert_slots(ff, k);
        let norm = norm.map(|(weight, eps)| InputNorm { weight, eps });
        let ds = ops::expert_matvec(
            self.ctx,
            &x.gate_up,
            input,
            norm.as_ref(),
            &mo.act,
            ff,
            &gate_up,
            route_in,
            MatvecOut::Geglu,
        )?;
        self.run(ds);
        let d = self.width();
        let ds =
            ops::expert_matvec_mixed(self.ctx, &x.down, &mo.act, &mo.weight, &mo.out, d, &down, k)?;
        self.run(ds);
        Ok(())
    }

    /// The end of layer `il`: its feed-forward output joins the stream where the next block
    /// reads it, or first, with per-layer inputs, the stream takes it and the layer's slice of
    /// the per-layer inputs gates a small projection that joins next (scaled with the layer's
    /// output).
    pub(super) fn end_layer(
        &mut self,
        il: usize,
        l: &'s Layer,
        ffn_out: Delta<'s>,
    ) -> Result<(), GpuError> {
        self.pending = Some((ffn_out, &l.post_ffw_norm, l.out_scale));
        let Some(p) = &l.ple else {
            return Ok(());
        };
        let s = &self.session.s;
        let mut ds = Vec::new();
        let ffn_out = delta_row(self.ctx, ffn_out, &s.moe.ffn_out, &mut ds)?;
        self.run(ds);
        if !self.table_rows_added {
            self.add_table_rows()?;
            self.table_rows_added = true;
        }
        self.per_layer_input(il, l, p, ffn_out)?;
        let d = self.width();
        let ds = self.product(&p.proj, &s.ple.act, &s.ple.out, d, PLAIN)?;
        self.run(ds);
        self.pending = Some((Delta::Row(&s.ple.out), &p.post_norm, l.out_scale));
        Ok(())
    }

    /// `x += norm(ffn) * post`, then `gelu(x W_gate) * per-layer input` into `ple.act`.
    fn per_layer_input(
        &mut self,
        il: usize,
        l: &'s Layer,
        p: &'s PleLayer,
        ffn_out: &'s View,
    ) -> Result<(), GpuError> {
        let (cfg, s) = (&self.session.model.cfg, &self.session.s);
        let (n, all) = (cfg.n_ple as u32, (cfg.n_ple * cfg.n_layer) as u32);
        let offset = il as u32 * n;
        let (stream, other) = self.streams();
        if self.one_token && self.fusions.per_layer_gate {
            // One dispatch: the residual add, the gate's product and its GELU times the
            // per-layer input.
            let step = ResidualStep {
                res: stream,
                delta: Delta::Row(ffn_out),
                post: &l.post_ffw_norm,
                scale: 1.0,
                eps: self.eps(),
                res_out: other,
                next_norm: None,
            };
            self.alt = !self.alt;
            let out = MatvecOut::GeluTimes {
                by: &s.ple.all,
                offset,
            };
            let ds = ops::matvec_after_residual(self.ctx, &p.inp_gate, &step, &s.ple.act, 0, out)?;
            self.run(ds);
        } else {
            let add = self.norm(ffn_out, NormOut::AddTo(stream), &l.post_ffw_norm)?;
            self.run(vec![add]);
            let ds = self.product(&p.inp_gate, stream, &s.ple.gate, n, PLAIN)?;
            self.run(ds);
            let op = Elementwise::Geglu {
                gate: &s.ple.gate,
                up: &s.ple.all,
                cols: n,
                gate_stride: n,
                up_stride: all,
                up_offset: offset,
            };
            let geglu = ops::elementwise(self.ctx, op, &s.ple.act, self.m * n)?;
            self.run(vec![geglu]);
        }
        Ok(())
    }

    /// The final norm and the logits (of the last row, or of every row into `all_logits`). A
    /// chunk without logits leaves only its KV entries behind: its last residual add has no
    /// reader.
    pub(super) fn logits(
        &mut self,
        logits: LogitsFor,
        all_logits: Option<&View>,
    ) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, &self.session.s);
        let cfg = &model.cfg;
        if logits == LogitsFor::None {
            return Ok(());
        }
        self.enter(&model.output_norm, None)?;
        let (m, d) = (self.m, self.width());
        let out = MatvecOut::Rows {
            softcap: cfg.final_softcap.unwrap_or(0.0),
        };
        let ds = if logits == LogitsFor::Last {
            let src = if m == 1 {
                &s.xn
            } else {
                let bytes = u64::from(d) * 4;
                self.ops.push(Op::Copy {
                    from: s.xn.slice(u64::from(m - 1) * bytes, bytes)?,
                    to: s.last_n.clone(),
                    bytes,
                });
                &s.last_n
            };
            ops::matvec(self.ctx, model.output_matrix(), src, &s.logits, 0, out)?
        } else {
            let y = all_logits.ok_or_else(|| GpuError::Shape("no buffer for all logits".into()))?;
            let args = MatmulArgs {
                x: &s.xn,
                y,
                m,
                x_stride: d,
                y_stride: cfg.n_vocab as u32,
                out,
                y_offset: 0,
                partials: None,
            };
            ops::matmul(self.ctx, model.output_matrix(), &args)?
        };
        self.run(ds);
        Ok(())
    }
}
