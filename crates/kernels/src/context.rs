//! The GPU context: adapter choice, device with the adapter's real limits and the features
//! that help, error capture, and the pipeline cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[cfg(not(target_arch = "wasm32"))]
use crate::device_class::DeviceClass;
use crate::shader::ShaderSource;

/// Why the GPU could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found{filter}. Install a Vulkan driver (on Debian: `apt-get install mesa-vulkan-drivers libvulkan1` gives lavapipe, a CPU Vulkan), or on macOS/Windows use Metal/DX12; WGEMMA_BACKEND and WGEMMA_ADAPTER choose among several"
    )]
    NoAdapter { filter: String },
    #[error("the GPU device could not be created: {0}")]
    RequestDevice(String),
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    #[error("{0}")]
    Shape(String),
}

/// Options for [`GpuContext::new`]. Environment variables override them: `WGEMMA_BACKEND`
/// (vulkan, metal, dx12, gl, webgpu), `WGEMMA_ADAPTER` (substring of the adapter name),
/// `WGEMMA_NO_F16=1`, `WGEMMA_NO_SUBGROUPS=1`, `WGEMMA_NO_COOP=1` (force the fallbacks; in a
/// browser, no subgroup matrices either), `WGEMMA_GPU_ROUTING=1`,
/// `WGEMMA_NO_INT8_ACTIVATIONS=1`, `WGEMMA_INT8_TILES=0`, `WGEMMA_NO_BUSY_WAIT=1`,
/// `WGEMMA_WEBGPU_LIMITS=1`, `WGEMMA_NO_SPLIT_K=1` and `WGEMMA_COOP_TILE` (64 or 128: the
/// tokens of every tiled product's tile on tensor cores).
#[derive(Clone, Debug)]
pub struct ContextOptions {
    pub power_preference: wgpu::PowerPreference,
    pub backends: wgpu::Backends,
    /// Case-insensitive substring the adapter name must contain.
    pub adapter_name: Option<String>,
    /// Use `shader-f16` when the adapter has it.
    pub allow_f16: bool,
    /// Use subgroup operations when the adapter has them.
    pub allow_subgroups: bool,
    /// Use cooperative matrices (tensor cores) for the prefill products when the adapter has
    /// 16x16x16 f16 ones with f32 accumulators (in a browser: Dawn's subgroup matrices,
    /// [`GpuFeatures::subgroup_matrix`]).
    pub allow_coop: bool,
    /// Let one token's products round activations to 8-bit integers per 32 values where
    /// that is faster (as llama.cpp's quantized products do): the FFN's gated activations
    /// for its down product, and on GPUs the input of its gate/up product. Off, every
    /// activation stays f32 (closest to the f32 reference).
    pub allow_int8_activations: bool,
    /// Let the tiled products of Q4_K, Q6_K and Q8_0 rows on a device without cooperative
    /// matrices round their inputs to 8-bit integers per 32 values and multiply in integer
    /// dot products (`ops::tiles_round_inputs`), as llama.cpp's quantized products do: the
    /// browser's prefill, 1.7x the f32 tiles' through Dawn on an H200 (benches/RESULTS.md).
    /// On by default; `WGEMMA_INT8_TILES=0` turns it off (closest to the f32 reference).
    pub allow_int8_tiles: bool,
    /// Let wgpu add bounds checks, loop bounds and division guards to every shader, and zero
    /// workgroup memory at each dispatch's start (as a browser runs them). Off by
    /// default: they cost the kernels a large share of their speed, and every kernel's indices
    /// are bounded by the shapes its dispatcher validates. On for debugging
    /// (`WGEMMA_SHADER_CHECKS=1`).
    pub shader_checks: bool,
    /// Treat the adapter as a CPU rasterizer (tuning kernels for a SIMD loop per workgroup)
    /// even when it does not say so: the browser hides that its WebGPU runs on SwiftShader,
    /// but the page can tell from the adapter's architecture.
    pub cpu_adapter: bool,
    /// Route and shape the kernels as on a GPU even on a CPU adapter (`WGEMMA_GPU_ROUTING=1`,
    /// over `cpu_adapter`): so that tests run a GPU's kernels, the tiled products among them,
    /// on lavapipe or SwiftShader; slow there.
    pub gpu_routing: bool,
    /// Natively, wait for work the next submission depends on by polling the device in a loop
    /// rather than sleeping until it signals ([`GpuContext::wait_for`]). A model whose decode
    /// step needs the previous token on the CPU (per-layer embeddings) submits the rest of the
    /// step that much sooner after the token is sampled: E2B on the H100 went from 2.60 to
    /// 2.55 ms a token, what the same steps take back to back with no readback. The price is
    /// one CPU core busy while tokens are generated. Never on a CPU adapter, whose threads
    /// the spinning core would take.
    pub busy_wait: bool,
    /// Ask only for WebGPU's default limits (`WGEMMA_WEBGPU_LIMITS=1`): natively, what a
    /// browser that offers no more than them runs (fewer storage buffers a stage, less
    /// workgroup memory), to find where the browser differs.
    pub webgpu_limits: bool,
    /// Split tiled products over k where their tiles alone would leave most of the GPU idle
    /// (`WGEMMA_NO_SPLIT_K=1` turns it off, to measure what it brings).
    pub allow_split_k: bool,
    /// The tile every plain product on cooperative matrices takes (`WGEMMA_COOP_TILE`);
    /// `None`: chosen per product by its shape.
    pub coop_tile: Option<crate::ops::CoopTile>,
    /// Tokens a workgroup of the prefill attention takes (`WGEMMA_ATTENTION_ROWS`: 1, 2, 4
    /// or 8); `None`: as many as fill its eight heads.
    pub attention_rows: Option<u32>,
    /// The prefill attention of many query rows on cooperative matrices where the device has
    /// them (`ops::attention`); `WGEMMA_NO_COOP_ATTENTION=1` keeps it on f32 FMAs, to measure
    /// what it brings.
    pub coop_attention: bool,
    /// Parts over the keys the cooperative-matrix attention splits into where its blocks
    /// alone leave the GPU idle (`WGEMMA_ATTENTION_PARTS`; 1: never); `None`: chosen by
    /// shape (`ops::attention_in_parts`).
    pub attention_parts: Option<u32>,
    /// Slots a tile of the grouped experts' products takes on cooperative matrices
    /// (`WGEMMA_EXPERT_TILE`: 16, 32 or 64); `None`: chosen by the slots an expert
    /// (`ops::FEW_SLOTS_PER_EXPERT`, `ops::SOME_SLOTS_PER_EXPERT`).
    pub expert_tile: Option<u32>,
    /// Values of k a step of the experts' 16- and 32-slot tiles on cooperative matrices takes
    /// (`WGEMMA_COOP_STEP`: 64 or 128): the more, the fewer workgroup barriers, which are
    /// most of those tiles' time.
    pub coop_step: u32,
    /// Weight rows a tile of the integer-dot products takes (`ops::tiles_round_inputs`;
    /// `WGEMMA_INT8_ROWS`: 64 or 128).
    pub int8_tile_rows: u32,
    /// The most tokens a K-quant product takes through the few-token kernel (inputs rounded to
    /// 8-bit integers, several tokens a workgroup: batched decode); more go to the tiled
    /// kernel. Below `ops::FEW_TOKENS_MIN`: never (`WGEMMA_FEW_TOKENS`). Needs
    /// `allow_int8_activations`. 8 by default: up to 16 was slower at 16 tokens than the
    /// tiled kernel (benches/RESULTS.md, "thirtieth session").
    pub few_tokens: u32,
    /// The few-token kernel's lanes a row and rows a group (`WGEMMA_FEW_TUNING=16,2`), to
    /// sweep them on a GPU; `None`: the tuned choice (`ops::few_tokens`). A gated product
    /// takes at least 2 rows a group.
    pub few_tuning: Option<(u32, u32)>,
    /// The split over k's target of workgroups and fewest steps a part
    /// (`WGEMMA_SPLIT=512,8`), to sweep them on a GPU: for every token count, and no
    /// 16-token tiles unless `coop_tile` names them; `None`: the tuned choice
    /// (`ops::MatmulRouting`).
    pub split_routing: Option<(u64, u64)>,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            power_preference: wgpu::PowerPreference::HighPerformance,
            backends: wgpu::Backends::all(),
            adapter_name: None,
            allow_f16: true,
            allow_subgroups: true,
            allow_coop: true,
            allow_int8_activations: true,
            allow_int8_tiles: true,
            shader_checks: false,
            cpu_adapter: false,
            gpu_routing: false,
            busy_wait: true,
            webgpu_limits: false,
            allow_split_k: true,
            coop_tile: None,
            attention_rows: None,
            coop_attention: true,
            attention_parts: None,
            expert_tile: None,
            coop_step: 128,
            int8_tile_rows: 64,
            few_tokens: 8,
            few_tuning: None,
            split_routing: None,
        }
    }
}

