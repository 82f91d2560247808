//! How the matrix-vector kernel spreads a product over workgroups ([`MatvecTuning`]): a base
//! shape that fills the device, then a table of named rules keyed by device class, dtype and
//! shape bucket. `benches/RESULTS.md` ("Matrix-vector tuning rules") holds the measurements
//! behind each rule, under its name; a rule changes only with a measurement there.

use super::*;

/// How a matrix-vector product spreads over a workgroup of 256 threads: `tpr` threads per
/// row group (4..=256, a power of two) and `rpt` rows per group (1, 2 or 4; at least 2 for a
/// gated output); with `prefetch`, each lane loads a step's weights while it sums the step
/// before (worth it where lanes take many steps); with `int8_input` (Q4_K and Q6_K), the
/// input is rounded to 8-bit integers per 32 values and multiplied in integer dot products,
/// as ggml's quantized dot products do. [`MatvecTuning::choose`] picks one per shape and
/// device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecTuning {
    pub tpr: u32,
    pub rpt: u32,
    pub prefetch: bool,
    pub int8_input: bool,
}

/// The device classes the rules tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuningClass {
    /// A GPU: many workgroups run at once, and a product is bound by its loads.
    Gpu,
    /// A CPU adapter (lavapipe): a workgroup is one thread's SIMD loop, so more and smaller
    /// workgroups only add overhead, and a group wider than a subgroup only adds barriers.
    CpuAdapter,
}

impl TuningClass {
    pub fn of(ctx: &GpuContext) -> Self {
        if ctx.info.device_type == wgpu::DeviceType::Cpu {
            Self::CpuAdapter
        } else {
            Self::Gpu
        }
    }

    /// Workgroups the base shape aims for before it stops trading rows per group and lanes
    /// for more of them ("fill the device").
    fn min_workgroups(self) -> u64 {
        match self {
            Self::Gpu => 192,
            Self::CpuAdapter => 1,
        }
    }
}

/// How [`matmul`] routes a product of a stored weight and activations: matrix-vector products
/// up to `matvec_max_tokens` tokens, tiled above; a tiled product whose tiles leave the device
/// idle (fewer than `fill` workgroups) split over k into parts for about `target` workgroups,
/// each part at least `min_steps` steps of 64 values. The measurements behind the numbers are
/// in `benches/RESULTS.md` under the names of [`MatmulRouting::RULES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulRouting {
    pub matvec_max_tokens: u32,
    pub fill: u64,
    pub target: u64,
    pub min_steps: u64,
    /// Tokens up to which a product on cooperative matrices takes 16-token tiles
    /// ([`CoopTile::Tokens16`]); 0: never.
    pub small_tile_max_tokens: u32,
}

