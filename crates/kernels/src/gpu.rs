//! Buffers, prepared dispatches, and the recorder that puts many dispatches into one command
//! encoder and one compute pass.

use std::cell::RefCell;
use std::sync::Arc;

use crate::context::{GpuContext, GpuError, Pipeline};
use crate::params::{Params, ParamsLayout};

/// Parameter blocks of the dispatches built inside [`GpuContext::with_params_batch`] on one
/// thread: packed into shared uniform buffers and written once at its end, rather than a
/// buffer and a write each (a prefill plan builds hundreds of dispatches; creating and writing
/// their blocks one by one was most of the time it took on the CPU).
struct ParamsBatch {
    /// The context the batch is for (its address).
    ctx: usize,
    align: u64,
    /// Uniform buffers and the bytes queued for each.
    chunks: Vec<(wgpu::Buffer, Vec<u8>)>,
}

/// Bytes per shared uniform buffer of a batch.
const PARAMS_CHUNK: u64 = 64 * 1024;

impl ParamsBatch {
    /// Places `bytes` in the current chunk (a new one when full): the buffer and offset.
    fn place(&mut self, device: &wgpu::Device, bytes: &[u8]) -> (wgpu::Buffer, u64) {
        let slot = (bytes.len() as u64).div_ceil(self.align) * self.align;
        let full = self
            .chunks
            .last()
            .is_none_or(|(_, data)| data.len() as u64 + slot > PARAMS_CHUNK);
        if full {
            let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: PARAMS_CHUNK.max(slot),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.chunks.push((buffer, Vec::new()));
        }
        let (buffer, data) = self.chunks.last_mut().expect("a chunk was just ensured");
        let offset = data.len() as u64;
        data.extend_from_slice(bytes);
        data.resize((offset + slot) as usize, 0);
        (buffer.clone(), offset)
    }
}

thread_local! {
    static PARAMS_BATCH: RefCell<Option<ParamsBatch>> = const { RefCell::new(None) };
}

/// A region of a storage buffer.
#[derive(Clone, Debug)]
pub struct View {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl View {
    /// The whole buffer.
    pub fn of(buffer: &wgpu::Buffer) -> Self {
        Self {
            buffer: buffer.clone(),
            offset: 0,
            size: buffer.size(),
        }
    }

    /// `size` bytes starting `offset` bytes into this view.
    pub fn slice(&self, offset: u64, size: u64) -> Result<Self, GpuError> {
        if offset.checked_add(size).is_none_or(|e| e > self.size) {
            return Err(GpuError::Shape(format!(
                "slice [{offset}, +{size}) of a {}-byte view",
                self.size
            )));
        }
        Ok(Self {
            buffer: self.buffer.clone(),
            offset: self.offset + offset,
            size,
        })
    }

    /// Number of 4-byte elements the view holds.
    pub fn len32(&self) -> u64 {
        self.size / 4
    }

    pub(crate) fn resource(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }

    /// Checks the view holds at least `n` 4-byte elements.
    pub(crate) fn expect_len32(&self, what: &str, n: u64) -> Result<(), GpuError> {
        if self.len32() < n {
            return Err(GpuError::Shape(format!(
                "{what}: needs {n} elements, the buffer holds {}",
                self.len32()
            )));
        }
        Ok(())
    }
}

/// A dispatch with its pipeline and bind group built once, recordable any number of times.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub label: &'static str,
    /// The kernel variant ([`Pipeline::key`]).
    pub kernel: Arc<str>,
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// What each binding number holds, and the parameter block's layout: what
    /// [`crate::reflect`] checks against the kernel's WGSL.
    pub bindings: Arc<[BindKind]>,
    /// The bound fields' numbers and WGSL names ([`KernelBindings::NAMES`]).
    pub binding_names: &'static [(u32, &'static [&'static str])],
    pub params_layout: Option<ParamsLayout>,
    /// The parameter block's buffer and offset.
    params: Option<(wgpu::Buffer, u64)>,
}

impl Dispatch {
    /// Rewrites the parameter block (for values that change between steps, such as a
    /// sampling step counter). Takes effect for submissions made after this call.
    pub fn update_params(&self, ctx: &GpuContext, params: &Params) {
        if let Some((buf, offset)) = &self.params {
            ctx.queue
                .write_buffer(buf, *offset, bytemuck::cast_slice(&params.words()));
        }
    }
}

/// One binding of a dispatch: a storage view, a parameter block, or nothing (a binding number
/// the shader variant does not declare).
pub enum Bind<'a> {
    Storage(&'a View),
    Params(Params),
    Skip,
}

/// What a binding number of a dispatch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindKind {
    Storage,
    Uniform,
    Unused,
}

