//! The GPU forward: the weights ([`GpuModel`]) and a conversation's state and steps
//! ([`GpuSession`]).

mod lora;
mod model;
mod session;

pub use lora::PreparedLora;
pub use model::{
    ExpertPlacement, GateUp, GpuModel, LoadError, LoadOptions, LoadProgress, PleRows, WeightBytes,
    load_gate_up,
};
pub use session::{
    BatchDecoder, BatchRow, CanvasBuffers, CanvasWork, ForwardError, Fusions, GpuSession, KvPool,
    MAX_IN_FLIGHT, MAX_TOP_LOGPROBS, PrefillWatch, SessionOptions, SoftTokens, TokenLogprobs,
    Traced,
};
