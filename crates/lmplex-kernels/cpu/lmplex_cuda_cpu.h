// lmplex_cuda_cpu.h: the subset of CUDA that lmplex's kernels use, executed on the CPU, so the
// unchanged `kernels/*.cu` sources compile with g++/clang++ and run against their CPU twins.
//
// Execution model (one block at a time per OS thread):
// - Every CUDA thread of a block is a fiber with its own stack; a fiber runs without
//   interruption from one synchronisation point to the next (`__syncthreads`, a warp shuffle,
//   `__syncwarp`, or the kernel's return). Fibers are reused for every block and launch; a
//   switch is a few instructions on x86-64 (ucontext's elsewhere).
// - The scheduler runs every runnable fiber of the block, in the launch's order (forward,
//   reverse, or a seeded random permutation), until each blocks; then it completes one warp
//   operation whose participating lanes (its mask, within the block) have all arrived: the
//   first such warp in the launch's order (lowest, highest, or a random one), which then runs
//   on alone until its next synchronisation point. So one warp runs ahead of the others between
//   barriers, as warps drift on a device, and a missing `__syncthreads` between warps shows.
//   `__syncthreads` is released once every thread of the block waits there. Blocks run in the
//   same order. A kernel whose result depends on the order has a race: the tests compare orders.
// - A tensor-core mma (`mma_16816`) is a warp operation of the whole warp: when its 32 lanes
//   have arrived, their fragments are gathered and the product computed in double (see
//   `complete_mma`).
// - A shuffle waits only for the lanes of its own warp, so warps that make different numbers of
//   warp reductions stay correct (unlike executors that hand control around the whole block).
// - Errors a device would hang on or leave undefined are reported instead: a `__syncthreads`
//   that some threads of the block never reach (they returned), a warp operation that a lane of
//   its mask never reaches, lanes of one operation with different masks or kinds.
// - `__shared__` is a function-local `static thread_local`: one copy per OS thread, shared by
//   the fibers of the block that thread runs, as shared memory is shared by a block.
// Invariant: the kernel sources are never edited for this layer; what they need lives here.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define warpSize 32

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

// ---- storage types -------------------------------------------------------------------------
struct __half {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short x;
};

inline float __half2float(__half h) {
    _Float16 f;
    std::memcpy(&f, &h.x, 2);
    return (float)f;
}
inline __half __float2half_rn(float x) {
    const _Float16 f = (_Float16)x;  // round to nearest even
    __half h;
    std::memcpy(&h.x, &f, 2);
    return h;
}
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t u = (uint32_t)b.x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float __uint_as_float(unsigned int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// Explicitly rounded arithmetic: this layer compiles with -ffp-contract=off, so a plain
// operation is never fused, and std::fma rounds once, as the device's fma does.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
    return a < b ? a : b;
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a > b ? a : b;
}