/// A kernel's bindings as named fields, each with its binding number and the WGSL variable
/// names it may have (the variants of one file name a few bindings after what they hold
/// there). `crate::reflect` checks kinds and names against the shader; the struct is the one
/// place a kernel's binding numbers are written.
pub trait KernelBindings<'a> {
    /// Per bound field: its binding number and the WGSL names it may have.
    const NAMES: &'static [(u32, &'static [&'static str])];
    /// The bindings by number (`Bind::Skip` in the gaps).
    fn into_binds(self) -> Vec<Bind<'a>>;
}

/// Declares a [`KernelBindings`] struct: each field a [`Bind`] with its binding number,
/// named as its WGSL variable or given the names it may have (`x: 1 = ["x", "xg"]`).
macro_rules! kernel_bindings {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident: $num:literal $(= [$($alias:literal),+])?),* $(,)? }) => {
        $(#[$meta])*
        pub struct $name<'a> {
            $($(#[$fmeta])* pub $field: $crate::Bind<'a>),*
        }

        impl<'a> $crate::gpu::KernelBindings<'a> for $name<'a> {
            const NAMES: &'static [(u32, &'static [&'static str])] =
                &[$(($num, kernel_bindings!(@names $field $(, [$($alias),+])?))),*];

            fn into_binds(self) -> Vec<$crate::Bind<'a>> {
                let mut out = Vec::new();
                $(
                    if out.len() <= $num {
                        out.resize_with($num + 1, || $crate::Bind::Skip);
                    }
                    out[$num] = self.$field;
                )*
                out
            }
        }
    };
    (@names $field:ident) => { &[stringify!($field)] };
    (@names $field:ident, [$($alias:literal),+]) => { &[$($alias),+] };
}
pub(crate) use kernel_bindings;

impl Bind<'_> {
    /// A storage binding of `view`, or none.
    pub fn opt(view: Option<&View>) -> Bind<'_> {
        view.map_or(Bind::Skip, Bind::Storage)
    }

    fn kind(&self) -> BindKind {
        match self {
            Bind::Storage(_) => BindKind::Storage,
            Bind::Params(_) => BindKind::Uniform,
            Bind::Skip => BindKind::Unused,
        }
    }
}

