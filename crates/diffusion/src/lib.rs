//! DiffusionGemma (not yet written): the mixture-of-experts denoiser built from the text
//! decoder's layers and the canvas loop that unmasks a block of tokens over several steps.