impl MatmulRouting {
    /// The rules' names: a CPU adapter takes every token count as matrix-vector products;
    /// the split over k; a few rows' tiles and split ([`MatmulRouting::for_tokens`]).
    pub const RULES: [&'static str; 3] = ["matmul-cpu-matvec", "matmul-split-k", "matmul-few-rows"];

    /// Tokens up to which rule `matmul-few-rows` holds (a batched decode step's rows).
    pub const FEW_ROWS_MAX: u32 = 64;

    const GPU: Self = Self {
        matvec_max_tokens: MATVEC_MAX_TOKENS,
        fill: 256,
        target: 512,
        min_steps: 8,
        small_tile_max_tokens: 32,
    };

    pub fn of(ctx: &GpuContext) -> Self {
        let routing = match TuningClass::of(ctx) {
            TuningClass::Gpu => Self::GPU,
            TuningClass::CpuAdapter => Self {
                matvec_max_tokens: u32::MAX,
                small_tile_max_tokens: 0,
                ..Self::GPU
            },
        };
        // Named numbers stand for every token count, with tiles chosen as for many tokens.
        let routing = match ctx.split_routing {
            Some((target, min_steps)) => Self {
                target,
                min_steps: min_steps.max(1),
                small_tile_max_tokens: 0,
                ..routing
            },
            None => routing,
        };
        // Without the split, every tile count fills the device.
        let fill = if ctx.split_k { routing.fill } else { 0 };
        Self { fill, ..routing }
    }

    /// The routing of a product over `m` tokens: on a GPU, rule `matmul-few-rows` for up to
    /// [`Self::FEW_ROWS_MAX`] tokens (parts of 4 steps or more, for 1,024 workgroups, or 512
    /// in 16-token tiles), unless the context names the split's numbers.
    pub fn for_tokens(ctx: &GpuContext, m: u32) -> Self {
        let r = Self::of(ctx);
        let few = m <= Self::FEW_ROWS_MAX
            && ctx.split_routing.is_none()
            && TuningClass::of(ctx) == TuningClass::Gpu;
        if !few {
            return r;
        }
        Self {
            target: if m <= r.small_tile_max_tokens {
                512
            } else {
                1024
            },
            min_steps: 4,
            ..r
        }
    }
}

/// A product as the rules see it: `rows` rows of `k` values of `dtype`; `geglu`: gate/up
/// pairs out; `prologue`: every workgroup first computes the input (the residual step or the
/// attention merge in front of the product).
#[derive(Clone, Copy, Debug)]
pub struct MatvecShape {
    pub dtype: GgmlType,
    pub k: u32,
    pub rows: u64,
    pub geglu: bool,
    pub prologue: bool,
}

impl MatvecShape {
    /// Values the kernel takes at a time for the dtype.
    fn step(&self) -> u32 {
        match self.dtype {
            GgmlType::Q6K => 64,
            _ => 32,
        }
    }

    fn steps(&self) -> u32 {
        self.k.div_ceil(self.step())
    }

    fn workgroups(&self, tpr: u32, rpt: u32) -> u64 {
        self.rows.div_ceil(u64::from(256 / tpr * rpt))
    }

    fn min_rpt(&self) -> u32 {
        if self.geglu { 2 } else { 1 }
    }
}

/// Which dtypes a rule covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtypes {
    Any,
    /// Block-quantized (not F32, F16, BF16).
    Quantized,
}

/// The shapes a rule covers (every condition must hold).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    dtypes: Dtypes,
    prologue: Option<bool>,
    geglu: Option<bool>,
    min_k: u32,
    min_steps: u32,
    min_rows: u64,
    /// Workgroups at the rule's own lanes and rows (or, where it sets none, the current ones).
    min_workgroups: u64,
}

const ANY: Bucket = Bucket {
    dtypes: Dtypes::Any,
    prologue: None,
    geglu: None,
    min_k: 0,
    min_steps: 0,
    min_rows: 0,
    min_workgroups: 0,
};

/// What a rule sets.
#[derive(Clone, Copy, Debug)]
enum Set {
    /// Lanes per row group.
    Tpr(u32),
    /// As few rows per group as the output allows (1, a gate/up pair 2).
    FewestRows,
    /// Lanes and rows per group.
    Lanes(u32, u32),
}

/// A rule of the table: on `class`, for shapes in `when`, set `set`. Every rule that holds
/// applies, in order.
#[derive(Clone, Copy, Debug)]
struct Rule {
    name: &'static str,
    class: TuningClass,
    when: Bucket,
    set: Set,
}

/// The rules after the base shape.
const RULES: &[Rule] = &[
    Rule {
        name: "prologue-many-workgroups",
        class: TuningClass::Gpu,
        when: Bucket {
            prologue: Some(true),
            min_workgroups: 512,
            ..ANY
        },
        set: Set::Tpr(16),
    },
    Rule {
        name: "long-rows",
        class: TuningClass::Gpu,
        when: Bucket {
            prologue: Some(false),
            min_k: 4096,
            ..ANY
        },
        set: Set::FewestRows,
    },
    Rule {
        name: "prologue-long-rows",
        class: TuningClass::Gpu,
        when: Bucket {
            prologue: Some(true),
            geglu: Some(false),
            min_steps: 65,
            min_rows: 1025,
            ..ANY
        },
        set: Set::Lanes(32, 2),
    },
];

