//! `cargo xtask shader-stats DIR`: what the Vulkan driver says about each kernel variant
//! written by `WGEMMA_DUMP_SPIRV=DIR` (any run: a benchmark, a test) — the statistics of
//! `VK_KHR_pipeline_executable_properties` (NVIDIA reports registers a thread, shared memory
//! and more), for the pipeline as wgpu builds it (robust buffer access on, as wgpu enables it)
//! and, where the driver has `VK_EXT_pipeline_robustness`, with robustness off for its buffers.
//! Register counts set occupancy, which no timestamp shows; wgpu exposes none of this, so the
//! variants are compiled again here through `ash` (the Vulkan binding wgpu itself uses).

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use ash::vk;

use crate::TaskError;

#[derive(clap::Args)]
pub struct Args {
    /// Folder that `WGEMMA_DUMP_SPIRV` wrote (`<variant>.spv` and `<variant>.bind`).
    dir: PathBuf,
    /// Only variants whose file name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Also save the driver's internal representations, where it gives any, next to each
    /// variant (`<variant>.<n>.txt`).
    #[arg(long)]
    ir: bool,
}

/// A Vulkan device with pipeline statistics enabled.
struct Driver {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    executables: ash::khr::pipeline_executable_properties::Device,
    /// Whether `VK_EXT_pipeline_robustness` is enabled (robustness can be turned off per
    /// pipeline).
    can_drop_robustness: bool,
    name: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: every object made from the device is destroyed before this runs.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// One statistic as text.
fn stat_value(s: &vk::PipelineExecutableStatisticKHR) -> String {
    // SAFETY: the driver sets the union member `format` names.
    unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
            _ => "?".into(),
        }
    }
}

