// Writes this step's keys and values into the paged cache through the slot mapping.
// Cache layout (shared with the CPU backend, per layer): [num_slots, num_kv_heads, head_dim],
// slot = block_table[pos / block_size] * block_size + pos % block_size (computed on the host).
// A negative slot (padding) writes nothing. One block per token.
template <typename T>
__device__ void reshape_and_cache(const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ k_cache,
                                  T* __restrict__ v_cache, const i64* __restrict__ slot_mapping,
                                  int num_kv_heads, int head_dim, int k_stride, int v_stride) {
    const i64 t = blockIdx.x;
    const i64 slot = slot_mapping[t];
    if (slot < 0) return;
    const int n = num_kv_heads * head_dim;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        k_cache[slot * n + i] = k[t * k_stride + i];
        v_cache[slot * n + i] = v[t * v_stride + i];
    }
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void reshape_and_cache_##S(const T* k, const T* v, T* k_cache, T* v_cache, \
                                                     const i64* slot_mapping, int num_kv_heads,    \
                                                     int head_dim, int k_stride, int v_stride) {   \
        reshape_and_cache<T>(k, v, k_cache, v_cache, slot_mapping, num_kv_heads, head_dim, k_stride, \
                             v_stride);                                                            \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
