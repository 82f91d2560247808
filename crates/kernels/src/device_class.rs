//! The devices whose plans are pinned: each class's features and the limits the kernels and
//! the weight tiling read, as wgpu reports them on that device. [`GpuContext::emulating`]
//! builds plans for a class on wgpu's no-op backend, so that a test can check the dispatch
//! sequence of every model on every class without that device (`xtask plans --check` checks
//! a real device against its class).
//!
//! [`GpuContext::emulating`]: crate::GpuContext::emulating

use crate::context::GpuFeatures;

/// A kind of device the kernels specialise for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    /// An NVIDIA data-centre GPU through Vulkan (the lent H100 and H200): f16, subgroups of
    /// exactly 32 lanes, 16x16x16 cooperative matrices, 2 GiB bindings.
    NvidiaVulkan,
    /// Mesa's lavapipe (CI's Vulkan on the CPU, 256-bit LLVM): f16, subgroups of 8 lanes,
    /// 128 MiB bindings, a CPU device.
    Lavapipe,
    /// lavapipe with f16 and subgroups off (`WGEMMA_NO_F16=1 WGEMMA_NO_SUBGROUPS=1`): the
    /// kernels the browser runs on SwiftShader.
    LavapipeFallback,
}

impl DeviceClass {
    pub const ALL: [DeviceClass; 3] = [
        DeviceClass::NvidiaVulkan,
        DeviceClass::Lavapipe,
        DeviceClass::LavapipeFallback,
    ];

    /// The class's name in file names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::NvidiaVulkan => "nvidia-vulkan",
            DeviceClass::Lavapipe => "lavapipe",
            DeviceClass::LavapipeFallback => "lavapipe-fallback",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The class a real device belongs to, if any: by its vendor, type and features.
    pub fn of(info: &wgpu::AdapterInfo, features: &GpuFeatures) -> Option<Self> {
        const NVIDIA: u32 = 0x10de;
        match info.device_type {
            wgpu::DeviceType::Cpu if info.name.contains("llvmpipe") => {
                Some(if features.subgroups || features.shader_f16 {
                    DeviceClass::Lavapipe
                } else {
                    DeviceClass::LavapipeFallback
                })
            }
            wgpu::DeviceType::DiscreteGpu
                if info.vendor == NVIDIA && info.backend == wgpu::Backend::Vulkan =>
            {
                Some(DeviceClass::NvidiaVulkan)
            }
            _ => None,
        }
    }

    // Read by `GpuContext::emulating`, which the browser build has not.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn device_type(self) -> wgpu::DeviceType {
        match self {
            DeviceClass::NvidiaVulkan => wgpu::DeviceType::DiscreteGpu,
            DeviceClass::Lavapipe | DeviceClass::LavapipeFallback => wgpu::DeviceType::Cpu,
        }
    }

    // Read by `GpuContext::emulating`, which the browser build has not.
    #[cfg(not(target_arch = "wasm32"))]
    /// What the kernels use of the device (timestamps do not change a plan and are off).
    pub(crate) fn features(self) -> GpuFeatures {
        let none = GpuFeatures {
            shader_f16: false,
            subgroups: false,
            timestamps: false,
            timestamps_in_passes: false,
            subgroup_min_size: 4,
            subgroup_max_size: 128,
            coop_matmul: false,
            int8_activations: true,
            int8_tiles: true,
            browser_wgsl: false,
            subgroup_matrix: 0,
        };
        match self {
            DeviceClass::NvidiaVulkan => GpuFeatures {
                shader_f16: true,
                subgroups: true,
                subgroup_min_size: 32,
                subgroup_max_size: 32,
                coop_matmul: true,
                ..none
            },
            DeviceClass::Lavapipe => GpuFeatures {
                shader_f16: true,
                subgroups: true,
                subgroup_min_size: 8,
                subgroup_max_size: 8,
                ..none
            },
            DeviceClass::LavapipeFallback => GpuFeatures {
                subgroup_min_size: 8,
                subgroup_max_size: 8,
                ..none
            },
        }
    }

    // Read by `GpuContext::emulating`, which the browser build has not.
    #[cfg(not(target_arch = "wasm32"))]
    /// The limits wgpu reports on the class's devices (`cargo xtask plans` prints a real
    /// device's).
    pub(crate) fn limits(self) -> wgpu::Limits {
        let base = wgpu::Limits {
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            max_compute_workgroup_size_y: 1024,
            max_compute_workgroup_size_z: 64,
            max_compute_workgroups_per_dimension: 65535,
            max_bind_groups: 8,
            max_storage_buffers_per_shader_stage: 32,
            max_uniform_buffers_per_shader_stage: 15,
            max_uniform_buffer_binding_size: 65536,
            ..wgpu::Limits::default()
        };
        match self {
            // As the H200 (driver 580.159) reports them.
            DeviceClass::NvidiaVulkan => wgpu::Limits {
                max_storage_buffer_binding_size: 2_147_483_644,
                max_buffer_size: 4_292_870_144,
                max_compute_workgroup_storage_size: 49152,
                min_uniform_buffer_offset_alignment: 64,
                max_storage_buffers_per_shader_stage: 524_288,
                ..base
            },
            DeviceClass::Lavapipe | DeviceClass::LavapipeFallback => wgpu::Limits {
                max_storage_buffer_binding_size: 1 << 27,
                max_buffer_size: (1 << 31) - 1,
                max_compute_workgroup_storage_size: 32768,
                max_compute_workgroup_size_z: 1024,
                min_uniform_buffer_offset_alignment: 32,
                min_storage_buffer_offset_alignment: 32,
                ..base
            },
        }
    }
}
