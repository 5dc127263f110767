// Seeded top-k / top-p sampling on the device, one block (blockDim.x = 1024) per row of f32
// logits. Steps, all with fixed-order block reductions (so a row's draw never depends on the
// batch):
//   1. p_i = exp((l_i - max) / temperature), unnormalised.
//   2. top-k: the k-th largest p by bisection on a threshold (count of p >= t), 48 rounds.
//   3. top-p: the largest threshold whose kept mass is >= top_p of the top-k mass, bisection.
//   4. u = a uniform draw from (seed, step) by a counter hash (SplitMix64), times the kept
//      mass; an inverse-CDF scan in index order over the kept tokens picks the token.
// top_k <= 0 means no cut; top_p >= 1 means no cut. Greedy rows use argmax_f32 instead.
#define THREADS 1024

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
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

extern "C" __global__ void sample_top_k_top_p_f32(const float* __restrict__ logits, u32* __restrict__ out,
                                                   const float* __restrict__ temperature,
                                                   const int* __restrict__ top_k, const float* __restrict__ top_p,
                                                   const unsigned long long* __restrict__ seed,
                                                   const unsigned long long* __restrict__ step, int vocab) {
    const int r = blockIdx.x;
    const float* row = logits + (i64)r * vocab;
    const float inv_t = 1.0f / fmaxf(temperature[r], 1e-6f);
    float m = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m);
    // p_i is recomputed where needed (no scratch buffer): exp((l - m) * inv_t).
    #define P(i) expf((row[i] - m) * inv_t)

    float lo = 0.0f, hi = 1.0f;  // the kept set is {p >= lo}; p_max == 1
    const int k = top_k[r];
    if (k > 0 && k < vocab) {
        // Largest t with count(p >= t) >= k.
        for (int it = 0; it < 48; ++it) {
            const float mid = 0.5f * (lo + hi);
            float c = 0.0f;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += P(i) >= mid ? 1.0f : 0.0f;
            c = block_sum(c);
            if (c >= (float)k) lo = mid; else hi = mid;
        }
    }
    float total = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) { const float p = P(i); total += p >= lo ? p : 0.0f; }
    total = block_sum(total);
    const float tp = top_p[r];
    if (tp < 1.0f) {
        // Largest t >= lo with mass(p >= t) >= tp * total.
        float a = lo, b = 1.0f;
        for (int it = 0; it < 48; ++it) {
            const float mid = 0.5f * (a + b);
            float s = 0.0f;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) { const float p = P(i); s += p >= mid ? p : 0.0f; }
            s = block_sum(s);
            if (s >= tp * total) a = mid; else b = mid;
        }
        lo = a;
        total = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) { const float p = P(i); total += p >= lo ? p : 0.0f; }
        total = block_sum(total);
    }
    // Inverse CDF in index order: each thread owns a contiguous chunk.
    const unsigned long long bits = splitmix64(seed[r] ^ splitmix64(step[r]));
    const float u = (float)(bits >> 40) * (1.0f / 16777216.0f) * total;
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int begin = threadIdx.x * chunk, end = min(vocab, begin + chunk);
    float mine = 0.0f;
    for (int i = begin; i < end; ++i) { const float p = P(i); mine += p >= lo ? p : 0.0f; }
    __shared__ float sums[THREADS];
    sums[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        int owner = -1;
        for (int t = 0; t < (int)blockDim.x; ++t) {
            if (owner < 0 && sums[t] > 0.0f && u < acc + sums[t]) owner = t;
            if (owner < 0) acc += sums[t];
        }
        u32 pick = 0xffffffffu;
        if (owner >= 0) {
            const int b0 = owner * chunk, e0 = min(vocab, b0 + chunk);
            for (int i = b0; i < e0 && pick == 0xffffffffu; ++i) {
                const float p = P(i);
                if (p >= lo) {
                    acc += p;
                    if (u < acc) pick = (u32)i;
                }
            }
        }
        // Rounding can leave u at the very end of the mass: take the last kept token.
        if (pick == 0xffffffffu) {
            for (int i = vocab - 1; i >= 0; --i) if (P(i) >= lo) { pick = (u32)i; break; }
        }
        out[r] = pick;
    }
    #undef P
}
