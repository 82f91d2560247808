//! A summary of a GGUF file: what `wgemma info` prints.

use std::collections::BTreeMap;
use std::fmt;

use wgemma_gguf::{GgmlType, Gguf, Value};

/// What a GGUF file holds, summarised.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub version: u32,
    pub file_size: u64,
    pub tensor_count: usize,
    pub parameter_count: u64,
    /// Per dtype: tensor count and bytes.
    pub dtypes: BTreeMap<GgmlType, (usize, u64)>,
    /// The architecture's own scalar keys (`gemma3.block_count`, ...), in file order.
    pub hyper_parameters: Vec<(String, Value)>,
    header: Gguf,
}

impl ModelInfo {
    pub fn new(g: &Gguf) -> Self {
        let architecture = g.architecture().map(str::to_string);
        let mut dtypes = BTreeMap::new();
        for t in g.tensors() {
            let e = dtypes.entry(t.dtype).or_insert((0, 0));
            e.0 += 1;
            e.1 += t.n_bytes;
        }
        let prefix = architecture.as_deref().map(|a| format!("{a}."));
        let hyper_parameters = g
            .metadata
            .entries()
            .iter()
            .filter(|(k, v)| {
                prefix.as_deref().is_some_and(|p| k.starts_with(p))
                    && !matches!(v, Value::Array(a) if a.len() > 64)
            })
            .cloned()
            .collect();
        Self {
            name: g
                .metadata
                .opt_str("general.name")
                .ok()
                .flatten()
                .map(str::to_string),
            architecture,
            version: g.version,
            file_size: g.file_len,
            tensor_count: g.tensors().len(),
            parameter_count: g.parameter_count(),
            dtypes,
            hyper_parameters,
            header: g.clone(),
        }
    }

    /// One JSON object: `architecture`, `tensor_count`, `parameter_count`, `file_size`,
    /// `metadata` (every scalar key), `dtypes`, and `tensors` (name, dtype, shape, offset).
    pub fn to_json(&self) -> serde_json::Value {
        let metadata: serde_json::Map<String, serde_json::Value> = self
            .header
            .metadata
            .entries()
            .iter()
            .filter(|(_, v)| !matches!(v, Value::Array(_)))
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect();
        let dtypes: serde_json::Map<String, serde_json::Value> = self
            .dtypes
            .iter()
            .map(|(t, (n, bytes))| {
                (
                    t.name().to_string(),
                    serde_json::json!({ "tensors": n, "bytes": bytes }),
                )
            })
            .collect();
        let tensors: Vec<serde_json::Value> = self
            .header
            .tensors()
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "dtype": t.dtype.name(),
                    "shape": t.dims,
                    "offset": self.header.data_offset + t.offset,
                    "bytes": t.n_bytes,
                })
            })
            .collect();
        serde_json::json!({
            "architecture": self.architecture,
            "name": self.name,
            "gguf_version": self.version,
            "file_size": self.file_size,
            "tensor_count": self.tensor_count,
            "parameter_count": self.parameter_count,
            "alignment": self.header.alignment,
            "data_offset": self.header.data_offset,
            "metadata": metadata,
            "dtypes": dtypes,
            "tensors": tensors,
        })
    }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "architecture     {}",
            self.architecture.as_deref().unwrap_or("(none)")
        )?;
        if let Some(name) = &self.name {
            writeln!(f, "name             {name}")?;
        }
        writeln!(f, "gguf version     {}", self.version)?;
        writeln!(
            f,
            "file size        {} ({} bytes)",
            human_bytes(self.file_size),
            self.file_size
        )?;
        writeln!(f, "tensors          {}", self.tensor_count)?;
        writeln!(
            f,
            "parameters       {} ({})",
            human_count(self.parameter_count),
            self.parameter_count
        )?;
        writeln!(f, "dtypes")?;
        for (t, (n, bytes)) in &self.dtypes {
            writeln!(
                f,
                "  {:<8} {n:>5} tensors  {:>10}",
                t.name(),
                human_bytes(*bytes)
            )?;
        }
        if !self.hyper_parameters.is_empty() {
            writeln!(f, "hyper-parameters")?;
            for (k, v) in &self.hyper_parameters {
                writeln!(f, "  {k:<44} {v}")?;
            }
        }
        Ok(())
    }
}
