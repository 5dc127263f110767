// Rotary position embedding, one block per token: `rope` in place on q and k; `rope_and_cache`
// (the fused path, `LMPLEX_CUDA_FUSED=1`) rotates q in place and writes the rotated k, and v as it
// is, straight into the paged cache (kv_write.cu's layout and slot mapping; a negative slot writes
// nothing), so the KV write needs no launch of its own. Its cache holds the same bits as `rope`
// followed by `reshape_and_cache`; it leaves the k columns of the qkv buffer unrotated (nothing
// after it reads them).
// Rows are strided (`q_stride`, `k_stride` elements per token) so q and k may be views into a
// fused qkv buffer. `inv_freq[rot_dim / 2]` is computed on the host (Llama-3 and other scalings
// live there); `neox` pairs (i, i + rot_dim/2), otherwise GPT-J pairs (2i, 2i + 1). Dimensions
// past `rot_dim` are left alone (partial rotary). Angles use sincosf (full precision); the
// rotation is explicitly rounded (no contraction into fma), so both kernels give the same bits.
__device__ __forceinline__ float rotated_a(float x, float y, float c, float s) {
    return __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
}
__device__ __forceinline__ float rotated_b(float x, float y, float c, float s) {
    return __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, s));
}

template <typename T>
__device__ void rotate(T* __restrict__ v, int i, int rot_dim, int neox, float c, float s) {
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + rot_dim / 2 : 2 * i + 1;
    const float x = to_f32(v[a]), y = to_f32(v[b]);
    v[a] = from_f32<T>(rotated_a(x, y, c, s));
    v[b] = from_f32<T>(rotated_b(x, y, c, s));
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

template <typename T>
__device__ void rope_and_cache(T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               T* __restrict__ k_cache, T* __restrict__ v_cache, const i64* __restrict__ slot_mapping,
                               const i64* __restrict__ positions, const float* __restrict__ inv_freq, int num_q_heads,
                               int num_kv_heads, int head_dim, int rot_dim, int q_stride, int kv_stride, int neox) {
    const int t = blockIdx.x;
    const float pos = (float)positions[t];
    const int half = rot_dim / 2;
    for (int j = threadIdx.x; j < num_q_heads * half; j += blockDim.x) {
        const int head = j / half, i = j % half;
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        rotate(q + (i64)t * q_stride + head * head_dim, i, rot_dim, neox, c, s);
    }
    const i64 slot = slot_mapping[t];
    if (slot < 0) return;
    const int n = num_kv_heads * head_dim;
    const T* kr = k + (i64)t * kv_stride;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int d = j % head_dim, base = j - d;
        v_cache[slot * n + j] = v[(i64)t * kv_stride + j];
        if (d >= rot_dim) {
            k_cache[slot * n + j] = kr[j];
            continue;
        }
        // This element's pair and its side of the rotation, as `rotate` computes it.
        const int i = neox ? d % half : d / 2;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        const float x = to_f32(kr[base + a]), y = to_f32(kr[base + b]);
        k_cache[slot * n + j] = from_f32<T>(d == a ? rotated_a(x, y, c, s) : rotated_b(x, y, c, s));
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void rope_##S(T* q, T* k, const i64* positions, const float* inv_freq,    \
                                        int num_q_heads, int num_kv_heads, int head_dim, int rot_dim, \
                                        int q_stride, int k_stride, int neox) {                    \
        rope<T>(q, k, positions, inv_freq, num_q_heads, num_kv_heads, head_dim, rot_dim, q_stride,  \
                k_stride, neox);                                                                   \
    }                                                                                              \
    extern "C" __global__ void rope_and_cache_##S(T* q, const T* k, const T* v, T* k_cache, T* v_cache, \
                                                  const i64* slot_mapping, const i64* positions,   \
                                                  const float* inv_freq, int num_q_heads,          \
                                                  int num_kv_heads, int head_dim, int rot_dim,     \
                                                  int q_stride, int kv_stride, int neox) {         \
        rope_and_cache<T>(q, k, v, k_cache, v_cache, slot_mapping, positions, inv_freq, num_q_heads, \
                          num_kv_heads, head_dim, rot_dim, q_stride, kv_stride, neox);             \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
