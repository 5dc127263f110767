// Greedy sampling on the device: out[r] = the index of the largest logit of row r (f32 logits),
// the lowest index among equal maxima (as the CPU sampler picks). One block per row; each
// thread scans a strided slice, then a fixed-order tree reduction over (value, index).
// NaN never wins (comparisons with NaN are false).
__device__ __forceinline__ void better(float& v, u32& i, float v2, u32 i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

extern "C" __global__ void argmax_f32(const float* __restrict__ logits, u32* __restrict__ out, int vocab) {
    const float* row = logits + (i64)blockIdx.x * vocab;
    float v = NEG_INF;
    u32 idx = 0xffffffffu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) better(v, idx, row[i], (u32)i);
    __shared__ float sv[1024];
    __shared__ u32 si[1024];
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float a = sv[threadIdx.x];
            u32 ai = si[threadIdx.x];
            better(a, ai, sv[threadIdx.x + s], si[threadIdx.x + s]);
            sv[threadIdx.x] = a;
            si[threadIdx.x] = ai;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0xffffffffu ? 0u : si[0];
}
