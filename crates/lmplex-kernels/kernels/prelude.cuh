// Shared by every lmplex kernel (prepended to each source before NVRTC compiles it).
// Storage types: float (f32), __half (f16), __nv_bfloat16 (bf16); arithmetic is in f32.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef long long i64;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The raw bits of a 16-bit storage value.
__device__ __forceinline__ unsigned short bits16(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

// Two 16-bit values, low first, as one word (the fragment layout of mma.sync).
template <typename T> __device__ __forceinline__ u32 pack2(T lo, T hi) {
    return (u32)bits16(lo) | ((u32)bits16(hi) << 16);
}

#if defined(__CUDA_ARCH__)
// d += a * b for one warp on the tensor cores (PTX mma.sync.aligned.m16n8k16, sm_80 and later):
// a 16x16 in row fragments, b 16x8 in column fragments, d 16x8 in f32; the last argument picks
// the input type. The CPU build's header defines the same functions.
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b, __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b, __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Sum over a warp, in a fixed butterfly order (the same result whatever the batch).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024), fixed order.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    v = lane < nwarps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// Instantiates a templated kernel once per storage type: NAME_f32, NAME_f16, NAME_bf16.
#define LMPLEX_FOR_EACH_DTYPE(M) M(float, f32) M(__half, f16) M(__nv_bfloat16, bf16)

// -inf without <math.h> (NVRTC has no INFINITY macro).
#define NEG_INF (__int_as_float(0xff800000))
