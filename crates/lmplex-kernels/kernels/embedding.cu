// Embedding gather: out[t, :] = table[ids[t], :].
// Grid: one block per token; threads stride over `hidden`. Ids are checked against the
// vocabulary before launch; an id outside it gives a zero row rather than a wild read.
template <typename T>
__device__ void embedding(const T* __restrict__ table, const u32* __restrict__ ids, T* __restrict__ out,
                          int hidden, int vocab) {
    const int t = blockIdx.x;
    const u32 id = ids[t];
    T* row = out + (i64)t * hidden;
    if (id >= (u32)vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = from_f32<T>(0.0f);
        return;
    }
    const T* src = table + (i64)id * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = src[i];
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void embedding_##S(const T* table, const u32* ids, T* out, int hidden,  \
                                             int vocab) {                                          \
        embedding<T>(table, ids, out, hidden, vocab);                                              \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
