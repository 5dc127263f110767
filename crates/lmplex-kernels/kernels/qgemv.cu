// Dequantizing GEMV for GGUF weights (W4A16/W8A16 decode): y[m, n] = sum_k x[m, k] * W[n, k].
// W is stored as GGUF rows of blocks (row n holds k / QK blocks); x and y are in the storage
// type T. Each warp computes one output column n for up to 8 rows at a time; lane j takes the
// groups of 32 weights j, j + 32, ..., dequantizes them in registers and dots them with x;
// a fixed-order warp sum ends the column. Every (m, n) is reduced in the same order whatever m
// is, so batching never changes a row's result. Layouts follow ggml (and candle's k_quants):
//   Q8_0: 34 bytes per 32 weights: f16 d, 32 x i8.                     w = d * q
//   Q4_K: 144 bytes per 256: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 x 4-bit.
//         Group g of 32 uses scale/min pair g; w = d * sc * q - dmin * m
//   Q6_K: 210 bytes per 256: ql[128], qh[64], i8 scales[16], f16 d.   w = d * sc * (q - 32)
#define FMT_Q8_0 0
#define FMT_Q4_K 1
#define FMT_Q6_K 2
#define MAX_ROWS 8

__device__ __forceinline__ float load_f16(const unsigned char* p) {
    return __half2float(__ushort_as_half(*(const unsigned short*)p));
}

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_Q8_0> { static const int QK = 32, BYTES = 34; };
template <> struct Fmt<FMT_Q4_K> { static const int QK = 256, BYTES = 144; };
template <> struct Fmt<FMT_Q6_K> { static const int QK = 256, BYTES = 210; };

__device__ __forceinline__ void scale_min_k4(int j, const unsigned char* q, float& sc, float& mn) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        mn = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// The 32 weights of group `g` (within block `b`) into v.
template <int FMT> __device__ __forceinline__ void dequant32(const unsigned char* blk, int g, float* v);

template <> __device__ __forceinline__ void dequant32<FMT_Q8_0>(const unsigned char* blk, int, float* v) {
    const float d = load_f16(blk);
    const signed char* q = (const signed char*)(blk + 2);
    for (int i = 0; i < 32; ++i) v[i] = d * (float)q[i];
}

template <> __device__ __forceinline__ void dequant32<FMT_Q4_K>(const unsigned char* blk, int g, float* v) {
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    const unsigned char* scales = blk + 4;
    const unsigned char* q = blk + 16 + 32 * (g / 2);
    float sc, mn;
    scale_min_k4(g, scales, sc, mn);
    const float d1 = d * sc, m1 = dmin * mn;
    if (g % 2 == 0) {
        for (int i = 0; i < 32; ++i) v[i] = d1 * (float)(q[i] & 0xF) - m1;
    } else {
        for (int i = 0; i < 32; ++i) v[i] = d1 * (float)(q[i] >> 4) - m1;
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
__device__ void qgemv(const unsigned char* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, int n_out,
                      int k, int m) {
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
            if (lane == 0) y[(i64)(m0 + i) * n_out + n] = from_f32<T>(s);
        }
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void qgemv_q8_0_##S(const unsigned char* w, const T* x, T* y, int n_out, int k, int m) { \
        qgemv<T, FMT_Q8_0>(w, x, y, n_out, k, m);                                                  \
    }                                                                                              \
    extern "C" __global__ void qgemv_q4_k_##S(const unsigned char* w, const T* x, T* y, int n_out, int k, int m) { \
        qgemv<T, FMT_Q4_K>(w, x, y, n_out, k, m);                                                  \
    }                                                                                              \
    extern "C" __global__ void qgemv_q6_k_##S(const unsigned char* w, const T* x, T* y, int n_out, int k, int m) { \
        qgemv<T, FMT_Q6_K>(w, x, y, n_out, k, m);                                                  \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
