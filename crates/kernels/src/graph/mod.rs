//! A step as a graph of named values, and its lowering into dispatches.
//!
//! Model code builds a [`Graph`]: it says what is computed — an embedding gather, norms,
//! products, the residual step, per-head norms and rope, attention, the experts' routing and
//! products — over named values ("blk.3.attn_out"), as the reference implementation reads.
//! [`lower`] turns the graph into a plan of dispatches, copies and the caller's own host
//! steps. Where one kernel does the work of several nodes it takes them together; each such
//! fusion rule is a pattern of nodes and a legality check (the kernels' fit predicates and the
//! step's size), switched by a field of [`Fusions`], so a graph lowered with and without a
//! rule must compute the same values. Values can be copied out by name as the plan runs
//! ([`Lowering::taps`]), to compare a step with a CPU reference value by value.

mod lower;

pub use lower::{LoraScratch, Lowered, Lowering, Scratch};

use crate::ops::{AttentionArgs, HeadPostArgs, LoraSegments};
use crate::{GpuWeight, View};
use std::borrow::Cow;
use std::fmt;

/// A value of a [`Graph`]: an index into its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Val(u32);

/// Where a value's rows live.
#[derive(Clone, Debug)]
pub enum Place<'a> {
    /// Row r at float `r * stride + col` of `view`.
    At {
        view: &'a View,
        stride: u32,
        col: u32,
    },
    /// The residual stream: one of the two buffers of [`Scratch::streams`], which the lowering
    /// picks (a residual step fused into a product writes its result to the other one).
    Stream,
}

/// A value's name: `blk.N.name` for a layer's, `name` for the step's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    pub name: &'static str,
    pub layer: Option<usize>,
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer {
            Some(l) => write!(f, "blk.{l}.{}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// A value: its name, where it lives, and its shape (`rows` of `cols` floats or words).
#[derive(Clone, Debug)]
pub struct Value<'a> {
    pub name: Name,
    pub place: Place<'a>,
    pub rows: u32,
    pub cols: u32,
}

impl Value<'_> {
    /// Floats between consecutive rows.
    pub fn stride(&self) -> u32 {
        match self.place {
            Place::At { stride, .. } => stride,
            Place::Stream => self.cols,
        }
    }

    /// The column where row 0 starts.
    pub fn col(&self) -> u32 {
        match self.place {
            Place::At { col, .. } => col,
            Place::Stream => 0,
        }
    }
}

/// A mixture-of-experts layer's stacked expert weights.
#[derive(Clone, Copy, Debug)]
pub struct ExpertWeights<'a> {
    /// Each expert's gate and up rows interleaved (`2 ff` rows an expert).
    pub gate_up: &'a GpuWeight,
    /// Each expert's down rows (the model's width an expert).
    pub down: &'a GpuWeight,
    pub n_expert: u32,
    /// Experts per token.
    pub k: u32,
    /// An expert's hidden width.
    pub ff: u32,
}

/// The adapters' low-rank delta on a product, all of them joined: `y += (x A^T) B^T` by
/// segments (the projections stacked in the weight): `a` holds `segments * rank` rows of the
/// product's input width, `b` `[W's rows, rank]`, row r its segment's B row for W's row r
/// with the adapters' scales in it (f32, row-major).
#[derive(Clone, Copy, Debug)]
pub struct LoraTerm<'a> {
    /// A as an f32 weight, so that `x A^T` runs through the weights' products, which split
    /// its long sums over many workgroups.
    pub a: &'a GpuWeight,
    pub b: &'a View,
    pub rank: u32,
    pub segments: LoraSegments,
}

/// The buffers the experts' products use between them.
#[derive(Clone, Copy, Debug)]
pub struct ExpertScratch<'a> {
    /// The gated activations of every slot.
    pub act: &'a View,
    /// The slots grouped by expert (`ops::moe_group`), for many tokens.
    pub groups: &'a View,
}