// ---- the executor --------------------------------------------------------------------------
namespace lmplex_cpu {

enum State : int { RUN, AT_BLOCK, AT_WARP, DONE };
enum WarpOp : int { SHFL_XOR, SHFL_DOWN, SHFL_UP, SHFL_IDX, SYNCWARP, MMA_F16, MMA_BF16 };
enum Order : int { FORWARD = 0, REVERSE = 1, RANDOM = 2 };

constexpr size_t STACK_BYTES = 256 * 1024;

// A fiber's saved context. On x86-64 a switch saves the callee-saved registers on the old stack
// and swaps stack pointers (no system call; the FP control words are never changed by a kernel,
// so they are not saved); elsewhere it is ucontext's.
#if defined(__x86_64__)
struct Ctx {
    void* sp = nullptr;
};
extern "C" void lmplex_cpu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .hidden lmplex_cpu_switch
    .type lmplex_cpu_switch, @function
lmplex_cpu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lmplex_cpu_switch, .-lmplex_cpu_switch
)");
inline void switch_ctx(Ctx* save, Ctx* load) { lmplex_cpu_switch(&save->sp, load->sp); }
// A context that starts `entry` on the stack [stack, stack + bytes): the frame
// lmplex_cpu_switch pops (six registers, then `entry` as the return address), laid out so
// `entry` starts with the stack aligned as after a call.
inline void init_ctx(Ctx* c, char* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    uint64_t* a = (uint64_t*)(top - 16);
    a[1] = 0;  // `entry`'s own return address: it never returns
    a[0] = (uint64_t)(uintptr_t)entry;
    for (int i = 1; i <= 6; ++i) a[-i] = 0;  // rbp, rbx, r12..r15
    c->sp = a - 6;
}
#else
struct Ctx {
    ucontext_t uc;
};
inline void switch_ctx(Ctx* save, Ctx* load) { swapcontext(&save->uc, &load->uc); }
inline void init_ctx(Ctx* c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

struct Fiber {
    Ctx ctx;
    char* stack = nullptr;  // STACK_BYTES plus a guard page below
    size_t color = 0;       // bytes left unused at the top of the stack (see `resume`)
    bool started = false;
    int state = DONE;
    uint3 tid{0, 0, 0};
    // The pending warp operation.
    int op = 0;
    unsigned mask = 0;
    int src = 0;  // the lane to read (computed by the caller), or -1 for none
    uint64_t val = 0, out = 0;
};

struct Exec {
    std::vector<Fiber*> fibers;
    Ctx sched;
    Fiber* cur = nullptr;
    uint3 block_idx{0, 0, 0};
    dim3 block_dim{1, 1, 1}, grid_dim{1, 1, 1};
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    char err[512] = {0};
    bool failed = false;
    ~Exec();
};

inline thread_local Exec* g_exec = nullptr;

inline void fail(const char* fmt, unsigned a = 0, unsigned b = 0, unsigned c = 0) {
    Exec* e = g_exec;
    if (!e->failed) std::snprintf(e->err, sizeof e->err, fmt, a, b, c);
    e->failed = true;
}

// Blocks the running fiber in state `s` and returns to the scheduler.
__attribute__((noinline)) inline void block_on(int s) {
    Exec* e = g_exec;
    Fiber* f = e->cur;
    f->state = s;
    asm volatile("" ::: "memory");
    switch_ctx(&f->ctx, &e->sched);
    asm volatile("" ::: "memory");
}

[[noreturn]] inline void fiber_entry() {
    for (;;) {
        Exec* e = g_exec;
        e->body(e->body_arg);
        block_on(DONE);
    }
}

inline Fiber* new_fiber() {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* mem = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    mprotect(mem, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
    Fiber* f = new (std::nothrow) Fiber();
    if (!f) {
        munmap(mem, STACK_BYTES + page);
        return nullptr;
    }
    f->stack = (char*)mem + page;
    return f;
}

inline Exec::~Exec() {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (Fiber* f : fibers) {
        munmap(f->stack - page, STACK_BYTES + page);
        delete f;
    }
}

__attribute__((noinline)) inline void resume(Exec* e, Fiber* f) {
    e->cur = f;
    f->state = RUN;
    if (!f->started) {
        f->started = true;
        // Stack tops staggered by 9 cache lines per fiber: at one page offset, every fiber's
        // frame would fall in the same cache sets and evict its neighbours at each switch.
        init_ctx(&f->ctx, f->stack, STACK_BYTES - f->color, (void (*)())fiber_entry);
    }
    switch_ctx(&e->sched, &f->ctx);
}

inline uint64_t next_random(uint64_t& s) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

// `n` indices in the launch's order.
inline void ordered(std::vector<unsigned>& idx, int order, uint64_t& rng) {
    if (order == REVERSE) {
        for (size_t i = 0; i < idx.size() / 2; ++i) std::swap(idx[i], idx[idx.size() - 1 - i]);
    } else if (order == RANDOM) {
        for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[next_random(rng) % i]);
    }
}

// One lane's operands of an mma (its `val` points here, on the lane's stack, while it waits).
struct MmaFrag {
    float* d;
    const unsigned* a;
    const unsigned* b;
};

// Completes one warp's mma.sync m16n8k16: gathers A (16x16), B (16x8) and D (16x8) from the
// fragments of the 32 lanes in the PTX ISA's layout (lane = 4 * group + q; A's registers hold
// rows group and group + 8, columns 2q, 2q + 1 and 8 more; B's, rows 2q, 2q + 1 and 8 more of
// column group; D's, rows group and group + 8, columns 2q and 2q + 1), then
// D[i][j] += sum over k of A[i][k] * B[k][j], exact products summed in k order in double and
// rounded once. The device sums in an order PTX leaves unspecified; each is one fixed order,
// which is what batch invariance needs.
inline void complete_mma(Fiber** f, bool bf16) {
    float A[16][16], B[16][8], D[16][8];
    auto v = [bf16](unsigned w, int hi) {
        const unsigned short u = hi ? (unsigned short)(w >> 16) : (unsigned short)(w & 0xffffu);
        return bf16 ? __bfloat162float(__nv_bfloat16{u}) : __half2float(__half{u});
    };
    for (int l = 0; l < 32; ++l) {
        const MmaFrag* m = (const MmaFrag*)(uintptr_t)f[l]->val;
        const int g = l >> 2, q = l & 3;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * q + h] = v(m->a[0], h);
            A[g + 8][2 * q + h] = v(m->a[1], h);
            A[g][2 * q + 8 + h] = v(m->a[2], h);
            A[g + 8][2 * q + 8 + h] = v(m->a[3], h);
            B[2 * q + h][g] = v(m->b[0], h);
            B[2 * q + 8 + h][g] = v(m->b[1], h);
            D[g][2 * q + h] = m->d[h];
            D[g + 8][2 * q + h] = m->d[2 + h];
        }
    }
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            double s = D[i][j];
            for (int k = 0; k < 16; ++k) s += (double)A[i][k] * (double)B[k][j];
            D[i][j] = (float)s;
        }
    for (int l = 0; l < 32; ++l) {
        const MmaFrag* m = (const MmaFrag*)(uintptr_t)f[l]->val;
        const int g = l >> 2, q = l & 3;
        for (int h = 0; h < 2; ++h) {
            m->d[h] = D[g][2 * q + h];
            m->d[2 + h] = D[g + 8][2 * q + h];
        }
    }
}

