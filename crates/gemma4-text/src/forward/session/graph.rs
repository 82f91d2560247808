//! The decoder as a graph: what one step computes, block by block, over named values
//! (`blk.N.attn_out`, `blk.N.ffn_out`, ...), as the reference implementation reads. Fusion is
//! not decided here: [`wgemma_kernels::graph::Lowering`] turns the graph into dispatches,
//! taking several nodes into one kernel where a rule of [`Fusions`] matches and fits.

use std::borrow::Cow;

use wgemma_kernels::graph::{
    ExpertScratch, ExpertWeights, Fusions, Graph, LoraScratch, LoraTerm, Lowering, Name, Node,
    Place, Scratch, Val,
};
use wgemma_kernels::{GpuError, GpuWeight, View, WeightTile};

use super::super::lora::Site;
use super::{Activations, GpuSession, HostOp, KeyReach, LogitsFor, Op, StepInput};
use crate::forward::model::{Experts, GateUp, Layer, PleLayer};
use crate::reference::LayerRole;

fn step_value(name: &'static str) -> Name {
    Name { name, layer: None }
}

fn layer_value(name: &'static str, il: usize) -> Name {
    Name {
        name,
        layer: Some(il),
    }
}

/// Names of a layer's q/k/v products, by index (projections of one dtype share one).
const QKV_PARTS: [&str; 3] = ["qkv_0", "qkv_1", "qkv_2"];

pub(super) struct DecoderGraph<'s> {
    session: &'s GpuSession,
    /// Where the step's activations live (the session's own row or the shared arena).
    acts: &'s Activations,
    g: Graph<'s, HostOp>,
    /// The stream's latest value.
    x: Option<Val>,
    /// Every layer's per-layer inputs, once computed.
    ple_all: Option<Val>,
    /// The step's token ids (on the GPU), which a table on the GPU is gathered by.
    ids: Option<&'s View>,
    table_rows_added: bool,
    /// Which keys the step's rows see.
    reach: KeyReach,
    /// Which output scales the layers apply (DiffusionGemma's encoder or denoiser).
    role: LayerRole,
}

impl<'s> DecoderGraph<'s> {
    pub(super) fn new(session: &'s GpuSession, m: u32) -> Self {
        let mut g = Graph::new(m);
        // About 16 nodes a layer (the experts' and per-layer inputs' included).
        g.reserve(16 * session.model.layers.len() + 8);
        Self {
            session,
            acts: session.acts(m as usize),
            g,
            x: None,
            ple_all: None,
            ids: None,
            table_rows_added: false,
            reach: KeyReach::Causal,
            role: LayerRole::Encoder,
        }
    }

