//! Reader/writer round trips and hostile input.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use wgemma_gguf::*;

fn s(k: &str) -> String {
    k.to_string()
}

fn sample_metadata() -> Vec<(String, Value)> {
    vec![
        (s("general.architecture"), Value::String("gemma3".into())),
        (s("u8"), Value::U8(7)),
        (s("i8"), Value::I8(-7)),
        (s("u16"), Value::U16(65535)),
        (s("i16"), Value::I16(-300)),
        (s("u32"), Value::U32(4_000_000_000)),
        (s("i32"), Value::I32(-5)),
        (s("f32"), Value::F32(1.5)),
        (s("bool"), Value::Bool(true)),
        (s("u64"), Value::U64(1 << 40)),
        (s("i64"), Value::I64(-(1 << 40))),
        (s("f64"), Value::F64(-2.25)),
        (s("str.utf8"), Value::String("héllo ▁ 🙂".into())),
        (
            s("arr.f32"),
            Value::Array(Array::F32(vec![0.5, -1.0, 3.25])),
        ),
        (
            s("arr.str"),
            Value::Array(Array::String(vec![s("a"), s(""), s("<0x0A>")])),
        ),
        (s("arr.i32"), Value::Array(Array::I32(vec![-1, 2, 3]))),
        (s("arr.bool"), Value::Array(Array::Bool(vec![true, false]))),
        (s("arr.empty"), Value::Array(Array::U64(vec![]))),
        (
            s("arr.nested"),
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec![s("x")]),
                Array::Array(vec![Array::I8(vec![-1])]),
            ])),
        ),
    ]
}

fn sample_tensors() -> Vec<(TensorSpec, Vec<u8>)> {
    let q = |dtype, n: usize| {
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        quantize(dtype, &v).unwrap()
    };
    vec![
        (
            TensorSpec::new("a.f32", GgmlType::F32, &[5, 3]),
            q(GgmlType::F32, 15),
        ),
        (
            TensorSpec::new("b.q8", GgmlType::Q8_0, &[64, 3]),
            q(GgmlType::Q8_0, 192),
        ),
        (
            TensorSpec::new("c.q4k", GgmlType::Q4K, &[256, 2, 1, 2]),
            q(GgmlType::Q4K, 1024),
        ),
        (
            TensorSpec::new("d.q6k", GgmlType::Q6K, &[512]),
            q(GgmlType::Q6K, 512),
        ),
    ]
}

fn sample_file(alignment: u64) -> Vec<u8> {
    write_gguf(&sample_metadata(), &sample_tensors(), alignment).unwrap()
}

#[test]
fn reader_of_writer_is_identity() {
    for alignment in [1, 8, 32, 64, 4096] {
        let bytes = sample_file(alignment);
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, alignment);
        assert_eq!(g.data_offset % alignment, 0);
        let mut expected = sample_metadata();
        if alignment != DEFAULT_ALIGNMENT {
            expected.push((s("general.alignment"), Value::U32(alignment as u32)));
        }
        assert_eq!(g.metadata.entries(), expected.as_slice());
        let src = BytesSource::new(bytes.clone());
        for (spec, data) in sample_tensors() {
            let t = g.tensor(&spec.name).unwrap();
            assert_eq!((t.dtype, &t.dims), (spec.dtype, &spec.dims));
            let r = g.tensor_range(t);
            assert_eq!(
                src.bytes(r.start, r.end - r.start).unwrap(),
                data.as_slice()
            );
            assert_eq!(
                read_tensor_f32(&g, &src, t).unwrap(),
                dequantize_to_vec(spec.dtype, &data).unwrap()
            );
        }
        // Writing what we read gives the same bytes back.
        let again: Vec<(TensorSpec, Vec<u8>)> = g
            .tensors()
            .iter()
            .map(|t| {
                let r = g.tensor_range(t);
                (
                    TensorSpec::new(&t.name, t.dtype, &t.dims),
                    bytes[r.start as usize..r.end as usize].to_vec(),
                )
            })
            .collect();
        assert_eq!(
            write_gguf(g.metadata.entries(), &again, alignment).unwrap(),
            bytes
        );
    }
}

