//! The lowering: a walk over a graph's nodes that emits each node's dispatches, or one
//! kernel's for a pattern of nodes where a fusion rule matches and is legal. Every rule's
//! decision is a pure function of the graph, the step's size and the device (`*_fused`
//! below), so a node that another takes in knows it without waiting for it.

use super::{Fusions, Graph, LoraTerm, Node, Place, PlanOp, Val};
use crate::ops::{
    self, Activation, Binary, Delta, Elementwise, EmbedOut, Epilogue, ExpertGroups, ExpertRoute,
    ExpertSlots, HeadPostArgs, InputNorm, LoraDelta, MatmulArgs, MatvecOut, MoeMix, NormOut,
    Product, ResidualStep,
};
use crate::{DType, Dispatch, GpuContext, GpuError, GpuWeight, Tensor, View};

/// Query heads up to which one token's split attention is merged in front of the output
/// product (each of its workgroups merging every head) rather than in a dispatch of its own
/// (benches/RESULTS.md, "Matrix-vector tuning rules").
pub const MERGE_IN_FRONT_HEADS: u32 = 8;

/// Most sequences of a batched decode step whose per-head norms, rope and K/V store run
/// inside their split attention (rule `batched_heads_in_attention`): each of its workgroups
/// redoes its head's work, which costs more than the dispatch it saves from 16 rows on
/// (benches/RESULTS.md, "Matrix-vector tuning rules").
pub const BATCHED_HEADS_IN_ATTENTION_ROWS: u32 = 8;

/// Slots per expert on average from which the experts' products run tiled, grouped by
/// expert: a tiled product costs about the same for 1 to 64 slots of an expert, one product
/// per slot grows with the slots (benches/RESULTS.md, "Matrix-vector tuning rules").
pub const TILED_SLOTS_PER_EXPERT: u32 = 6;

/// Buffers the lowering uses besides the graph's values.
#[derive(Clone, Copy)]
pub struct Scratch<'a> {
    /// The residual stream's two homes; it starts in the first.
    pub streams: [&'a View; 2],
    /// Partial sums of tiled products split over k (`ops::matmul_partials_floats`).
    pub partials: &'a View,
    /// One token's gated activations as 8-bit integers (`ops::int8_vector_words`).
    pub int8_act: &'a View,
    /// One token's split attention's partial results; with room enough, a many-token
    /// attention's parts over its keys (`ops::attention_parts_floats`).
    pub attn_part: &'a View,
    /// The last row of a many-row step's input to its logits.
    pub last_row: &'a View,
    /// Room for LoRA deltas, where a graph's products have adapters.
    pub lora: Option<LoraScratch<'a>>,
}

impl<'a> Scratch<'a> {
    /// The scratch of a graph of embeddings, norms, products, rows and sums lowered without
    /// fusions ([`super::Fusions::NONE`]; no residual stream, attention or logits, whose
    /// buffers it lacks): the partial sums of products split over k in `partials`. The
    /// lowering reads the other buffers only for those, so they all name `partials` here.
    pub fn for_products(partials: &'a View) -> Self {
        Self {
            streams: [partials, partials],
            partials,
            int8_act: partials,
            attn_part: partials,
            last_row: partials,
            lora: None,
        }
    }
}

/// The buffers LoRA deltas use: `t` (`x A^T`: the step's rows of the largest rank) and `raw`
/// (a gated product's gate and up rows before the activation: twice the widest gated output).
#[derive(Clone, Copy)]
pub struct LoraScratch<'a> {
    pub t: &'a View,
    pub raw: &'a View,
}

/// How to lower a graph.
pub struct Lowering<'a> {
    pub fusions: Fusions,
    pub scratch: Scratch<'a>,
    /// Values to copy out as soon as they are written, and where to (floats from the
    /// value's first row's first column up to its last row's last, `stride` apart).
    pub taps: Vec<(Val, View)>,
}

/// A lowered graph: its plan.
pub struct Lowered<H> {
    pub ops: Vec<PlanOp<H>>,
}

impl<'a> Lowering<'a> {
    /// The plan of `g`.
    pub fn lower<H: Clone>(
        &self,
        ctx: &GpuContext,
        g: &Graph<'a, H>,
    ) -> Result<Lowered<H>, GpuError> {
        let n_values = g.values().count();
        let mut readers = vec![Readers::default(); n_values];
        let mut producer = vec![None; n_values];
        for (i, n) in g.nodes().iter().enumerate() {
            n.for_each_input(|v| {
                let r = &mut readers[v.0 as usize];
                r.count += 1;
                r.first.get_or_insert(i);
            });
            n.for_each_output(|v| producer[v.0 as usize] = Some(i));
        }
        let mut w = Walk {
            ctx,
            g,
            l: self,
            readers,
            producer,
            alt: false,
            stream: None,
            ops: Vec::with_capacity(2 * g.nodes().len()),
            tapped: vec![false; self.taps.len()],
        };
        let mut i = 0;
        while i < g.nodes().len() {
            i += w.node(i)?;
        }
        if let Some((k, _)) = w.tapped.iter().enumerate().find(|(_, done)| !**done) {
            let name = g.get(self.taps[k].0).name;
            return Err(GpuError::Shape(format!(
                "{name} is not written by this plan (a fusion takes it in, or nothing reads it)"
            )));
        }
        Ok(Lowered { ops: w.ops })
    }
}

/// How many nodes read a value, and the first of them.
#[derive(Clone, Copy, Default)]
struct Readers {
    count: u32,
    first: Option<usize>,
}

