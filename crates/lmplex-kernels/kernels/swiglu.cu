// SwiGLU activation: out[t, i] = silu(gate[t, i]) * up[t, i], one block per token.
// `gate` and `up` rows are `in_stride` elements apart, so they may be the two halves of a
// fused gate_up projection ([gate | up], as Phi-3 stores it) or two separate buffers.
template <typename T>
__device__ void silu_and_mul(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                             int inter, int in_stride) {
    const i64 t = blockIdx.x;
    for (int i = threadIdx.x; i < inter; i += blockDim.x) {
        const float g = to_f32(gate[t * in_stride + i]);
        const float u = to_f32(up[t * in_stride + i]);
        out[t * inter + i] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void silu_and_mul_##S(const T* gate, const T* up, T* out, int inter,      \
                                                int in_stride) {                                   \
        silu_and_mul<T>(gate, up, out, inter, in_stride);                                          \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
