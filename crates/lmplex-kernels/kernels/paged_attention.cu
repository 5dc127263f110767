// Paged attention with grouped-query heads, split along the context (flash-decoding).
//
// One query row r (a decode token, or one token of a prefill chunk) belongs to sequence
// row_seq[r] and attends to the first row_ctx[r] positions of that sequence (causal: a prefill
// token at position p has row_ctx = p + 1), read from the paged cache through the sequence's
// block table. The cache already holds this step's keys and values (kv_write runs first).
//
// Pass 1, grid (num_q_heads, num_rows, max_partitions), PARTITION tokens per block: scores in
// shared memory, the partition's max and sum of exponentials, and its unnormalised output.
// Pass 2, grid (num_q_heads, num_rows): combines the partitions in index order.
// The partition size is a constant, never chosen from the batch, so a row's result is the same
// whatever else runs with it. head_dim <= 256; blockDim.x = 128.
//
// One pass (`_one` entry points, the fused path, `LMPLEX_CUDA_FUSED=1`): when no row attends to
// more than PARTITION positions (max_partitions == 1), the first pass writes each row's output
// itself, as pass 2 would combine a single partition (0 + out_p * exp(0), over 0 + sum_p * exp(0),
// explicitly rounded), so the two paths give the same bits; a row attending to nothing writes 0.
//
// Pass 1 for a prefill chunk, grid (num_q_heads, num_tiles, max_partitions): the rows of a tile
// (up to TILE_ROWS consecutive rows of one sequence, listed by the host) share each partition's
// keys and values, staged KV_CHUNK positions at a time in shared memory, so a chunk reads its
// cache once per tile instead of once per row. Every row's scores, max, sum and output are the
// same operations in the same order as in attn_partition (explicit fma in both), so the two
// kernels give the same bits and a row never depends on how it was tiled.
#define PARTITION 512
#define TILE_ROWS 8
#define KV_CHUNK 16

// The max `m` of scores[0, len) and the sum `l` of exp(score - m), the scores overwritten with
// those exponentials. Both first passes call this, so a row's softmax is the same operations in
// the same order whichever pass runs it. Every thread of the block (blockDim.x) calls it.
__device__ __forceinline__ void softmax_partials(float* scores, int len, float& m, float& l) {
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    m = NEG_INF;
    for (int i = threadIdx.x; i < len; i += blockDim.x) m = fmaxf(m, scores[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = NEG_INF;
    for (int w = 0; w < nwarps; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    l = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const float e = expf(scores[i] - m);
        scores[i] = e;
        l += e;
    }
    l = block_sum(l);
}

// Row r's output for head h when its only partition is the whole context: what pass 2 computes
// from one partition (`attn_reduce`), or 0 for a row that attends to nothing (`l` unused).
template <typename T>
__device__ __forceinline__ void write_one(T* __restrict__ out, int r, int h, int num_q_heads, int head_dim, int d,
                                          float acc, float l, bool any) {
    out[((i64)r * num_q_heads + h) * head_dim + d] =
        from_f32<T>(any ? __fadd_rn(0.0f, __fmul_rn(acc, 1.0f)) / __fadd_rn(0.0f, __fmul_rn(l, 1.0f)) : 0.0f);
}

template <typename T, bool ONE>
__device__ void attn_partition(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                               const u32* __restrict__ block_tables, const u32* __restrict__ row_seq,
                               const u32* __restrict__ row_ctx, float* __restrict__ part_out,
                               float* __restrict__ part_max, float* __restrict__ part_sum, float scale,
                               int num_q_heads, int num_kv_heads, int head_dim, int block_size,
                               int max_blocks_per_seq, int max_partitions, int q_stride, T* __restrict__ out) {
    const int h = blockIdx.x, r = blockIdx.y, p = blockIdx.z;
    const int ctx = (int)row_ctx[r];
    const int start = p * PARTITION;
    const i64 slot_out = ((i64)r * num_q_heads + h) * max_partitions + p;
    if (start >= ctx) {  // pass 2 reads only partitions below ceil(ctx / PARTITION)
        if (ONE)
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
                write_one(out, r, h, num_q_heads, head_dim, d, 0.0f, 0.0f, false);
        return;
    }
    const int end = min(ctx, start + PARTITION);
    const int kvh = h / (num_q_heads / num_kv_heads);
    const u32* table = block_tables + (i64)row_seq[r] * max_blocks_per_seq;
    const int row_elems = num_kv_heads * head_dim;

    __shared__ float qs[256];
    __shared__ float scores[PARTITION];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = to_f32(q[(i64)r * q_stride + h * head_dim + d]);
    __syncthreads();

    // Scores: one warp per token at a time, lanes over head_dim, fixed-order warp sum.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int t = start + warp; t < end; t += nwarps) {
        const i64 slot = (i64)table[t / block_size] * block_size + t % block_size;
        const T* kr = k_cache + slot * row_elems + kvh * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s = __fmaf_rn(qs[d], to_f32(kr[d]), s);
        s = warp_sum(s);
        if (lane == 0) scores[t - start] = s * scale;
    }
    __syncthreads();

    // Max and sum of exponentials over the partition.
    float m, l;
    softmax_partials(scores, end - start, m, l);
    __syncthreads();

    // Unnormalised output: one thread per dimension, tokens in order.
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = start; t < end; ++t) {
            const i64 slot = (i64)table[t / block_size] * block_size + t % block_size;
            acc = __fmaf_rn(scores[t - start], to_f32(v_cache[slot * row_elems + kvh * head_dim + d]), acc);
        }
        if (ONE) {
            write_one(out, r, h, num_q_heads, head_dim, d, acc, l, true);
        } else {
            part_out[slot_out * head_dim + d] = acc;
        }
    }
    if (!ONE && threadIdx.x == 0) {
        part_max[slot_out] = m;
        part_sum[slot_out] = l;
    }
}

