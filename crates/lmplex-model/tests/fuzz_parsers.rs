//! Structure-aware fuzzing of every parser of untrusted checkpoint bytes: GGUF files, and a
//! Hugging Face folder's `config.json`, safetensors header, `tokenizer.json`,
//! `tokenizer_config.json` (with its chat template) and `generation_config.json`.
//!
//! Each case corrupts one valid tiny checkpoint (`lmplex_model::testing`) where its structure
//! is (a GGUF count, length, type tag, dimension or offset; a JSON value, key or type; the
//! safetensors header length), loads it, and on success renders a chat with its template. The
//! load must end within `HANG_S` seconds with a model or a `ModelLoad`/`InvalidRequest` error
//! naming the corrupted file, never a panic or an abort, without any single allocation above
//! `MAX_ALLOC` (the checkpoints are under 1 MB), and without backtrace text in the message.
//!
//! Bounded for CI (`CASES` per target); `scripts/fuzz-parsers --minutes N` runs each target
//! for a share of N minutes (`LMPLEX_FUZZ_SECONDS`, `LMPLEX_FUZZ_CASES`).

use lmplex_core::Error;
use lmplex_model::testing::{write_tiny_checkpoint, write_tiny_gguf, Family};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Cases per target in CI.
const CASES: u32 = 512;
/// Seconds one load (and chat render) may take.
const HANG_S: u64 = 20;
/// The largest single allocation any case may make.
const MAX_ALLOC: usize = 64 << 20;