fn c_text(chars: &[std::ffi::c_char]) -> String {
    // SAFETY: the driver writes NUL-terminated names into these fixed arrays.
    unsafe { CStr::from_ptr(chars.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl Driver {
    fn new() -> Result<Self, TaskError> {
        // SAFETY: loading the system's Vulkan loader, as wgpu does.
        let entry = unsafe { ash::Entry::load() }?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        // SAFETY: plain instance creation; destroyed in `Drop`.
        let instance = unsafe {
            entry.create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
        }?;
        match Self::open(&instance) {
            Ok((device, can_drop_robustness, name)) => Ok(Self {
                _entry: entry,
                executables: ash::khr::pipeline_executable_properties::Device::new(
                    &instance, &device,
                ),
                instance,
                device,
                can_drop_robustness,
                name,
            }),
            Err(e) => {
                // SAFETY: nothing was made from the instance.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    /// A device of `instance` with statistics enabled, whether it can turn robustness off
    /// per pipeline, and its name.
    fn open(instance: &ash::Instance) -> Result<(ash::Device, bool, String), TaskError> {
        // SAFETY: queries on a live instance.
        let devices = unsafe { instance.enumerate_physical_devices() }?;
        // SAFETY: a query on a live instance.
        let props = |pd: vk::PhysicalDevice| unsafe { instance.get_physical_device_properties(pd) };
        let pd = devices
            .iter()
            .copied()
            .find(|&pd| props(pd).device_type == vk::PhysicalDeviceType::DISCRETE_GPU)
            .or_else(|| devices.first().copied())
            .ok_or("no Vulkan device")?;
        let name = c_text(&props(pd).device_name);
        // SAFETY: as above.
        let extensions = unsafe { instance.enumerate_device_extension_properties(pd) }?;
        let has = |n: &CStr| {
            extensions
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(n))
        };
        let exe_name = ash::khr::pipeline_executable_properties::NAME;
        if !has(exe_name) {
            return Err(format!("{name}: the driver has no {exe_name:?}").into());
        }
        let mut enabled = vec![exe_name.as_ptr()];
        let optional = [
            ash::khr::cooperative_matrix::NAME,
            ash::ext::robustness2::NAME,
            ash::ext::pipeline_robustness::NAME,
        ];
        for n in optional.iter().filter(|n| has(n)) {
            enabled.push(n.as_ptr());
        }
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut exe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut robust2 = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
        let mut prob = vk::PhysicalDevicePipelineRobustnessFeaturesEXT::default();
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13)
            .push_next(&mut exe);
        if has(optional[0]) {
            features = features.push_next(&mut coop);
        }
        if has(optional[1]) {
            features = features.push_next(&mut robust2);
        }
        let can_drop_robustness = has(optional[2]);
        if can_drop_robustness {
            features = features.push_next(&mut prob);
        }
        // SAFETY: the chain holds structs of extensions the device has.
        unsafe { instance.get_physical_device_features2(pd, &mut features) };
        // Every feature the device has, so that any kernel's capabilities are enabled.
        let priorities = [1.0];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&enabled)
            .push_next(&mut features);
        // SAFETY: as above; destroyed in `Drop`.
        let device = unsafe { instance.create_device(pd, &info, None) }?;
        Ok((device, can_drop_robustness, name))
    }

    /// The statistics of `words` compiled with `bindings` (and the internal representations
    /// when `ir`), with robust buffer access or without.
    fn stats(
        &self,
        words: &[u32],
        bindings: &[(u32, vk::DescriptorType)],
        robust: bool,
        ir: bool,
    ) -> Result<Compiled, TaskError> {
        let d = &self.device;
        let layout_bindings: Vec<_> = bindings
            .iter()
            .map(|&(b, t)| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(t)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        // SAFETY: every object made here is destroyed before returning.
        unsafe {
            let set = d.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&layout_bindings),
                None,
            )?;
            let sets = [set];
            let layout = d.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&sets),
                None,
            )?;
            let module =
                d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
            let compiled = self.compile(module, layout, robust, ir);
            d.destroy_shader_module(module, None);
            d.destroy_pipeline_layout(layout, None);
            d.destroy_descriptor_set_layout(set, None);
            compiled
        }
    }

    /// # Safety
    /// `module` and `layout` are live objects of this device.
    unsafe fn compile(
        &self,
        module: vk::ShaderModule,
        layout: vk::PipelineLayout,
        robust: bool,
        ir: bool,
    ) -> Result<Compiled, TaskError> {
        let mut flags = vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR;
        if ir {
            flags |= vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR;
        }
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let mut no_robustness = vk::PipelineRobustnessCreateInfoEXT::default()
            .storage_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED)
            .uniform_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED);
        let mut info = vk::ComputePipelineCreateInfo::default()
            .flags(flags)
            .stage(stage)
            .layout(layout);
        if !robust {
            info = info.push_next(&mut no_robustness);
        }
        let d = &self.device;
        // SAFETY: the caller's objects are live; the pipeline is destroyed below.
        let pipeline = unsafe {
            d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| e)?[0]
        };
        let exe_info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(0);
        // SAFETY: the pipeline was made with the capture flags these queries need.
        let result = unsafe {
            self.executables
                .get_pipeline_executable_statistics(&exe_info)
                .map_err(TaskError::from)
                .and_then(|stats| {
                    let irs = if ir {
                        self.representations(&exe_info)?
                    } else {
                        Vec::new()
                    };
                    Ok(Compiled {
                        stats: stats
                            .iter()
                            .map(|s| (c_text(&s.name), stat_value(s)))
                            .collect(),
                        irs,
                    })
                })
        };
        // SAFETY: no command buffer uses it.
        unsafe { d.destroy_pipeline(pipeline, None) };
        result
    }

    /// The driver's internal representations of one executable, as (name, text).
    ///
    /// # Safety
    /// `exe_info` names a live pipeline made with internal representations captured.
    unsafe fn representations(
        &self,
        exe_info: &vk::PipelineExecutableInfoKHR,
    ) -> Result<Vec<(String, String)>, TaskError> {
        // SAFETY: the two-call idiom gives each representation's size; a third call, with a
        // buffer of that size behind each, fills them.
        unsafe {
            let mut reps = self
                .executables
                .get_pipeline_executable_internal_representations(exe_info)?;
            let mut buffers: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
            for (r, b) in reps.iter_mut().zip(buffers.iter_mut()) {
                r.p_data = b.as_mut_ptr().cast();
            }
            let mut count = reps.len() as u32;
            (self
                .executables
                .fp()
                .get_pipeline_executable_internal_representations_khr)(
                self.device.handle(),
                exe_info,
                &mut count,
                reps.as_mut_ptr(),
            )
            .result()?;
            Ok(reps
                .iter()
                .zip(buffers)
                .map(|(r, b)| {
                    let text = String::from_utf8_lossy(&b)
                        .trim_end_matches('\0')
                        .to_string();
                    (c_text(&r.name), text)
                })
                .collect())
        }
    }
}

