// LoRA deltas for a batch whose rows run under different adapters, every adapter of the step in
// one launch (Punica's SGMV shape): row t runs under slot s = row_slot[t] (-1: the base, no
// delta), and slot s's adapted projection is `slots[s]`: where A ([rank, in], row-major) and B
// transposed ([rank, out], row-major) start in `pool` (the resident adapters' weights, one
// buffer in the storage type, addressed by element offsets so a table holds no pointers), its
// rank and its scale (rank 0: the adapter does not adapt this projection).
//
// lora_shrink: v[t, j] = sum_i x[t, i] * A[j, i] for j < rank, 0 for the other j < max_rank.
//   Grid (rows, max_rank), blockDim.x a multiple of 32; the sum runs in each thread's stride
//   then block_sum (fixed order). v is f32, rows of max_rank.
// lora_expand: y[t, o] += scale * sum_j B[o, j] * v[t, j] over j in rank order, for o < out,
//   the sum in f32 and y rounded once to the storage type. Grid (rows, ceil(out / blockDim.x));
//   thread o reads B^T's column o (coalesced across the warp). y's rows are `ldy` apart; y may
//   point into a fused output (the k part of qkv), so a projection's delta lands in its columns.
//
// Invariants: a row's delta depends on that row, its slot and the adapter alone, in an order
// fixed by the shapes (batch invariance); base rows (slot -1) and columns past `out` are never
// written; every thread of a block reaches block_sum's barriers (no early return before it).
struct LoraSlot {
    i64 a;
    i64 bt;
    int rank;
    float scale;
};

template <typename T>
__device__ void lora_shrink(const T* __restrict__ pool, const LoraSlot* __restrict__ slots,
                            const int* __restrict__ row_slot, const T* __restrict__ x, float* __restrict__ v, int in_features, int max_rank) {
    const i64 t = blockIdx.x;
    const int j = blockIdx.y, s = row_slot[t];
    const bool live = s >= 0 && j < slots[s].rank;
    float acc = 0.0f;
    if (live) {
        const T* a = pool + slots[s].a + (i64)j * in_features;
        const T* xr = x + t * in_features;
        for (int i = threadIdx.x; i < in_features; i += blockDim.x) acc += to_f32(xr[i]) * to_f32(a[i]);
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) v[t * max_rank + j] = live ? acc : 0.0f;
}

template <typename T>
__device__ void lora_expand(const T* __restrict__ pool, const LoraSlot* __restrict__ slots,
                            const int* __restrict__ row_slot, const float* __restrict__ v, T* y, int out_features, int max_rank, int ldy) {
    const i64 t = blockIdx.x;
    const int s = row_slot[t], o = blockIdx.y * blockDim.x + threadIdx.x;
    if (s < 0 || o >= out_features) return;
    const int rank = slots[s].rank;
    if (rank == 0) return;
    const T* bt = pool + slots[s].bt;
    const float* vr = v + t * max_rank;
    float acc = 0.0f;
    for (int j = 0; j < rank; ++j) acc += to_f32(bt[(i64)j * out_features + o]) * vr[j];
    T* yr = y + t * ldy + o;
    *yr = from_f32<T>(to_f32(*yr) + slots[s].scale * acc);
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void lora_shrink_##S(const T* pool, const LoraSlot* slots, const int* row_slot, \
                                               const T* x, float* v, int in_features, int max_rank) { \
        lora_shrink<T>(pool, slots, row_slot, x, v, in_features, max_rank);                        \
    }                                                                                              \
    extern "C" __global__ void lora_expand_##S(const T* pool, const LoraSlot* slots, const int* row_slot, \
                                               const float* v, T* y, int out_features, int max_rank, \
                                               int ldy) {                                          \
        lora_expand<T>(pool, slots, row_slot, v, y, out_features, max_rank, ldy);                  \
    }
LMPLEX_FOR_EACH_DTYPE(INSTANTIATE)