#[test]
fn typed_accessors_convert_and_name_the_key_on_error() {
    let g = Gguf::parse(&sample_file(32)).unwrap();
    let m = &g.metadata;
    assert_eq!(m.get_u32("u8").unwrap(), 7);
    assert_eq!(m.get_u64("u32").unwrap(), 4_000_000_000);
    assert_eq!(m.get_i32("i16").unwrap(), -300);
    assert_eq!(m.get_f32("f64").unwrap(), -2.25);
    assert!(m.get_bool("bool").unwrap());
    assert_eq!(m.get_str("str.utf8").unwrap(), "héllo ▁ 🙂");
    assert_eq!(m.get_f32_array("arr.f32").unwrap(), &[0.5, -1.0, 3.25]);
    assert_eq!(m.get_str_array("arr.str").unwrap().len(), 3);
    assert_eq!(m.get_u32_per_layer("u8", 3).unwrap(), vec![7, 7, 7]);
    assert_eq!(m.opt_u32("nope").unwrap(), None);

    let e = m.get_u32("missing.key").unwrap_err();
    assert!(e.to_string().contains("missing.key"), "{e}");
    let e = m.get_u32("i32").unwrap_err();
    assert!(matches!(e, MetadataError::OutOfRange { .. }), "{e:?}");
    let e = m.get_u32("str.utf8").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("str.utf8") && text.contains("string"),
        "{text}"
    );
    let e = m.get_str_array("arr.f32").unwrap_err();
    assert!(e.to_string().contains("array of f32"), "{e}");
    assert!(m.get_u32_per_layer("arr.i32", 4).is_err());
}

#[test]
fn row_reads_touch_one_row() {
    let bytes = sample_file(32);
    let g = Gguf::parse(&bytes).unwrap();
    let src = BytesSource::new(bytes.clone());
    let t = g.tensor("b.q8").unwrap();
    let all = read_tensor_f32(&g, &src, t).unwrap();
    for row in 0..3 {
        let r = g.row_range(t, row).unwrap();
        assert_eq!(r.end - r.start, 68);
        assert_eq!(
            read_row_f32(&g, &src, t, row).unwrap(),
            &all[row as usize * 64..][..64]
        );
    }
    assert!(matches!(
        read_row_f32(&g, &src, t, 3),
        Err(ReadError::Tensor(TensorError::RowOutOfRange { .. }))
    ));
}

#[test]
fn every_truncation_is_a_clean_error() {
    let bytes = sample_file(32);
    let g = Gguf::parse(&bytes).unwrap();
    // The writer pads after the last tensor; cuts inside that padding still hold every byte.
    let data_end = g
        .tensors()
        .iter()
        .map(|t| g.tensor_range(t).end)
        .max()
        .unwrap() as usize;
    assert!(Gguf::parse(&bytes[..data_end]).is_ok());
    for cut in 0..data_end {
        let r = Gguf::parse(&bytes[..cut]);
        assert!(r.is_err(), "a file cut at {cut} of {data_end} bytes parsed");
        if cut as u64 >= g.data_offset {
            assert!(
                matches!(r, Err(GgufError::DataPastEnd { .. })),
                "cut {cut}: {r:?}"
            );
        } else if cut >= 4 {
            assert!(
                matches!(
                    r,
                    Err(GgufError::Truncated { .. }
                        | GgufError::ImplausibleCount { .. }
                        | GgufError::DataPastEnd { .. })
                ),
                "cut {cut}: {r:?}"
            );
        }
    }
}

/// A raw header builder for files the writer refuses to make.
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        Raw(v)
    }
    fn u32(mut self, x: u32) -> Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn str(self, x: &str) -> Self {
        let mut r = self.u64(x.len() as u64);
        r.0.extend_from_slice(x.as_bytes());
        r
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    fn pad_to(mut self, n: usize) -> Vec<u8> {
        self.0.resize(n.max(self.0.len()), 0);
        self.0
    }
}