// Stages positions [c0, c0 + n) of kv head kvh from `cache` into `kv` (n x head_dim).
template <typename T>
__device__ __forceinline__ void stage_kv(const T* __restrict__ cache, const u32* table, T* kv, int c0, int n, int kvh,
                                         int head_dim, int block_size, int row_elems) {
    for (int idx = threadIdx.x; idx < n * head_dim; idx += blockDim.x) {
        const int t = c0 + idx / head_dim, d = idx % head_dim;
        const i64 slot = (i64)table[t / block_size] * block_size + t % block_size;
        kv[idx] = cache[slot * row_elems + (i64)kvh * head_dim + d];
    }
}

// A tile's longest context (rows [first, first + nrows)); in one pass, the rows that attend to
// nothing in this partition written as 0 first. Both tiled first passes start with it.
template <typename T, bool ONE>
__device__ __forceinline__ int tile_start(const u32* __restrict__ row_ctx, T* __restrict__ out, int first, int nrows,
                                          int h, int start, int num_q_heads, int head_dim) {
    int ctx_max = 0;
    for (int i = 0; i < nrows; ++i) ctx_max = max(ctx_max, (int)row_ctx[first + i]);
    if (ONE)
        for (int i = 0; i < nrows; ++i)
            if ((int)row_ctx[first + i] <= start)
                for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
                    write_one(out, first + i, h, num_q_heads, head_dim, d, 0.0f, 0.0f, false);
    return ctx_max;
}

