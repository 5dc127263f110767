// Kernels over GGUF-quantized weights (W4A16/W8A16): the dequantizing GEMV
// y[m, n] = sum_k x[m, k] * W[n, k], and the embedding gather of quantized rows.
// W is stored as GGUF rows of blocks (row n holds k / QK blocks); x is in the storage type T and
// y in T or f32 (`y_f32`, for the head's logits), row r of y at y + r * ldy. Each warp computes
// one output column n for up to 8 rows at a time; lane j takes the groups of 32 weights j,
// j + 32, ..., dequantizes them in registers and dots them with x; a fixed-order warp sum ends
// the column. Every (m, n) is reduced in the same order whatever m is, so batching never
// changes a row's result. Layouts and dequantization follow ggml (and candle's k_quants):
//   Q4_0: 18 bytes per 32: f16 d, 16 bytes of nibbles.               w = d * (q - 8)
//   Q4_1: 20 bytes per 32: f16 d, f16 m, 16 bytes of nibbles.        w = d * q + m
//   Q5_0: 22 bytes per 32: f16 d, u32 high bits, 16 bytes of nibbles. w = d * (q - 16)
//   Q5_1: 24 bytes per 32: f16 d, f16 m, u32 high bits, nibbles.     w = d * q + m
//   Q8_0: 34 bytes per 32: f16 d, 32 x i8.                            w = d * q
//   (in the 32-weight formats, weight j < 16 is the low nibble of byte j, weight j + 16 the high)
//   Q4_K: 144 bytes per 256: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 x 4-bit.
//         Group g of 32 uses scale/min pair g; w = d * sc * q - dmin * m
//   Q5_K: 176 bytes per 256: as Q4_K, then 32 bytes of fifth bits (bit g of byte l for weight l
//         of group g), then the 128 bytes of nibbles.
//   Q6_K: 210 bytes per 256: ql[128], qh[64], i8 scales[16], f16 d.   w = d * sc * (q - 32)
#define FMT_Q8_0 0
#define FMT_Q4_K 1
#define FMT_Q6_K 2
#define FMT_Q4_0 3
#define FMT_Q4_1 4
#define FMT_Q5_0 5
#define FMT_Q5_1 6
#define FMT_Q5_K 7
#define MAX_ROWS 8

__device__ __forceinline__ float load_f16(const unsigned char* p) {
    return __half2float(__ushort_as_half(*(const unsigned short*)p));
}

__device__ __forceinline__ u32 load_u32(const unsigned char* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_Q8_0> { static const int QK = 32, BYTES = 34; };
template <> struct Fmt<FMT_Q4_K> { static const int QK = 256, BYTES = 144; };
template <> struct Fmt<FMT_Q6_K> { static const int QK = 256, BYTES = 210; };
template <> struct Fmt<FMT_Q4_0> { static const int QK = 32, BYTES = 18; };
template <> struct Fmt<FMT_Q4_1> { static const int QK = 32, BYTES = 20; };
template <> struct Fmt<FMT_Q5_0> { static const int QK = 32, BYTES = 22; };
template <> struct Fmt<FMT_Q5_1> { static const int QK = 32, BYTES = 24; };
template <> struct Fmt<FMT_Q5_K> { static const int QK = 256, BYTES = 176; };

__device__ __forceinline__ void scale_min_k4(int j, const unsigned char* q, float& sc, float& mn) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        mn = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// The 32 weights of group `g` (within block `blk`) into v.
template <int FMT> __device__ __forceinline__ void dequant32(const unsigned char* blk, int g, float* v);

template <> __device__ __forceinline__ void dequant32<FMT_Q8_0>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk);
    const signed char* q = (const signed char*)(blk + 2);
    for (int i = 0; i < 32; ++i) v[i] = d * (float)q[i];
}

template <> __device__ __forceinline__ void dequant32<FMT_Q4_0>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk);
    const unsigned char* q = blk + 2;
    for (int i = 0; i < 16; ++i) {
        v[i] = (float)((int)(q[i] & 0xF) - 8) * d;
        v[i + 16] = (float)((int)(q[i] >> 4) - 8) * d;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q4_1>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk), m = load_f16(blk + 2);
    const unsigned char* q = blk + 4;
    for (int i = 0; i < 16; ++i) {
        v[i] = (float)(q[i] & 0xF) * d + m;
        v[i + 16] = (float)(q[i] >> 4) * d + m;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q5_0>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk);
    const u32 qh = load_u32(blk + 2);
    const unsigned char* q = blk + 6;
    for (int i = 0; i < 16; ++i) {
        const int h0 = ((qh >> i) << 4) & 0x10, h1 = (qh >> (i + 12)) & 0x10;
        v[i] = (float)(((int)(q[i] & 0xF) | h0) - 16) * d;
        v[i + 16] = (float)(((int)(q[i] >> 4) | h1) - 16) * d;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q5_1>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk), m = load_f16(blk + 2);
    const u32 qh = load_u32(blk + 4);
    const unsigned char* q = blk + 8;
    for (int i = 0; i < 16; ++i) {
        const int h0 = ((qh >> i) << 4) & 0x10, h1 = (qh >> (i + 12)) & 0x10;
        v[i] = (float)((int)(q[i] & 0xF) | h0) * d + m;
        v[i + 16] = (float)((int)(q[i] >> 4) | h1) * d + m;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q4_K>(const unsigned char* blk, int g, float* v) {
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    const unsigned char* q = blk + 16 + 32 * (g / 2);
    float sc, mn;
    scale_min_k4(g, blk + 4, sc, mn);
    const float d1 = d * sc, m1 = dmin * mn;
    if (g % 2 == 0) {
        for (int i = 0; i < 32; ++i) v[i] = d1 * (float)(q[i] & 0xF) - m1;
    } else {
        for (int i = 0; i < 32; ++i) v[i] = d1 * (float)(q[i] >> 4) - m1;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q5_K>(const unsigned char* blk, int g, float* v) {
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    const unsigned char* qh = blk + 16;
    const unsigned char* q = blk + 48 + 32 * (g / 2);
    float sc, mn;
    scale_min_k4(g, blk + 4, sc, mn);
    const float d1 = d * sc, m1 = dmin * mn;
    const int shift = g % 2 == 0 ? 0 : 4;
    for (int i = 0; i < 32; ++i) {
        const int hi = (qh[i] >> g) & 1 ? 16 : 0;
        v[i] = d1 * (float)(((q[i] >> shift) & 0xF) + hi) - m1;
    }
}

template <> __device__ __forceinline__ void dequant32<FMT_Q6_K>(const unsigned char* blk, int g, float* v) {
    const unsigned char* ql = blk + 64 * (g / 4);
    const unsigned char* qh = blk + 128 + 32 * (g / 4);
    const signed char* sc = (const signed char*)(blk + 192) + 8 * (g / 4);
    const float d = load_f16(blk + 208);
    const int quarter = g % 4;
    for (int l = 0; l < 32; ++l) {
        int q;
        switch (quarter) {
            case 0: q = (ql[l] & 0xF) | ((qh[l] & 3) << 4); break;
            case 1: q = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4); break;
            case 2: q = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4); break;
            default: q = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4); break;
        }
        v[l] = d * (float)sc[l / 16 + 2 * quarter] * (float)(q - 32);
    }
}

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