/// One operation of a graph. Values it reads and writes are [`Val`]s; the rest are its
/// attributes (weights, norm weights, the attention's cache and shape).
pub enum Node<'a, H> {
    /// `out[t] = table[ids[t]] * scale`, added to `onto` where given (same place as `out`).
    Embed {
        table: Cow<'a, GpuWeight>,
        ids: &'a View,
        scale: f32,
        onto: Option<Val>,
        out: Val,
    },
    /// Rows computed elsewhere (an encoder's soft tokens) over `x`'s rows from `row`: `out`
    /// (same place as `x`).
    CopyRows {
        from: View,
        row: u32,
        x: Val,
        out: Val,
    },
    /// RMS norm of every `dim` values of `x`, times `weight`: `out` (which may live where `x`
    /// does).
    Norm {
        x: Val,
        weight: Option<&'a View>,
        eps: f32,
        dim: u32,
        out: Val,
    },
    /// `out = x W^T` plus the adapters' `(x A^T) B^T`; with `gated`, W's rows are gate/up
    /// pairs and `out` is the gated activation `gelu_tanh(gate) * up` (half as many columns),
    /// the adapters joining the gate and up rows before it. Every projection of a model goes
    /// through here: this is where LoRA deltas join.
    Linear {
        w: &'a GpuWeight,
        x: Val,
        gated: bool,
        lora: Option<LoraTerm<'a>>,
        out: Val,
    },
    /// `out = gelu_tanh(gate) * up`
    Gated { gate: Val, up: Val, out: Val },
    /// The residual step: `out = (stream + norm(delta) * post) * scale`.
    Residual {
        stream: Val,
        delta: Val,
        post: &'a View,
        scale: f32,
        eps: f32,
        out: Val,
    },
    /// Per-head norms and rope of the queries and keys in `qkv` (in place), and the keys and
    /// values stored in the cache, as `args` says: `out` (same place as `qkv`).
    HeadNormRope {
        args: HeadPostArgs<'a>,
        qkv: Val,
        out: Val,
    },
    /// Causal attention of the queries in `qkv` over the cache, as `args` says.
    Attention {
        args: AttentionArgs<'a>,
        qkv: Val,
        out: Val,
    },
    /// Each row's `k` most likely experts by `logits` (`sel`, words) and their renormalised
    /// probabilities times `expert_scale` (`weight`).
    Route {
        logits: Val,
        expert_scale: Option<&'a View>,
        k: u32,
        sel: Val,
        weight: Val,
    },
    /// The experts' gated products of `x` and their down products, weighted and summed per
    /// token.
    Experts {
        w: ExpertWeights<'a>,
        x: Val,
        sel: Val,
        weight: Val,
        scratch: ExpertScratch<'a>,
        out: Val,
    },
    /// `out = norm(dense) * dense_post + norm(experts) * experts_post`
    MixExperts {
        dense: Val,
        dense_post: &'a View,
        experts: Val,
        experts_post: &'a View,
        eps: f32,
        out: Val,
    },
    /// `out = softmax(x * scale)` of every row (`out` where `x` is, or elsewhere).
    Softmax { x: Val, scale: f32, out: Val },
    /// `out = a + b` (`out` where `a` is).
    Add { a: Val, b: Val, out: Val },
    /// The logits: `out = softcap(x W^T)` of the last row (`all` false) or of every row.
    Logits {
        w: &'a GpuWeight,
        x: Val,
        softcap: f32,
        all: bool,
        out: Val,
    },
    /// A step of the caller's own (uploads, waits for the CPU), kept in its place.
    Host(H),
}

