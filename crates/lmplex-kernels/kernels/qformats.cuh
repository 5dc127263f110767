// GGUF block formats as the quantized kernels read them (qgemv.cu, tgemm.cu): each format's
// block size and bytes, and `dequant32<FMT>(block, g, v)`, the 32 weights of group g of a block
// as f32. Layouts and dequantization follow ggml (and candle's k_quants):
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