template <typename T, bool ONE>
__device__ void attn_tiles(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                           const u32* __restrict__ block_tables, const u32* __restrict__ row_seq,
                           const u32* __restrict__ row_ctx, float* __restrict__ part_out, float* __restrict__ part_max,
                           float* __restrict__ part_sum, float scale, int num_q_heads, int num_kv_heads, int head_dim,
                           int block_size, int max_blocks_per_seq, int max_partitions, int q_stride,
                           const u32* __restrict__ tiles, int row0, T* __restrict__ out) {
    const int h = blockIdx.x, p = blockIdx.z;
    const int first = (int)tiles[2 * blockIdx.y] - row0, nrows = (int)tiles[2 * blockIdx.y + 1];
    const int start = p * PARTITION;
    const int ctx_max = tile_start<T, ONE>(row_ctx, out, first, nrows, h, start, num_q_heads, head_dim);
    if (start >= ctx_max) return;
    const int end_max = min(ctx_max, start + PARTITION);
    const int kvh = h / (num_q_heads / num_kv_heads);
    const u32* table = block_tables + (i64)row_seq[first] * max_blocks_per_seq;
    const int row_elems = num_kv_heads * head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

    __shared__ float qs[TILE_ROWS][256];
    __shared__ float scores[TILE_ROWS][PARTITION];
    __shared__ T kv[KV_CHUNK * 256];
    __shared__ float row_m[TILE_ROWS], row_l[TILE_ROWS];
    for (int i = 0; i < nrows; ++i)
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
            qs[i][d] = to_f32(q[(i64)(first + i) * q_stride + h * head_dim + d]);

    // Scores: each (row, position) pair by one warp, lanes over head_dim, as in attn_partition.
    for (int c0 = start; c0 < end_max; c0 += KV_CHUNK) {
        const int n = min(KV_CHUNK, end_max - c0);
        __syncthreads();
        stage_kv(k_cache, table, kv, c0, n, kvh, head_dim, block_size, row_elems);
        __syncthreads();
        for (int j = warp; j < nrows * n; j += nwarps) {
            const int i = j / n, t = c0 + j % n;
            if (t >= min((int)row_ctx[first + i], start + PARTITION)) continue;
            float s = 0.0f;
            for (int d = lane; d < head_dim; d += 32) s = __fmaf_rn(qs[i][d], to_f32(kv[(t - c0) * head_dim + d]), s);
            s = warp_sum(s);
            if (lane == 0) scores[i][t - start] = s * scale;
        }
    }
    __syncthreads();

    // Each row's max and sum of exponentials, as in attn_partition.
    for (int i = 0; i < nrows; ++i) {
        const int len = min((int)row_ctx[first + i], start + PARTITION) - start;
        if (len <= 0) continue;
        float m, l;
        softmax_partials(scores[i], len, m, l);
        if (threadIdx.x == 0) {
            row_m[i] = m;
            row_l[i] = l;
        }
    }

    // Unnormalised outputs: thread d (and d + 128), positions in order, values staged per chunk.
    float acc[TILE_ROWS][2];
    for (int i = 0; i < TILE_ROWS; ++i) acc[i][0] = acc[i][1] = 0.0f;
    for (int c0 = start; c0 < end_max; c0 += KV_CHUNK) {
        const int n = min(KV_CHUNK, end_max - c0);
        __syncthreads();
        stage_kv(v_cache, table, kv, c0, n, kvh, head_dim, block_size, row_elems);
        __syncthreads();
        for (int i = 0; i < nrows; ++i) {
            const int end = min(min((int)row_ctx[first + i], start + PARTITION), c0 + n);
            for (int e = 0; e < 2; ++e) {
                const int d = threadIdx.x + e * blockDim.x;
                if (d >= head_dim) continue;
                for (int t = c0; t < end; ++t)
                    acc[i][e] = __fmaf_rn(scores[i][t - start], to_f32(kv[(t - c0) * head_dim + d]), acc[i][e]);
            }
        }
    }
    __syncthreads();
    for (int i = 0; i < nrows; ++i) {
        if ((int)row_ctx[first + i] <= start) continue;
        const i64 slot_out = ((i64)(first + i) * num_q_heads + h) * max_partitions + p;
        for (int e = 0; e < 2; ++e) {
            const int d = threadIdx.x + e * blockDim.x;
            if (d >= head_dim) continue;
            if (ONE) {
                write_one(out, first + i, h, num_q_heads, head_dim, d, acc[i][e], row_l[i], true);
            } else {
                part_out[slot_out * head_dim + d] = acc[i][e];
            }
        }
        if (!ONE && threadIdx.x == 0) {
            part_max[slot_out] = row_m[i];
            part_sum[slot_out] = row_l[i];
        }
    }
}