impl ContextOptions {
    /// Applies the `WGEMMA_*` overrides ([`crate::knobs`]: natively the environment, in the
    /// browser what the page set).
    pub fn with_env(mut self) -> Self {
        use crate::knobs::{get as var, on};
        if let Some(b) = var("WGEMMA_BACKEND") {
            self.backends = wgpu::Backends::from_comma_list(&b);
        }
        if let Some(a) = var("WGEMMA_ADAPTER") {
            self.adapter_name = Some(a);
        }
        if on("WGEMMA_NO_F16") {
            self.allow_f16 = false;
        }
        if on("WGEMMA_NO_SUBGROUPS") {
            self.allow_subgroups = false;
        }
        if on("WGEMMA_NO_COOP") {
            self.allow_coop = false;
        }
        if on("WGEMMA_NO_INT8_ACTIVATIONS") {
            self.allow_int8_activations = false;
        }
        if let Some(v) = var("WGEMMA_INT8_TILES") {
            self.allow_int8_tiles = v == "1";
        }
        if on("WGEMMA_SHADER_CHECKS") {
            self.shader_checks = true;
        }
        if on("WGEMMA_GPU_ROUTING") {
            self.gpu_routing = true;
        }
        if on("WGEMMA_NO_BUSY_WAIT") {
            self.busy_wait = false;
        }
        if on("WGEMMA_WEBGPU_LIMITS") {
            self.webgpu_limits = true;
        }
        if on("WGEMMA_NO_SPLIT_K") {
            self.allow_split_k = false;
        }
        if let Some(t) = var("WGEMMA_COOP_TILE") {
            self.coop_tile = crate::ops::CoopTile::from_name(&t);
        }
        if let Some(n) = var("WGEMMA_FEW_TOKENS").and_then(|n| n.parse().ok()) {
            self.few_tokens = n;
        }
        if let Some(t) = var("WGEMMA_FEW_TUNING") {
            self.few_tuning = pair(&t);
        }
        if let Some(t) = var("WGEMMA_SPLIT") {
            self.split_routing = pair(&t);
        }
        if let Some(n) = var("WGEMMA_ATTENTION_PARTS") {
            self.attention_parts = n.parse().ok().filter(|n: &u32| *n >= 1);
        }
        if let Some(t) = var("WGEMMA_EXPERT_TILE") {
            self.expert_tile = t.parse().ok().filter(|t| [16, 32, 64].contains(t));
        }
        if let Some(s) = var("WGEMMA_COOP_STEP") {
            self.coop_step = s
                .parse()
                .ok()
                .filter(|s| [64, 128].contains(s))
                .unwrap_or(128);
        }
        if let Some(r) = var("WGEMMA_INT8_ROWS") {
            self.int8_tile_rows = r
                .parse()
                .ok()
                .filter(|r| [64, 128].contains(r))
                .unwrap_or(64);
        }
        if on("WGEMMA_NO_COOP_ATTENTION") {
            self.coop_attention = false;
        }
        if let Some(r) = var("WGEMMA_ATTENTION_ROWS") {
            self.attention_rows = r.parse().ok().filter(|r: &u32| r.is_power_of_two());
        }
        self
    }
}

