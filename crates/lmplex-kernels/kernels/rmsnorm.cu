// RMSNorm fused with the residual add, one block per token row:
//   h = x + residual (if add_residual) else x;  residual = h;
//   out = h * rsqrt(mean(h^2) + eps) * (weight + weight_offset)
// `weight_offset` is 0 for Llama/Qwen and 1 for Gemma's (1 + w). h is rounded to the storage
// type before use, as the residual stream is stored, so the CPU reference rounds the same way.
// The reduction order is fixed (block_sum over THREADS = 256), so a row's result does not depend
// on the batch; the arithmetic is explicitly rounded (no contraction left to the compiler), so
// the tile GEMM's norm prologue (tgemm.cu) repeats it bit for bit.
template <typename T>
__device__ void fused_add_rmsnorm(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                  T* __restrict__ out, int hidden, float eps, float weight_offset,
                                  int add_residual) {
    const i64 base = (i64)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float h = to_f32(x[base + i]);
        if (add_residual) h += to_f32(residual[base + i]);
        const T hs = from_f32<T>(h);
        residual[base + i] = hs;
        h = to_f32(hs);
        ss = __fmaf_rn(h, h, ss);
    }
    ss = block_sum(ss);
    const float scale = rsqrtf(ss / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = to_f32(residual[base + i]);
        out[base + i] = from_f32<T>(__fmul_rn(__fmul_rn(h, scale), __fadd_rn(to_f32(weight[i]), weight_offset)));
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void fused_add_rmsnorm_##S(const T* x, T* residual, const T* weight, T* out, \
                                                     int hidden, float eps, float weight_offset,   \
                                                     int add_residual) {                           \
        fused_add_rmsnorm<T>(x, residual, weight, out, hidden, eps, weight_offset, add_residual);  \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