impl GpuContext {
    /// A storage buffer of `size` bytes (rounded up to 4), usable as copy source and target.
    pub fn storage(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    /// Two distinct one-word buffers, made once, for writable binding slots a dispatch never
    /// touches: WebGPU refuses one buffer in two writable bindings of a dispatch.
    pub fn unused_storage(&self) -> [View; 2] {
        let [a, b] = self
            .unused
            .get_or_init(|| [self.storage("unused 0", 4), self.storage("unused 1", 4)]);
        [View::of(a), View::of(b)]
    }

    pub fn storage_init(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let buf = self.storage(label, bytes.len() as u64);
        self.write(&buf, 0, bytes);
        buf
    }

    /// Queues a write of `bytes` at `offset` (padded to a multiple of 4).
    pub fn write(&self, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        if bytes.len().is_multiple_of(4) {
            self.queue.write_buffer(buffer, offset, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buffer, offset, &padded);
        }
    }

    /// Builds a dispatch of `pipeline` over `bindings`.
    pub fn dispatch<'a, B: KernelBindings<'a>>(
        &self,
        label: &'static str,
        pipeline: Pipeline,
        bindings: B,
        workgroups: [u32; 3],
    ) -> Result<Dispatch, GpuError> {
        let binds = bindings.into_binds();
        let mut d = self.dispatch_binds(label, pipeline, &binds, workgroups)?;
        d.binding_names = B::NAMES;
        Ok(d)
    }

    /// Builds a dispatch of `pipeline` over `binds` (binding i = `binds[i]`).
    fn dispatch_binds(
        &self,
        label: &'static str,
        pipeline: Pipeline,
        binds: &[Bind<'_>],
        workgroups: [u32; 3],
    ) -> Result<Dispatch, GpuError> {
        let max = self.limits.max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&w| w > max) {
            return Err(GpuError::Shape(format!(
                "{label}: grid {workgroups:?} exceeds {max} workgroups per dimension"
            )));
        }
        let params: Vec<Option<(wgpu::Buffer, u64, u64)>> = binds
            .iter()
            .map(|b| match b {
                Bind::Params(p) => {
                    let words = p.words();
                    let bytes: &[u8] = bytemuck::cast_slice(&words);
                    let batched = PARAMS_BATCH.with_borrow_mut(|batch| {
                        batch
                            .as_mut()
                            .filter(|b| b.ctx == self.id())
                            .map(|b| b.place(&self.device, bytes))
                    });
                    let (buf, offset) = batched.unwrap_or_else(|| {
                        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some(label),
                            size: bytes.len() as u64,
                            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        });
                        self.queue.write_buffer(&buf, 0, bytes);
                        (buf, 0)
                    });
                    Some((buf, offset, bytes.len() as u64))
                }
                Bind::Storage(_) | Bind::Skip => None,
            })
            .collect();
        let entries: Vec<wgpu::BindGroupEntry<'_>> = binds
            .iter()
            .zip(&params)
            .enumerate()
            .filter_map(|(i, (b, p))| {
                let resource = match (b, p) {
                    (Bind::Storage(v), _) => v.resource(),
                    (Bind::Params(_), Some((buffer, offset, size))) => {
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer,
                            offset: *offset,
                            size: wgpu::BufferSize::new(*size),
                        })
                    }
                    _ => return None,
                };
                Some(wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource,
                })
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.compute.get_bind_group_layout(0),
            entries: &entries,
        });
        let params_layout = binds.iter().find_map(|b| match b {
            Bind::Params(p) => Some(p.layout()),
            _ => None,
        });
        Ok(Dispatch {
            label,
            kernel: pipeline.key,
            pipeline: pipeline.compute,
            bind_group,
            workgroups,
            bindings: binds.iter().map(Bind::kind).collect(),
            binding_names: &[],
            params_layout,
            params: params.into_iter().flatten().next().map(|(b, o, _)| (b, o)),
        })
    }

    /// This context's identity, for the thread's parameter batch.
    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Runs `build`, packing the parameter blocks of the dispatches it builds on this thread
    /// into shared uniform buffers, written once when it returns (see `ParamsBatch`). Inside
    /// another batch, it joins that one.
    pub fn with_params_batch<R>(&self, build: impl FnOnce() -> R) -> R {
        /// Writes the batch it opened when dropped, also when `build` unwinds.
        struct Close<'a>(Option<&'a GpuContext>);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                let Some(ctx) = self.0 else { return };
                if let Some(batch) = PARAMS_BATCH.with_borrow_mut(Option::take) {
                    for (buffer, data) in &batch.chunks {
                        ctx.queue.write_buffer(buffer, 0, data);
                    }
                }
            }
        }
        let opened = PARAMS_BATCH.with_borrow_mut(|batch| {
            if batch.is_some() {
                return false;
            }
            *batch = Some(ParamsBatch {
                ctx: self.id(),
                align: u64::from(self.limits.min_uniform_buffer_offset_alignment).max(16),
                chunks: Vec::new(),
            });
            true
        });
        let _close = Close(opened.then_some(self));
        build()
    }

    /// A buffer of `size` bytes that the GPU copies into and the CPU maps to read
    /// ([`GpuContext::map_and_copy`]).
    pub fn readback_buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Reads `size` bytes at `offset` of `buffer` back to the CPU.
    pub async fn read(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size = size.div_ceil(4) * 4;
        let staging = self.readback_buffer("readback", size.max(4));
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.submit([enc.finish()]);
        self.map_and_copy(&staging, size).await
    }

    /// Maps a `MAP_READ` buffer and copies its first `size` bytes out (a multiple of 4), for
    /// a staging buffer kept across steps, into which a recorder copied them.
    pub async fn map_and_copy(
        &self,
        staging: &wgpu::Buffer,
        size: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let (tx, rx) = futures::channel::oneshot::channel();
        staging
            .slice(..size)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        self.done(None, WaitMode::Sleep).await?;
        let mapped = rx.await.map_err(|e| GpuError::Readback(e.to_string()))?;
        self.check()?;
        mapped.map_err(|e| GpuError::Readback(e.to_string()))?;
        let bytes = staging
            .slice(..size)
            .get_mapped_range()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }

    pub async fn read_f32(&self, view: &View) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read(&view.buffer, view.offset, view.size).await?;
        Ok(bytemuck::pod_collect_to_vec(
            &bytes[..view.size as usize / 4 * 4],
        ))
    }

    pub async fn read_u32(&self, view: &View) -> Result<Vec<u32>, GpuError> {
        let bytes = self.read(&view.buffer, view.offset, view.size).await?;
        Ok(bytemuck::pod_collect_to_vec(
            &bytes[..view.size as usize / 4 * 4],
        ))
    }

    /// How to wait for work the caller submits more after as soon as it is done:
    /// [`WaitMode::Spin`] where [`crate::ContextOptions::busy_wait`] allows it.
    pub fn urgent_wait(&self) -> WaitMode {
        if self.busy_wait {
            WaitMode::Spin
        } else {
            WaitMode::Sleep
        }
    }

    /// Submits `commands` (see [`GpuContext::poll`] for why every submission goes through
    /// here).
    pub fn submit(
        &self,
        commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> wgpu::SubmissionIndex {
        let _maintenance = self.maintenance.hold();
        self.queue.submit(commands)
    }

    /// Polls the device, never at the same time as another poll or submission of this
    /// context (`GpuContext::maintenance` says why). A wait with a timeout holds the lock
    /// for at most that long.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn poll(&self, poll: wgpu::PollType) -> Result<wgpu::PollStatus, wgpu::PollError> {
        let _maintenance = self.maintenance.hold();
        self.device.poll(poll)
    }

    /// Resolves once `submission` (`None`: everything submitted so far) has finished on the
    /// GPU; a buffer mapped after that work is mapped by then. Natively a background thread
    /// polls the device meanwhile ([`crate::poller`]), so the caller's thread is never held;
    /// in the browser, mapping a buffer is the wait and this is ready at once.
    pub async fn done(
        &self,
        submission: Option<wgpu::SubmissionIndex>,
        mode: WaitMode,
    ) -> Result<(), GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        self.poller.done(submission, mode).await?;
        #[cfg(target_arch = "wasm32")]
        let _ = (submission, mode);
        Ok(())
    }

    /// Waits until `submission` has finished on the GPU, holding the caller's thread (native;
    /// async callers use [`GpuContext::done`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for(
        &self,
        submission: wgpu::SubmissionIndex,
        mode: WaitMode,
    ) -> Result<(), GpuError> {
        self.wait_until(Some(submission), mode)
    }

    /// Waits for `submission`, or for everything submitted so far. Sleeping waits in slices
    /// of [`WAIT_SLICE`], so that other threads submit and poll between them.
    #[cfg(not(target_arch = "wasm32"))]
    fn wait_until(
        &self,
        submission: Option<wgpu::SubmissionIndex>,
        mode: WaitMode,
    ) -> Result<(), GpuError> {
        let timeout = match mode {
            WaitMode::Sleep => WAIT_SLICE,
            WaitMode::Spin => std::time::Duration::ZERO,
        };
        loop {
            let poll = wgpu::PollType::Wait {
                submission_index: submission.clone(),
                timeout: Some(timeout),
            };
            match self.poll(poll) {
                Ok(_) => return Ok(()),
                Err(wgpu::PollError::Timeout) => std::hint::spin_loop(),
                Err(e) => return Err(GpuError::Readback(e.to_string())),
            }
        }
    }

    /// Waits until everything submitted so far has finished (native).
    #[cfg(not(target_arch = "wasm32"))]
    fn wait_all(&self) -> Result<(), GpuError> {
        self.wait_until(None, WaitMode::Sleep)
    }

    /// Waits until the GPU has finished all submitted work (native); errors surface here.
    pub fn wait(&self) -> Result<(), GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        self.wait_all()?;
        self.check()
    }
}