/// The system allocator, remembering the largest single allocation since the last reset.
struct Tracking;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
thread_local! { static IN_TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // Where an oversized allocation comes from (the capture allocates: not again inside it).
        if layout.size() > MAX_ALLOC && !IN_TRACE.with(|t| t.replace(true)) {
            eprintln!("an allocation of {} bytes at\n{}", layout.size(), std::backtrace::Backtrace::force_capture());
            IN_TRACE.with(|t| t.set(false));
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// How the run is bounded: `CASES` (or `LMPLEX_FUZZ_CASES`) cases per round, and rounds until
/// `LMPLEX_FUZZ_SECONDS` have passed (one round without it).
fn bounds() -> (Config, Option<Instant>) {
    let cases = std::env::var("LMPLEX_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES);
    let deadline = std::env::var("LMPLEX_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|s| Instant::now() + Duration::from_secs(s));
    (Config { cases, failure_persistence: None, max_shrink_iters: 64, ..Config::default() }, deadline)
}

/// Loads `path` (and renders a chat with its template) on a thread of its own; the outcome
/// checked as the module header says. `file` is the name the error must carry.
fn check_load(path: &Path, file: &str) -> Result<(), TestCaseError> {
    // One case at a time in the process, so the largest allocation is this case's.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
    let p = path.to_path_buf();
    let path = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    LARGEST.store(0, Ordering::Relaxed);
    std::thread::spawn(move || {
        let out = std::panic::catch_unwind(|| {
            let m = lmplex_model::load(&p, Some(32)).map_err(|e| (true, e))?;
            let chat = [lmplex_model::ChatMessage::new("user", "hi")];
            let text = m.tokenizer.apply_chat_template(&chat, true).map_err(|e| (false, e))?;
            m.tokenizer.encode(&text, false).map(|_| ()).map_err(|e| (false, e))
        });
        let _ = tx.send(out.map_err(|p| {
            p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        }));
    });
    let out = rx
        .recv_timeout(Duration::from_secs(HANG_S))
        .map_err(|_| TestCaseError::fail(format!("{file}: no answer within {HANG_S} s (a hang)")))?;
    let largest = LARGEST.load(Ordering::Relaxed);
    prop_assert!(largest <= MAX_ALLOC, "{file}: an allocation of {largest} bytes");
    match out {
        Err(panic) => Err(TestCaseError::fail(format!("{file}: panicked: {panic:?}"))),
        Ok(Ok(())) => Ok(()),
        // A load error names the file; a chat template's error (at render) is the request's.
        Ok(Err((loading, Error::ModelLoad(m) | Error::InvalidRequest(m)))) => {
            let named = m.contains(file) || m.contains(&path.display().to_string());
            prop_assert!(!loading || named, "the error names neither {file} nor the checkpoint: {m}");
            prop_assert!(!m.contains("stack backtrace") && !m.contains("RUST_BACKTRACE"), "{m}");
            Ok(())
        }
        Ok(Err((_, e))) => Err(TestCaseError::fail(format!("{file}: not a load error: {e:?}"))),
    }
}

/// Runs rounds of `strategy`'s cases through `case` (see `bounds`), each round from a fresh
/// random seed; prints how many cases `target` ran (`scripts/fuzz-parsers` reads it).
fn fuzz<S: Strategy>(target: &str, strategy: S, case: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let (config, deadline) = bounds();
    let mut total = 0u64;
    loop {
        if let Err(e) = TestRunner::new(config.clone()).run(&strategy, &case) {
            panic!("{target}: {e}");
        }
        total += u64::from(config.cases);
        if deadline.is_none_or(|d| Instant::now() > d) {
            break;
        }
    }
    eprintln!("fuzz target {target}: {total} cases");
}

// --- GGUF -----------------------------------------------------------------------------------

/// One field of a GGUF file that a mutation may rewrite: its offset, width in bytes, and what
/// it holds.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// A count or length (tensor count, key count, string length, array length).
    Len(usize),
    /// A value type tag.
    Tag(usize),
    /// A tensor dimension.
    Dim(usize),
    /// A tensor's ggml type.
    DType(usize),
    /// A tensor's data offset.
    Offset(usize),
    /// A metadata value (`width` bytes).
    Value(usize, usize),
    /// A string's bytes (`len`).
    Text(usize, usize),
}

/// The mutable fields of a GGUF file (v2/v3 layout), in file order.
fn gguf_fields(b: &[u8]) -> Vec<Field> {
    let mut at = 8;
    let mut out = Vec::new();
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let (tensors, kvs) = (u64_at(8) as usize, u64_at(16) as usize);
    out.push(Field::Len(8));
    out.push(Field::Len(16));
    at += 16;
    let string = |at: &mut usize, out: &mut Vec<Field>| {
        let n = u64_at(*at) as usize;
        out.push(Field::Len(*at));
        out.push(Field::Text(*at + 8, n));
        *at += 8 + n;
    };
    fn width(tag: u32) -> usize {
        match tag {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            _ => 0,
        }
    }
    for _ in 0..kvs {
        string(&mut at, &mut out);
        let tag = u32_at(at);
        out.push(Field::Tag(at));
        at += 4;
        match tag {
            8 => string(&mut at, &mut out),
            9 => {
                let elem = u32_at(at);
                out.push(Field::Tag(at));
                let n = u64_at(at + 4) as usize;
                out.push(Field::Len(at + 4));
                at += 12;
                for _ in 0..n {
                    if elem == 8 {
                        string(&mut at, &mut out);
                    } else {
                        out.push(Field::Value(at, width(elem)));
                        at += width(elem);
                    }
                }
            }
            t => {
                out.push(Field::Value(at, width(t)));
                at += width(t);
            }
        }
    }
    for _ in 0..tensors {
        string(&mut at, &mut out);
        let dims = u32_at(at) as usize;
        out.push(Field::Len(at));
        at += 4;
        for _ in 0..dims {
            out.push(Field::Dim(at));
            at += 8;
        }
        out.push(Field::DType(at));
        out.push(Field::Offset(at + 4));
        at += 12;
    }
    out
}

/// Values worth writing into a field of `width` bytes.
fn interesting(width: usize, pick: u64) -> Vec<u8> {
    let v: u64 = match pick % 8 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => 1 << 40,
        4 => u64::MAX >> 1,
        5 => 0x8000_0000,
        6 => 255,
        _ => pick >> 3,
    };
    v.to_le_bytes()[..width.min(8)].to_vec()
}

/// One mutation of a GGUF file: a field and what to write there, or a cut.
#[derive(Debug, Clone)]
enum GgufMutation {
    Write { field: usize, pick: u64 },
    Bytes { field: usize, byte: u8, at: usize },
    Truncate { keep: usize },
}

fn gguf_mutation() -> impl Strategy<Value = Vec<GgufMutation>> {
    let one = prop_oneof![
        6 => (any::<usize>(), any::<u64>()).prop_map(|(field, pick)| GgufMutation::Write { field, pick }),
        2 => (any::<usize>(), any::<u8>(), any::<usize>()).prop_map(|(field, byte, at)| GgufMutation::Bytes { field, byte, at }),
        1 => any::<usize>().prop_map(|keep| GgufMutation::Truncate { keep }),
    ];
    prop::collection::vec(one, 1..4)
}

fn apply_gguf(mut b: Vec<u8>, fields: &[Field], muts: &[GgufMutation]) -> Vec<u8> {
    for m in muts {
        match *m {
            GgufMutation::Truncate { keep } => b.truncate(keep % (b.len() + 1)),
            GgufMutation::Write { field, pick } => {
                let (at, width) = match fields[field % fields.len()] {
                    Field::Len(at) | Field::Dim(at) | Field::Offset(at) => (at, 8),
                    Field::Tag(at) | Field::DType(at) => (at, 4),
                    Field::Value(at, w) => (at, w),
                    Field::Text(at, n) => (at, n.min(8)),
                };
                let bytes = interesting(width, pick);
                let end = (at + bytes.len()).min(b.len());
                if at < end {
                    b[at..end].copy_from_slice(&bytes[..end - at]);
                }
            }
            GgufMutation::Bytes { field, byte, at } => {
                if let Field::Text(start, n) = fields[field % fields.len()] {
                    if n > 0 && start + n <= b.len() {
                        b[start + at % n] = byte;
                    }
                }
            }
        }
    }
    b
}

#[test]
fn gguf_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    write_tiny_gguf(&base, Family::Llama, &|_| candle_core::quantized::GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&base).unwrap();
    let fields = gguf_fields(&bytes);
    check_load(&base, "base.gguf").unwrap();
    let path = dir.path().join("fuzzed.gguf");
    fuzz("gguf", gguf_mutation(), |muts| {
        std::fs::write(&path, apply_gguf(bytes.clone(), &fields, &muts)).unwrap();
        check_load(&path, "fuzzed.gguf")
    });
}

// --- Hugging Face folders ---------------------------------------------------------------------

/// One mutation of a JSON document: at the value reached by `path` (indices into each level's
/// keys or items), replace it, delete it, or (for a string) cut it.
#[derive(Debug, Clone)]
struct JsonMutation {
    path: Vec<usize>,
    op: u8,
    pick: u64,
}

fn json_mutation() -> impl Strategy<Value = Vec<JsonMutation>> {
    let one = (prop::collection::vec(any::<usize>(), 1..5), any::<u8>(), any::<u64>())
        .prop_map(|(path, op, pick)| JsonMutation { path, op, pick });
    prop::collection::vec(one, 1..4)
}

/// Jinja worth putting in a chat template: syntax errors, unknown names and filters, loops
/// and recursion that must stay bounded, huge output.
const TEMPLATES: &[&str] = &[
    "{% for m in messages %}{{ m.content }}",
    "{{ raise_exception('no') }}",
    "{{ messages[0].content | nosuchfilter }}",
    "{% for i in range(1000000000) %}x{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 'x' * 1000000000 }}",
    "{{ messages[99].content }}",
    "{% set x = namespace(a=1) %}{{ x.b.c.d }}",
    "{{ }}",
    "",
];

fn replacement(pick: u64) -> Value {
    match pick % 14 {
        0 => Value::Null,
        1 => Value::from(-1),
        2 => Value::from(0),
        3 => Value::from(u64::MAX),
        4 => Value::from(1e300),
        5 => Value::from(1u64 << 40),
        6 => Value::from("x"),
        7 => Value::Array(vec![]),
        8 => serde_json::json!({}),
        9 => Value::Bool(true),
        10 => Value::from(i64::MIN),
        11 => Value::from(TEMPLATES[(pick >> 4) as usize % TEMPLATES.len()]),
        12 => Value::from(-1e-300),
        _ => Value::from("\u{0}\u{ffff}\u{10ffff}"),
    }
}

fn mutate_json(v: &mut Value, m: &JsonMutation) {
    mutate_at(v, &m.path, m);
}

/// Follows `path` down from `node` while it can, then mutates what it reached.
fn mutate_at(node: &mut Value, path: &[usize], m: &JsonMutation) {
    let delete = m.op.is_multiple_of(5) && path.len() == 1;
    match (node, path.first()) {
        (Value::Object(map), Some(&i)) if !map.is_empty() => {
            let key = map.keys().nth(i % map.len()).unwrap().clone();
            if delete {
                map.remove(&key);
            } else {
                mutate_at(map.get_mut(&key).unwrap(), &path[1..], m);
            }
        }
        (Value::Array(items), Some(&i)) if !items.is_empty() => {
            let k = i % items.len();
            if delete {
                items.remove(k);
            } else {
                mutate_at(&mut items[k], &path[1..], m);
            }
        }
        (Value::String(s), _) if m.op % 5 == 1 => {
            let cut = s.char_indices().nth((m.pick as usize) % (s.chars().count() + 1)).map_or(s.len(), |c| c.0);
            s.truncate(cut);
        }
        (n, _) => *n = replacement(m.pick),
    }
}

/// A tiny Qwen2 folder (a tied head, biases) with a chat template and a generation config.
fn hf_base(dir: &Path) -> PathBuf {
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    write_tiny_checkpoint(&base, Family::Qwen2).unwrap();
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
        {% if add_generation_prompt %}<assistant>{% endif %}";
    let tc =
        serde_json::json!({"chat_template": template, "bos_token": "t1", "eos_token": "t2", "model_max_length": 64});
    std::fs::write(base.join("tokenizer_config.json"), tc.to_string()).unwrap();
    let gc = serde_json::json!({"bos_token_id": 1, "eos_token_id": [2, 3], "temperature": 0.7, "top_p": 0.9});
    std::fs::write(base.join("generation_config.json"), gc.to_string()).unwrap();
    base
}

/// Copies `base` to `to` (files only).
fn copy_dir(base: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(base).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Fuzzes the JSON file `name` of the folder.
fn json_file(name: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let base = hf_base(dir.path());
    check_load(&base, name).unwrap();
    let doc: Value = serde_json::from_slice(&std::fs::read(base.join(name)).unwrap()).unwrap();
    let case = dir.path().join("case");
    fuzz(name, json_mutation(), |muts| {
        copy_dir(&base, &case);
        let mut v = doc.clone();
        muts.iter().for_each(|m| mutate_json(&mut v, m));
        std::fs::write(case.join(name), v.to_string()).unwrap();
        check_load(&case, name)
    });
}

#[test]
fn config_json() {
    json_file("config.json");
}

#[test]
fn tokenizer_json() {
    json_file("tokenizer.json");
}

#[test]
fn tokenizer_config_json_and_chat_template() {
    json_file("tokenizer_config.json");
}

#[test]
fn generation_config_json() {
    json_file("generation_config.json");
}

/// How to corrupt a safetensors file: its header length, its header JSON, or a cut.
#[derive(Debug, Clone)]
enum SafetensorsMutation {
    HeaderLen(u64),
    Header(Vec<JsonMutation>),
    Truncate(usize),
}

#[test]
fn safetensors_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = hf_base(dir.path());
    let bytes = std::fs::read(base.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let case = dir.path().join("case");
    let strategy = prop_oneof![
        1 => any::<u64>().prop_map(SafetensorsMutation::HeaderLen),
        6 => json_mutation().prop_map(SafetensorsMutation::Header),
        1 => any::<usize>().prop_map(SafetensorsMutation::Truncate),
    ];
    fuzz("model.safetensors", strategy, |m| {
        copy_dir(&base, &case);
        let out = match m {
            SafetensorsMutation::HeaderLen(pick) => {
                let mut b = bytes.clone();
                b[..8].copy_from_slice(&interesting(8, pick));
                b
            }
            SafetensorsMutation::Header(muts) => {
                let mut h = header.clone();
                muts.iter().for_each(|m| mutate_json(&mut h, m));
                let text = h.to_string();
                let mut b = (text.len() as u64).to_le_bytes().to_vec();
                b.extend_from_slice(text.as_bytes());
                b.extend_from_slice(&bytes[8 + n..]);
                b
            }
            SafetensorsMutation::Truncate(keep) => bytes[..keep % (bytes.len() + 1)].to_vec(),
        };
        std::fs::write(case.join("model.safetensors"), out).unwrap();
        check_load(&case, "model.safetensors")
    });
}
