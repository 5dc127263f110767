// Rotary position embedding, in place on q and k, one block per token.
// Rows are strided (`q_stride`, `k_stride` elements per token) so q and k may be views into a
// fused qkv buffer. `inv_freq[rot_dim / 2]` is computed on the host (Llama-3 and other scalings
// live there); `neox` pairs (i, i + rot_dim/2), otherwise GPT-J pairs (2i, 2i + 1). Dimensions
// past `rot_dim` are left alone (partial rotary). Angles use sincosf (full precision).
template <typename T>
__device__ void rotate(T* __restrict__ v, int i, int rot_dim, int neox, float c, float s) {
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + rot_dim / 2 : 2 * i + 1;
    const float x = to_f32(v[a]), y = to_f32(v[b]);
    v[a] = from_f32<T>(x * c - y * s);
    v[b] = from_f32<T>(y * c + x * s);
}

template <typename T>
__device__ void rope(T* __restrict__ q, T* __restrict__ k, const i64* __restrict__ positions,
                     const float* __restrict__ inv_freq, int num_q_heads, int num_kv_heads, int head_dim,
                     int rot_dim, int q_stride, int k_stride, int neox) {
    const int t = blockIdx.x;
    const float pos = (float)positions[t];
    const int half = rot_dim / 2;
    const int n = (num_q_heads + num_kv_heads) * half;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int head = j / half, i = j % half;
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        if (head < num_q_heads) {
            rotate(q + (i64)t * q_stride + head * head_dim, i, rot_dim, neox, c, s);
        } else {
            rotate(k + (i64)t * k_stride + (head - num_q_heads) * head_dim, i, rot_dim, neox, c, s);
        }
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void rope_##S(T* q, T* k, const i64* positions, const float* inv_freq,    \
                                        int num_q_heads, int num_kv_heads, int head_dim, int rot_dim, \
                                        int q_stride, int k_stride, int neox) {                    \
        rope<T>(q, k, positions, inv_freq, num_q_heads, num_kv_heads, head_dim, rot_dim, q_stride,  \
                k_stride, neox);                                                                   \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
