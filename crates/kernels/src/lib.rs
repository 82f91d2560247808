//! wgemma's GPU kernels: a [`GpuContext`] (adapter, features, limits, pipeline cache), WGSL
//! kernels with typed dispatchers in [`ops`], weights in GGUF block layout tiled to the
//! binding limit ([`GpuWeight`]), a [`Recorder`] that puts many dispatches into one pass, and
//! a CPU reference of every kernel in [`cpu`].

mod context;
// The browser polls by itself: only `Maintenance` is used there.
pub mod cpu;
mod device_class;
mod gpu;
pub mod graph;
pub mod knobs;
pub mod ops;
pub mod params;
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
mod poller;
#[cfg(not(target_arch = "wasm32"))]
pub mod reflect;
mod shader;
mod steps;
pub mod store;
mod tensor;
mod weights;

pub use context::{ContextOptions, GpuContext, GpuError, GpuFeatures, Pipeline};
pub use device_class::DeviceClass;
pub use gpu::{Bind, BindKind, Dispatch, KernelBindings, Profiler, Recorder, View, WaitMode};
pub use params::{KernelParams, Params};
pub use shader::ShaderSource;
pub use steps::Steps;
pub use tensor::{DType, Layout4, MAX_RANK, Tensor};
pub use weights::{GPU_DTYPES, GpuWeight, WeightTile};
pub use wgpu;
