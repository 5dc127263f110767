// Kernels over GGUF-quantized weights (W4A16/W8A16; formats in qformats.cuh, prepended): the
// dequantizing GEMV y[m, n] = sum_k x[m, k] * W[n, k], and the embedding gather of quantized rows.
// W is stored as GGUF rows of blocks (row n holds k / QK blocks); x is in the storage type T and
// y in T or f32 (`y_f32`, for the head's logits), row r of y at y + r * ldy. Each warp computes
// one output column n for up to 8 rows at a time; lane j takes the groups of 32 weights j,
// j + 32, ..., dequantizes them in registers and dots them with x; a fixed-order warp sum ends
// the column. Every (m, n) is reduced in the same order whatever m is, so batching never
// changes a row's result.
#define MAX_ROWS 8

template <typename T, int FMT>
__device__ void qgemv(const unsigned char* __restrict__ w, const T* __restrict__ x, void* __restrict__ y, int n_out,
                      int k, int m, int ldy, int y_f32) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= n_out) return;
    const int groups = k / 32, per_block = Fmt<FMT>::QK / 32;
    const unsigned char* row = w + (i64)n * (k / Fmt<FMT>::QK) * Fmt<FMT>::BYTES;
    for (int m0 = 0; m0 < m; m0 += MAX_ROWS) {
        const int rows = min(MAX_ROWS, m - m0);
        float acc[MAX_ROWS];
        for (int i = 0; i < MAX_ROWS; ++i) acc[i] = 0.0f;
        for (int g = lane; g < groups; g += 32) {
            float v[32];
            dequant32<FMT>(row + (i64)(g / per_block) * Fmt<FMT>::BYTES, g % per_block, v);
            for (int i = 0; i < rows; ++i) {
                const T* xr = x + (i64)(m0 + i) * k + g * 32;
                float s = 0.0f;
                for (int j = 0; j < 32; ++j) s += v[j] * to_f32(xr[j]);
                acc[i] += s;
            }
        }
        for (int i = 0; i < rows; ++i) {
            const float s = warp_sum(acc[i]);
            if (lane != 0) continue;
            const i64 at = (i64)(m0 + i) * ldy + n;
            if (y_f32) {
                ((float*)y)[at] = s;
            } else {
                ((T*)y)[at] = from_f32<T>(s);
            }
        }
    }
}

// out[t, :] = the dequantized row ids[t] of `table` ([vocab, hidden] in GGUF blocks); a zero row
// for an id outside the vocabulary. One block per token; each thread dequantizes whole groups.
template <typename T, int FMT>
__device__ void qembedding(const unsigned char* __restrict__ table, const u32* __restrict__ ids, T* __restrict__ out,
                           int hidden, int vocab) {
    const int t = blockIdx.x;
    const u32 id = ids[t];
    T* dst = out + (i64)t * hidden;
    const int per_block = Fmt<FMT>::QK / 32;
    const unsigned char* row = table + (i64)id * (hidden / Fmt<FMT>::QK) * Fmt<FMT>::BYTES;
    for (int g = threadIdx.x; g < hidden / 32; g += blockDim.x) {
        float v[32];
        if (id < (u32)vocab) {
            dequant32<FMT>(row + (i64)(g / per_block) * Fmt<FMT>::BYTES, g % per_block, v);
        } else {
            for (int i = 0; i < 32; ++i) v[i] = 0.0f;
        }
        for (int i = 0; i < 32; ++i) dst[g * 32 + i] = from_f32<T>(v[i]);
    }
}

#define FORMAT(T, S, F, FMT)                                                                       \
    extern "C" __global__ void qgemv_##F##_##S(const unsigned char* w, const T* x, void* y, int n_out, int k, int m, \
                                               int ldy, int y_f32) {                               \
        qgemv<T, FMT>(w, x, y, n_out, k, m, ldy, y_f32);                                           \
    }                                                                                              \
    extern "C" __global__ void qembedding_##F##_##S(const unsigned char* table, const u32* ids, T* out, int hidden, \
                                                    int vocab) {                                   \
        qembedding<T, FMT>(table, ids, out, hidden, vocab);                                        \
    }
#define INSTANTIATE(T, S)                                                                          \
    FORMAT(T, S, q4_0, FMT_Q4_0)                                                                   \
    FORMAT(T, S, q4_1, FMT_Q4_1)                                                                   \
    FORMAT(T, S, q5_0, FMT_Q5_0)                                                                   \
    FORMAT(T, S, q5_1, FMT_Q5_1)                                                                   \
    FORMAT(T, S, q8_0, FMT_Q8_0)                                                                   \
    FORMAT(T, S, q4_k, FMT_Q4_K)                                                                   \
    FORMAT(T, S, q5_k, FMT_Q5_K)                                                                   \
    FORMAT(T, S, q6_k, FMT_Q6_K)
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