#[test]
fn hostile_headers_give_typed_errors() {
    use GgufError as E;
    let check = |bytes: &[u8], ok: &dyn Fn(&GgufError) -> bool| {
        let e = Gguf::parse(bytes).unwrap_err();
        assert!(ok(&e), "unexpected error: {e:?}");
        assert!(!e.to_string().is_empty());
    };
    check(b"GGML\x03\0\0\0", &|e| matches!(e, E::BadMagic(_)));
    check(&Raw::new(1, 0, 0).0, &|e| {
        matches!(e, E::UnsupportedVersion(1))
    });
    check(&Raw::new(0x0300_0000, 0, 0).0, &|e| {
        matches!(e, E::UnsupportedVersion(_))
    });
    // Counts that could never fit in the file.
    check(&Raw::new(3, u64::MAX, 0).pad_to(64), &|e| {
        matches!(e, E::ImplausibleCount { .. })
    });
    check(&Raw::new(3, 0, 1 << 60).pad_to(64), &|e| {
        matches!(e, E::ImplausibleCount { .. })
    });
    // A string claiming more bytes than the file has (a key's length past the most a name
    // takes is refused as such first).
    check(&Raw::new(3, 0, 1).u64(u64::MAX - 3).pad_to(64), &|e| {
        matches!(e, E::NameTooLong { .. })
    });
    check(
        &Raw::new(3, 0, 1)
            .str("k")
            .u32(8)
            .u64(u64::MAX - 3)
            .pad_to(64),
        &|e| matches!(e, E::Truncated { .. }),
    );
    check(&Raw::new(3, 0, 1).u64(1000).pad_to(64), &|e| {
        matches!(e, E::Truncated { .. })
    });
    // An array claiming 2^40 u32s.
    let arr = Raw::new(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(4)
        .u64(1 << 40)
        .pad_to(128);
    check(&arr, &|e| matches!(e, E::ImplausibleCount { .. }));
    // Unknown value types, at top level and as an array element type.
    check(&Raw::new(3, 0, 1).str("k").u32(13).pad_to(64), &|e| {
        matches!(e, E::UnknownValueType { .. })
    });
    check(
        &Raw::new(3, 0, 1).str("k").u32(9).u32(99).u64(1).pad_to(64),
        &|e| matches!(e, E::UnknownValueType { .. }),
    );
    // Arrays nested too deep.
    let mut deep = Raw::new(3, 0, 1).str("k").u32(9);
    for _ in 0..10 {
        deep = deep.u32(9).u64(1);
    }
    check(&deep.pad_to(256), &|e| {
        matches!(e, E::NestingTooDeep { .. })
    });
    // Duplicate keys.
    let dup = Raw::new(3, 0, 2)
        .str("k")
        .u32(4)
        .u32(1)
        .str("k")
        .u32(4)
        .u32(2)
        .pad_to(64);
    check(&dup, &|e| matches!(e, E::DuplicateKey(_)));
    // Bad alignment.
    let al = Raw::new(3, 0, 1)
        .str("general.alignment")
        .u32(4)
        .u32(24)
        .pad_to(64);
    check(&al, &|e| matches!(e, E::BadAlignment(_)));
    // Unknown tensor type, too many dims, partial blocks, overflowing dims.
    check(
        &Raw::new(3, 1, 0).tensor("t", &[32], 4, 0).pad_to(256),
        &|e| matches!(e, E::UnknownTensorType { type_id: 4, .. }),
    );
    check(
        &Raw::new(3, 1, 0)
            .tensor("t", &[1, 1, 1, 1, 1], 0, 0)
            .pad_to(256),
        &|e| matches!(e, E::BadTensor { .. }),
    );
    check(
        &Raw::new(3, 1, 0).tensor("t", &[33], 8, 0).pad_to(256),
        &|e| matches!(e, E::BadTensor { .. }),
    );
    check(
        &Raw::new(3, 1, 0)
            .tensor("t", &[1 << 40, 1 << 40], 0, 0)
            .pad_to(256),
        &|e| matches!(e, E::BadTensor { .. }),
    );
    // Misaligned offset.
    check(
        &Raw::new(3, 1, 0).tensor("t", &[4], 0, 4).pad_to(256),
        &|e| matches!(e, E::BadTensor { .. }),
    );
    // Overlapping tensors.
    let ov = Raw::new(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[16], 0, 32)
        .pad_to(512);
    check(&ov, &|e| matches!(e, E::OverlappingTensors { .. }));
    // Duplicate tensor names.
    let dn = Raw::new(3, 2, 0)
        .tensor("a", &[8], 0, 0)
        .tensor("a", &[8], 0, 32)
        .pad_to(512);
    check(&dn, &|e| matches!(e, E::DuplicateTensor(_)));
    // Data past the end, including an offset that overflows.
    check(
        &Raw::new(3, 1, 0).tensor("t", &[1024], 0, 0).pad_to(256),
        &|e| matches!(e, E::DataPastEnd { .. }),
    );
    check(
        &Raw::new(3, 1, 0)
            .tensor("t", &[8], 0, u64::MAX - 31)
            .pad_to(256),
        &|e| matches!(e, E::DataPastEnd { .. }),
    );
}

/// Corrupt lengths are errors before their bytes are read or allocated, and every message
/// stays short however long the string the file claims or holds.
#[test]
fn corrupt_lengths_fail_early_with_short_messages() {
    use GgufError as E;
    let short = |e: &GgufError| {
        let m = e.to_string();
        // 64 characters, each escaped to at most a dozen bytes, and a sentence around them.
        let head: String = m.chars().take(200).collect();
        assert!(m.len() < 1000, "{} bytes: {head}", m.len());
    };
    // A key length past the end of the file, and one inside a large file but no real key's.
    let e = Gguf::parse(&Raw::new(3, 0, 1).u64(u64::MAX - 3).pad_to(64)).unwrap_err();
    assert!(matches!(e, E::NameTooLong { .. }), "{e:?}");
    short(&e);
    let bogus = 116 << 20;
    let big = Raw::new(3, 0, 1).u64(bogus).pad_to(4 << 20);
    let e = Gguf::parse(&big).unwrap_err();
    assert!(
        matches!(e, E::NameTooLong { len, .. } if len == bogus),
        "{e:?}"
    );
    short(&e);
    // Through a streaming reader the bogus length is not fetched: the first read says it all.
    let src = CountingSource {
        bytes: Raw::new(3, 0, 1).u64(3 << 20).pad_to(8 << 20),
        requests: AtomicUsize::new(0),
        max_end: AtomicU64::new(0),
    };
    let e = futures::executor::block_on(read_header(&src)).unwrap_err();
    assert!(matches!(e, E::NameTooLong { .. }), "{e:?}");
    assert_eq!(src.requests.load(Ordering::Relaxed), 1);
    // The same for a tensor name.
    let e = Gguf::parse(&Raw::new(3, 1, 0).u64(1 << 20).pad_to(2 << 20)).unwrap_err();
    assert!(matches!(e, E::NameTooLong { .. }), "{e:?}");
    // A 100 MB string value in a small file.
    let e = Gguf::parse(&Raw::new(3, 0, 1).str("k").u32(8).u64(100 << 20).pad_to(256)).unwrap_err();
    assert!(matches!(e, E::Truncated { .. }), "{e:?}");
    short(&e);
    // The longest key accepted, of control bytes, in an error: quoted short.
    let key = "\u{1}".repeat(MAX_NAME_LEN as usize);
    let e = Gguf::parse(&Raw::new(3, 0, 1).str(&key).u32(99).pad_to(8192)).unwrap_err();
    assert!(matches!(e, E::UnknownValueType { .. }), "{e:?}");
    short(&e);
    // A long string value shown as a value (`wgemma info`, BadAlignment) is cut as well.
    let e = Gguf::parse(
        &Raw::new(3, 0, 1)
            .str("general.alignment")
            .u32(8)
            .str(&"7".repeat(1 << 20))
            .pad_to(2 << 20),
    )
    .unwrap_err();
    assert!(matches!(e, E::BadAlignment(_)), "{e:?}");
    short(&e);
    // The writer refuses a name the reader would.
    let long = "n".repeat(MAX_NAME_LEN as usize + 1);
    assert!(matches!(
        write_gguf(&[(long, Value::U32(1))], &[], 32),
        Err(WriteError::NameTooLong { .. })
    ));
}

/// A range source that counts its requests and checks they stay inside the header.
struct CountingSource {
    bytes: Vec<u8>,
    requests: AtomicUsize,
    max_end: AtomicU64,
}

impl RangeSource for CountingSource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.max_end.fetch_max(offset + len, Ordering::Relaxed);
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
}