/// The walk's state: where the stream is, and what is emitted so far.
struct Walk<'g, 'a, H> {
    ctx: &'g GpuContext,
    g: &'g Graph<'a, H>,
    l: &'g Lowering<'a>,
    /// The nodes that read each value.
    readers: Vec<Readers>,
    /// The node that writes each value.
    producer: Vec<Option<usize>>,
    /// The stream is in `streams[1]`.
    alt: bool,
    /// The stream's current value.
    stream: Option<Val>,
    ops: Vec<PlanOp<H>>,
    tapped: Vec<bool>,
}

const PLAIN: MatvecOut<'static> = MatvecOut::Rows { softcap: 0.0 };

impl<'g, 'a, H: Clone> Walk<'g, 'a, H> {
    fn node(&mut self, i: usize) -> Result<usize, GpuError> {
        match &self.g.nodes()[i] {
            Node::Embed { .. } | Node::CopyRows { .. } => self.input(i),
            Node::Norm { .. } => self.norm(i),
            Node::Linear { .. } => self.linear(i),
            Node::Gated { gate, up, out } => self.gated(*gate, *up, *out),
            Node::Residual { .. } => self.residual(i),
            Node::HeadNormRope { args, out, .. } => {
                // One token's head work always goes into its split attention; several
                // sequences' decode steps' (each its own slot of the cache) by rule
                // `batched_heads_in_attention`.
                let batched = self.l.fusions.batched_heads_in_attention
                    && self.g.tokens <= BATCHED_HEADS_IN_ATTENTION_ROWS;
                if matches!(self.at(i + 1), Some(Node::Attention { qkv, args: a, .. })
                        if qkv == out && (self.g.tokens == 1 || (batched && a.slot_rows > 0)))
                {
                    return Ok(1 + self.attention(i + 1, Some(args))?);
                }
                let d = ops::head_post(self.ctx, args)?;
                self.run(vec![d]);
                self.wrote(&[*out])?;
                Ok(1)
            }
            Node::Attention { .. } => self.attention(i, None),
            Node::Route { .. } => self.route(i),
            Node::Experts { .. } => self.experts(i),
            Node::MixExperts { out, .. } => {
                if self.mix_fused(i) {
                    return Ok(1);
                }
                let d = ops::moe_mix(self.ctx, &self.mix_args(i)?, self.view(*out)?)?;
                self.run(vec![d]);
                self.wrote(&[*out])?;
                Ok(1)
            }
            Node::Logits { .. } => self.logits(i),
            Node::Softmax { x, scale, out } => self.softmax(*x, *scale, *out),
            Node::Add { a, b, out } => self.add(*a, *b, *out),
            Node::Host(h) => {
                self.ops.push(PlanOp::Host(h.clone()));
                Ok(1)
            }
        }
    }

    // --- values ---

    fn at(&self, i: usize) -> Option<&'g Node<'a, H>> {
        self.g.nodes().get(i)
    }