impl<H> Node<'_, H> {
    /// Calls `f` with each value the node reads.
    pub fn for_each_input(&self, mut f: impl FnMut(Val)) {
        match self {
            Node::Embed { onto, .. } => onto.iter().copied().for_each(f),
            Node::CopyRows { x, .. } => f(*x),
            Node::Norm { x, .. }
            | Node::Linear { x, .. }
            | Node::Logits { x, .. }
            | Node::Softmax { x, .. } => f(*x),
            Node::Gated { gate, up, .. } => [*gate, *up].into_iter().for_each(f),
            Node::Add { a, b, .. } => [*a, *b].into_iter().for_each(f),
            Node::Residual { stream, delta, .. } => [*stream, *delta].into_iter().for_each(f),
            Node::HeadNormRope { qkv, .. } | Node::Attention { qkv, .. } => f(*qkv),
            Node::Route { logits, .. } => f(*logits),
            Node::Experts { x, sel, weight, .. } => [*x, *sel, *weight].into_iter().for_each(f),
            Node::MixExperts { dense, experts, .. } => [*dense, *experts].into_iter().for_each(f),
            Node::Host(_) => {}
        }
    }

    /// Calls `f` with each value the node writes.
    pub fn for_each_output(&self, mut f: impl FnMut(Val)) {
        match self {
            Node::Embed { out, .. }
            | Node::CopyRows { out, .. }
            | Node::Norm { out, .. }
            | Node::Linear { out, .. }
            | Node::Gated { out, .. }
            | Node::Residual { out, .. }
            | Node::HeadNormRope { out, .. }
            | Node::Attention { out, .. }
            | Node::Experts { out, .. }
            | Node::MixExperts { out, .. }
            | Node::Logits { out, .. }
            | Node::Softmax { out, .. }
            | Node::Add { out, .. } => f(*out),
            Node::Route { sel, weight, .. } => {
                f(*sel);
                f(*weight);
            }
            Node::Host(_) => {}
        }
    }
}

/// A step's computation over `tokens` rows: its values and its nodes in order.
pub struct Graph<'a, H> {
    pub tokens: u32,
    values: Vec<Value<'a>>,
    nodes: Vec<Node<'a, H>>,
}

impl<'a, H> Graph<'a, H> {
    pub fn new(tokens: u32) -> Self {
        Self {
            tokens,
            values: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Room for `nodes` more nodes and twice as many values.
    pub fn reserve(&mut self, nodes: usize) {
        self.nodes.reserve(nodes);
        self.values.reserve(2 * nodes);
    }

    /// A new value.
    pub fn value(&mut self, name: Name, place: Place<'a>, rows: u32, cols: u32) -> Val {
        self.values.push(Value {
            name,
            place,
            rows,
            cols,
        });
        Val(self.values.len() as u32 - 1)
    }

    /// A new value of the step's rows of `cols` in `view` (`stride` apart, from `col`).
    pub fn rows_in(&mut self, name: Name, view: &'a View, cols: u32, stride: u32, col: u32) -> Val {
        let place = Place::At { view, stride, col };
        self.value(name, place, self.tokens, cols)
    }

    /// A new value where `v` lives, of its shape: what an in-place node writes.
    pub fn next(&mut self, v: Val, name: Name) -> Val {
        let old = self.get(v).clone();
        self.value(name, old.place, old.rows, old.cols)
    }

    pub fn get(&self, v: Val) -> &Value<'a> {
        &self.values[v.0 as usize]
    }

    pub fn push(&mut self, node: Node<'a, H>) {
        self.nodes.push(node);
    }

    pub fn nodes(&self) -> &[Node<'a, H>] {
        &self.nodes
    }

    pub fn values(&self) -> impl Iterator<Item = (Val, &Value<'a>)> {
        (0..).map(Val).zip(&self.values)
    }

    /// The value named `name` (the last one, where several are).
    pub fn find(&self, name: &str) -> Option<Val> {
        self.values()
            .filter(|(_, v)| v.name.to_string() == name)
            .map(|(i, _)| i)
            .last()
    }
}

/// An operation of a lowered plan.
#[derive(Clone, Debug)]
pub enum PlanOp<H> {
    Run(crate::Dispatch),
    Copy { from: View, to: View, bytes: u64 },
    Host(H),
}

/// The fusions a lowering may use: all by default, each still under its kernels' fit
/// predicates. Turning one off gives the unfused ops for the same graph, which must agree with
/// the fused ones (that is how each rule is tested).
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
    /// One token's adapter delta joined to its product's rows (`x A^T` first, with the
    /// product's prologue where it has one), rather than added by products of its own; the
    /// adapted products keep the other rules.
    pub lora_in_product: bool,
    /// A few rows' K-quant products through the few-token kernel (`ops::matmul_few_tokens`:
    /// inputs rounded to 8-bit integers, the rows sharing each weight load). For steps whose
    /// rows are several sequences' tokens (batched decode); a prompt's steps leave it off, so
    /// that its logits do not depend on how it was cut into steps.
    pub few_token_products: bool,
    /// Several sequences' decode steps' per-head norms, rope and K/V store inside their split
    /// attention, up to `lower::BATCHED_HEADS_IN_ATTENTION_ROWS` sequences (one token's always
    /// are: no other kernel takes that pattern).
    pub batched_heads_in_attention: bool,
}

