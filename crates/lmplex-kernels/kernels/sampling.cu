// Seeded sampling on the device: lmplex_model::draw, bit for bit. One block (blockDim.x = 1024)
// per row of f32 logits; rows whose temperature is 0 are left alone (argmax_f32 picks them).
// The row is overwritten with its weights. Steps (see draw.rs for the definition):
//   1. w_i = exp_fixed((l_i - max) * (1 / T)), in place: explicitly rounded f32 operations
//      (never contracted into other fused operations), so the bits equal the host's.
//   2. key_i = (~bits(w_i) << 32) | i: ascending is w descending, then index ascending.
//   3. Masses q_i = trunc(w_i * 2^40) summed exactly in u64, so no sum depends on the order of
//      the threads or the reduction.
//   4. top-k: the k-th smallest key, by bisection on counts (the key's high word, then the
//      index); min-p: w_i >= min_p; top-p: the smallest key whose head mass (within top-k and
//      min-p) reaches max(1, trunc(top_p * top-k mass)), by bisection on masses.
//   5. u = mulhi(splitmix64(seed ^ splitmix64(step)), total); the first kept index, in index
//      order, whose running mass exceeds u (thread chunks, then one thread's scan).
#define THREADS 1024
#define MASS_SCALE 1099511627776.0f  // 2^40

typedef unsigned long long u64;

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Cephes' expf for x <= 0, as draw.rs's exp_fixed: the same operations, in the same order, on
// the same constants (as f32 bits).
__device__ __forceinline__ float exp_fixed(float x) {
    if (!(x >= -86.0f)) return 0.0f;
    x = fminf(x, 0.0f);
    const float n = rintf(__fmul_rn(x, __uint_as_float(0x3fb8aa3bu)));
    float r = __fmaf_rn(-n, __uint_as_float(0x3f318000u), x);
    r = __fmaf_rn(-n, __uint_as_float(0xb95e8083u), r);
    float p = __fmaf_rn(__uint_as_float(0x39506967u), r, __uint_as_float(0x3ab743ceu));
    p = __fmaf_rn(p, r, __uint_as_float(0x3c088908u));
    p = __fmaf_rn(p, r, __uint_as_float(0x3d2aa9c1u));
    p = __fmaf_rn(p, r, __uint_as_float(0x3e2aaaaau));
    p = __fmaf_rn(p, r, __uint_as_float(0x3f000000u));
    const float y = __fadd_rn(__fmaf_rn(p, __fmul_rn(r, r), r), 1.0f);
    return __fmul_rn(y, __uint_as_float((u32)((int)n + 127) << 23));
}

__device__ float block_max(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v = fmaxf(v, partial[w]);
    return v;
}

// An exact sum over the block (integers: any order gives the same value).
__device__ u64 block_sum_u64(u64 v) {
    __shared__ u64 partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v += partial[w];
    return v;
}

__device__ __forceinline__ u32 high(float w) { return ~__float_as_uint(w); }
__device__ __forceinline__ u64 mass(float w) { return (u64)__fmul_rn(w, MASS_SCALE); }

// Which tokens count in a sum: key <= `lim` (high word, then index), and w >= min_p (when > 0).
struct Cut {
    u32 hi;
    int idx;
    float min_p;
    __device__ bool keeps(float w, u32 h, int i) const {
        return (h < hi || (h == hi && i <= idx)) && (min_p <= 0.0f || w >= min_p);
    }
};

// count (by_mass false) or mass of the tokens `c` keeps.
__device__ u64 measure(const float* row, int vocab, Cut c, bool by_mass) {
    u64 s = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float w = row[i];
        if (c.keeps(w, high(w), i)) s += by_mass ? mass(w) : 1;
    }
    return block_sum_u64(s);
}

// The smallest key (high word, then index) whose head, within `base`, measures at least `need`.
// `need` must be reachable (measure(base) >= need).
__device__ Cut smallest_head(const float* row, int vocab, Cut base, bool by_mass, u64 need) {
    u32 lo = 0, hi = base.hi;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        Cut c = base;
        if (mid < base.hi) c.hi = mid, c.idx = vocab;
        if (measure(row, vocab, c, by_mass) >= need) hi = mid; else lo = mid + 1;
    }
    int a = 0, b = lo == base.hi ? base.idx : vocab - 1;
    while (a < b) {
        const int mid = a + (b - a) / 2;
        Cut c = base;
        c.hi = lo;
        c.idx = mid;
        if (measure(row, vocab, c, by_mass) >= need) b = mid; else a = mid + 1;
    }
    Cut c = base;
    c.hi = lo;
    c.idx = a;
    return c;
}

