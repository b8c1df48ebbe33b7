// Host emulation of the small CUDA subset used by kernels/*.cu, for CPU tests.
//
// The threads of a block are fibers on one host thread (see emu::run_grid);
// blocks run one after the other; __syncthreads() switches to the next fiber
// of the block.  __shared__ variables are statics (shared by the block's
// threads; blocks never overlap).  This checks the kernels' logic and the
// Python wrappers' launches (argument order and types, grid-stride loops,
// multi-launch sequences) against the CPU twins; it says nothing about speed
// and does not model the GPU memory model beyond what a barrier gives.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <ucontext.h>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct emu_dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local emu_dim3 threadIdx;
inline thread_local emu_dim3 blockIdx;
inline emu_dim3 blockDim;
inline emu_dim3 gridDim;

// CUDA's vector types must be accessed at multiples of their size.  Here every
// copy of one checks both addresses (a plain alignas() type would make the
// compiler emit aligned SSE moves that crash the process instead); scalar
// types are checked by -fsanitize=alignment.  Faults are counted, and reported
// by emu_faults() as a test failure.
namespace emu {
void fault(const char* what, const void* p, unsigned long long align);
inline void check_align(const void* p, unsigned long long align, const char* what) {
    if (reinterpret_cast<unsigned long long>(p) & (align - 1)) fault(what, p, align);
}
}  // namespace emu

#define EMU_VECTOR_COPY(T, A)                             \
    T() = default;                                        \
    T(const T& o) { *this = o; }                          \
    T& operator=(const T& o) {                            \
        emu::check_align(this, A, #T " store");          \
        emu::check_align(&o, A, #T " load");             \
        std::memcpy(static_cast<void*>(this), &o, A);     \
        return *this;                                     \
    }

struct uint4 {
    unsigned int x, y, z, w;
    EMU_VECTOR_COPY(uint4, 16)
};
struct uint2 {
    unsigned int x, y;
    EMU_VECTOR_COPY(uint2, 8)
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
    uint4 r;
    r.x = a;
    r.y = b;
    r.z = c;
    r.w = d;
    return r;
}

inline long long __double_as_longlong(double v) {
    long long r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}
using std::isinf;

inline int atomicMax(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

namespace emu {

// The threads of a block are fibers (ucontext) run by one host thread: each
// runs until it reaches __syncthreads() or returns, then the next one; a
// barrier phase ends when every live thread of the block has reached it.  This
// is one legal CUDA schedule, deterministic and cheap enough for the
// thousands of blocks the grid-stride kernels launch.
struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;  // not zero-filled: untouched pages cost nothing
    bool done = false;
};

inline ucontext_t scheduler;
inline Fiber* fibers = nullptr;
inline unsigned current = 0;
inline const std::function<void()>* body_fn = nullptr;

inline void fiber_entry() {
    (*body_fn)();
    fibers[current].done = true;
    swapcontext(&fibers[current].ctx, &scheduler);
}

inline void run_grid(unsigned gx, unsigned bx, const std::function<void()>& body) {
    gridDim = emu_dim3{gx, 1, 1};
    blockDim = emu_dim3{bx, 1, 1};
    std::vector<Fiber> fs(bx);
    const std::size_t stack_size = 1 << 16;
    for (auto& f : fs) f.stack.reset(new char[stack_size]);
    fibers = fs.data();
    body_fn = &body;
    for (unsigned b = 0; b < gx; ++b) {
        blockIdx = emu_dim3{b, 0, 0};
        for (unsigned t = 0; t < bx; ++t) {
            Fiber& f = fs[t];
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.get();
            f.ctx.uc_stack.ss_size = stack_size;
            f.ctx.uc_link = nullptr;
            f.done = false;
            makecontext(&f.ctx, fiber_entry, 0);
        }
        unsigned live = bx;
        while (live) {  // one barrier phase per round
            live = 0;
            for (unsigned t = 0; t < bx; ++t) {
                if (fs[t].done) continue;
                current = t;
                threadIdx = emu_dim3{t, 0, 0};
                swapcontext(&scheduler, &fs[t].ctx);
                if (!fs[t].done) ++live;
            }
        }
    }
    fibers = nullptr;
    body_fn = nullptr;
}

inline void sync_block() { swapcontext(&fibers[current].ctx, &scheduler); }

template <typename... A, std::size_t... I>
void call_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*reinterpret_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

// cudaLaunchKernel's convention: args[i] points at the value of parameter i.
template <typename... A>
void launch(void (*f)(A...), unsigned gx, unsigned bx, void** args) {
    run_grid(gx, bx, [&] { call_with(f, args, std::index_sequence_for<A...>{}); });
}

}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }

// -fsanitize=alignment calls this on every misaligned access (recover mode).
// Defined here (and bound inside the library, -Wl,-Bsymbolic) to count the
// faults a GPU would take, for emu_faults() to report to Python.
namespace emu {
struct UbsanLocation {
    const char* file;
    unsigned line, column;
};
struct UbsanMismatch {
    UbsanLocation loc;
    const void* type;
    unsigned char log_alignment;
    unsigned char kind;
};
inline unsigned long long faults = 0;
inline char first_fault[256] = {0};
}  // namespace emu

inline void emu::fault(const char* what, const void* p, unsigned long long align) {
    if (emu::faults++ == 0)
        std::snprintf(emu::first_fault, sizeof emu::first_fault, "%s at %p, not %llu-byte aligned", what, p, align);
}

extern "C" void __ubsan_handle_type_mismatch_v1(void* data, void* ptr) {
    auto* d = static_cast<emu::UbsanMismatch*>(data);
    const unsigned long long align = 1ULL << d->log_alignment;
    if (ptr == nullptr || (reinterpret_cast<unsigned long long>(ptr) & (align - 1)) == 0) return;
    char what[160];
    std::snprintf(what, sizeof what, "access (%s:%u)", d->loc.file, d->loc.line);
    emu::fault(what, ptr, align);
}

extern "C" unsigned long long emu_faults(char* first, int n) {
    std::snprintf(first, n, "%s", emu::first_fault);
    const unsigned long long f = emu::faults;
    emu::faults = 0;
    emu::first_fault[0] = 0;
    return f;
}