/// The longest a sleeping [`GpuContext::wait_for`] holds the context's maintenance lock
/// (natively; the browser never blocks).
#[cfg(not(target_arch = "wasm32"))]
pub const WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(1);

/// How [`GpuContext::wait_for`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Sleep until the device signals (its wake-up can take tens of microseconds).
    Sleep,
    /// Poll the device in a loop, keeping a CPU core busy: back the moment the work is done.
    /// [`GpuContext::done`] checks once each time it is polled and asks to be polled again,
    /// so the executor's other tasks run in between.
    Spin,
}

/// Records dispatches into one command encoder, all in one compute pass unless a copy or a
/// timed span needs the encoder.
pub struct Recorder<'a> {
    ctx: &'a GpuContext,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    dispatches: usize,
    profiler: Option<&'a mut Profiler>,
}

impl<'a> Recorder<'a> {
    pub fn new(ctx: &'a GpuContext, label: &str) -> Self {
        let encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        Self {
            ctx,
            encoder: Some(encoder),
            pass: None,
            dispatches: 0,
            profiler: None,
        }
    }

    /// A recorder that times every dispatch with `profiler`: between the dispatches of the one
    /// pass where the adapter can (each then covers its wait for the one before, its launch
    /// and its run, plus what the timestamps themselves cost: about 6 us a dispatch on the
    /// H100), else each in a pass of its own (whose overhead the times then include). For
    /// ranking kernels, not for summing to a step's time.
    pub fn profiled(ctx: &'a GpuContext, label: &str, profiler: &'a mut Profiler) -> Self {
        let mut r = Self::new(ctx, label);
        r.profiler = Some(profiler);
        r
    }

    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder
            .as_mut()
            .expect("the encoder lives until finish")
    }

    /// Records `d` in the current compute pass (opening one if needed).
    pub fn run(&mut self, d: &Dispatch) {
        self.run_grid(d, d.workgroups);
    }

    /// Records `d` with a different grid (for grids that depend on the step).
    pub fn run_grid(&mut self, d: &Dispatch, workgroups: [u32; 3]) {
        if workgroups.contains(&0) {
            return;
        }
        if let Some(p) = self.profiler.as_mut() {
            if let Some(index) = p.claim(d.label, workgroups) {
                let queries = p.queries.clone();
                if !p.in_pass {
                    let d = Dispatch {
                        workgroups,
                        ..d.clone()
                    };
                    self.run_timed(&d, &queries, index);
                    return;
                }
                self.pass().write_timestamp(&queries, index);
                self.dispatch_in_pass(d, workgroups);
                self.pass().write_timestamp(&queries, index + 1);
                return;
            }
        }
        self.dispatch_in_pass(d, workgroups);
    }

    /// The current compute pass, opened if needed.
    fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let encoder = self
                .encoder
                .as_mut()
                .expect("the encoder lives until finish");
            let pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgemma"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("just opened")
    }

    fn dispatch_in_pass(&mut self, d: &Dispatch, workgroups: [u32; 3]) {
        let pass = self.pass();
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        self.dispatches += 1;
    }

    /// Records `d` in a pass of its own whose start and end are written to `queries` at
    /// `index` and `index + 1` (per-kernel profiling).
    pub fn run_timed(&mut self, d: &Dispatch, queries: &wgpu::QuerySet, index: u32) {
        self.dispatches += 1;
        let encoder = self.encoder();
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(d.label),
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: queries,
                beginning_of_pass_write_index: Some(index),
                end_of_pass_write_index: Some(index + 1),
            }),
        });
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
    }

    /// Copies between buffers (ends the current compute pass).
    pub fn copy(&mut self, from: &View, to: &View, size: u64) {
        self.encoder().copy_buffer_to_buffer(
            &from.buffer,
            from.offset,
            &to.buffer,
            to.offset,
            size,
        );
    }

    /// The underlying encoder (ends the current compute pass).
    pub fn raw_encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.encoder()
    }

    /// Dispatches recorded so far.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Ends the pass and returns everything recorded, to submit later.
    pub fn finish(mut self) -> wgpu::CommandBuffer {
        self.pass = None;
        let mut encoder = self.encoder.take().expect("the encoder lives until finish");
        if let Some(p) = self.profiler.take() {
            p.resolve(&mut encoder);
        }
        encoder.finish()
    }

    /// Submits everything recorded so far and goes on in a new encoder: writes queued after
    /// this land between the two (before the rest of the recording runs).
    pub fn flush(&mut self) {
        self.pass = None;
        let label = Some("wgemma");
        let next = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label });
        if let Some(encoder) = self.encoder.replace(next) {
            self.ctx.submit([encoder.finish()]);
        }
    }

    /// The context recorded for.
    pub fn ctx(&self) -> &'a GpuContext {
        self.ctx
    }

    /// Ends the pass and submits everything recorded.
    pub fn submit(self) -> wgpu::SubmissionIndex {
        let ctx = self.ctx;
        ctx.submit([self.finish()])
    }
}