#[test]
fn header_through_a_range_source_reads_only_the_header() {
    // A 3 MiB vocabulary pushes the header past the first 1 MiB read, like a real Gemma file.
    let vocab: Vec<String> = (0..200_000).map(|i| format!("tok{i:08}")).collect();
    let meta = vec![(
        s("tokenizer.ggml.tokens"),
        Value::Array(Array::String(vocab)),
    )];
    let big = vec![0u8; 8 << 20];
    let tensors = vec![(TensorSpec::new("w", GgmlType::F32, &[2 << 20]), big)];
    let bytes = write_gguf(&meta, &tensors, 32).unwrap();
    let expected = Gguf::parse(&bytes).unwrap();
    let src = CountingSource {
        bytes,
        requests: AtomicUsize::new(0),
        max_end: AtomicU64::new(0),
    };
    let (g, requests) = futures::executor::block_on(read_header(&src)).unwrap();
    assert_eq!(g, expected);
    assert_eq!(requests, src.requests.load(Ordering::Relaxed));
    assert!(requests <= 4, "{requests} requests");
    // Never more than twice the header: the 8 MiB of tensor data stays unread.
    assert!(
        src.max_end.load(Ordering::Relaxed) <= 2 * g.data_offset,
        "read up to {}",
        src.max_end.load(Ordering::Relaxed)
    );

    // A source shorter than its header gives a clean error, not a loop.
    let short = CountingSource {
        bytes: src.bytes[..(3 << 20)].to_vec(),
        requests: AtomicUsize::new(0),
        max_end: AtomicU64::new(0),
    };
    let e = futures::executor::block_on(read_header(&short)).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::Truncated { .. } | GgufError::DataPastEnd { .. }
        ),
        "{e:?}"
    );
}