/// What the driver reported for one pipeline.
struct Compiled {
    stats: Vec<(String, String)>,
    irs: Vec<(String, String)>,
}

/// A dumped variant's bindings and workgroup memory (`<variant>.bind`: "workgroup BYTES",
/// then "number uniform|storage" a line).
fn read_bindings(path: &Path) -> Result<(Vec<(u32, vk::DescriptorType)>, u32), TaskError> {
    let text = std::fs::read_to_string(path)?;
    let bad = || format!("{}: not a binding list", path.display());
    let mut workgroup = 0;
    let mut bindings = Vec::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let (first, kind) = l.split_once(' ').ok_or_else(bad)?;
        let t = match kind.trim() {
            _ if first == "workgroup" => {
                workgroup = kind.trim().parse().map_err(|_| bad())?;
                continue;
            }
            "uniform" => vk::DescriptorType::UNIFORM_BUFFER,
            "storage" => vk::DescriptorType::STORAGE_BUFFER,
            _ => return Err(bad().into()),
        };
        bindings.push((first.parse().map_err(|_| bad())?, t));
    }
    Ok((bindings, workgroup))
}

fn read_words(path: &Path) -> Result<Vec<u32>, TaskError> {
    let bytes = std::fs::read(path)?;
    if bytes.len() % 4 != 0 {
        return Err(format!("{}: not whole SPIR-V words", path.display()).into());
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The statistics as "name=value" pairs, the register count first.
fn line(stats: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = stats.iter().collect();
    pairs.sort_by_key(|(n, _)| !n.contains("Register"));
    pairs
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let driver = Driver::new()?;
    println!("# {}", driver.name);
    let mut variants: Vec<PathBuf> = std::fs::read_dir(&a.dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "spv"))
        .filter(|p| {
            a.filter.as_ref().is_none_or(|f| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains(f.as_str()))
            })
        })
        .collect();
    variants.sort();
    for spv in variants {
        let stem = spv
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let words = read_words(&spv)?;
        let (bindings, workgroup) = read_bindings(&spv.with_extension("bind"))?;
        println!("{stem} (workgroup memory {workgroup} bytes)");
        match driver.stats(&words, &bindings, true, a.ir) {
            Ok(c) => {
                println!("  robust: {}", line(&c.stats));
                for (i, (name, text)) in c.irs.iter().enumerate() {
                    let out = a.dir.join(format!("{stem}.{i}.txt"));
                    std::fs::write(&out, text)?;
                    println!("  representation {name:?}: {} bytes", text.len());
                }
            }
            Err(e) => println!("  robust: failed: {e}"),
        }
        if driver.can_drop_robustness {
            match driver.stats(&words, &bindings, false, false) {
                Ok(c) => println!("  not robust: {}", line(&c.stats)),
                Err(e) => println!("  not robust: failed: {e}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_lists_are_read_and_bad_ones_refused() {
        let dir = std::env::temp_dir().join(format!("shader-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.bind");
        std::fs::write(&good, "workgroup 1024\n0 storage\n4 uniform\n").unwrap();
        let (bindings, workgroup) = read_bindings(&good).unwrap();
        assert_eq!(workgroup, 1024);
        assert_eq!(
            bindings,
            [
                (0, vk::DescriptorType::STORAGE_BUFFER),
                (4, vk::DescriptorType::UNIFORM_BUFFER)
            ]
        );
        for text in ["workgroup many\n", "0 texture\n", "x storage\n", "0\n"] {
            let bad = dir.join("bad.bind");
            std::fs::write(&bad, text).unwrap();
            assert!(read_bindings(&bad).is_err(), "{text:?}");
        }
        std::fs::write(dir.join("odd.spv"), [1u8, 2, 3]).unwrap();
        assert!(read_words(&dir.join("odd.spv")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
