//! Gemma 4 audio (not yet written): 16 kHz PCM to log-mel features, the conformer tower run
//! through `wgemma-kernels`, and the projection of its output into soft tokens that fill a
//! prompt's audio placeholder range.