// Completes the warp operation of the first warp, in the launch's order, whose lanes have all
// arrived; false if none could.
inline bool settle_warps(Exec* e, unsigned n, int order, uint64_t& rng) {
    std::vector<unsigned> warps;
    for (unsigned w0 = 0; w0 < n; w0 += 32) warps.push_back(w0);
    ordered(warps, order, rng);
    for (unsigned w0 : warps) {
        if (e->failed) return false;
        const unsigned lanes = n - w0 < 32 ? n - w0 : 32;
        Fiber** f = e->fibers.data() + w0;
        int first = -1;
        for (unsigned l = 0; l < lanes; ++l)
            if (f[l]->state == AT_WARP) {
                first = (int)l;
                break;
            }
        if (first < 0) continue;
        const unsigned mask = f[first]->mask;
        const int op = f[first]->op;
        bool ready = true;
        for (unsigned l = 0; l < lanes; ++l) {
            const bool in_mask = (mask >> l) & 1u;
            if (f[l]->state == AT_WARP && (f[l]->mask != mask || f[l]->op != op))
                return fail("block (%u): warp %u: lanes wait at different warp operations or masks (lane %u)",
                            e->block_idx.x, w0 / 32, l),
                       false;
            if (f[l]->state == AT_WARP && !in_mask)
                return fail("block (%u): warp %u: lane %u is not in the mask it passed", e->block_idx.x, w0 / 32, l),
                       false;
            if (in_mask && f[l]->state != AT_WARP) {
                if (f[l]->state == RUN) {
                    ready = false;
                } else {
                    return fail("block (%u): warp %u: lane %u of the mask never reaches the warp operation "
                                "(it returned or waits at __syncthreads)",
                                e->block_idx.x, w0 / 32, l),
                           false;
                }
            }
        }
        if (!ready) continue;
        if (op == MMA_F16 || op == MMA_BF16) {
            if (lanes != 32 || mask != 0xffffffffu)
                return fail("block (%u): warp %u: an mma needs all 32 lanes of a full warp", e->block_idx.x, w0 / 32),
                       false;
            complete_mma(f, op == MMA_BF16);
        }
        for (unsigned l = 0; l < lanes; ++l) {
            if (f[l]->state != AT_WARP) continue;
            const int s = f[l]->src;
            f[l]->out = (s >= 0 && s < (int)lanes && ((mask >> s) & 1u)) ? f[s]->val : f[l]->val;
        }
        for (unsigned l = 0; l < lanes; ++l)
            if (f[l]->state == AT_WARP) f[l]->state = RUN;
        return true;
    }
    return false;
}