// Pass 1 on the tensor cores (`_tc` entry points, f16 and bf16, head_dim <= 128; the tensor-core
// path, `LMPLEX_CUDA_ATTENTION=tensor`): a tile's rows (as `attn_tiles`' tiles, or row y alone
// when `tiles` is null) padded to TC_ROWS, each partition's keys staged TC_KEYS positions at a
// time. Scores are mma.sync m16n8k16 over head_dim (each a fixed chain over the dimensions,
// whatever the other rows), scaled into shared memory; each row's max and sum of exponentials are
// `softmax_partials`' as in pass 1; the exponentials are rounded to T and multiplied with the
// values by mma over the positions, 16 at a time from the partition's start in order (positions
// past a row's context weigh 0, values past the tile's staged as 0). So a row's partials do not
// depend on its tile, and the combining pass (or the one-pass write) is unchanged. The partials
// differ from the CUDA-core pass's by the rounding of the exponentials to T (as FlashAttention's).
#define TC_ROWS 16
#define TC_KEYS 16
#define TC_MAX_HD 128
#define TC_QW (TC_MAX_HD / 2 + 4)
#define TC_VW (TC_KEYS / 2 + 4)

template <typename T, bool ONE>
__device__ void attn_tc(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                        const u32* __restrict__ block_tables, const u32* __restrict__ row_seq,
                        const u32* __restrict__ row_ctx, float* __restrict__ part_out, float* __restrict__ part_max,
                        float* __restrict__ part_sum, float scale, int num_q_heads, int num_kv_heads, int head_dim,
                        int block_size, int max_blocks_per_seq, int max_partitions, int q_stride,
                        const u32* __restrict__ tiles, int row0, T* __restrict__ out) {
    const int h = blockIdx.x, p = blockIdx.z;
    const int first = tiles ? (int)tiles[2 * blockIdx.y] - row0 : (int)blockIdx.y;
    const int nrows = tiles ? (int)tiles[2 * blockIdx.y + 1] : 1;
    const int start = p * PARTITION;
    const int ctx_max = tile_start<T, ONE>(row_ctx, out, first, nrows, h, start, num_q_heads, head_dim);
    if (start >= ctx_max) return;
    const int end_max = min(ctx_max, start + PARTITION);
    const int kvh = h / (num_q_heads / num_kv_heads);
    const u32* table = block_tables + (i64)row_seq[first] * max_blocks_per_seq;
    const int row_elems = num_kv_heads * head_dim, hw = head_dim / 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;

    __shared__ u32 qs[TC_ROWS * TC_QW];
    __shared__ u32 ks[TC_KEYS * TC_QW];
    __shared__ u32 vt[TC_MAX_HD * TC_VW];
    __shared__ float scores[TC_ROWS][PARTITION];
    __shared__ float row_m[TC_ROWS], row_l[TC_ROWS];
    for (int idx = threadIdx.x; idx < TC_ROWS * hw; idx += blockDim.x) {
        const int r = idx / hw, c = idx % hw;
        qs[r * TC_QW + c] = r < nrows ? ((const u32*)(q + (i64)(first + r) * q_stride + h * head_dim))[c] : 0u;
    }
    // Scores: warps 0 and 1 each take 8 of a chunk's 16 positions.
    for (int c0 = start; c0 < end_max; c0 += TC_KEYS) {
        const int n = min(TC_KEYS, end_max - c0);
        __syncthreads();
        for (int idx = threadIdx.x; idx < TC_KEYS * hw; idx += blockDim.x) {
            const int j = idx / hw, c = idx % hw, t = c0 + j;
            u32 w = 0u;
            if (j < n) {
                const i64 slot = (i64)table[t / block_size] * block_size + t % block_size;
                w = ((const u32*)(k_cache + slot * row_elems + (i64)kvh * head_dim))[c];
            }
            ks[j * TC_QW + c] = w;
        }
        __syncthreads();
        if (warp < 2) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int kw = 0; kw < hw; kw += 8) {
                const u32 a[4] = {qs[g * TC_QW + kw + qd], qs[(g + 8) * TC_QW + kw + qd],
                                  qs[g * TC_QW + kw + qd + 4], qs[(g + 8) * TC_QW + kw + qd + 4]};
                const u32 b[2] = {ks[(warp * 8 + g) * TC_QW + kw + qd], ks[(warp * 8 + g) * TC_QW + kw + qd + 4]};
                mma_16816(d, a, b, T());
            }
            for (int e = 0; e < 4; ++e) {
                const int r = g + (e >> 1) * 8, j = warp * 8 + qd * 2 + (e & 1);
                if (j < n) scores[r][c0 - start + j] = d[e] * scale;
            }
        }
    }
    __syncthreads();
    // Each row's max and sum of exponentials, as in attn_partition; then weights past its
    // context (to the last whole 16 positions), and every weight of the padding rows, are 0.
    const int span = (end_max - start + TC_KEYS - 1) / TC_KEYS * TC_KEYS;
    for (int i = 0; i < TC_ROWS; ++i) {
        const int len = i < nrows ? min((int)row_ctx[first + i], start + PARTITION) - start : 0;
        if (len > 0) {
            float m, l;
            softmax_partials(scores[i], len, m, l);
            if (threadIdx.x == 0) {
                row_m[i] = m;
                row_l[i] = l;
            }
        }
        for (int t = max(len, 0) + threadIdx.x; t < span; t += blockDim.x) scores[i][t] = 0.0f;
    }
    // Unnormalised outputs: warp w takes the 8-wide column tiles w, w + 4, ... of head_dim.
    float acc[TC_MAX_HD / 32][4];
    for (int nt = 0; nt < TC_MAX_HD / 32; ++nt)
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
    for (int c0 = start; c0 < end_max; c0 += TC_KEYS) {
        const int n = min(TC_KEYS, end_max - c0);
        __syncthreads();
        for (int idx = threadIdx.x; idx < TC_KEYS * head_dim; idx += blockDim.x) {
            const int j = idx / head_dim, d = idx % head_dim, t = c0 + j;
            T v = from_f32<T>(0.0f);
            if (j < n) {
                const i64 slot = (i64)table[t / block_size] * block_size + t % block_size;
                v = v_cache[slot * row_elems + (i64)kvh * head_dim + d];
            }
            ((T*)vt)[d * (2 * TC_VW) + j] = v;
        }
        __syncthreads();
        const float* s0 = scores[g] + (c0 - start);
        const float* s8 = scores[g + 8] + (c0 - start);
        const u32 a[4] = {pack2(from_f32<T>(s0[2 * qd]), from_f32<T>(s0[2 * qd + 1])),
                          pack2(from_f32<T>(s8[2 * qd]), from_f32<T>(s8[2 * qd + 1])),
                          pack2(from_f32<T>(s0[2 * qd + 8]), from_f32<T>(s0[2 * qd + 9])),
                          pack2(from_f32<T>(s8[2 * qd + 8]), from_f32<T>(s8[2 * qd + 9]))};
        for (int nt = 0; nt < TC_MAX_HD / 32; ++nt) {
            const int col = (warp + 4 * nt) * 8;
            if (col >= head_dim) break;
            const u32 b[2] = {vt[(col + g) * TC_VW + qd], vt[(col + g) * TC_VW + qd + 4]};
            mma_16816(acc[nt], a, b, T());
        }
    }
    __syncthreads();
    for (int nt = 0; nt < TC_MAX_HD / 32; ++nt) {
        const int col = (warp + 4 * nt) * 8;
        if (col >= head_dim) break;
        for (int e = 0; e < 4; ++e) {
            const int r = g + (e >> 1) * 8, d = col + qd * 2 + (e & 1);
            if (r >= nrows || (int)row_ctx[first + r] <= start) continue;
            const i64 slot_out = ((i64)(first + r) * num_q_heads + h) * max_partitions + p;
            if (ONE) {
                write_one(out, first + r, h, num_q_heads, head_dim, d, acc[nt][e], row_l[r], true);
            } else {
                part_out[slot_out * head_dim + d] = acc[nt][e];
            }
        }
    }
    if (!ONE && (int)threadIdx.x < nrows && (int)row_ctx[first + threadIdx.x] > start) {
        const i64 slot_out = ((i64)(first + threadIdx.x) * num_q_heads + h) * max_partitions + p;
        part_max[slot_out] = row_m[threadIdx.x];
        part_sum[slot_out] = row_l[threadIdx.x];
    }
}

