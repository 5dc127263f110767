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
//
// `tgemm_swiglu_*` (the fused path, `LMPLEX_CUDA_FUSED=1`): y[m, inter] = silu(x * Wg) * (x * Wu)
// with the gate and up matrices ([inter, k] each) in one launch: a block computes the same
// 64x64 tile of both products (the same chains as `tgemm`), rounds each to T as `tgemm` stores
// it, and writes the activation as `silu_and_mul` computes it, so it equals the two launches bit
// for bit and the [m, 2 * inter] product never reaches memory.
//
// `tgemm_fused_*` and `tgemm_swiglu_*` take the fused path's prologue and epilogue (`norm_w`,
// `eps`, `weight_offset`, `add`): with `norm_w` set, x is the residual stream and the block
// stages rmsnorm(x) * (norm_w + weight_offset) in its place, each row's scale computed as
// `fused_add_rmsnorm` computes it (256 virtual threads, the same sums in the same order, emulated
// by one warp per row), so the norm launch and its [m, k] output disappear; with `add`, y is the
// residual stream and receives y + (x * W) rounded as the tile GEMM stores it, as the next
// `fused_add_rmsnorm` would add it. Both give the bits of the launches they replace.
#define TM 64
#define TN 64
#define TK 32
#define ROW_WORDS 20
#define FMT_DENSE -1

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

// One normalised value as `fused_add_rmsnorm` writes it.
template <typename T> __device__ __forceinline__ T normed(T h, float scale, T w, float weight_offset) {
    return from_f32<T>(__fmul_rn(__fmul_rn(to_f32(h), scale), __fadd_rn(to_f32(w), weight_offset)));
}

// The rmsnorm scale of each row [m0, m0 + TM) of x ([m, k]) into `scale`, as `fused_add_rmsnorm`
// computes it with 256 threads: lane l of a warp holds the partial sums of virtual threads
// l + 32 j (j < 8), reduces each as that virtual warp would, then the eight as block_sum does.
// Every thread of the block (128) calls it; rows past m get 0.
template <typename T>
__device__ void row_scales(const T* __restrict__ x, float* scale, int m0, int m, int k, float eps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < TM; r += 4) {
        if (m0 + r >= m) {
            if (lane == 0) scale[r] = 0.0f;
            continue;
        }
        const T* row = x + (i64)(m0 + r) * k;
        float mine = 0.0f;
        for (int j = 0; j < 8; ++j) {
            float ss = 0.0f;
            for (int i = lane + 32 * j; i < k; i += 256) {
                const float h = to_f32(row[i]);
                ss = __fmaf_rn(h, h, ss);
            }
            ss = warp_sum(ss);
            if (lane == j) mine = ss;
        }
        const float total = warp_sum(lane < 8 ? mine : 0.0f);
        if (lane == 0) scale[r] = rsqrtf(total / (float)k + eps);
    }
}

// As stage_x, each value normalised (`normed`) with its row's scale and its column's weight.
template <typename T>
__device__ __forceinline__ void stage_x_normed(const T* __restrict__ x, u32* xs, const float* scale,
                                               const T* __restrict__ norm_w, float weight_offset, int m0, int k0,
                                               int m, int k, int t) {
    for (int i = 0; i < TM * TK / 2 / 64; ++i) {
        const int at = i * 64 + t, r = at / (TK / 2), c = at % (TK / 2);
        u32 word = 0u;
        if (m0 + r < m) {
            const T* v = x + (i64)(m0 + r) * k + k0 + 2 * c;
            const int col = k0 + 2 * c;
            word = pack2(normed(v[0], scale[r], norm_w[col], weight_offset),
                         normed(v[1], scale[r], norm_w[col + 1], weight_offset));
        }
        xs[r * ROW_WORDS + c] = word;
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

// The x tile as the GEMM multiplies it: normalised (`stage_x_normed`) when `norm_w` is set, else
// as stored (`stage_x`); called by threads t = 0..63.
template <typename T>
__device__ __forceinline__ void stage_x_maybe_normed(const T* __restrict__ x, u32* xs, const float* scale,
                                                     const T* __restrict__ norm_w, float weight_offset, int m0,
                                                     int k0, int m, int k, int t) {
    if (norm_w) {
        stage_x_normed(x, xs, scale, norm_w, weight_offset, m0, k0, m, k, t);
    } else {
        stage_x((const u32*)x, xs, m0, k0, m, k, t);
    }
}

// One k step of a warp's 32x32 of the tile: acc += xs (its rows) * ws (its columns), 2x4
// mma.sync in a fixed order.
template <typename T>
__device__ __forceinline__ void tile_step(const u32* xs, const u32* ws, float (*acc)[4][4], int wm, int wn, int g,
                                          int q) {
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
}

template <typename T, int FMT>
__device__ void tgemm(const unsigned char* __restrict__ w, const T* __restrict__ x, void* __restrict__ y, int n_out,
                      int k, int m, int ldy, int y_f32, const T* __restrict__ norm_w, float eps, float weight_offset,
                      int add) {
    __shared__ u32 xs[TM * ROW_WORDS];
    __shared__ u32 ws[TN * ROW_WORDS];
    __shared__ float scale[TM];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int m0 = blockIdx.x * TM, n0 = blockIdx.y * TN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int g = lane >> 2, q = lane & 3;
    if (norm_w) {
        row_scales(x, scale, m0, m, k, eps);
        __syncthreads();
    }
    float acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TK) {
        if (t < 64) {
            stage_w<T, FMT>(w, ws, n0, k0, n_out, k, t);
        } else {
            stage_x_maybe_normed(x, xs, scale, norm_w, weight_offset, m0, k0, m, k, t - 64);
        }
        __syncthreads();
        tile_step<T>(xs, ws, acc, wm, wn, g, q);
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
                } else if (add) {
                    const float v = to_f32(from_f32<T>(acc[i][j][e]));
                    ((T*)y)[at] = from_f32<T>(v + to_f32(((T*)y)[at]));
                } else {
                    ((T*)y)[at] = from_f32<T>(acc[i][j][e]);
                }
            }
        }
    }
}