// Runs one block to completion; false (with `e->err`) on an error.
inline bool run_block(Exec* e, int order, uint64_t& rng) {
    const unsigned n = e->block_dim.x * e->block_dim.y * e->block_dim.z;
    while (e->fibers.size() < n) {
        Fiber* f = new_fiber();
        if (!f) return fail("cannot allocate a fiber stack"), false;
        f->color = (e->fibers.size() * 9 * 64) % 4096;
        e->fibers.push_back(f);
    }
    for (unsigned i = 0; i < n; ++i) {
        Fiber* f = e->fibers[i];
        f->state = RUN;
        f->tid = uint3{i % e->block_dim.x, (i / e->block_dim.x) % e->block_dim.y,
                       i / (e->block_dim.x * e->block_dim.y)};
    }
    std::vector<unsigned> idx;
    for (;;) {
        idx.clear();
        for (unsigned i = 0; i < n; ++i)
            if (e->fibers[i]->state == RUN) idx.push_back(i);
        if (!idx.empty()) {
            ordered(idx, order, rng);
            for (unsigned i : idx) resume(e, e->fibers[i]);
            continue;
        }
        if (settle_warps(e, n, order, rng)) continue;
        if (e->failed) return false;
        unsigned done = 0, at_block = 0;
        for (unsigned i = 0; i < n; ++i) {
            done += e->fibers[i]->state == DONE;
            at_block += e->fibers[i]->state == AT_BLOCK;
        }
        if (done == n) return true;
        if (done > 0)
            return fail("block (%u): __syncthreads reached by %u of %u threads (the others returned)", e->block_idx.x,
                        at_block, n),
                   false;
        for (unsigned i = 0; i < n; ++i) e->fibers[i]->state = RUN;
    }
}

// Abandons fibers left inside a kernel by an error: they restart from the top next time.
inline void reset(Exec* e) {
    for (Fiber* f : e->fibers) {
        f->started = false;
        f->state = DONE;
    }
    e->failed = false;
    e->err[0] = 0;
}

// The launch parameters, as Rust passes them (`lmplex_kernels::cpu::Launch`).
struct Launch {
    unsigned grid[3];
    unsigned block[3];
    int order;
    uint64_t seed;
};

inline thread_local Exec t_exec;

// Runs `body` for every thread of every block; 0 on success, else 1 with a message in `err`.
inline int run_grid(const Launch* l, void (*body)(void*), void* arg, char* err, size_t err_len) {
    Exec* e = &t_exec;
    g_exec = e;
    reset(e);
    e->body = body;
    e->body_arg = arg;
    e->grid_dim = dim3{l->grid[0], l->grid[1], l->grid[2]};
    e->block_dim = dim3{l->block[0], l->block[1], l->block[2]};
    uint64_t rng = l->seed * 2654435761u + 0x9e3779b97f4a7c15ull;
    std::vector<unsigned> blocks(l->grid[0] * l->grid[1] * l->grid[2]);
    for (unsigned i = 0; i < blocks.size(); ++i) blocks[i] = i;
    ordered(blocks, l->order, rng);
    for (unsigned b : blocks) {
        e->block_idx = uint3{b % l->grid[0], (b / l->grid[0]) % l->grid[1], b / (l->grid[0] * l->grid[1])};
        if (!run_block(e, l->order, rng)) {
            std::snprintf(err, err_len, "%s", e->err);
            reset(e);
            return 1;
        }
    }
    return 0;
}

