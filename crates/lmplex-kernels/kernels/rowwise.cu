// Small row-wise kernels of the forward pass, one block per token row.
//
// add_bias: x[t, i] += bias[i] over `width` columns (q/k/v biases of Qwen2).
// rmsnorm_heads: per-head RMSNorm in place (Qwen3's q_norm / k_norm) on `heads` consecutive
//   head vectors of `head_dim` starting at column `col0` of rows `row_stride` elements apart,
//   so it runs on the q or k part of a fused qkv buffer. Grid (tokens, heads); blockDim.x a
//   multiple of 32. The sum of squares uses block_sum (fixed order), so a row's result does not
//   depend on the batch; the input is read before any output is written (one pass to reduce,
//   a second to scale), so in-place is safe.
template <typename T>
__device__ void add_bias(T* __restrict__ x, const T* __restrict__ bias, int width) {
    T* row = x + (i64)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] = from_f32<T>(to_f32(row[i]) + to_f32(bias[i]));
}

template <typename T>
__device__ void rmsnorm_heads(T* x, const T* __restrict__ weight, int row_stride, int col0, int head_dim, float eps) {
    T* v = x + (i64)blockIdx.x * row_stride + col0 + (i64)blockIdx.y * head_dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float a = to_f32(v[i]);
        ss += a * a;
    }
    ss = block_sum(ss);
    const float scale = rsqrtf(ss / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = from_f32<T>(to_f32(v[i]) * scale * to_f32(weight[i]));
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void add_bias_##S(T* x, const T* bias, int width) { add_bias<T>(x, bias, width); } \
    extern "C" __global__ void rmsnorm_heads_##S(T* x, const T* weight, int row_stride, int col0,   \
                                                 int head_dim, float eps) {                        \
        rmsnorm_heads<T>(x, weight, row_stride, col0, head_dim, eps);                              \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
