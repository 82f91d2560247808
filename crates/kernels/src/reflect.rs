//! Checks prepared dispatches against their kernels' WGSL, parsed by naga: the Rust side binds
//! by number and fills parameter blocks by field, and nothing else compares either with the
//! shader (which runs with wgpu's bounds checks off). For each kernel variant:
//! - every flag the dispatcher set is read by an `#if` of its files (a misspelt flag would
//!   silently select the other branch);
//! - the bindings the dispatch fills are the ones the variant declares, storage to storage and
//!   parameter block to uniform, each named as its Rust field says (`KernelBindings::NAMES`);
//! - the parameter struct's members have the Rust struct's names and offsets, and its size.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::context::GpuContext;
use crate::gpu::{BindKind, Dispatch};
use crate::params::ParamsLayout;
use crate::shader::{DIRECTIVE_FLAGS, ShaderSource};

/// Every problem with `dispatches` (each kernel variant and parameter layout checked once).
pub fn check_dispatches<'a>(
    ctx: &GpuContext,
    dispatches: impl IntoIterator<Item = &'a Dispatch>,
) -> Vec<String> {
    Reflection::default().check(ctx, dispatches)
}

/// The variants checked so far, so that a harness checking every dispatch it runs parses each
/// variant once.
#[derive(Default)]
pub struct Reflection {
    seen: HashSet<Variant>,
}

/// A kernel variant as a dispatch binds it.
type Variant = (
    Arc<str>,
    Arc<[BindKind]>,
    &'static [(u32, &'static [&'static str])],
    Option<ParamsLayout>,
);

impl Reflection {
    /// Every problem with those of `dispatches` not checked before.
    pub fn check<'a>(
        &mut self,
        ctx: &GpuContext,
        dispatches: impl IntoIterator<Item = &'a Dispatch>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        for d in dispatches {
            let key = (
                d.kernel.clone(),
                d.bindings.clone(),
                d.binding_names,
                d.params_layout,
            );
            if !self.seen.insert(key) {
                continue;
            }
            if let Err(e) = check_dispatch(ctx, d) {
                problems.push(format!("{}: {e}", d.kernel));
            }
        }
        problems
    }
}

/// One dispatch against its variant's WGSL.
pub fn check_dispatch(ctx: &GpuContext, d: &Dispatch) -> Result<(), String> {
    let source = ctx
        .shader_source(&d.kernel)
        .ok_or("not compiled by this context")?;
    check_flags(&source)?;
    let wgsl = source.render(&ctx.features);
    let module = naga::front::wgsl::parse_str(&wgsl).map_err(|e| e.emit_to_string(&wgsl))?;
    let declared = declared_bindings(&module)?;
    let bound: BTreeMap<u32, BindKind> = d
        .bindings
        .iter()
        .enumerate()
        .filter(|(_, k)| **k != BindKind::Unused)
        .map(|(i, k)| (i as u32, *k))
        .collect();
    let kinds = |m: &BTreeMap<u32, _>| -> Vec<(u32, BindKind)> {
        m.iter().map(|(i, (k, _, _))| (*i, *k)).collect()
    };
    let want = kinds(&declared);
    let got: Vec<(u32, BindKind)> = bound.into_iter().collect();
    if got != want {
        return Err(format!("binds {got:?}, the shader declares {want:?}"));
    }
    check_names(d, &declared)?;
    let uniform = declared.values().find_map(|(k, ty, _)| match k {
        BindKind::Uniform => *ty,
        _ => None,
    });
    match (uniform, d.params_layout) {
        (None, None) => Ok(()),
        (Some(ty), Some(layout)) => {
            let (members, span) = struct_layout(&module, ty)?;
            let rust: Vec<(String, u32)> = layout
                .fields
                .iter()
                .map(|(n, o)| (n.to_string(), *o as u32))
                .collect();
            if members != rust || span as usize != layout.size {
                return Err(format!(
                    "parameters {rust:?} ({} bytes), the shader's {members:?} ({span} bytes)",
                    layout.size
                ));
            }
            Ok(())
        }
        (u, l) => Err(format!(
            "a uniform block declared: {}, bound: {}",
            u.is_some(),
            l.is_some()
        )),
    }
}

/// Each flag of `source` is named by some `#if` of its parts (or is a directive's).
fn check_flags(source: &ShaderSource) -> Result<(), String> {
    let named: HashSet<&str> = DIRECTIVE_FLAGS
        .into_iter()
        .map(|(flag, _)| flag)
        .chain(
            source
                .parts
                .iter()
                .flat_map(|part| part.lines())
                .filter_map(|l| l.trim_start().strip_prefix("#if "))
                .flat_map(|cond| cond.split('|'))
                .map(|c| c.trim().trim_start_matches('!')),
        )
        .collect();
    match source.flags.iter().find(|f| !named.contains(f.as_str())) {
        Some(f) => Err(format!("flag {f} is read by no #if")),
        None => Ok(()),
    }
}