    /// The whole step: the embeddings, every layer, the logits.
    pub(super) fn step(
        session: &'s GpuSession,
        m: u32,
        input: StepInput<'s>,
        logits: LogitsFor,
        all_logits: Option<&'s View>,
    ) -> Result<Graph<'s, HostOp>, GpuError> {
        let mut b = Self::new(session, m);
        b.reach = input.reach;
        if input.reach == KeyReach::Canvas {
            b.role = LayerRole::Denoiser;
        }
        b.embed(input)?;
        for (il, l) in session.model.layers.iter().enumerate() {
            b.attention(il, l)?;
            let ffn_out = b.ffn(il, l)?;
            b.end_layer(il, l, ffn_out)?;
        }
        b.logits(logits, all_logits)?;
        Ok(b.g)
    }

    /// The graph's plan under `fusions`, copying the `taps` out as they are written.
    pub(super) fn lower(
        session: &GpuSession,
        g: &Graph<'_, HostOp>,
        fusions: Fusions,
        taps: Vec<(Val, View)>,
    ) -> Result<Vec<Op>, GpuError> {
        let (s, acts) = (&session.s, session.acts(g.tokens as usize));
        let lowering = Lowering {
            fusions,
            scratch: Scratch {
                streams: [&acts.x, &s.x_alt],
                partials: &acts.partials,
                int8_act: &s.act_q,
                attn_part: &s.attn_part,
                last_row: &s.last_n,
                lora: session.lora.as_ref().map(|b| LoraScratch {
                    t: &b.t,
                    raw: &b.raw,
                }),
            },
            taps,
        };
        Ok(lowering.lower(&session.model.ctx, g)?.ops)
    }

    fn m(&self) -> u32 {
        self.g.tokens
    }

    fn width(&self) -> u32 {
        self.session.model.cfg.n_embd as u32
    }

    fn eps(&self) -> f32 {
        self.session.model.cfg.eps
    }

    fn stream(&self) -> Result<Val, GpuError> {
        self.x
            .ok_or_else(|| GpuError::Shape("a layer before the embeddings".into()))
    }

    /// A new value of the step's rows in `view` (`cols` wide, `stride` apart, from `col`).
    fn rows(&mut self, name: Name, view: &'s View, cols: u32, stride: u32, col: u32) -> Val {
        self.g.rows_in(name, view, cols, stride, col)
    }

    /// A new value of the stream.
    fn new_stream(&mut self, name: Name) -> Val {
        let d = self.width();
        let v = self.g.value(name, Place::Stream, self.m(), d);
        self.x = Some(v);
        v
    }

    /// `norm(x) * weight` into `xn`.
    fn norm(&mut self, x: Val, weight: &'s View, name: Name) -> Val {
        let d = self.width();
        let out = self.rows(name, &self.acts.xn, d, d, 0);
        self.g.push(Node::Norm {
            x,
            weight: Some(weight),
            eps: self.eps(),
            dim: d,
            out,
        });
        out
    }

    fn linear(&mut self, w: &'s GpuWeight, x: Val, out: Val) -> Val {
        self.adapted(w, x, out, None)
    }

    /// [`DecoderGraph::linear`] with the session's adapters' joined term: the one place
    /// their deltas join a product.
    fn adapted(&mut self, w: &'s GpuWeight, x: Val, out: Val, lora: Option<LoraTerm<'s>>) -> Val {
        self.g.push(Node::Linear {
            w,
            x,
            gated: false,
            lora,
            out,
        });
        out
    }

    /// The session's adapters' joined term on layer `il`'s product `site`.
    fn lora(&self, il: usize, site: Site) -> Option<LoraTerm<'s>> {
        self.session.lora.as_ref()?.joined.term(il, site)
    }

    /// `stream = (stream + norm(delta) * post) * scale`.
    fn residual(
        &mut self,
        delta: Val,
        post: &'s View,
        scale: f32,
        name: Name,
    ) -> Result<Val, GpuError> {
        let stream = self.stream()?;
        let out = self.new_stream(name);
        self.g.push(Node::Residual {
            stream,
            delta,
            post,
            scale,
            eps: self.eps(),
            out,
        });
        Ok(out)
    }

    /// The token embeddings (and soft tokens over some), then every layer's per-layer input:
    /// `(norm(proj x / sqrt(d)) + table row * sqrt(n)) / sqrt(2)`. The projection's part here
    /// (the norm's weight is loaded times 1 / sqrt(2)); the table rows' where the first layer
    /// needs them. The norm of `proj x / sqrt(d)` is the norm of `proj x` with `eps * d` in
    /// place of `eps`: no node scales it first.
    pub(super) fn embed(&mut self, input: StepInput<'s>) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, self.acts);
        let cfg = &model.cfg;
        let mut x = self.new_stream(step_value("inp_embd"));
        self.ids = Some(input.ids);
        self.g.push(Node::Embed {
            table: Cow::Borrowed(&model.token_embd),
            ids: input.ids,
            scale: cfg.embed_scale,
            onto: None,
            out: x,
        });
        for c in input.soft {
            let out = self.new_stream(step_value("inp_embd"));
            self.g.push(Node::CopyRows {
                from: c.rows.clone(),
                row: c.row,
                x,
                out,
            });
            x = out;
        }
        if let Some(ple) = &model.ple {
            let (n, l) = (cfg.n_ple as u32, cfg.n_layer as u32);
            let proj = self.rows(step_value("per_layer_proj"), &s.ple.all, n * l, n * l, 0);
            self.linear(&ple.proj, x, proj);
            let normed = self.g.next(proj, step_value("per_layer_proj_norm"));
            self.g.push(Node::Norm {
                x: proj,
                weight: Some(&ple.proj_norm),
                eps: self.eps() * self.width() as f32,
                dim: n,
                out: normed,
            });
            self.ple_all = Some(normed);
        }
        Ok(())
    }

    /// The table rows of this step's tokens join the per-layer inputs: gathered from the
    /// table where it is on the GPU, else staged by the CPU (after `HostOp::TokenRows`, so
    /// that a decode step can start before its token is on the CPU).
    fn add_table_rows(&mut self) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, self.acts);
        let (Some(ple), Some(all)) = (&model.ple, self.ple_all) else {
            return Ok(());
        };
        let n = model.cfg.n_ple as u32;
        // row * sqrt(n), times the sum's 1 / sqrt(2).
        let scale = (n as f32 / 2.0).sqrt();
        let out = self.g.next(all, step_value("per_layer_inputs"));
        if let Some(table) = &ple.gpu {
            let ids = self
                .ids
                .ok_or_else(|| GpuError::Shape("per-layer rows before the embeddings".into()))?;
            self.g.push(Node::Embed {
                table: Cow::Borrowed(table),
                ids,
                scale,
                onto: Some(all),
                out,
            });
            self.ple_all = Some(out);
            return Ok(());
        }
        let m = self.m();
        let staged = GpuWeight {
            name: "per_layer_token_embd rows".into(),
            dtype: ple.info.dtype,
            cols: ple.info.row_len(),
            rows: u64::from(m),
            row_bytes: ple.info.row_bytes(),
            tiles: vec![WeightTile {
                buffer: s.ple.rows.buffer.clone(),
                first_row: 0,
                rows: u64::from(m),
            }],
        };
        self.g.push(Node::Host(HostOp::TokenRows));
        self.g.push(Node::Embed {
            table: Cow::Owned(staged),
            ids: &s.ple.iota,
            scale,
            onto: Some(all),
            out,
        });
        self.ple_all = Some(out);
        Ok(())
    }

    /// Layer `il`'s attention block: the norm, the q/k/v products, per-head norms, rope and
    /// the KV store, attention, the output product, the residual step.
    pub(super) fn attention(&mut self, il: usize, l: &'s Layer) -> Result<(), GpuError> {
        let (session, s) = (self.session, self.acts);
        let m = self.m();
        let xn = self.norm(self.stream()?, &l.attn_norm, layer_value("attn_norm", il));
        for (i, (p, name)) in l.qkv.iter().zip(QKV_PARTS).enumerate() {
            let rows = p.w.rows as u32;
            let out = self.rows(layer_value(name, il), &s.qkv, rows, l.qkv_width, p.offset);
            self.adapted(&p.w, xn, out, self.lora(il, Site::Qkv(i)));
        }
        let w = l.qkv_width;
        let qkv = self.rows(layer_value("qkv", il), &s.qkv, w, w, 0);
        let roped = self.g.next(qkv, layer_value("qkv_roped", il));
        self.g.push(Node::HeadNormRope {
            args: session.head_post_args(il, m),
            qkv,
            out: roped,
        });
        let heads = l.o.cols as u32;
        let kqv = self.rows(layer_value("kqv_out", il), &s.attn, heads, heads, 0);
        self.g.push(Node::Attention {
            args: session.attention_args(il, m, self.reach)?,
            qkv: roped,
            out: kqv,
        });
        let d = self.width();
        let o = self.rows(layer_value("attn_out", il), &s.o, d, d, 0);
        self.adapted(&l.o, kqv, o, self.lora(il, Site::O));
        self.residual(o, &l.post_attn_norm, 1.0, layer_value("ffn_inp", il))?;
        Ok(())
    }

    /// Layer `il`'s feed-forward block (GeGLU), and its experts where it has them: the
    /// block's output, before its post-norm.
    pub(super) fn ffn(&mut self, il: usize, l: &'s Layer) -> Result<Val, GpuError> {
        let s = self.acts;
        let (d, ff) = (self.width(), self.session.model.cfg.layers[il].n_ff as u32);
        let x = self.stream()?;
        let xn = self.norm(x, &l.ffn_norm, layer_value("ffn_norm", il));
        let act = self.rows(layer_value("ffn_act", il), &s.act, ff, ff, 0);
        match &l.gate_up {
            GateUp::Interleaved(w) => {
                self.g.push(Node::Linear {
                    w,
                    x: xn,
                    gated: true,
                    lora: self.lora(il, Site::GateUp),
                    out: act,
                });
            }
            GateUp::Separate { gate, up } => {
                let g = self.rows(layer_value("ffn_gate", il), &s.gate, ff, ff, 0);
                self.adapted(gate, xn, g, self.lora(il, Site::Gate));
                let u = self.rows(layer_value("ffn_up", il), &s.up, ff, ff, 0);
                self.adapted(up, xn, u, self.lora(il, Site::Up));
                self.g.push(Node::Gated {
                    gate: g,
                    up: u,
                    out: act,
                });
            }
        }
        let name = if l.experts.is_some() {
            "ffn_down"
        } else {
            "ffn_out"
        };
        let down = self.rows(layer_value(name, il), &s.down, d, d, 0);
        self.adapted(&l.down, act, down, self.lora(il, Site::Down));
        match &l.experts {
            Some(e) => self.experts(il, e, x, down),
            None => Ok(down),
        }
    }

    /// The dense branch's output `dense` plus the experts' mix: each token's router picks its
    /// experts, whose gated and down products are weighted and summed; both are normed and
    /// added.
    fn experts(&mut self, il: usize, e: &'s Experts, x: Val, dense: Val) -> Result<Val, GpuError> {
        let s = self.acts;
        let Some(mc) = self.session.model.cfg.moe else {
            return Ok(dense);
        };
        let (m, d) = (self.m(), self.width());
        let (k, ne) = (mc.n_used as u32, mc.n_expert as u32);
        let mo = &s.moe;
        let router_in = self.rows(layer_value("ffn_router_in", il), &mo.normed, d, d, 0);
        self.g.push(Node::Norm {
            x,
            weight: Some(&e.router_scale),
            eps: self.eps(),
            dim: d,
            out: router_in,
        });
        let logits = self.rows(layer_value("ffn_router_logits", il), &mo.logits, ne, ne, 0);
        self.linear(&e.router, router_in, logits);
        let sel = self.rows(layer_value("ffn_expert_ids", il), &mo.sel, k, k, 0);
        let weight = self.rows(layer_value("ffn_expert_weights", il), &mo.weight, k, k, 0);
        self.g.push(Node::Route {
            logits,
            expert_scale: e.down_scale.as_ref(),
            k,
            sel,
            weight,
        });
        let experts_in = self.rows(layer_value("ffn_experts_in", il), &mo.normed, d, d, 0);
        self.g.push(Node::Norm {
            x,
            weight: Some(&e.pre_norm),
            eps: self.eps(),
            dim: d,
            out: experts_in,
        });
        if let Some(host) = &e.host {
            // Fewer slots than experts: copying the chosen ones is cheaper than all, even
            // with the wait for the router.
            let slots = m * k;
            let routed = (slots < ne).then(|| (mo.sel.clone(), slots));
            self.g.push(Node::Host(HostOp::Upload {
                host: host.clone(),
                routed,
            }));
        }
        let out = self.rows(layer_value("ffn_experts", il), &mo.out, d, d, 0);
        self.g.push(Node::Experts {
            w: ExpertWeights {
                gate_up: &e.gate_up,
                down: &e.down,
                n_expert: ne,
                k,
                ff: mc.n_ff as u32,
            },
            x: experts_in,
            sel,
            weight,
            scratch: ExpertScratch {
                act: &mo.act,
                groups: &mo.groups,
            },
            out,
        });
        let mixed = self.rows(layer_value("ffn_out", il), &mo.ffn_out, d, d, 0);
        self.g.push(Node::MixExperts {
            dense,
            dense_post: &e.post_norm_dense,
            experts: out,
            experts_post: &e.post_norm_experts,
            eps: self.eps(),
            out: mixed,
        });
        Ok(mixed)
    }

    /// The end of layer `il`: its feed-forward output joins the stream, and with per-layer
    /// inputs, the layer's slice of them gates a small projection of the stream that joins
    /// next; then the layer's output scale.
    pub(super) fn end_layer(
        &mut self,
        il: usize,
        l: &'s Layer,
        ffn_out: Val,
    ) -> Result<(), GpuError> {
        let scale = match self.role {
            LayerRole::Encoder => l.enc_out_scale.unwrap_or(l.out_scale),
            LayerRole::Denoiser => l.out_scale,
        };
        let Some(p) = &l.ple else {
            self.residual(ffn_out, &l.post_ffw_norm, scale, layer_value("out", il))?;
            return Ok(());
        };
        if !self.table_rows_added {
            self.add_table_rows()?;
            self.table_rows_added = true;
        }
        let x = self.residual(ffn_out, &l.post_ffw_norm, 1.0, layer_value("pe_in", il))?;
        let proj = self.per_layer_input(il, p, x)?;
        self.residual(proj, &p.post_norm, scale, layer_value("out", il))?;
        Ok(())
    }

    /// `proj(gelu(x W_gate) * per-layer input)`.
    fn per_layer_input(&mut self, il: usize, p: &'s PleLayer, x: Val) -> Result<Val, GpuError> {
        let (cfg, s) = (&self.session.model.cfg, self.acts);
        let (n, all) = (cfg.n_ple as u32, (cfg.n_ple * cfg.n_layer) as u32);
        let gate = self.rows(layer_value("inp_gate", il), &s.ple.gate, n, n, 0);
        self.linear(&p.inp_gate, x, gate);
        let input = self.rows(
            layer_value("per_layer_input", il),
            &s.ple.all,
            n,
            all,
            il as u32 * n,
        );
        let act = self.rows(layer_value("per_layer_act", il), &s.ple.act, n, n, 0);
        self.g.push(Node::Gated {
            gate,
            up: input,
            out: act,
        });
        let d = self.width();
        let proj = self.rows(layer_value("per_layer_out", il), &s.ple.out, d, d, 0);
        Ok(self.linear(&p.proj, act, proj))
    }

    /// The final norm and the logits (of the last row, or of every row into `all_logits`).
    /// A chunk without logits leaves only its KV entries behind: its last residual step has
    /// no reader.
    pub(super) fn logits(
        &mut self,
        logits: LogitsFor,
        all_logits: Option<&'s View>,
    ) -> Result<(), GpuError> {
        let (model, s) = (&*self.session.model, &self.session.s);
        let cfg = &model.cfg;
        if logits == LogitsFor::None {
            return Ok(());
        }
        let xn = self.norm(
            self.stream()?,
            &model.output_norm,
            step_value("result_norm"),
        );
        let vocab = cfg.n_vocab as u32;
        let all = logits == LogitsFor::All;
        let out = if all {
            let y = all_logits.ok_or_else(|| GpuError::Shape("no buffer for all logits".into()))?;
            self.rows(step_value("result_output"), y, vocab, vocab, 0)
        } else {
            let name = step_value("result_output");
            self.g.value(
                name,
                Place::At {
                    view: &s.logits,
                    stride: vocab,
                    col: 0,
                },
                1,
                vocab,
            )
        };
        self.g.push(Node::Logits {
            w: model.output_matrix(),
            x: xn,
            softcap: cfg.final_softcap.unwrap_or(0.0),
            all,
            out,
        });
        Ok(())
    }
}