extern "C" __global__ void sample_f32(float* __restrict__ logits, u32* __restrict__ out,
                                      const float* __restrict__ temperature, const int* __restrict__ top_k,
                                      const float* __restrict__ top_p, const float* __restrict__ min_p,
                                      const u64* __restrict__ seed, const u64* __restrict__ step, int vocab) {
    const int r = blockIdx.x;
    const float t = temperature[r];
    if (!(t > 0.0f)) return;
    float* row = logits + (i64)r * vocab;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m);
    const float inv_t = __fdiv_rn(1.0f, t);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) row[i] = exp_fixed(__fmul_rn(__fsub_rn(row[i], m), inv_t));
    __syncthreads();

    Cut cut = {0xffffffffu, vocab - 1, 0.0f};
    const int k = top_k[r];
    if (k > 0 && k < vocab) cut = smallest_head(row, vocab, cut, false, (u64)k);
    const u64 top_k_mass = measure(row, vocab, cut, true);
    cut.min_p = min_p[r];
    const float tp = top_p[r];
    if (tp < 1.0f) {
        u64 target = (u64)((double)tp * (double)top_k_mass);
        target = target > 0 ? target : 1;
        if (measure(row, vocab, cut, true) >= target) cut = smallest_head(row, vocab, cut, true, target);
    }
    const u64 total = measure(row, vocab, cut, true);
    if (total == 0) {
        if (threadIdx.x == 0) out[r] = 0;
        return;
    }
    const u64 u = __umul64hi(splitmix64(seed[r] ^ splitmix64(step[r])), total);
    // Inverse CDF in index order: each thread owns a contiguous chunk.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int begin = min(vocab, (int)threadIdx.x * chunk), end = min(vocab, begin + chunk);
    u64 mine = 0;
    for (int i = begin; i < end; ++i) {
        const float w = row[i];
        if (cut.keeps(w, high(w), i)) mine += mass(w);
    }
    __shared__ u64 sums[THREADS];
    sums[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 acc = 0;
        int owner = 0;
        while (owner + 1 < (int)blockDim.x && u >= acc + sums[owner]) acc += sums[owner++];
        const int b0 = min(vocab, owner * chunk), e0 = min(vocab, b0 + chunk);
        u32 pick = 0;
        for (int i = b0; i < e0; ++i) {
            const float w = row[i];
            if (!cut.keeps(w, high(w), i)) continue;
            acc += mass(w);
            if (u < acc) {
                pick = (u32)i;
                break;
            }
        }
        out[r] = pick;
    }
}

// A request's edits of single logits before its pick (lmplex_model::pick, bit for bit): one block
// per row of f32 logits, the row's edits at [row_start[r], row_start[r + 1]) of `edits`, five
// words each: token, flags (1 repetition, 2 subtract, 4 add, 8 forbid), then the repetition
// penalty, the amount subtracted and the amount added as f32 bits. A row holds at most one edit
// per token, so no two threads touch one logit; a token past the vocabulary is skipped.
extern "C" __global__ void logit_edits_f32(float* logits, const u32* edits, const u32* row_start, int vocab) {
    const int r = blockIdx.x;
    float* row = logits + (i64)r * vocab;
    for (u32 e = row_start[r] + threadIdx.x; e < row_start[r + 1]; e += blockDim.x) {
        const u32* ed = edits + 5 * (i64)e;
        const u32 t = ed[0], flags = ed[1];
        if (t >= (u32)vocab) continue;
        float x = row[t];
        if (flags & 1u) {
            const float rep = __uint_as_float(ed[2]);
            x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
        }
        if (flags & 2u) x = __fsub_rn(x, __uint_as_float(ed[3]));
        if (flags & 4u) x = __fadd_rn(x, __uint_as_float(ed[4]));
        if (flags & 8u) x = NEG_INF;
        row[t] = x;
    }
}