#[test]
fn file_sources_read_the_same_bytes() {
    let bytes = sample_file(32);
    let dir = std::env::temp_dir().join(format!("wgemma-gguf-src-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let mapped = MmapSource::open(&path).unwrap();
    assert_eq!(TensorSource::len(&mapped), bytes.len() as u64);
    assert_eq!(mapped.bytes(10, 20).unwrap(), &bytes[10..30]);
    assert!(matches!(
        mapped.bytes(bytes.len() as u64 - 1, 2),
        Err(SourceError::OutOfRange { .. })
    ));
    let file = FileRangeSource::open(&path).unwrap();
    let (g, _) = futures::executor::block_on(read_header(&file)).unwrap();
    assert_eq!(g, Gguf::parse(&bytes).unwrap());
    let r = futures::executor::block_on(file.read_range(5, 7)).unwrap();
    assert_eq!(r, &bytes[5..12]);
    assert!(futures::executor::block_on(file.read_range(bytes.len() as u64, 1)).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A directory or a FIFO is refused by what it is, at once (a FIFO is never waited on); a file
/// that shrinks after it was opened is an error naming that, and the plain-read header reader
/// gives what parsing the whole file gives.
#[cfg(unix)]
#[test]
fn file_sources_refuse_what_is_not_a_regular_file() {
    let dir = std::env::temp_dir().join(format!("wgemma-gguf-kinds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(
        MmapSource::open(&dir),
        Err(SourceError::IsDirectory)
    ));
    assert!(matches!(
        FileRangeSource::open(&dir),
        Err(SourceError::IsDirectory)
    ));
    assert!(matches!(
        read_file_header(&dir),
        Err(GgufError::Source(SourceError::IsDirectory))
    ));
    let fifo = dir.join("model.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // In a thread, so that an open that blocks fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let mapped = matches!(MmapSource::open(&path), Err(SourceError::NotRegularFile));
        let read = matches!(
            FileRangeSource::open(&path),
            Err(SourceError::NotRegularFile)
        );
        tx.send(mapped && read).unwrap();
    });
    let refused = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert_eq!(
        refused,
        Ok(true),
        "opening a FIFO blocked or was not refused"
    );
    assert!(
        SourceError::NotRegularFile
            .to_string()
            .contains("not a regular file")
    );

    let bytes = sample_file(32);
    let path = dir.join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        read_file_header(&path).unwrap(),
        Gguf::parse(&bytes).unwrap()
    );
    let file = FileRangeSource::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10)
        .unwrap();
    assert!(matches!(
        futures::executor::block_on(file.read_range(0, 64)),
        Err(SourceError::Shrank { size, .. }) if size == bytes.len() as u64
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ollama_store_lookup_resolves_blobs() {
    use wgemma_gguf::ollama::{OllamaError, resolve_in};
    let store = std::env::temp_dir().join(format!("wgemma-ollama-{}", std::process::id()));
    let blob = |hex: char| format!("sha256:{}", hex.to_string().repeat(64));
    let write_manifest = |path: &str, layers: serde_json::Value| {
        let p = store.join("manifests").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(
            p,
            serde_json::json!({ "schemaVersion": 2, "layers": layers }).to_string(),
        )
        .unwrap();
    };
    std::fs::create_dir_all(store.join("blobs")).unwrap();
    for h in ['a', 'b', 'c'] {
        std::fs::write(
            store
                .join("blobs")
                .join(format!("sha256-{}", h.to_string().repeat(64))),
            b"GGUF",
        )
        .unwrap();
    }
    write_manifest(
        "registry.ollama.ai/library/gemma4/e2b",
        serde_json::json!([
            { "mediaType": "application/vnd.ollama.image.model", "digest": blob('a') },
            { "mediaType": "application/vnd.ollama.image.projector", "digest": blob('b') },
            { "mediaType": "application/vnd.ollama.image.template", "digest": blob('c') },
        ]),
    );
    write_manifest(
        "registry.ollama.ai/library/gemma3/270m",
        serde_json::json!([{ "mediaType": "application/vnd.ollama.image.model", "digest": blob('c') }]),
    );
    write_manifest(
        "registry.ollama.ai/library/gemma4/latest",
        serde_json::json!([{ "mediaType": "application/vnd.ollama.image.model", "digest": blob('b') }]),
    );
    write_manifest(
        "example.com/me/broken/latest",
        serde_json::json!([{ "mediaType": "application/vnd.ollama.image.model", "digest": blob('f') }]),
    );

    let m = resolve_in(&store, "gemma4:e2b").unwrap();
    assert!(m.model.ends_with(format!("sha256-{}", "a".repeat(64))));
    assert!(
        m.projector
            .unwrap()
            .ends_with(format!("sha256-{}", "b".repeat(64)))
    );
    let m = resolve_in(&store, "gemma3:270m").unwrap();
    assert!(m.model.ends_with(format!("sha256-{}", "c".repeat(64))));
    assert_eq!(m.projector, None);
    assert_eq!(
        resolve_in(&store, "library/gemma4:latest").unwrap().model,
        resolve_in(&store, "gemma4").unwrap().model
    );
    assert_eq!(
        resolve_in(&store, "registry.ollama.ai/library/gemma4:e2b")
            .unwrap()
            .model,
        resolve_in(&store, "gemma4:e2b").unwrap().model
    );
    assert!(matches!(
        resolve_in(&store, "gemma4:31b"),
        Err(OllamaError::NotFound { .. })
    ));
    assert!(matches!(
        resolve_in(&store, "example.com/me/broken"),
        Err(OllamaError::MissingBlob { .. })
    ));
    std::fs::write(
        store.join("manifests/registry.ollama.ai/library/gemma3/270m"),
        "{not json",
    )
    .unwrap();
    assert!(matches!(
        resolve_in(&store, "gemma3:270m"),
        Err(OllamaError::BadManifest { .. })
    ));
    std::fs::remove_dir_all(&store).unwrap();
}
