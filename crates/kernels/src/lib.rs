//! WGSL kernels with typed dispatchers and CPU references.