/// The bandwidth-bound rule, before the base shape: quantized matrices with rows enough to
/// fill the GPU many times over (an output head) at [`head_lanes`] lanes and 4 rows a group.
const HEAD: Bucket = Bucket {
    dtypes: Dtypes::Quantized,
    min_workgroups: 512,
    ..ANY
};

/// Rounded inputs ([`MatvecTuning::rounded_input`]) of long rows: 128 lanes x 2 rows.
const ROUNDED_LONG_ROWS: Rule = Rule {
    name: "rounded-input-long-rows",
    class: TuningClass::Gpu,
    when: Bucket { min_k: 4096, ..ANY },
    set: Set::Lanes(128, 2),
};

impl Bucket {
    fn holds(&self, s: &MatvecShape, (tpr, rpt): (u32, u32)) -> bool {
        let dtype = match self.dtypes {
            Dtypes::Any => true,
            Dtypes::Quantized => s.dtype.block_size() > 1,
        };
        dtype
            && self.prologue.is_none_or(|p| p == s.prologue)
            && self.geglu.is_none_or(|g| g == s.geglu)
            && s.k >= self.min_k
            && s.steps() >= self.min_steps
            && s.rows >= self.min_rows
            && s.workgroups(tpr, rpt) >= self.min_workgroups
    }
}

impl Rule {
    fn apply(&self, class: TuningClass, s: &MatvecShape, t: MatvecTuning) -> MatvecTuning {
        if class != self.class || !self.when.holds(s, (t.tpr, t.rpt)) {
            return t;
        }
        match self.set {
            Set::Tpr(tpr) => MatvecTuning { tpr, ..t },
            Set::FewestRows => MatvecTuning {
                rpt: s.min_rpt(),
                ..t
            },
            Set::Lanes(tpr, rpt) => MatvecTuning { tpr, rpt, ..t },
        }
    }
}

/// Lanes per row of the bandwidth-bound rule: K-quants 4 (8 with 8-bit inputs), others the
/// widest of 16, 8 and 4 that divides the row's steps (lanes share a row's steps evenly).
fn head_lanes(s: &MatvecShape, int8_input: bool) -> u32 {
    match s.dtype {
        _ if int8_input => 8,
        GgmlType::Q4K | GgmlType::Q6K => 4,
        _ => [16, 8, 4]
            .into_iter()
            .find(|t| s.steps().is_multiple_of(*t))
            .unwrap_or(4),
    }
}

/// The widest group a device's lanes take: a CPU adapter's subgroup (4 without subgroups).
fn max_tpr(ctx: &GpuContext, class: TuningClass) -> u32 {
    match (class, ctx.features.subgroups) {
        (TuningClass::CpuAdapter, true) => ctx.features.subgroup_min_size.clamp(4, 256),
        (TuningClass::CpuAdapter, false) => 4,
        (TuningClass::Gpu, _) => 256,
    }
}

/// The base shape: a lane per step of the row where possible (short rows leave no lane idle,
/// the rows' loads all start at once) and 4 rows a group, sharing each input load; then, while
/// the product would take fewer workgroups than the device wants, fewer rows a group (down to
/// the output's fewest), then wider groups.
fn base(class: TuningClass, max_tpr: u32, s: &MatvecShape) -> (u32, u32) {
    let mut tpr = [4u32, 8, 16, 32, 64, 128, 256]
        .into_iter()
        .find(|&t| t >= s.steps().min(max_tpr))
        .unwrap_or(256);
    let mut rpt = 4u32;
    let enough = class.min_workgroups();
    while rpt > s.min_rpt() && s.workgroups(tpr, rpt) < enough {
        rpt /= 2;
    }
    while tpr < 256 && s.workgroups(tpr, rpt) < enough {
        tpr *= 2;
    }
    (tpr, rpt)
}

