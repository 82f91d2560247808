//! WGSL assembly: a kernel is its own file plus the snippets it uses, specialised by
//! `#if FLAG` / `#else` / `#endif` lines and by WGSL `override` constants.
//!
//! Flags `F16`, `SUBGROUPS` and `SUBGROUP32` (subgroups of exactly 32 lanes) are set from the
//! device's features, so one file serves with and without them; other flags come from the
//! dispatcher (e.g. the weight dtype).

use std::collections::BTreeSet;

use crate::context::GpuFeatures;

/// WGSL shared by kernels that read quantized weights from the `w` binding.
pub(crate) const BYTES_WGSL: &str = include_str!("wgsl/bytes.wgsl");
/// Per-dtype `load_unit` functions (one is selected by a `DT_*` flag).
pub(crate) const DTYPES_WGSL: &str = include_str!("wgsl/dtypes.wgsl");

/// Flags that `render` turns into WGSL `enable` directives (besides any `#if` reading them),
/// with the extension each enables.
pub(crate) const DIRECTIVE_FLAGS: [(&str, &str); 3] = [
    ("F16", "f16"),
    ("COOP", "wgpu_cooperative_matrix"),
    ("SGMAT", "chromium_experimental_subgroup_matrix"),
];

/// The source of one pipeline variant.
#[derive(Clone, Debug)]
pub struct ShaderSource {
    pub name: &'static str,
    pub parts: Vec<&'static str>,
    pub flags: BTreeSet<String>,
    pub constants: Vec<(String, f64)>,
}

impl ShaderSource {
    pub fn new(name: &'static str, parts: &[&'static str]) -> Self {
        Self {
            name,
            parts: parts.to_vec(),
            flags: BTreeSet::new(),
            constants: Vec::new(),
        }
    }

    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.flags.insert(flag.into());
        self
    }

    pub fn flag_if(self, on: bool, flag: impl Into<String>) -> Self {
        if on { self.flag(flag) } else { self }
    }

    pub fn constant(mut self, name: &str, value: f64) -> Self {
        self.constants.push((name.to_string(), value));
        self
    }

    /// The cache key: name, flags and constants.
    pub fn key(&self) -> String {
        let mut key = self.name.to_string();
        for f in &self.flags {
            key.push('+');
            key.push_str(f);
        }
        for (k, v) in &self.constants {
            key.push_str(&format!(" {k}={v}"));
        }
        key
    }

    /// Storage buffers the variant declares. Device features choose code paths, never
    /// bindings, so none are set here.
    pub fn storage_bindings(&self) -> u32 {
        self.render(&GpuFeatures::default())
            .matches("var<storage")
            .count() as u32
    }

    /// The WGSL text for a device with `features`.
    pub fn render(&self, features: &GpuFeatures) -> String {
        let mut flags = self.flags.clone();
        if features.shader_f16 {
            flags.insert("F16".into());
        }
        if features.subgroups {
            flags.insert("SUBGROUPS".into());
            // Subgroups of one known size let workgroup reductions skip most of their tree.
            if features.subgroup_min_size == 32 && features.subgroup_max_size == 32 {
                flags.insert("SUBGROUP32".into());
            }
        }
        let mut out = String::new();
        for (flag, extension) in DIRECTIVE_FLAGS {
            if flags.contains(flag) {
                out.push_str(&format!("enable {extension};\n"));
            }
        }
        // Naga exposes subgroup built-ins when the device has the feature and rejects the
        // `enable subgroups;` directive; a browser's compiler needs it. Kernels call subgroup
        // reductions where every lane of a subgroup arrives together but the uniformity
        // analysis cannot prove it (loops over workgroup-computed bounds), so that
        // diagnostic is off.
        if features.subgroups && features.browser_wgsl {
            out.push_str("enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n");
        }
        for part in &self.parts {
            preprocess(part, &flags, &mut out);
        }
        out
    }
}

