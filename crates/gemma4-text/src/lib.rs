//! Gemma text decoder.