impl MatvecTuning {
    /// The tuning for `rows` rows of `k` values of `dtype` on `ctx`'s device.
    pub fn choose(
        ctx: &GpuContext,
        dtype: GgmlType,
        k: u32,
        rows: u64,
        geglu: bool,
        prologue: bool,
    ) -> Self {
        let shape = MatvecShape {
            dtype,
            k,
            rows,
            geglu,
            prologue,
        };
        Self::for_shape(ctx, &shape)
    }

    /// [`MatvecTuning::choose`] of a shape.
    pub fn for_shape(ctx: &GpuContext, s: &MatvecShape) -> Self {
        let class = TuningClass::of(ctx);
        let max_tpr = max_tpr(ctx, class);
        let int8_fits = int8_input_fits(ctx, s.dtype, s.k, s.prologue);
        let wide = head_lanes(s, int8_fits);
        if class == TuningClass::Gpu && max_tpr >= wide && HEAD.holds(s, (wide, 4)) {
            return Self {
                tpr: wide,
                rpt: 4,
                prefetch: s.dtype == GgmlType::Q4K,
                int8_input: int8_fits,
            };
        }
        let (tpr, rpt) = base(class, max_tpr, s);
        let t = Self {
            tpr,
            rpt,
            prefetch: false,
            // Rule "int8-gated-behind-prologue": the gate/up product behind the residual
            // step takes 8-bit inputs where the device has them.
            int8_input: class == TuningClass::Gpu
                && s.prologue
                && s.geglu
                && ctx.features.int8_activations
                && int8_fits,
        };
        RULES.iter().fold(t, |t, rule| rule.apply(class, s, t))
    }

    /// The tuning for a product whose input comes rounded ([`matvec_int8_input`]): as
    /// [`MatvecTuning::choose`], then rule "rounded-input-long-rows".
    pub fn rounded_input(ctx: &GpuContext, dtype: GgmlType, k: u32, rows: u64) -> Self {
        let shape = MatvecShape {
            dtype,
            k,
            rows,
            geglu: false,
            prologue: false,
        };
        let t = Self::for_shape(ctx, &shape);
        ROUNDED_LONG_ROWS.apply(TuningClass::of(ctx), &shape, t)
    }

    /// Rule "experts-down-two-rows": the experts' down products (many short-row slots, no
    /// prologue, rows out) at 2 rows a group on a GPU; mixed ones (each token's slots summed
    /// in the product) always 2.
    pub fn for_experts_down(ctx: &GpuContext, t: Self, mixed: bool) -> Self {
        if TuningClass::of(ctx) != TuningClass::Gpu {
            return t;
        }
        Self {
            rpt: if mixed { 2 } else { t.rpt.min(2) },
            ..t
        }
    }

    /// The rule names, in the order they apply (after the head rule and the base shape), for
    /// the docs and `benches/RESULTS.md`.
    pub fn rule_names() -> Vec<&'static str> {
        let mut names = vec!["head", "base", "int8-gated-behind-prologue"];
        names.extend(RULES.iter().map(|r| r.name));
        names.extend([ROUNDED_LONG_ROWS.name, "experts-down-two-rows"]);
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule's measurements are in `benches/RESULTS.md`, under its name.
    #[test]
    fn every_rule_has_its_measurements_in_results() {
        let results = include_str!("../../../../benches/RESULTS.md");
        let section = results
            .split("## Matrix-vector tuning rules")
            .nth(1)
            .expect("RESULTS.md has a section on the matrix-vector tuning rules");
        let section = section.split("\n## ").next().unwrap_or(section);
        for name in MatvecTuning::rule_names()
            .into_iter()
            .chain(MatmulRouting::RULES)
        {
            assert!(
                section.contains(&format!("`{name}`")),
                "rule {name} has no entry in RESULTS.md's tuning section"
            );
        }
    }
}