/// GPU timestamps around dispatches, summed per kernel label.
pub struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    capacity: u32,
    /// Per timed dispatch: its label and workgroups.
    labels: Vec<(&'static str, u32)>,
    period_ns: f64,
    /// Dispatches are timed inside the step's one pass ([`crate::GpuFeatures::timestamps_in_passes`]).
    in_pass: bool,
}

impl Profiler {
    /// Room for `dispatches` timed dispatches per submission; `None` without timestamp queries.
    pub fn new(ctx: &GpuContext, dispatches: u32) -> Option<Self> {
        if !ctx.features.timestamps {
            return None;
        }
        let count = (dispatches * 2).min(4096);
        let queries = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profiler"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profiler"),
            size: u64::from(count) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(Self {
            queries,
            resolve,
            capacity: count / 2,
            labels: Vec::new(),
            period_ns: f64::from(ctx.queue.get_timestamp_period()),
            in_pass: ctx.features.timestamps_in_passes,
        })
    }

    /// Whether dispatches are timed inside one pass (else each in a pass of its own).
    pub fn in_pass(&self) -> bool {
        self.in_pass
    }

    fn claim(&mut self, label: &'static str, workgroups: [u32; 3]) -> Option<u32> {
        let i = self.labels.len() as u32;
        (i < self.capacity).then(|| {
            self.labels.push((label, workgroups.iter().product()));
            2 * i
        })
    }

    fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = self.labels.len() as u32 * 2;
        if n > 0 {
            encoder.resolve_query_set(&self.queries, 0..n, &self.resolve, 0);
        }
    }

    /// Reads the timings of the last profiled submission: per dispatch in recording order, its
    /// label, workgroups and microseconds. Clears them for the next submission.
    pub async fn read_each(
        &mut self,
        ctx: &GpuContext,
    ) -> Result<Vec<(&'static str, u32, f64)>, GpuError> {
        let n = self.labels.len() as u64 * 2;
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = ctx.read(&self.resolve, 0, n * 8).await?;
        let stamps: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[..(n * 8) as usize]);
        Ok(self
            .labels
            .drain(..)
            .enumerate()
            .map(|(i, (label, workgroups))| {
                let ticks = stamps[2 * i + 1].saturating_sub(stamps[2 * i]);
                (label, workgroups, ticks as f64 * self.period_ns / 1e3)
            })
            .collect())
    }

    /// [`Profiler::read_each`] summed per label ([`Profiler::totals`]).
    pub async fn read(
        &mut self,
        ctx: &GpuContext,
    ) -> Result<Vec<(&'static str, usize, f64)>, GpuError> {
        Ok(Self::totals(&self.read_each(ctx).await?))
    }

    /// Per label of `each` ([`Profiler::read_each`]'s rows): (dispatches, total microseconds),
    /// most expensive first.
    pub fn totals(each: &[(&'static str, u32, f64)]) -> Vec<(&'static str, usize, f64)> {
        let mut totals: Vec<(&'static str, usize, f64)> = Vec::new();
        for &(label, _, us) in each {
            match totals.iter_mut().find(|t| t.0 == label) {
                Some(t) => {
                    t.1 += 1;
                    t.2 += us;
                }
                None => totals.push((label, 1, us)),
            }
        }
        totals.sort_by(|a, b| b.2.total_cmp(&a.2));
        totals
    }
}