    /// Where `v` is now. A stream value is only readable while it is the stream's latest.
    fn view(&self, v: Val) -> Result<&'a View, GpuError> {
        match self.g.get(v).place {
            Place::At { view, .. } => Ok(view),
            Place::Stream if self.stream == Some(v) => {
                Ok(self.l.scratch.streams[usize::from(self.alt)])
            }
            Place::Stream => Err(GpuError::Shape(format!(
                "{} is read after the stream has moved on",
                self.g.get(v).name
            ))),
        }
    }

    /// The stream's other home, where a fused residual step writes.
    fn other_stream(&self) -> &'a View {
        self.l.scratch.streams[usize::from(!self.alt)]
    }

    fn is_stream(&self, v: Val) -> bool {
        matches!(self.g.get(v).place, Place::Stream)
    }

    fn cols(&self, v: Val) -> u32 {
        self.g.get(v).cols
    }

    /// The node that writes `v`.
    fn producer(&self, v: Val) -> Option<(usize, &'g Node<'a, H>)> {
        let i = self.producer[v.0 as usize]?;
        Some((i, &self.g.nodes()[i]))
    }

    /// The only node that reads `v`.
    fn only_reader(&self, v: Val) -> Option<(usize, &'g Node<'a, H>)> {
        match self.readers[v.0 as usize] {
            Readers {
                count: 1,
                first: Some(i),
            } => Some((i, &self.g.nodes()[i])),
            _ => None,
        }
    }

    fn same_place(&self, a: Val, b: Val) -> bool {
        match (&self.g.get(a).place, &self.g.get(b).place) {
            (
                Place::At {
                    view: x, col: cx, ..
                },
                Place::At {
                    view: y, col: cy, ..
                },
            ) => x.buffer == y.buffer && x.offset == y.offset && cx == cy,
            (Place::Stream, Place::Stream) => true,
            _ => false,
        }
    }

    fn run(&mut self, ds: Vec<crate::Dispatch>) {
        self.ops.extend(ds.into_iter().map(PlanOp::Run));
    }

    /// Copies the tapped ones of `vals`, just written, to their taps.
    fn wrote(&mut self, vals: &[Val]) -> Result<(), GpuError> {
        for (k, (v, to)) in self.l.taps.iter().enumerate() {
            if !vals.contains(v) {
                continue;
            }
            let value = self.g.get(*v);
            let floats = u64::from(value.rows.max(1) - 1) * u64::from(value.stride())
                + u64::from(value.cols);
            let bytes = (floats * 4).min(to.size);
            let from = self.view(*v)?.slice(u64::from(value.col()) * 4, bytes)?;
            self.ops.push(PlanOp::Copy {
                from,
                to: to.clone(),
                bytes,
            });
            self.tapped[k] = true;
        }
        Ok(())
    }

    /// One token, whose row of `cols` fits in a workgroup's memory: the one-token fusions
    /// can run.
    fn one_token(&self, cols: u32) -> bool {
        self.g.tokens == 1 && ops::matvec_input_fits(self.ctx, cols)
    }

    // --- the inputs ---

    fn input(&mut self, i: usize) -> Result<usize, GpuError> {
        let m = self.g.tokens;
        let out = match &self.g.nodes()[i] {
            Node::Embed {
                table,
                ids,
                scale,
                onto,
                out,
            } => {
                let y = self.place_of_new(*out)?;
                let how = if onto.is_some() {
                    EmbedOut::Add
                } else {
                    EmbedOut::Write
                };
                let ds = ops::embed(self.ctx, table, ids, y, m, *scale, how)?;
                self.run(ds);
                *out
            }
            Node::CopyRows { from, row, x, out } => {
                let v = self.g.get(*x);
                let start = (u64::from(*row) * u64::from(v.stride()) + u64::from(v.col())) * 4;
                let to = self.view(*x)?.slice(start, from.size)?;
                self.ops.push(PlanOp::Copy {
                    from: from.clone(),
                    to,
                    bytes: from.size,
                });
                *out
            }
            _ => unreachable!("input() is called on inputs"),
        };
        if self.is_stream(out) {
            self.stream = Some(out);
        }
        self.wrote(&[out])?;
        Ok(1)
    }

    /// Where a node writes `out`: a new stream value takes the stream's current home.
    fn place_of_new(&mut self, out: Val) -> Result<&'a View, GpuError> {
        if self.is_stream(out) {
            self.stream = Some(out);
        }
        self.view(out)
    }

    // --- rows and sums ---

    fn softmax(&mut self, x: Val, scale: f32, out: Val) -> Result<usize, GpuError> {
        let (xt, yt) = (self.tensor(x)?, self.tensor(out)?);
        let op = ops::RowOp::Softmax { scale };
        let d = ops::rows(self.ctx, op, ops::Affine::default(), &xt, &yt)?;
        self.run(vec![d]);
        self.wrote(&[out])?;
        Ok(1)
    }

    fn add(&mut self, a: Val, b: Val, out: Val) -> Result<usize, GpuError> {
        let whole = |v: &super::Value<'_>| v.col() == 0 && v.stride() == v.cols;
        let (av, bv) = (self.g.get(a), self.g.get(b));
        if !self.same_place(a, out)
            || !whole(av)
            || !whole(bv)
            || (av.rows, av.cols) != (bv.rows, bv.cols)
        {
            return Err(GpuError::Shape(format!(
                "{}: a sum of two terms of one shape, each whole rows of its buffer, written \
                 where its first term is",
                self.g.get(out).name
            )));
        }
        let n = count_of(u64::from(av.rows) * u64::from(av.cols))?;
        let d = ops::elementwise(self.ctx, Elementwise::Add(self.view(b)?), self.view(a)?, n)?;
        self.run(vec![d]);
        if self.is_stream(out) {
            self.stream = Some(out);
        }
        self.wrote(&[out])?;
        Ok(1)
    }

    // --- norms and products ---

    fn norm(&mut self, i: usize) -> Result<usize, GpuError> {
        let Node::Norm {
            x,
            weight,
            eps,
            dim,
            out,
        } = &self.g.nodes()[i]
        else {
            unreachable!("norm() is called on norms")
        };
        if self.router_norm_fused(i) {
            let Some(Node::Linear { w, out: y, .. }) = self.at(i + 1) else {
                unreachable!("the rule matched a product")
            };
            let norm = InputNorm {
                weight: weight.ok_or_else(|| GpuError::Shape("a norm without weight".into()))?,
                eps: *eps,
            };
            let col = self.g.get(*y).col();
            let ds = ops::matvec_normed(
                self.ctx,
                w,
                self.view(*x)?,
                &norm,
                self.view(*y)?,
                col,
                PLAIN,
            )?;
            self.run(ds);
            self.wrote(&[*y])?;
            return Ok(2);
        }
        if let Some((j, _)) = self.only_reader(*out)
            && self.expert_norm_fused(j)
        {
            return Ok(1);
        }
        let xv = self.g.get(*x);
        let (rows, stride) = if xv.stride() == xv.cols && xv.cols.is_multiple_of(*dim) {
            (xv.rows * (xv.cols / dim), *dim)
        } else if xv.cols == *dim {
            (xv.rows, xv.stride())
        } else {
            return Err(GpuError::Shape(format!(
                "{}: a norm over {dim} of a row of {}",
                xv.name, xv.cols
            )));
        };
        let x_view = self.view(*x)?;
        let to = if self.same_place(*x, *out) {
            NormOut::InPlace
        } else {
            NormOut::To(self.view(*out)?)
        };
        let d = ops::rms_norm(
            self.ctx,
            ops::RmsNorm {
                x: x_view,
                out: to,
                weight: *weight,
                rows,
                dim: *dim,
                x_stride: stride,
                eps: *eps,
            },
        )?;
        self.run(vec![d]);
        if self.is_stream(*out) {
            self.stream = Some(*out);
        }
        self.wrote(&[*out])?;
        Ok(1)
    }

    fn linear(&mut self, i: usize) -> Result<usize, GpuError> {
        let Node::Linear {
            w,
            x,
            gated,
            lora,
            out,
        } = &self.g.nodes()[i]
        else {
            unreachable!("linear() is called on products")
        };
        let (xv, yv) = (self.g.get(*x), self.g.get(*out));
        if xv.col() != 0 {
            return Err(GpuError::Shape(format!(
                "{}: a product of a column slice",
                xv.name
            )));
        }
        let kind = if *gated { MatvecOut::Geglu } else { PLAIN };
        let args = MatmulArgs {
            x: self.view(*x)?,
            y: self.view(*out)?,
            m: self.g.tokens,
            x_stride: xv.stride(),
            y_stride: yv.stride(),
            out: kind,
            y_offset: yv.col(),
            partials: Some(self.l.scratch.partials),
        };
        match lora {
            None if self.l.fusions.few_token_products => {
                let ds = ops::matmul_few_tokens(self.ctx, w, &args)?;
                self.run(ds);
            }
            None => {
                let ds = ops::matmul(self.ctx, w, &args)?;
                self.run(ds);
            }
            // Rule `lora_in_product`: one token, whatever its width (the epilogue reads only
            // `t` and B's rows).
            Some(term) if self.l.fusions.lora_in_product && self.g.tokens == 1 => {
                let t = self.x_times_a(term, &args)?;
                let delta = self.lora_delta(term, t);
                let e = Epilogue {
                    out: kind,
                    lora: Some(&delta),
                };
                let ds = ops::matvec(self.ctx, w, args.x, args.y, args.y_offset, e)?;
                self.run(ds);
            }
            Some(term) => self.linear_then_lora(w, term, args, *out)?,
        }
        self.wrote(&[*out])?;
        Ok(1)
    }

    /// The product `args` says, then its adapter's delta added by products of their own: `x
    /// A^T` as a weight's product, then each segment's `t B^T` added in place. A gated
    /// product's gate and up rows are written as they are, interleaved, and the activation
    /// follows the deltas.
    fn linear_then_lora(
        &mut self,
        w: &GpuWeight,
        term: &LoraTerm<'_>,
        mut args: MatmulArgs<'a>,
        out: Val,
    ) -> Result<(), GpuError> {
        let gated = args.out.is_geglu();
        let raw = self.lora_scratch()?.raw;
        let n = w.rows as u32;
        let y = if gated {
            (args.y, args.y_stride, args.y_offset, args.out) = (raw, n, 0, PLAIN);
            Tensor::new(raw, &[1, args.m, n])?
        } else {
            self.tensor(out)?
        };
        let ds = ops::matmul(self.ctx, w, &args)?;
        self.run(ds);
        let t = self.x_times_a(term, &args)?;
        let segments = term.segments.count(n);
        let t_stride = segments * term.rank;
        for s in 0..segments {
            let (first, count, step) = term.segments.rows(s, n);
            let dims = [1, count, term.rank];
            let b = Tensor::strided(
                term.b,
                DType::F32,
                &dims,
                &[0, step * term.rank, 1],
                first * term.rank,
            )?;
            let ts = Tensor::strided(
                t,
                DType::F32,
                &[1, args.m, term.rank],
                &[0, t_stride, 1],
                s * term.rank,
            )?;
            let tb = Product {
                a: &ts,
                bt: &b,
                bias: None,
                alpha: 1.0,
                accumulate: true,
            };
            let ys = if gated {
                Tensor::strided(raw, DType::F32, &[1, args.m, count], &[0, n, step], first)?
            } else {
                y.narrow(2, first, count)?
            };
            let d = ops::product(self.ctx, &tb, &ys)?;
            self.run(vec![d]);
        }
        if gated {
            let rows =
                |first| Tensor::strided(raw, DType::F32, &[1, args.m, n / 2], &[0, n, 2], first);
            let (gate, up) = (rows(0)?, rows(1)?);
            let act = Binary::Gated(Activation::GeluTanh);
            let d = ops::binary(self.ctx, act, &gate, &up, &self.tensor(out)?)?;
            self.run(vec![d]);
        }
        Ok(())
    }

    fn lora_scratch(&self) -> Result<LoraScratch<'a>, GpuError> {
        self.l.scratch.lora.ok_or_else(|| {
            GpuError::Shape("a product with adapters, and no room for their deltas".into())
        })
    }

    /// `v` as a `[1, rows, cols]` tensor (its rows `stride` apart from its column).
    fn tensor(&self, v: Val) -> Result<Tensor, GpuError> {
        let value = self.g.get(v);
        let (rows, cols, stride) = (value.rows, value.cols, value.stride());
        let dims = [1, rows, cols];
        let strides = [rows * stride, stride, 1];
        Tensor::strided(self.view(v)?, DType::F32, &dims, &strides, value.col())
    }

    /// `t = x A^T` (sums as long as the input is wide) as a weight's product into the
    /// scratch, for the product whose input `x` is (`args.x`, `args.m` rows `args.x_stride`
    /// apart).
    fn x_times_a(&mut self, term: &LoraTerm<'_>, x: &MatmulArgs<'_>) -> Result<&'a View, GpuError> {
        let t = self.lora_scratch()?.t;
        let m = x.m;
        let partials = self.l.scratch.partials;
        let fits = ops::matmul_partials_floats(self.ctx, term.a, m) * 4 <= partials.size;
        let xa = MatmulArgs {
            x: x.x,
            y: t,
            m,
            x_stride: x.x_stride,
            y_stride: term.a.rows as u32,
            out: PLAIN,
            y_offset: 0,
            partials: fits.then_some(partials),
        };
        let ds = ops::matmul(self.ctx, term.a, &xa)?;
        self.run(ds);
        Ok(t)
    }

    /// With `lora`, `t = x A^T` by `product` (A's product with the step its product has in
    /// front), and the delta the product then joins to its rows.
    fn x_times_a_with(
        &mut self,
        lora: Option<&LoraTerm<'a>>,
        product: impl FnOnce(&GpuContext, &GpuWeight, &'a View) -> Result<Vec<Dispatch>, GpuError>,
    ) -> Result<Option<LoraDelta<'a>>, GpuError> {
        let Some(term) = lora else { return Ok(None) };
        let t = self.lora_scratch()?.t;
        let ds = product(self.ctx, term.a, t)?;
        self.run(ds);
        Ok(Some(self.lora_delta(term, t)))
    }

    /// The delta a product joins to its rows, from `t` (the scratch's `x A^T`).
    fn lora_delta(&self, term: &LoraTerm<'a>, t: &'a View) -> LoraDelta<'a> {
        LoraDelta {
            t,
            b: term.b,
            rank: term.rank,
            segments: term.segments,
        }
    }

    fn gated(&mut self, gate: Val, up: Val, out: Val) -> Result<usize, GpuError> {
        let (gv, uv, ov) = (self.g.get(gate), self.g.get(up), self.g.get(out));
        if gv.col() != 0 || ov.col() != 0 || ov.stride() != ov.cols {
            return Err(GpuError::Shape(format!(
                "{}: a gated product of slices",
                ov.name
            )));
        }
        let op = Elementwise::Geglu {
            gate: self.view(gate)?,
            up: self.view(up)?,
            cols: ov.cols,
            gate_stride: gv.stride(),
            up_stride: uv.stride(),
            up_offset: uv.col(),
        };
        let d = ops::elementwise(self.ctx, op, self.view(out)?, self.g.tokens * ov.cols)?;
        self.run(vec![d]);
        self.wrote(&[out])?;
        Ok(1)
    }

    // --- the residual step ---

    fn residual(&mut self, i: usize) -> Result<usize, GpuError> {
        let Node::Residual {
            stream,
            delta,
            post,
            scale,
            eps,
            out,
        } = &self.g.nodes()[i]
        else {
            unreachable!("residual() is called on residual steps")
        };
        if self.readers[out.0 as usize].count == 0 {
            // Nothing reads the updated stream (a chunk without logits).
            return Ok(1);
        }
        if self.residual_prologue_fused(i) {
            return self.residual_into_product(i);
        }
        if self.per_layer_gate_fused(i) {
            return self.residual_into_gate(i);
        }
        let (res, dv) = (self.view(*stream)?, self.view(*delta)?);
        let (m, d) = (self.g.tokens, self.cols(*out));
        self.stream = Some(*out);
        if let Some(Node::Norm {
            x,
            weight: Some(weight),
            out: normed,
            ..
        }) = self.at(i + 1)
            && x == out
        {
            let d = ops::residual_norm(
                self.ctx,
                &ops::ResidualNorm {
                    res,
                    delta: dv,
                    post,
                    weight,
                    out: self.view(*normed)?,
                    rows: m,
                    dim: d,
                    scale: *scale,
                    eps: *eps,
                },
            )?;
            self.run(vec![d]);
            self.wrote(&[*out, *normed])?;
            return Ok(2);
        }
        if *scale != 1.0 {
            return Err(GpuError::Shape(format!(
                "{}: a scaled residual step without a norm after it",
                self.g.get(*out).name
            )));
        }
        let stride = self.g.get(*delta).stride();
        let add = ops::rms_norm(
            self.ctx,
            ops::RmsNorm {
                x: dv,
                out: NormOut::AddTo(res),
                weight: Some(post),
                rows: m,
                dim: d,
                x_stride: stride,
                eps: *eps,
            },
        )?;
        self.run(vec![add]);
        self.wrote(&[*out])?;
        Ok(1)
    }

    /// The step whose residual `i` feeds: the step itself (the stream's other home written),
    /// its delta and, where `next_norm`, the norm after it.
    fn residual_step(
        &self,
        i: usize,
        next_norm: Option<(&'a View, &'a View)>,
    ) -> Result<ResidualStep<'a>, GpuError> {
        let Node::Residual {
            stream,
            delta,
            post,
            scale,
            eps,
            ..
        } = &self.g.nodes()[i]
        else {
            unreachable!("residual_step() is called on residual steps")
        };
        let delta = match self.producer(*delta) {
            Some((p, _)) if self.mix_fused(p) => Delta::Moe(self.mix_args(p)?),
            _ => Delta::Row(self.view(*delta)?),
        };
        Ok(ResidualStep {
            res: self.view(*stream)?,
            delta,
            post,
            scale: *scale,
            eps: *eps,
            res_out: self.other_stream(),
            next_norm,
        })
    }

    /// Rule `residual_prologue`: residual `i`, the norm of its result, and one token's product
    /// of that (with, behind a gated product, the down product reading 8-bit activations).
    fn residual_prologue_fused(&self, i: usize) -> bool {
        let Some(Node::Residual { out, .. }) = self.at(i) else {
            return false;
        };
        let (
            Some(Node::Norm {
                x,
                out: n,
                weight: Some(_),
                ..
            }),
            Some(Node::Linear { x: lx, lora, .. }),
        ) = (self.at(i + 1), self.at(i + 2))
        else {
            return false;
        };
        self.l.fusions.residual_prologue
            && x == out
            && lx == n
            && (lora.is_none() || self.l.fusions.lora_in_product)
            && self.one_token(self.cols(*out))
    }

    fn residual_into_product(&mut self, i: usize) -> Result<usize, GpuError> {
        let (
            Some(Node::Residual { out, .. }),
            Some(Node::Norm {
                weight: Some(weight),
                out: normed,
                ..
            }),
            Some(Node::Linear {
                w,
                gated,
                lora,
                out: y,
                ..
            }),
        ) = (self.at(i), self.at(i + 1), self.at(i + 2))
        else {
            unreachable!("the rule matched")
        };
        let normed_view = self.view(*normed)?;
        let step = self.residual_step(i, Some((weight, normed_view)))?;
        self.alt = !self.alt;
        self.stream = Some(*out);
        // With an adapter, its `x A^T` takes the step in front of it (writing the stream and
        // the normed input), and the product reads the normed input.
        let delta = self.x_times_a_with(lora.as_ref(), |ctx, a, t| {
            ops::matvec_after_residual(ctx, a, &step, t, 0, PLAIN)
        })?;
        let ctx = self.ctx;
        let product = |y: &'a View, col: u32, out: MatvecOut<'a>| {
            let e = Epilogue {
                out,
                lora: delta.as_ref(),
            };
            match delta {
                Some(_) => ops::matvec(ctx, w, normed_view, y, col, e),
                None => ops::matvec_after_residual(ctx, w, &step, y, col, e),
            }
        };
        if let Some(Node::Linear {
            w: down,
            out: z,
            x,
            lora: None,
            ..
        }) = self.at(i + 3)
            && x == y
            && *gated
            && self.l.fusions.int8_activations
            && ops::int8_activations_fit(self.ctx, w, down, delta.is_none())
        {
            let q = self.l.scratch.int8_act;
            let ds = product(q, 0, MatvecOut::GegluInt8)?;
            self.run(ds);
            let col = self.g.get(*z).col();
            let ds = ops::matvec_int8_input(self.ctx, down, q, self.view(*z)?, col, PLAIN)?;
            self.run(ds);
            self.wrote(&[*out, *normed, *z])?;
            return Ok(4);
        }
        let kind = if *gated { MatvecOut::Geglu } else { PLAIN };
        let ds = product(self.view(*y)?, self.g.get(*y).col(), kind)?;
        self.run(ds);
        self.wrote(&[*out, *normed, *y])?;
        Ok(3)
    }

    /// Rule `per_layer_gate`: residual `i`, one token's product of its result and that
    /// product's GELU times another value.
    fn per_layer_gate_fused(&self, i: usize) -> bool {
        let Some(Node::Residual { out, .. }) = self.at(i) else {
            return false;
        };
        let (
            Some(Node::Linear {
                x,
                gated: false,
                out: y,
                lora: None,
                ..
            }),
            Some(Node::Gated { gate, .. }),
        ) = (self.at(i + 1), self.at(i + 2))
        else {
            return false;
        };
        self.l.fusions.per_layer_gate && x == out && gate == y && self.one_token(self.cols(*out))
    }

    fn residual_into_gate(&mut self, i: usize) -> Result<usize, GpuError> {
        let (
            Some(Node::Residual { out, .. }),
            Some(Node::Linear { w, .. }),
            Some(Node::Gated { up, out: act, .. }),
        ) = (self.at(i), self.at(i + 1), self.at(i + 2))
        else {
            unreachable!("the rule matched")
        };
        let step = self.residual_step(i, None)?;
        self.alt = !self.alt;
        self.stream = Some(*out);
        let kind = MatvecOut::GeluTimes {
            by: self.view(*up)?,
            offset: self.g.get(*up).col(),
        };
        let col = self.g.get(*act).col();
        let ds = ops::matvec_after_residual(self.ctx, w, &step, self.view(*act)?, col, kind)?;
        self.run(ds);
        self.wrote(&[*out, *act])?;
        Ok(3)
    }

    // --- attention ---

    /// Attention node `i` (with the per-head norms and rope in front of it for one token,
    /// `heads`): for one token the split kernel, its merge in front of the output product
    /// where rule `merge_in_front` holds; for the tokens of several sequences (a cache of
    /// slots) the split kernel over them all; else the batched kernel.
    fn attention(&mut self, i: usize, heads: Option<&HeadPostArgs<'_>>) -> Result<usize, GpuError> {
        let Node::Attention { args, out, .. } = &self.g.nodes()[i] else {
            unreachable!("attention() is called on attention")
        };
        let part = self.l.scratch.attn_part;
        if self.g.tokens != 1 && args.slot_rows > 0 {
            // Each token a sequence of its own (a batch of decode steps): split over the keys
            // as one token's attention is, the tokens side by side.
            let (split, merge) = ops::attention_split(self.ctx, args, 0, part, heads)?;
            let combine = ops::attention_combine(self.ctx, &merge)?;
            self.run(vec![split, combine]);
            self.wrote(&[*out])?;
            return Ok(1);
        }
        if self.g.tokens != 1 {
            let d = ops::attention_in_parts(self.ctx, args, part)?;
            self.run(d);
            self.wrote(&[*out])?;
            return Ok(1);
        }
        let (split, merge) = ops::attention_split(self.ctx, args, 0, part, heads)?;
        self.run(vec![split]);
        if let Some(Node::Linear {
            w,
            x,
            gated: false,
            out: y,
            lora,
        }) = self.at(i + 1)
            && x == out
            && (lora.is_none() || self.l.fusions.lora_in_product)
            && self.l.fusions.merge_in_front
            && args.n_head <= MERGE_IN_FRONT_HEADS
            && ops::matvec_input_fits(self.ctx, w.cols as u32)
        {
            let (col, yv) = (self.g.get(*y).col(), self.view(*y)?);
            // With an adapter, its `x A^T` merges the chunks (and stores K and V) first, and
            // the product merges them again.
            let delta = self.x_times_a_with(lora.as_ref(), |ctx, a, t| {
                ops::matvec_after_attention(ctx, a, &merge, t, 0, PLAIN)
            })?;
            let merge = if delta.is_some() {
                merge.without_kv_store()
            } else {
                merge
            };
            let e = Epilogue {
                out: PLAIN,
                lora: delta.as_ref(),
            };
            let ds = ops::matvec_after_attention(self.ctx, w, &merge, yv, col, e)?;
            self.run(ds);
            self.wrote(&[*y])?;
            return Ok(2);
        }
        let d = ops::attention_combine(self.ctx, &merge)?;
        self.run(vec![d]);
        self.wrote(&[*out])?;
        Ok(1)
    }

    // --- experts ---

    /// Rule `router_norm_in_product`: norm `i`, one token's product of it, and the routing
    /// that reads that.
    fn router_norm_fused(&self, i: usize) -> bool {
        let (
            Some(Node::Norm {
                x,
                out,
                weight: Some(_),
                ..
            }),
            Some(Node::Linear {
                x: lx,
                gated: false,
                out: y,
                lora: None,
                ..
            }),
            Some(Node::Route { logits, .. }),
        ) = (self.at(i), self.at(i + 1), self.at(i + 2))
        else {
            return false;
        };
        self.l.fusions.router_norm_in_product
            && lx == out
            && logits == y
            && self.one_token(self.cols(*x))
    }

    /// Whether experts node `j` runs tiled (slots grouped by expert): many tokens, and
    /// enough slots per expert.
    fn experts_tiled(&self, j: usize) -> bool {
        let Some(Node::Experts { w, .. }) = self.at(j) else {
            return false;
        };
        let m = self.g.tokens;
        m > ops::MATVEC_MAX_TOKENS && m * w.k >= TILED_SLOTS_PER_EXPERT * w.n_expert
    }

    /// Rule `expert_norm_in_product`: the experts' input is a norm only they read, computed
    /// inside their per-slot gate/up product.
    fn expert_norm_fused(&self, j: usize) -> bool {
        let Some(Node::Experts { x, .. }) = self.at(j) else {
            return false;
        };
        let Some((
            _,
            Node::Norm {
                weight: Some(_), ..
            },
        )) = self.producer(*x)
        else {
            return false;
        };
        self.l.fusions.expert_norm_in_product
            && self.only_reader(*x).is_some()
            && ops::matvec_input_fits(self.ctx, self.cols(*x))
            && !self.experts_tiled(j)
    }

    /// Rule `route_in_product`: the routing inside the experts' gate/up product, where their
    /// norm is (nothing of the caller's runs between: a streamed layer's upload needs the
    /// route first).
    fn route_fused(&self, j: usize) -> bool {
        let Some(Node::Experts { sel, x, .. }) = self.at(j) else {
            return false;
        };
        let Some((p, Node::Route { .. })) = self.producer(*sel) else {
            return false;
        };
        let host_between = self.g.nodes()[p..j]
            .iter()
            .any(|n| matches!(n, Node::Host(_)));
        self.l.fusions.route_in_product
            && self.expert_norm_fused(j)
            && !host_between
            && ops::expert_route_fits(self.ctx, self.cols(*x))
    }

    fn route(&mut self, i: usize) -> Result<usize, GpuError> {
        let Node::Route {
            logits,
            expert_scale,
            k,
            sel,
            weight,
        } = &self.g.nodes()[i]
        else {
            unreachable!("route() is called on routes")
        };
        if let Some((j, _)) = self.only_reader(*sel)
            && self.route_fused(j)
        {
            return Ok(1);
        }
        let (m, ne) = (self.g.tokens, self.cols(*logits));
        let (lv, sv, wv) = (self.view(*logits)?, self.view(*sel)?, self.view(*weight)?);
        let d = ops::moe_route(
            self.ctx,
            &ops::ExpertRoute {
                logits: lv,
                weight: wv,
                expert_scale: *expert_scale,
                n_expert: ne,
            },
            sv,
            m,
            *k,
        )?;
        self.run(vec![d]);
        self.wrote(&[*sel, *weight])?;
        Ok(1)
    }

    fn experts(&mut self, j: usize) -> Result<usize, GpuError> {
        let Node::Experts {
            w,
            x,
            sel,
            weight,
            scratch,
            out,
        } = &self.g.nodes()[j]
        else {
            unreachable!("experts() is called on experts")
        };
        let (m, d) = (self.g.tokens, self.cols(*out));
        let gate_up = ExpertSlots {
            sel: self.view(*sel)?,
            slots: m * w.k,
            rows_per_expert: 2 * w.ff,
            x_group: w.k,
        };
        let down = ExpertSlots {
            rows_per_expert: d,
            x_group: 1,
            ..gate_up
        };
        let y = self.view(*out)?;
        if self.experts_tiled(j) {
            let groups = ExpertGroups {
                groups: scratch.groups,
                n_expert: w.n_expert,
                tokens: m,
            };
            let group = ops::moe_group(self.ctx, &gate_up, &groups)?;
            self.run(vec![group]);
            let (xv, act) = (self.view(*x)?, scratch.act);
            let ds = ops::expert_matmul(
                self.ctx,
                w.gate_up,
                &ops::ExpertIo {
                    x: xv,
                    y: act,
                    y_stride: w.ff,
                    slots: &gate_up,
                },
                &groups,
                MatvecOut::Geglu,
            )?;
            self.run(ds);
            let ds = ops::expert_matmul(
                self.ctx,
                w.down,
                &ops::ExpertIo {
                    x: act,
                    y,
                    y_stride: d,
                    slots: &down,
                },
                &groups,
                PLAIN,
            )?;
            self.run(ds);
            self.wrote(&[*out])?;
            return Ok(1);
        }
        let (input, norm) = match self.producer(*x) {
            Some((
                _,
                Node::Norm {
                    x: nx,
                    weight: Some(nw),
                    eps,
                    ..
                },
            )) if self.expert_norm_fused(j) => (
                self.view(*nx)?,
                Some(InputNorm {
                    weight: nw,
                    eps: *eps,
                }),
            ),
            _ => (self.view(*x)?, None),
        };
        let route = match self.producer(*sel) {
            Some((
                _,
                Node::Route {
                    logits,
                    expert_scale,
                    ..
                },
            )) if self.route_fused(j) => Some(ExpertRoute {
                logits: self.view(*logits)?,
                weight: self.view(*weight)?,
                expert_scale: *expert_scale,
                n_expert: w.n_expert,
            }),
            _ => None,
        };
        let ds = ops::expert_matvec(
            self.ctx,
            w.gate_up,
            &ops::ExpertIo {
                x: input,
                y: scratch.act,
                y_stride: w.ff,
                slots: &gate_up,
            },
            norm.as_ref(),
            route.as_ref(),
            MatvecOut::Geglu,
        )?;
        self.run(ds);
        let wv = self.view(*weight)?;
        let ds = ops::expert_matvec_mixed(
            self.ctx,
            w.down,
            &ops::ExpertIo {
                x: scratch.act,
                y,
                y_stride: d,
                slots: &down,
            },
            wv,
            w.k,
        )?;
        self.run(ds);
        let routed: &[Val] = if route.is_some() {
            &[*sel, *weight]
        } else {
            &[]
        };
        self.wrote(&[&[*out], routed].concat())?;
        Ok(1)
    }

    /// Rule `experts_mix_in_product`: mix `p` computed inside the product behind the residual
    /// step that reads it.
    fn mix_fused(&self, p: usize) -> bool {
        let (Some(Node::MixExperts { out, .. }), Some(Node::Residual { delta, .. })) =
            (self.at(p), self.at(p + 1))
        else {
            return false;
        };
        self.l.fusions.experts_mix_in_product
            && delta == out
            && self.residual_prologue_fused(p + 1)
            && ops::moe_delta_fits(self.ctx)
    }

    /// [`ops::moe_mix`]'s arguments for mix node `p`: per slot, or (the per-slot products
    /// sum them) per token.
    fn mix_args(&self, p: usize) -> Result<MoeMix<'a>, GpuError> {
        let Some(Node::MixExperts {
            dense,
            dense_post,
            experts,
            experts_post,
            eps,
            out,
        }) = self.at(p)
        else {
            unreachable!("mix_args() is called on mixes")
        };
        let (weight, k) = match self.producer(*experts) {
            Some((j, Node::Experts { weight, w, .. })) if self.experts_tiled(j) => {
                (Some(self.view(*weight)?), w.k)
            }
            _ => (None, 1),
        };
        Ok(MoeMix {
            experts: self.view(*experts)?,
            weight,
            experts_post,
            dense: self.view(*dense)?,
            dense_post,
            tokens: self.g.tokens,
            k,
            dim: self.cols(*out),
            eps: *eps,
        })
    }

    // --- logits ---

    fn logits(&mut self, i: usize) -> Result<usize, GpuError> {
        let Node::Logits {
            w,
            x,
            softcap,
            all,
            out,
        } = &self.g.nodes()[i]
        else {
            unreachable!("logits() is called on logits")
        };
        let (m, kind) = (self.g.tokens, MatvecOut::Rows { softcap: *softcap });
        let (xv, y) = (self.view(*x)?, self.view(*out)?);
        let ds = if *all {
            let args = MatmulArgs {
                x: xv,
                y,
                m,
                x_stride: self.g.get(*x).stride(),
                y_stride: self.g.get(*out).stride(),
                out: kind,
                y_offset: 0,
                partials: None,
            };
            if self.l.fusions.few_token_products {
                ops::matmul_few_tokens(self.ctx, w, &args)?
            } else {
                ops::matmul(self.ctx, w, &args)?
            }
        } else if m == 1 {
            ops::matvec(self.ctx, w, xv, y, 0, kind)?
        } else {
            let bytes = u64::from(self.cols(*x)) * 4;
            let last = u64::from(m - 1) * u64::from(self.g.get(*x).stride()) * 4;
            let row = self.l.scratch.last_row;
            self.ops.push(PlanOp::Copy {
                from: xv.slice(last, bytes)?,
                to: row.clone(),
                bytes,
            });
            ops::matvec(self.ctx, w, row, y, 0, kind)?
        };
        self.run(ds);
        self.wrote(&[*out])?;
        Ok(1)
    }
}

/// A count of floats that a dispatch's parameters hold.
fn count_of(n: u64) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Shape(format!("{n} values in one dispatch")))
}
