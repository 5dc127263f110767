//! Batch-1 greedy decode speed of a GGUF or HF checkpoint on the CPU backend.
//! `cargo run --release -p lmplex-model --example decode_speed -- PATH [TOKENS]`
//! (the full benchmark harness against peers is `lmplex bench`, another piece of work).

use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: decode_speed PATH [TOKENS]");
    let n: usize = args.next().map_or(128, |s| s.parse().expect("TOKENS must be a number"));
    let loaded = lmplex_model::load(std::path::Path::new(&path), Some(2048)).unwrap_or_else(|e| panic!("{e}"));
    let prompt = loaded.tokenizer.encode("The history of computing began", false).unwrap();
    let bs = 16;
    let blocks = (prompt.len() + n).div_ceil(bs);
    let mut kv = loaded.model.new_kv_cache(blocks, bs, loaded.kv_dtype).expect("KV cache");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let t0 = std::time::Instant::now();
    let mut chunk = prompt.clone();
    let mut pos = 0;
    let mut first = None;
    for i in 0..n {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                token_ids: &chunk,
                start_pos: pos,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: prompt.len(),
                lora: None,
                embeds: None,
            }],
        };
        let logits = loaded.model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap().remove(0);
        pos += chunk.len();
        chunk = vec![lmplex_model::sample::argmax(&logits)];
        if i == 0 {
            first = Some(t0.elapsed());
        }
    }
    let total = t0.elapsed();
    let prefill = first.unwrap_or_default();
    let decode = (total - prefill).as_secs_f64();
    println!(
        "{{\"prompt_tokens\": {}, \"prefill_s\": {:.4}, \"decode_tokens\": {}, \"decode_tok_per_s\": {:.1}, \"threads\": {}}}",
        prompt.len(),
        prefill.as_secs_f64(),
        n - 1,
        (n - 1) as f64 / decode,
        rayon::current_num_threads()
    );
}