/// The side of the square f16-into-f32 subgroup matrices `matmul_sgmat.wgsl` takes on this
/// browser adapter (the larger where there are two), or 0: the feature, subgroups of one size
/// (the kernel's fragments are shared out by subgroup, a count it fixes when compiled) whose
/// 256-thread workgroup has no more subgroups than a 64 x 64 tile has fragments, and the
/// workgroup memory.
fn subgroup_matrix_side(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
) -> u32 {
    let size = info.subgroup_min_size;
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        || size != info.subgroup_max_size
        || ![8, 16, 32].contains(&size)
        || limits.max_compute_workgroup_storage_size < crate::ops::SGMAT_MATMUL_BYTES
    {
        return 0;
    }
    adapter
        .cooperative_matrix_properties()
        .iter()
        .filter(|c| {
            c.m_size == c.n_size
                && c.n_size == c.k_size
                && [8, 16].contains(&c.m_size)
                && c.ab_type == wgpu::CooperativeScalarType::F16
                && c.cr_type == wgpu::CooperativeScalarType::F32
                && (64 / c.m_size) * (64 / c.m_size) * size >= 256
        })
        .map(|c| c.m_size)
        .max()
        .unwrap_or(0)
}

/// Two numbers written `a,b`.
fn pair<A: std::str::FromStr, B: std::str::FromStr>(s: &str) -> Option<(A, B)> {
    let (a, b) = s.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Optional hardware abilities the kernels specialise on (by default none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFeatures {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    /// Timestamps between the dispatches of one compute pass, so that a profile times the
    /// step as it runs rather than each dispatch in a pass of its own.
    pub timestamps_in_passes: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// 16x16x16 cooperative matrix products of f16 into f32, run by subgroups of exactly 32
    /// lanes (the tiling of `matmul_coop.wgsl` assumes eight of them per workgroup), and
    /// subgroup barriers (`attend_coop.wgsl`'s subgroups exchange values through workgroup
    /// memory).
    pub coop_matmul: bool,
    /// [`ContextOptions::allow_int8_activations`].
    pub int8_activations: bool,
    /// [`ContextOptions::allow_int8_tiles`].
    pub int8_tiles: bool,
    /// The WGSL goes to a browser's compiler (wgpu's WebGPU backend passes it through), which
    /// wants the `enable` directive of each extension used; naga rejects `enable subgroups;`.
    pub browser_wgsl: bool,
    /// In a browser with Dawn's experimental subgroup matrices: the side (8 or 16) of the
    /// square f16 products into f32 that `matmul_sgmat.wgsl` takes its tiled products on,
    /// subgroups of one size that fits them; 0 without.
    pub subgroup_matrix: u32,
}

/// A compiled kernel variant and its key ([`ShaderSource::key`]: name, flags, constants),
/// which names it in a plan's dispatch sequence.
#[derive(Clone, Debug)]
pub struct Pipeline {
    pub key: Arc<str>,
    pub compute: Arc<wgpu::ComputePipeline>,
}

impl GpuFeatures {
    /// The device features these abilities need.
    fn required(&self) -> wgpu::Features {
        let wanted = [
            (self.shader_f16, wgpu::Features::SHADER_F16),
            (self.subgroups, wgpu::Features::SUBGROUP),
            (self.timestamps, wgpu::Features::TIMESTAMP_QUERY),
            (
                self.timestamps_in_passes,
                wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
            ),
            (
                self.coop_matmul,
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            ),
            (self.coop_matmul, wgpu::Features::SUBGROUP_BARRIER),
            (
                self.subgroup_matrix > 0,
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            ),
        ];
        wanted
            .into_iter()
            .filter(|(on, _)| *on)
            .fold(wgpu::Features::empty(), |all, (_, f)| all | f)
    }
}

/// A GPU device and queue with everything the kernels need to run on it.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub features: GpuFeatures,
    pub limits: wgpu::Limits,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// Compiled variants by key, with their sources.
    pipelines: Mutex<HashMap<String, (Pipeline, ShaderSource)>>,
    /// See [`GpuContext::unused_storage`].
    pub(crate) unused: std::sync::OnceLock<[wgpu::Buffer; 2]>,
    shader_checks: bool,
    /// [`ContextOptions::busy_wait`], on a GPU adapter.
    pub(crate) busy_wait: bool,
    /// [`ContextOptions::allow_split_k`].
    pub(crate) split_k: bool,
    /// [`ContextOptions::coop_tile`].
    pub(crate) coop_tile: Option<crate::ops::CoopTile>,
    /// [`ContextOptions::attention_rows`].
    pub(crate) attention_rows: Option<u32>,
    /// [`ContextOptions::coop_attention`].
    pub(crate) coop_attention: bool,
    /// [`ContextOptions::attention_parts`].
    pub(crate) attention_parts: Option<u32>,
    /// [`ContextOptions::expert_tile`].
    pub(crate) expert_tile: Option<u32>,
    /// [`ContextOptions::coop_step`].
    pub(crate) coop_step: u32,
    /// [`ContextOptions::int8_tile_rows`].
    pub(crate) int8_tile_rows: u32,
    /// [`ContextOptions::few_tokens`].
    pub(crate) few_tokens: u32,
    /// [`ContextOptions::few_tuning`].
    pub(crate) few_tuning: Option<(u32, u32)>,
    /// [`ContextOptions::split_routing`].
    pub(crate) split_routing: Option<(u64, u64)>,
    /// Held around every submit and poll ([`GpuContext::submit`], [`GpuContext::poll`]):
    /// [`crate::poller::Maintenance`] says why.
    pub(crate) maintenance: Arc<crate::poller::Maintenance>,
    /// Natively, the thread that polls the device while async waits are pending.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) poller: crate::poller::Poller,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("features", &self.features)
            .finish()
    }
}

