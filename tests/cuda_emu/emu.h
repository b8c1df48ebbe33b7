// Host emulation of the small CUDA subset used by kernels/*.cu, for CPU tests.
//
// Every CUDA thread of a block is a real host thread; blocks run one after the
// other; __syncthreads() is a barrier over the block's threads.  Atomics are
// real atomics, __shared__ variables are statics (shared by the block's
// threads; blocks never overlap).  This checks the kernels' logic and the
// Python wrappers' launches (argument order and types, grid-stride loops,
// multi-launch sequences) against the CPU twins; it says nothing about speed
// and does not model the GPU memory model beyond what a barrier gives.
#pragma once

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
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

struct uint4 {
    unsigned int x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

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

class Barrier {
  public:
    explicit Barrier(unsigned n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(m_);
        const unsigned long gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            ++gen_;
            cv_.notify_all();
        } else {
            cv_.wait(lk, [&] { return gen_ != gen; });
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    unsigned n_, count_ = 0;
    unsigned long gen_ = 0;
};

inline Barrier* block_barrier = nullptr;

inline void run_grid(unsigned gx, unsigned bx, const std::function<void()>& body) {
    gridDim = emu_dim3{gx, 1, 1};
    blockDim = emu_dim3{bx, 1, 1};
    Barrier bar(bx);
    block_barrier = &bar;
    std::vector<std::thread> ts;
    ts.reserve(bx);
    for (unsigned t = 0; t < bx; ++t)
        ts.emplace_back([&, t] {
            threadIdx = emu_dim3{t, 0, 0};
            for (unsigned b = 0; b < gx; ++b) {
                blockIdx = emu_dim3{b, 0, 0};
                body();
                bar.wait();  // the block ends for all its threads before the next starts
            }
        });
    for (auto& t : ts) t.join();
    block_barrier = nullptr;
}

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

inline void __syncthreads() { emu::block_barrier->wait(); }