/// Keeps the lines of `src` whose enclosing `#if` conditions hold. `#if A|B` is true when any
/// flag is set, `#if !A` when it is not.
fn preprocess(src: &str, flags: &BTreeSet<String>, out: &mut String) {
    // Stack of (this branch active, some branch of this #if already taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &[(bool, bool)]| stack.iter().all(|&(a, _)| a);
    for line in src.lines() {
        let t = line.trim_start();
        if let Some(cond) = t.strip_prefix("#if ") {
            let holds = cond
                .trim()
                .split('|')
                .any(|c| match c.trim().strip_prefix('!') {
                    Some(neg) => !flags.contains(neg),
                    None => flags.contains(c.trim()),
                });
            stack.push((holds, holds));
        } else if t.starts_with("#else") {
            if let Some(top) = stack.last_mut() {
                *top = (!top.1, true);
            }
        } else if t.starts_with("#endif") {
            stack.pop();
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
}

/// A kernel variant as SPIR-V, written the way wgpu's Vulkan backend writes a trusted module
/// (overrides applied, no bounds checks, no loop bounding, no division guards), with the
/// bindings a pipeline layout for it needs: for tools that hand it to a driver themselves
/// (`cargo xtask shader-stats`).
#[cfg(not(target_arch = "wasm32"))]
pub struct Spirv {
    pub words: Vec<u32>,
    /// Binding numbers (group 0) and whether each is a uniform block (else a storage buffer).
    pub bindings: Vec<(u32, bool)>,
    /// Bytes of workgroup memory the variant declares.
    pub workgroup_bytes: u32,
}

/// `source` rendered for a device with `features`, validated and written as SPIR-V.
#[cfg(not(target_arch = "wasm32"))]
pub fn spirv(source: &ShaderSource, features: &GpuFeatures) -> Result<Spirv, String> {
    let key = source.key();
    let wgsl = source.render(features);
    let module = naga::front::wgsl::parse_str(&wgsl)
        .map_err(|e| format!("{key}: {}", e.emit_to_string(&wgsl)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{key}: {e:?}"))?;
    let constants = source.constants.iter().cloned().collect();
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
            .map_err(|e| format!("{key}: {e:?}"))?;
    let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: unchecked,
            buffer: unchecked,
            image_load: unchecked,
            binding_array: unchecked,
        },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        emit_int_div_checks: false,
        ..naga::back::spv::Options::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None)
        .map_err(|e| format!("{key}: SPIR-V: {e:?}"))?;
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .map_err(|e| format!("{key}: {e:?}"))?;
    let mut bindings = Vec::new();
    let mut workgroup_bytes = 0;
    for (_, var) in module.global_variables.iter() {
        if var.space == naga::AddressSpace::WorkGroup {
            workgroup_bytes += layouter[var.ty].size;
        }
        if let Some(b) = &var.binding {
            bindings.push((b.binding, var.space == naga::AddressSpace::Uniform));
        }
    }
    Ok(Spirv {
        words,
        bindings,
        workgroup_bytes,
    })
}

/// Writes `source`'s SPIR-V and bindings under `dir` (the switch `WGEMMA_DUMP_SPIRV`): file
/// names are the variant's key with anything but letters, digits and `+=.-` as `_`.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn dump_spirv(dir: &str, source: &ShaderSource, features: &GpuFeatures) {
    let name: String = source
        .key()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let written = spirv(source, features).and_then(|s| {
        let dir = std::path::Path::new(dir);
        let mut bind = format!("workgroup {}\n", s.workgroup_bytes);
        for (b, uniform) in &s.bindings {
            let kind = if *uniform { "uniform" } else { "storage" };
            bind.push_str(&format!("{b} {kind}\n"));
        }
        std::fs::create_dir_all(dir)
            .and_then(|_| {
                std::fs::write(
                    dir.join(format!("{name}.spv")),
                    bytemuck::cast_slice(&s.words),
                )
            })
            .and_then(|_| std::fs::write(dir.join(format!("{name}.bind")), bind))
            .map_err(|e| e.to_string())
    });
    if let Err(e) = written {
        tracing::warn!("WGEMMA_DUMP_SPIRV: {name}: {e}");
    }
}

/// Parses and validates `source` with naga as a device with f16, 32-lane subgroups and
/// cooperative matrices renders it; panics with naga's message where it fails.
#[cfg(test)]
pub(crate) fn validate_coop(source: &ShaderSource) {
    let features = GpuFeatures {
        shader_f16: true,
        subgroups: true,
        timestamps: false,
        timestamps_in_passes: false,
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        coop_matmul: true,
        int8_activations: false,
        int8_tiles: false,
        browser_wgsl: false,
        subgroup_matrix: 0,
    };
    // What the Vulkan backend writes: naga's SPIR-V writer refuses (or panics on) some forms
    // its validator passes.
    let bytes = spirv(source, &features)
        .unwrap_or_else(|e| panic!("{e}"))
        .workgroup_bytes;
    // Past the device's limit the driver does not refuse the pipeline: the kernel faults.
    let limit = crate::device_class::DeviceClass::NvidiaVulkan
        .limits()
        .max_compute_workgroup_storage_size;
    assert!(
        bytes <= limit,
        "{}: {bytes} bytes of workgroup memory, past the {limit} NVIDIA's Vulkan driver allows",
        source.key()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocessor_keeps_the_taken_branches() {
        let src =
            "a\n#if X\nb\n#if !Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\n#if Z|X\nf\n#endif\n";
        let flags: BTreeSet<String> = ["X".to_string()].into();
        let mut out = String::new();
        preprocess(src, &flags, &mut out);
        assert_eq!(out, "a\nb\nc\nf\n");
        let mut out = String::new();
        preprocess(src, &BTreeSet::new(), &mut out);
        assert_eq!(out, "a\ne\n");
    }

    /// The `var` declarations without an initializer inside a block of a function (brace
    /// depth 2 or more): `(file:line, text)`.
    fn nested_vars_without_initializer(file: &str, src: &str) -> Vec<(String, String)> {
        let mut depth = 0usize;
        let mut found = Vec::new();
        for (i, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let t = code.trim();
            if depth >= 2 && t.starts_with("var ") && !t.starts_with("var<") && !t.contains('=') {
                found.push((format!("{file}:{}", i + 1), t.to_string()));
            }
            depth += code.matches('{').count();
            depth = depth.saturating_sub(code.matches('}').count());
        }
        found
    }

    /// Every variable declared inside a loop or branch says its first value. WGSL zeroes one
    /// declared without an initializer each time the declaration runs, but Chromium's Tint
    /// (the browser's shader compiler; seen in Debian's Chromium 156) zeroes it once, at the
    /// function's start: a loop's per-trip sums then carried over from the trip before
    /// (the prefill attention over more than 64 keys was off by 20% in the browser).
    #[test]
    fn nested_variables_are_initialized() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/wgsl");
        let mut found = Vec::new();
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).expect("the wgsl folder") {
            let path = entry.expect("a wgsl entry").path();
            let src = std::fs::read_to_string(&path).expect("a wgsl file");
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            found.extend(nested_vars_without_initializer(name, &src));
            files += 1;
        }
        assert!(files > 20, "only {files} WGSL files in {}", dir.display());
        assert!(found.is_empty(), "give these an initializer: {found:?}");
        let planted = "fn f() {\n    var a: f32;\n    for (;;) {\n        var b: f32;\n        var c = 0.0;\n    }\n}\n";
        assert_eq!(
            nested_vars_without_initializer("planted", planted),
            vec![("planted:4".to_string(), "var b: f32;".to_string())]
        );
    }
}
