//! Replays the fuzz corpus (`crates/gguf/fuzz/corpus/parse`) through the parser: every input
//! the fuzzer kept must still parse or fail cleanly.

#[test]
fn fuzz_corpus_replays_without_panics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        wgemma_gguf::exercise_parser(&bytes);
        n += 1;
    }
    assert!(n >= 8, "corpus at {} has only {n} inputs", dir.display());
}