template <typename T>
__device__ void attn_reduce(const float* __restrict__ part_out, const float* __restrict__ part_max,
                            const float* __restrict__ part_sum, const u32* __restrict__ row_ctx, T* __restrict__ out,
                            int num_q_heads, int head_dim, int max_partitions) {
    const int h = blockIdx.x, r = blockIdx.y;
    const int n = ((int)row_ctx[r] + PARTITION - 1) / PARTITION;
    const i64 base = ((i64)r * num_q_heads + h) * max_partitions;
    float m = NEG_INF;
    for (int p = 0; p < n; ++p) m = fmaxf(m, part_max[base + p]);
    float l = 0.0f;
    for (int p = 0; p < n; ++p) l += part_sum[base + p] * expf(part_max[base + p] - m);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < n; ++p) acc += part_out[(base + p) * head_dim + d] * expf(part_max[base + p] - m);
        out[((i64)r * num_q_heads + h) * head_dim + d] = from_f32<T>(n > 0 ? acc / l : 0.0f);
    }
}

#define PA_ARGS(T)                                                                                  \
    const T *q, const T *k_cache, const T *v_cache, const u32 *block_tables, const u32 *row_seq,     \
        const u32 *row_ctx, float *part_out, float *part_max, float *part_sum, float scale,         \
        int num_q_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks_per_seq,    \
        int max_partitions, int q_stride
