//! Tuning and debugging switches (`WGEMMA_*`, in the README and ARCHITECTURE.md): natively the process
//! environment; in the browser, which has none, a map the page sets before loading a model
//! (`WGemma.load`'s `knobs`), so that a kernel or fusion can be switched off there too to find
//! where the browser's shader compiler and native differ.

#[cfg(target_arch = "wasm32")]
use std::collections::HashMap;
#[cfg(target_arch = "wasm32")]
use std::sync::Mutex;

#[cfg(target_arch = "wasm32")]
static KNOBS: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// The switch `name`'s value, `None` when it is unset or empty.
pub fn get(name: &str) -> Option<String> {
    #[cfg(not(target_arch = "wasm32"))]
    let value = std::env::var(name).ok();
    #[cfg(target_arch = "wasm32")]
    let value = KNOBS
        .lock()
        .ok()
        .and_then(|k| k.as_ref().and_then(|k| k.get(name).cloned()));
    value.filter(|v| !v.is_empty())
}

/// Whether the switch `name` is set to something other than `0`.
pub fn on(name: &str) -> bool {
    get(name).is_some_and(|v| v != "0")
}

/// Replaces the browser's switches (models loaded after this read them).
#[cfg(target_arch = "wasm32")]
pub fn set(knobs: HashMap<String, String>) {
    if let Ok(mut k) = KNOBS.lock() {
        *k = Some(knobs);
    }
}