template <typename T, int FMT>
__device__ void tgemm_swiglu(const unsigned char* __restrict__ w_gate, const unsigned char* __restrict__ w_up,
                             const T* __restrict__ x, T* __restrict__ y, int inter, int k, int m,
                             const T* __restrict__ norm_w, float eps, float weight_offset) {
    __shared__ u32 xs[TM * ROW_WORDS];
    __shared__ u32 wg[TN * ROW_WORDS];
    __shared__ u32 wu[TN * ROW_WORDS];
    __shared__ float scale[TM];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int m0 = blockIdx.x * TM, n0 = blockIdx.y * TN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int g = lane >> 2, q = lane & 3;
    if (norm_w) {
        row_scales(x, scale, m0, m, k, eps);
        __syncthreads();
    }
    float gate[2][4][4], up[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) gate[i][j][e] = up[i][j][e] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TK) {
        if (t < 64) {
            stage_w<T, FMT>(w_gate, wg, n0, k0, inter, k, t);
            stage_w<T, FMT>(w_up, wu, n0, k0, inter, k, t);
        } else {
            stage_x_maybe_normed(x, xs, scale, norm_w, weight_offset, m0, k0, m, k, t - 64);
        }
        __syncthreads();
        tile_step<T>(xs, wg, gate, wm, wn, g, q);
        tile_step<T>(xs, wu, up, wm, wn, g, q);
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
            for (int e = 0; e < 4; ++e) {
                const int r = m0 + wm + i * 16 + g + (e >> 1) * 8, c = n0 + wn + j * 8 + q * 2 + (e & 1);
                if (r >= m || c >= inter) continue;
                const float a = to_f32(from_f32<T>(gate[i][j][e])), u = to_f32(from_f32<T>(up[i][j][e]));
                y[(i64)r * inter + c] = from_f32<T>(a / (1.0f + expf(-a)) * u);
            }
        }
    }
}

#define TGEMM(T, S, F, FMT)                                                                        \
    extern "C" __global__ void tgemm_##F##_##S(const unsigned char* w, const T* x, void* y, int n_out, int k, int m, \
                                               int ldy, int y_f32) {                               \
        tgemm<T, FMT>(w, x, y, n_out, k, m, ldy, y_f32, nullptr, 0.0f, 0.0f, 0);                   \
    }                                                                                              \
    extern "C" __global__ void tgemm_fused_##F##_##S(const unsigned char* w, const T* x, void* y, int n_out, int k, \
                                                     int m, int ldy, int y_f32, const T* norm_w, float eps, \
                                                     float weight_offset, int add) {               \
        tgemm<T, FMT>(w, x, y, n_out, k, m, ldy, y_f32, norm_w, eps, weight_offset, add);          \
    }                                                                                              \
    extern "C" __global__ void tgemm_swiglu_##F##_##S(const unsigned char* w_gate, const unsigned char* w_up, \
                                                      const T* x, T* y, int inter, int k, int m,   \
                                                      const T* norm_w, float eps, float weight_offset) { \
        tgemm_swiglu<T, FMT>(w_gate, w_up, x, y, inter, k, m, norm_w, eps, weight_offset);         \
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