impl GpuContext {
    /// Picks an adapter and creates the device.
    pub async fn new(options: ContextOptions) -> Result<Self, GpuError> {
        let _span = tracing::info_span!("gpu_init").entered();
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = options.backends;
        // wgpu-core's own validation stays on; driver validation layers would only slow us.
        desc.flags = wgpu::InstanceFlags::empty();
        let instance = wgpu::Instance::new(desc);
        let adapter = Self::pick_adapter(&instance, &options).await?;
        let mut info = adapter.get_info();
        if options.gpu_routing {
            info.device_type = wgpu::DeviceType::Other;
        } else if options.cpu_adapter {
            info.device_type = wgpu::DeviceType::Cpu;
        }
        let available = adapter.features();
        let shader_f16 = options.allow_f16 && available.contains(wgpu::Features::SHADER_F16);
        let subgroups = options.allow_subgroups && available.contains(wgpu::Features::SUBGROUP);
        let timestamps = available.contains(wgpu::Features::TIMESTAMP_QUERY);
        // Ask for everything the adapter offers: weight tiles and scratch are sized from these.
        let limits = if options.webgpu_limits {
            wgpu::Limits::default()
        } else {
            adapter.limits()
        };
        let browser = info.backend == wgpu::Backend::BrowserWebGpu;
        let coop_matmul = options.allow_coop
            && !browser
            && limits.max_compute_workgroup_storage_size >= crate::ops::COOP_MATMUL_BYTES
            && shader_f16
            && subgroups
            && info.subgroup_min_size == 32
            && info.subgroup_max_size == 32
            && available.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            && available.contains(wgpu::Features::SUBGROUP_BARRIER)
            && adapter.cooperative_matrix_properties().iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                    && c.ab_type == wgpu::CooperativeScalarType::F16
                    && c.cr_type == wgpu::CooperativeScalarType::F32
            });
        let features = GpuFeatures {
            shader_f16,
            subgroups,
            timestamps,
            timestamps_in_passes: timestamps
                && available.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            coop_matmul,
            int8_activations: options.allow_int8_activations,
            int8_tiles: options.allow_int8_tiles,
            browser_wgsl: browser,
            subgroup_matrix: if browser && options.allow_coop && shader_f16 && subgroups {
                subgroup_matrix_side(&adapter, &info, &limits)
            } else {
                0
            },
        };
        Self::open(&adapter, info, features, limits, &options).await
    }

    /// Creates the device on `adapter` with what `features` use and `limits`.
    async fn open(
        adapter: &wgpu::Adapter,
        info: wgpu::AdapterInfo,
        features: GpuFeatures,
        limits: wgpu::Limits,
        options: &ContextOptions,
    ) -> Result<Self, GpuError> {
        let required = features.required();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgemma"),
                required_features: required,
                required_limits: limits.clone(),
                // SAFETY: the one experimental feature we may ask for is cooperative matrices,
                // used by one kernel whose loads and stores stay inside workgroup arrays at
                // 16-byte aligned offsets, and which runs only where the adapter reports the
                // exact configuration it uses; its output is checked against the CPU on the
                // H100 (`benches/h100.sh tests`).
                experimental_features: if features.coop_matmul {
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;

        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("wgpu error: {e}");
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            tracing::error!("GPU device lost ({reason:?}): {message}");
            if let Ok(mut l) = lost_sink.lock() {
                *l = Some(format!("{reason:?}: {message}"));
            }
        });
        tracing::info!(
            adapter = %info.name,
            backend = ?info.backend,
            device_type = ?info.device_type,
            ?features,
            max_binding = limits.max_storage_buffer_binding_size,
            max_buffer = limits.max_buffer_size,
            "GPU ready"
        );
        let busy_wait = options.busy_wait
            && !options.cpu_adapter
            && !options.gpu_routing
            && info.device_type != wgpu::DeviceType::Cpu;
        let maintenance = Arc::new(crate::poller::Maintenance::default());
        #[cfg(not(target_arch = "wasm32"))]
        let poller = crate::poller::Poller::new(device.clone(), maintenance.clone());
        Ok(Self {
            device,
            queue,
            info,
            features,
            limits,
            errors,
            lost,
            split_k: options.allow_split_k,
            coop_tile: options.coop_tile,
            attention_rows: options.attention_rows,
            coop_attention: options.coop_attention,
            attention_parts: options.attention_parts,
            expert_tile: options.expert_tile,
            coop_step: options.coop_step,
            int8_tile_rows: options.int8_tile_rows,
            few_tokens: options.few_tokens,
            few_tuning: options.few_tuning,
            split_routing: options.split_routing,
            pipelines: Mutex::new(HashMap::new()),
            unused: std::sync::OnceLock::new(),
            shader_checks: options.shader_checks,
            busy_wait,
            maintenance,
            #[cfg(not(target_arch = "wasm32"))]
            poller,
        })
    }

    /// A context that builds plans as `class` would run them, on wgpu's no-op backend: every
    /// shader variant is compiled (validated by naga) and every dispatch and bind group is
    /// built against the class's features and limits, but nothing runs and buffers are
    /// plain host memory. For the tests that pin each model's dispatch sequence per device.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn emulating(class: DeviceClass) -> Result<Self, GpuError> {
        let features = class.features();
        let limits = class.limits();
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::NOOP;
        desc.backend_options.noop = wgpu::NoopBackendOptions {
            enable: true,
            limits: Some(limits.clone()),
            features: Some(features.required()),
            device_type: Some(class.device_type()),
            subgroup_min_size: Some(features.subgroup_min_size),
            subgroup_max_size: Some(features.subgroup_max_size),
        };
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions::default())
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let mut info = adapter.get_info();
        info.name = format!("{} (emulated)", class.name());
        // The no-op adapter reports a CPU whatever its options say.
        info.device_type = class.device_type();
        let options = ContextOptions {
            busy_wait: false,
            ..ContextOptions::default()
        };
        Self::open(&adapter, info, features, limits, &options).await
    }

    async fn pick_adapter(
        instance: &wgpu::Instance,
        options: &ContextOptions,
    ) -> Result<wgpu::Adapter, GpuError> {
        let no_adapter = || GpuError::NoAdapter {
            filter: options
                .adapter_name
                .as_ref()
                .map(|n| format!(" whose name contains {n:?}"))
                .unwrap_or_default(),
        };
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(name) = &options.adapter_name {
            let needle = name.to_lowercase();
            let adapters = instance.enumerate_adapters(options.backends).await;
            return adapters
                .into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&needle))
                .ok_or_else(no_adapter);
        }
        instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: options.power_preference,
                force_fallback_adapter: false,
                compatible_surface: None,
                // The real limits, not a bucketed subset: weight tiles are sized from them.
                apply_limit_buckets: false,
            })
            .await
            .map_err(|_| no_adapter())
    }

    /// The largest buffer a single storage binding may cover (weights are tiled to fit).
    pub fn max_binding_size(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Returns the first GPU error reported since the last check, or the loss of the device.
    pub fn check(&self) -> Result<(), GpuError> {
        if let Some(reason) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(GpuError::DeviceLost(reason));
        }
        let mut errors = self
            .errors
            .lock()
            .map_err(|e| GpuError::Validation(e.to_string()))?;
        if errors.is_empty() {
            return Ok(());
        }
        let first = errors.remove(0);
        errors.clear();
        if first.to_lowercase().contains("out of memory") {
            Err(GpuError::OutOfMemory(first))
        } else {
            Err(GpuError::Validation(first))
        }
    }

    /// Whether the device has been lost (the session must be rebuilt).
    pub fn is_lost(&self) -> bool {
        self.lost.lock().map(|l| l.is_some()).unwrap_or(true)
    }

    /// The compute pipeline for `source`, compiled once per context.
    pub fn pipeline(&self, source: &ShaderSource) -> Pipeline {
        let key = source.key();
        if let Some(p) = self
            .pipelines
            .lock()
            .ok()
            .and_then(|m| m.get(&key).map(|(p, _)| p.clone()))
        {
            return p;
        }
        let _span = tracing::debug_span!("compile", shader = %key).entered();
        let code = source.render(&self.features);
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(dir) = crate::knobs::get("WGEMMA_DUMP_SPIRV") {
            crate::shader::dump_spirv(&dir, source, &self.features);
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&key),
            source: wgpu::ShaderSource::Wgsl(code.into()),
        };
        let module = if self.shader_checks {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: the kernels are ours, not user input. Every buffer index is bounded by
            // parameters the dispatchers check against the bound sizes (weights carry padding
            // for the one-word read-ahead), every loop runs to a bound taken from those
            // parameters, and every divisor is a validated non-zero size.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let constants: Vec<(&str, f64)> = source
            .constants
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        let compute = Arc::new(self.device.create_compute_pipeline(
            &wgpu::ComputePipelineDescriptor {
                label: Some(&key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: self.shader_checks,
                },
                cache: None,
            },
        ));
        let pipeline = Pipeline {
            key: key.as_str().into(),
            compute,
        };
        if let Ok(mut m) = self.pipelines.lock() {
            m.insert(key, (pipeline.clone(), source.clone()));
        }
        pipeline
    }

    /// The source of a compiled variant, by its key ([`Pipeline::key`]).
    pub fn shader_source(&self, key: &str) -> Option<ShaderSource> {
        let m = self.pipelines.lock().ok()?;
        m.get(key).map(|(_, source)| source.clone())
    }

    /// Number of distinct pipelines compiled so far.
    pub fn pipeline_count(&self) -> usize {
        self.pipelines.lock().map(|m| m.len()).unwrap_or(0)
    }
}
