// The tile GEMM on the tensor cores: y[m, n] = x[m, k] * W[n, k] summed over k, for the 16-bit
// storage types T (f16, bf16); W dense in T ([n, k] row-major) or in GGUF blocks (qformats.cuh,
// prepended), dequantized to T in shared memory. y is in T or f32 (`y_f32`, for the head's
// logits), row r of y at y + r * ldy.
//
// A block of 128 threads computes a 64x64 tile of y: blockIdx.x is the tile's 64 rows of x,
// blockIdx.y its 64 columns. Each warp owns 32x32 of the tile as 2x4 mma.sync m16n8k16 with f32
// accumulators. k advances 32 at a time: warps 0-1 stage the W tile (dense: words in row order,
// coalesced; quantized: one row's group of 32 per thread), warps 2-3 the x tile, into shared
// memory rows of 40 values (20 words: the fragment reads of a warp hit 32 distinct banks).
//
// Invariants:
// - Batch invariance: every element of y is one fixed chain over k (32-wide steps of two mma,
//   each adding to the accumulator) on the same instructions whatever m is and wherever the row
//   lands in its tile; rows past m are staged as zeros and never stored.
// - Weight traffic: the row tiles of one column tile are consecutive blocks (x varies fastest),
//   so a step's blocks fetch each W tile from memory about once and from L2 after.
// - k is a multiple of 32 (a quantized k is a whole number of blocks); x, a dense W and y are
//   read and written in 4-byte words or single values, so they need only their type's alignment
//   and an even k.
#define TM 64
#define TN 64
#define TK 32
#define ROW_WORDS 20
#define FMT_DENSE -1

// Two 16-bit values, low first, as one word (the fragment layout of mma.sync).
template <typename T> __device__ __forceinline__ u32 pack2(T lo, T hi) {
    return (u32)bits16(lo) | ((u32)bits16(hi) << 16);
}

// Stages the W tile's 64 rows x 32 values at (n0, k0) into `ws` (rows past n_out are zeros);
// called by threads t = 0..63.
template <typename T, int FMT>
__device__ __forceinline__ void stage_w(const unsigned char* __restrict__ w, u32* ws, int n0, int k0, int n_out,
                                        int k, int t) {
    if constexpr (FMT == FMT_DENSE) {
        const u32* words = (const u32*)w;
        for (int i = 0; i < TN * TK / 2 / 64; ++i) {
            const int at = i * 64 + t, r = at / (TK / 2), c = at % (TK / 2);
            ws[r * ROW_WORDS + c] = n0 + r < n_out ? words[((i64)(n0 + r) * k + k0) / 2 + c] : 0u;
        }
    } else {
        const int r = t;
        if (n0 + r >= n_out) {
            for (int c = 0; c < TK / 2; ++c) ws[r * ROW_WORDS + c] = 0u;
            return;
        }
        const int per_block = Fmt<FMT>::QK / 32, g = k0 / 32;
        const unsigned char* row = w + (i64)(n0 + r) * (k / Fmt<FMT>::QK) * Fmt<FMT>::BYTES;
        float v[32];
        dequant32<FMT>(row + (i64)(g / per_block) * Fmt<FMT>::BYTES, g % per_block, v);
        for (int c = 0; c < TK / 2; ++c) ws[r * ROW_WORDS + c] = pack2(from_f32<T>(v[2 * c]), from_f32<T>(v[2 * c + 1]));
    }
}

// Stages the x tile's 64 rows x 32 values at (m0, k0) into `xs` (rows past m are zeros); called by
// threads t = 0..63.
__device__ __forceinline__ void stage_x(const u32* __restrict__ x, u32* xs, int m0, int k0, int m, int k, int t) {
    for (int i = 0; i < TM * TK / 2 / 64; ++i) {
        const int at = i * 64 + t, r = at / (TK / 2), c = at % (TK / 2);
        xs[r * ROW_WORDS + c] = m0 + r < m ? x[((i64)(m0 + r) * k + k0) / 2 + c] : 0u;
    }
}

template <typename T, int FMT>
__device__ void tgemm(const unsigned char* __restrict__ w, const T* __restrict__ x, void* __restrict__ y, int n_out,
                      int k, int m, int ldy, int y_f32) {
    __shared__ u32 xs[TM * ROW_WORDS];
    __shared__ u32 ws[TN * ROW_WORDS];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int m0 = blockIdx.x * TM, n0 = blockIdx.y * TN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int g = lane >> 2, q = lane & 3;
    float acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TK) {
        if (t < 64) {
            stage_w<T, FMT>(w, ws, n0, k0, n_out, k, t);
        } else {
            stage_x((const u32*)x, xs, m0, k0, m, k, t - 64);
        }
        __syncthreads();
        for (int kw = 0; kw < TK / 2; kw += 8) {
            u32 a[2][4], b[4][2];
            for (int i = 0; i < 2; ++i) {
                const u32* r0 = xs + (wm + i * 16 + g) * ROW_WORDS + kw + q;
                const u32* r8 = r0 + 8 * ROW_WORDS;
                a[i][0] = r0[0];
                a[i][1] = r8[0];
                a[i][2] = r0[4];
                a[i][3] = r8[4];
            }
            for (int j = 0; j < 4; ++j) {
                const u32* c = ws + (wn + j * 8 + g) * ROW_WORDS + kw + q;
                b[j][0] = c[0];
                b[j][1] = c[4];
            }
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 4; ++j) mma_16816(acc[i][j], a[i], b[j], T());
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
            for (int e = 0; e < 4; ++e) {
                const int r = m0 + wm + i * 16 + g + (e >> 1) * 8, c = n0 + wn + j * 8 + q * 2 + (e & 1);
                if (r >= m || c >= n_out) continue;
                const i64 at = (i64)r * ldy + c;
                if (y_f32) {
                    ((float*)y)[at] = acc[i][j][e];
                } else {
                    ((T*)y)[at] = from_f32<T>(acc[i][j][e]);
                }
            }
        }
    }
}

#define TGEMM(T, S, F, FMT)                                                                        \
    extern "C" __global__ void tgemm_##F##_##S(const unsigned char* w, const T* x, void* y, int n_out, int k, int m, \
                                               int ldy, int y_f32) {                               \
        tgemm<T, FMT>(w, x, y, n_out, k, m, ldy, y_f32);                                           \
    }
#define TGEMM_ALL(T, S)                                                                            \
    TGEMM(T, S, dense, FMT_DENSE)                                                                  \
    TGEMM(T, S, q4_0, FMT_Q4_0)                                                                    \
    TGEMM(T, S, q4_1, FMT_Q4_1)                                                                    \
    TGEMM(T, S, q5_0, FMT_Q5_0)                                                                    \
    TGEMM(T, S, q5_1, FMT_Q5_1)                                                                    \
    TGEMM(T, S, q8_0, FMT_Q8_0)                                                                    \
    TGEMM(T, S, q4_k, FMT_Q4_K)                                                                    \
    TGEMM(T, S, q5_k, FMT_Q5_K)                                                                    \
    TGEMM(T, S, q6_k, FMT_Q6_K)
TGEMM_ALL(__half, f16)
TGEMM_ALL(__nv_bfloat16, bf16)
