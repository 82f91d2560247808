//! Fuzzes the GGUF parser: whole-file parses, prefix parses, and every accessor and decoder a
//! loader would call on what the parser accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wgemma_gguf::exercise_parser(data);
});
