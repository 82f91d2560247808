//! Gemma 4 vision (not yet written): image decoding and resizing to the model's patch grid,
//! the ViT tower run through `wgemma-kernels`, and the projection of its output into soft
//! tokens that fill a prompt's image placeholder range. Weights come from the `mmproj` GGUF
//! (llama.cpp) or the vision tensors of an Ollama blob.