/// Each bound binding is one the dispatch's bindings struct names, under one of the names it
/// allows.
fn check_names(d: &Dispatch, declared: &Declared) -> Result<(), String> {
    for (num, (_, _, name)) in declared {
        let allowed = d
            .binding_names
            .iter()
            .find(|(n, _)| n == num)
            .map(|(_, names)| *names)
            .ok_or_else(|| format!("binding {num} ({name}) is no field of the bindings struct"))?;
        if !allowed.contains(&name.as_str()) {
            return Err(format!(
                "binding {num} is {name} in the shader, {allowed:?} in Rust"
            ));
        }
    }
    Ok(())
}

type Declared = BTreeMap<u32, (BindKind, Option<naga::Handle<naga::Type>>, String)>;

/// The module's bindings (group 0) by number: storage or uniform, a uniform's type, and the
/// variable's name.
fn declared_bindings(module: &naga::Module) -> Result<Declared, String> {
    let mut out = BTreeMap::new();
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        if binding.group != 0 {
            return Err(format!("binding in group {}", binding.group));
        }
        let kind = match var.space {
            naga::AddressSpace::Uniform => (BindKind::Uniform, Some(var.ty)),
            naga::AddressSpace::Storage { .. } => (BindKind::Storage, None),
            other => return Err(format!("binding {} in {other:?}", binding.binding)),
        };
        let name = var.name.clone().unwrap_or_default();
        out.insert(binding.binding, (kind.0, kind.1, name));
    }
    Ok(out)
}

/// A struct type's members (name, offset) and size.
fn struct_layout(
    module: &naga::Module,
    ty: naga::Handle<naga::Type>,
) -> Result<(Vec<(String, u32)>, u32), String> {
    match &module.types[ty].inner {
        naga::TypeInner::Struct { members, span } => Ok((
            members
                .iter()
                .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
                .collect(),
            *span,
        )),
        other => Err(format!("the uniform is a {other:?}, not a struct")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Bind, View, kernel_bindings};
    use crate::params::{ElementwiseParams, Params};
    use crate::{DeviceClass, GpuContext};

    kernel_bindings!(
        /// `elementwise.wgsl`'s bindings with `y` misnamed.
        Misnamed { a: 0, b: 1, out: 2, p: 3 }
    );

    kernel_bindings!(
        /// `elementwise.wgsl`'s bindings one short.
        Short { a: 0, b: 1, y: 2 }
    );

    /// A bindings struct that names a binding otherwise than the shader, or leaves one out, is
    /// caught.
    #[test]
    fn bindings_named_otherwise_than_the_shader_are_caught() {
        let ctx = pollster::block_on(GpuContext::emulating(DeviceClass::Lavapipe)).unwrap();
        let source = ShaderSource::new(
            "elementwise",
            &[
                include_str!("wgsl/activations.wgsl"),
                include_str!("wgsl/elementwise.wgsl"),
            ],
        )
        .flag("ADD");
        let [a, y] = [0, 1].map(|i| View::of(&ctx.storage(&format!("t{i}"), 64)));
        let params = || Bind::Params(Params::of(&ElementwiseParams::over(4, 0.0)));
        let misnamed = Misnamed {
            a: Bind::Storage(&a),
            b: Bind::Skip,
            out: Bind::Storage(&y),
            p: params(),
        };
        let d = ctx
            .dispatch("add", ctx.pipeline(&source), misnamed, [1, 1, 1])
            .unwrap();
        let e = check_dispatch(&ctx, &d).unwrap_err();
        assert!(e.contains("binding 2 is y"), "{e}");
        let short = Short {
            a: Bind::Storage(&a),
            b: Bind::Skip,
            y: Bind::Storage(&y),
        };
        // Its kinds made to match (only the names are under test): a struct without the
        // uniform's field.
        let mut d = ctx
            .dispatch("add", ctx.pipeline(&source), short, [1, 1, 1])
            .unwrap();
        d.bindings = [
            BindKind::Storage,
            BindKind::Unused,
            BindKind::Storage,
            BindKind::Uniform,
        ]
        .into();
        let e = check_dispatch(&ctx, &d).unwrap_err();
        assert!(e.contains("binding 3 (p) is no field"), "{e}");
    }
}