template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

inline unsigned lane_id() {
    const Exec* e = g_exec;
    const uint3 t = e->cur->tid;
    return (t.x + e->block_dim.x * (t.y + e->block_dim.y * t.z)) & 31u;
}

template <typename T>
inline T warp_op(int op, unsigned mask, T v, int src) {
    Fiber* f = g_exec->cur;
    f->op = op;
    f->mask = mask;
    f->src = src;
    f->val = to_bits(v);
    block_on(AT_WARP);
    return from_bits<T>(f->out);
}

}  // namespace lmplex_cpu

#define threadIdx (lmplex_cpu::g_exec->cur->tid)
#define blockIdx (lmplex_cpu::g_exec->block_idx)
#define blockDim (lmplex_cpu::g_exec->block_dim)
#define gridDim (lmplex_cpu::g_exec->grid_dim)

inline void __syncthreads() { lmplex_cpu::block_on(lmplex_cpu::AT_BLOCK); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    lmplex_cpu::warp_op<int>(lmplex_cpu::SYNCWARP, mask, 0, -1);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = (int)lmplex_cpu::lane_id();
    const int src = (lane & ~(width - 1)) | ((lane % width) ^ lane_mask);
    return lmplex_cpu::warp_op<T>(lmplex_cpu::SHFL_XOR, mask, v, (lane_mask & ~(width - 1)) ? lane : src);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = (int)lmplex_cpu::lane_id();
    const int src = (lane % width) + (int)delta < width ? lane + (int)delta : lane;
    return lmplex_cpu::warp_op<T>(lmplex_cpu::SHFL_DOWN, mask, v, src);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = (int)lmplex_cpu::lane_id();
    const int src = (lane % width) >= (int)delta ? lane - (int)delta : lane;
    return lmplex_cpu::warp_op<T>(lmplex_cpu::SHFL_UP, mask, v, src);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    const int lane = (int)lmplex_cpu::lane_id();
    return lmplex_cpu::warp_op<T>(lmplex_cpu::SHFL_IDX, mask, v, (lane & ~(width - 1)) + (src_lane % width));
}

namespace lmplex_cpu {
inline void mma(int op, float* d, const unsigned* a, const unsigned* b) {
    MmaFrag m{d, a, b};
    warp_op<uint64_t>(op, 0xffffffffu, (uint64_t)(uintptr_t)&m, -1);
}
}  // namespace lmplex_cpu
inline void mma_16816(float* d, const unsigned* a, const unsigned* b, __half) {
    lmplex_cpu::mma(lmplex_cpu::MMA_F16, d, a, b);
}
inline void mma_16816(float* d, const unsigned* a, const unsigned* b, __nv_bfloat16) {
    lmplex_cpu::mma(lmplex_cpu::MMA_BF16, d, a, b);
}

namespace lmplex_cpu {
// Calls kernel `k` with its arguments read from `args` (each a pointer to the value, as
// cuLaunchKernel takes them).
template <typename... A>
struct Call {
    void (*k)(A...);
    void** args;
};
template <typename... A, size_t... I>
inline void invoke(const Call<A...>* c, std::index_sequence<I...>) {
    c->k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(c->args[I])...);
}
template <typename... A>
inline void call_body(void* p) {
    invoke(static_cast<const Call<A...>*>(p), std::index_sequence_for<A...>{});
}
template <typename... A>
inline int launch(void (*k)(A...), const Launch* l, void** args, char* err, size_t err_len) {
    Call<A...> c{k, args};
    return run_grid(l, &call_body<A...>, &c, err, err_len);
}
}  // namespace lmplex_cpu

// Exports kernel `NAME` as `lmplex_cpu_NAME(launch, args, err, err_len)` for the Rust loader.
#define LMPLEX_CPU_EXPORT(NAME)                                                                        \
    extern "C" __attribute__((visibility("default"))) int lmplex_cpu_##NAME(                           \
        const lmplex_cpu::Launch* l, void** args, char* err, size_t err_len) {                         \
        return lmplex_cpu::launch(NAME, l, args, err, err_len);                                        \
    }