#define PA_PASS                                                                                     \
    q, k_cache, v_cache, block_tables, row_seq, row_ctx, part_out, part_max, part_sum, scale,        \
        num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, max_partitions, q_stride
#define INSTANTIATE(T, S)                                                                           \
    extern "C" __global__ void paged_attention_partition_##S(PA_ARGS(T)) {                             \
        attn_partition<T, false>(PA_PASS, nullptr);                                                 \
    }                                                                                               \
    extern "C" __global__ void paged_attention_tiles_##S(PA_ARGS(T), const u32* tiles, int row0) {     \
        attn_tiles<T, false>(PA_PASS, tiles, row0, nullptr);                                        \
    }                                                                                               \
    extern "C" __global__ void paged_attention_partition_one_##S(PA_ARGS(T), T* out) {                 \
        attn_partition<T, true>(PA_PASS, out);                                                      \
    }                                                                                               \
    extern "C" __global__ void paged_attention_tiles_one_##S(PA_ARGS(T), const u32* tiles, int row0, T* out) { \
        attn_tiles<T, true>(PA_PASS, tiles, row0, out);                                             \
    }                                                                                               \
    extern "C" __global__ void paged_attention_reduce_##S(const float* part_out, const float* part_max, \
                                                          const float* part_sum, const u32* row_ctx, \
                                                          T* out, int num_q_heads, int head_dim,    \
                                                          int max_partitions) {                     \
        attn_reduce<T>(part_out, part_max, part_sum, row_ctx, out, num_q_heads, head_dim, max_partitions); \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
#define INSTANTIATE_TC(T, S)                                                                        \
    extern "C" __global__ void paged_attention_tc_##S(PA_ARGS(T), const u32* tiles, int row0) {     \
        attn_tc<T, false>(PA_PASS, tiles, row0, nullptr);                                           \
    }                                                                                               \
    extern "C" __global__ void paged_attention_tc_one_##S(PA_ARGS(T), const u32* tiles, int row0, T* out) { \
        attn_tc<T, true>(PA_PASS, tiles, row0, out);                                                \
    }
INSTANTIATE_TC(__half, f16)
INSTANTIATE_TC(__nv_bfloat16, bf16)