/// A rule's field of [`Fusions`].
type Switch = fn(&mut Fusions) -> &mut bool;

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
        lora_in_product: true,
        few_token_products: true,
        batched_heads_in_attention: true,
    };

    /// No fusion rule: one dispatch per node, but where a kernel is the only one for a
    /// pattern (a residual step and the norm after it; one token's per-head norms, rope and
    /// split attention).
    pub const NONE: Self = Self {
        residual_prologue: false,
        experts_mix_in_product: false,
        merge_in_front: false,
        int8_activations: false,
        router_norm_in_product: false,
        expert_norm_in_product: false,
        route_in_product: false,
        per_layer_gate: false,
        lora_in_product: false,
        few_token_products: false,
        batched_heads_in_attention: false,
    };

    /// Each rule's name and a switch for it.
    fn rules() -> [(&'static str, Switch); 11] {
        [
            ("residual_prologue", |f| &mut f.residual_prologue),
            ("experts_mix_in_product", |f| &mut f.experts_mix_in_product),
            ("merge_in_front", |f| &mut f.merge_in_front),
            ("int8_activations", |f| &mut f.int8_activations),
            ("router_norm_in_product", |f| &mut f.router_norm_in_product),
            ("expert_norm_in_product", |f| &mut f.expert_norm_in_product),
            ("route_in_product", |f| &mut f.route_in_product),
            ("per_layer_gate", |f| &mut f.per_layer_gate),
            ("lora_in_product", |f| &mut f.lora_in_product),
            ("few_token_products", |f| &mut f.few_token_products),
            ("batched_heads_in_attention", |f| {
                &mut f.batched_heads_in_attention
            }),
        ]
    }

    /// These fusions less the rules named in `WGEMMA_FUSIONS_OFF` (comma-separated;
    /// [`crate::knobs`]), to measure what a rule brings with one binary, or to find which
    /// one a browser runs differently.
    pub fn with_env(mut self) -> Self {
        if let Some(off) = crate::knobs::get("WGEMMA_FUSIONS_OFF") {
            for name in off.split(',').map(str::trim) {
                if let Some((_, switch)) = Self::rules().into_iter().find(|(n, _)| *n == name) {
                    *switch(&mut self) = false;
                }
            }
        }
        self
    }

    /// Each rule alone turned off, by name.
    pub fn each_off() -> Vec<(&'static str, Self)> {
        Self::rules()
            .into_iter()
            .map(|(name, switch)| {
                let mut f = Self::ALL;
                *switch(&mut f) = false;
                (name, f)
            })
            .collect()
    }
}

impl Default for Fusions {
    fn default() -> Self {
        Self::ALL
    }
}

#[cfg(test)]
mod tests {
    use super::Fusions;

    #[test]
    fn each_rule_switches_one_fusion_of_its_own() {
        let offs = Fusions::each_off();
        let mut names: Vec<&str> = offs.iter().map(|(n, _)| *n).collect();
        names.dedup();
        assert_eq!(names.len(), 11);
        for (i, (name, f)) in offs.iter().enumerate() {
            assert_ne!(*f, Fusions::ALL, "{name}");
            assert!(offs.iter().skip(i + 1).all(|(_, g)| g != f), "{name}");
        }
        let all_off = offs.iter().fold(Fusions::ALL, |mut acc, (_, f)| {
            for (_, switch) in Fusions::rules() {
                if !*switch(&mut f.clone()) {
                    *switch(&mut acc) = false;
                }
            }
            acc
        });
        assert_eq!(all_off, Fusions::NONE);
    }
}
