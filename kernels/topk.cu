// Top-k of a flat priority array (the leaves of a max tree).
//
// Twin of gear_flow/ops/maxtree.topk; Python wrapper gear_flow/gpu/ops/maxtree.py.
// Semantics (identical to the twin): the k largest entries that are not -inf,
// in descending order, ties broken by the LOWER index first; returns how many
// were found (min(k, number of entries that are not -inf)).  -0.0 and +0.0
// compare equal, as in the twin.  NaN is not a valid priority (validated
// upstream) and its position is unspecified.
//
// Algorithm: every entry gets a unique 96-bit composite key
//     hi = order-preserving uint64 image of the value,   lo = ~index (uint32)
// so that "descending key" is exactly "descending value, then ascending index".
// 1. Radix select, most significant 8-bit digit first (12 passes at most):
//    topk_histogram counts the candidates still matching the prefix per digit,
//    topk_select (one thread) picks the digit holding the k-th largest key and
//    stops early once a whole bin is taken.  The result is a threshold key with
//    exactly k keys >= it.
// 2. topk_collect writes those k (key, index) pairs in any order.
// 3. Sort the k pairs descending: topk_sort_block (one block, shared memory,
//    k <= 2048) or topk_bitonic_step launched log2(m)*(log2(m)+1)/2 times.
//    Keys are unique, so the order is fully determined.
// 4. topk_emit writes the indices and the original values.
//
// state (uint64[8]): 0 prefix_hi, 1 prefix_lo, 2 rank still wanted inside the
// current bin, 3 done flag, 4 found, 5 collect counter.  hist: uint64[256],
// zero between passes.  n must be < 2**32.

typedef unsigned long long u64;
typedef unsigned int u32;

#define TOPK_SORT_BLOCK_MAX 2048

__device__ __forceinline__ long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }

__device__ __forceinline__ long long gstride() { return (long long)gridDim.x * blockDim.x; }

__device__ __forceinline__ bool is_empty(double v) { return isinf(v) && v < 0.0; }

// Larger double -> larger key; -0.0 folded onto +0.0 (the twin compares values).
__device__ __forceinline__ u64 order_key(double v) {
    if (v == 0.0) v = 0.0;
    const u64 b = (u64)__double_as_longlong(v);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ULL);
}

__device__ __forceinline__ int digit_of(u64 hi, u32 lo, int pass) {
    return pass < 8 ? (int)((hi >> (56 - 8 * pass)) & 255u) : (int)((lo >> (24 - 8 * (pass - 8))) & 255u);
}

// do the digits above `pass` equal the prefix's?
__device__ __forceinline__ bool prefix_match(u64 hi, u32 lo, int pass, u64 phi, u32 plo) {
    if (pass < 8) {
        if (pass == 0) return true;
        const u64 mask = ~0ULL << (64 - 8 * pass);
        return (hi & mask) == (phi & mask);
    }
    if (hi != phi) return false;
    if (pass == 8) return true;
    const u32 mask = ~0u << (32 - 8 * (pass - 8));
    return (lo & mask) == (plo & mask);
}

template <typename T>
__global__ void topk_histogram(const T* __restrict__ vals, long long n, int pass, const u64* __restrict__ state,
                               u64* __restrict__ hist) {
    if (state[3]) return;  // already decided
    __shared__ u32 sh[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh[i] = 0;
    __syncthreads();
    const u64 phi = state[0];
    const u32 plo = (u32)state[1];
    for (long long j = gtid(); j < n; j += gstride()) {
        const double v = (double)vals[j];
        if (is_empty(v)) continue;
        const u64 hi = order_key(v);
        const u32 lo = ~(u32)j;
        if (prefix_match(hi, lo, pass, phi, plo)) atomicAdd(sh + digit_of(hi, lo, pass), 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        if (sh[i]) atomicAdd(hist + i, (u64)sh[i]);
}

__global__ void topk_select(int pass, long long k, u64* __restrict__ state, u64* __restrict__ hist) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (state[3]) return;  // hist stayed zero
    if (pass == 0) {
        u64 total = 0;
        for (int d = 0; d < 256; ++d) total += hist[d];
        const u64 kk = (u64)k < total ? (u64)k : total;
        state[4] = kk;
        state[2] = kk;
        if (kk == 0 || kk == total) {  // nothing, or everything: threshold 0 takes all entries
            state[0] = 0;
            state[1] = 0;
            state[3] = 1;
            for (int d = 0; d < 256; ++d) hist[d] = 0;
            return;
        }
    }
    const u64 want = state[2];
    u64 above = 0;
    int d = 255;
    for (; d > 0; --d) {
        if (above + hist[d] >= want) break;
        above += hist[d];
    }
    const u64 rank = want - above;  // wanted inside bin d, 1 <= rank <= hist[d]
    if (pass < 8)
        state[0] |= (u64)d << (56 - 8 * pass);
    else
        state[1] |= (u64)d << (24 - 8 * (pass - 8));
    state[2] = rank;
    if (rank == hist[d]) state[3] = 1;  // the whole bin is in: lower digits stay 0
    for (int i = 0; i < 256; ++i) hist[i] = 0;
}

template <typename T>
__global__ void topk_collect(const T* __restrict__ vals, long long n, u64* __restrict__ state, u64* __restrict__ key_hi,
                             u32* __restrict__ key_lo) {
    const u64 thi = state[0];
    const u32 tlo = (u32)state[1];
    const u64 found = state[4];
    if (found == 0) return;
    for (long long j = gtid(); j < n; j += gstride()) {
        const double v = (double)vals[j];
        if (is_empty(v)) continue;
        const u64 hi = order_key(v);
        const u32 lo = ~(u32)j;
        if (hi > thi || (hi == thi && lo >= tlo)) {
            const u64 pos = atomicAdd(state + 5, 1ULL);
            if (pos < found) {
                key_hi[pos] = hi;
                key_lo[pos] = lo;
            }
        }
    }
}

__device__ __forceinline__ bool key_less(u64 ahi, u32 alo, u64 bhi, u32 blo) {
    return ahi < bhi || (ahi == bhi && alo < blo);
}

// One compare-exchange step of a bitonic sort into descending order over m
// (a power of two) pairs; padding pairs are (0, 0), below every real key.
__global__ void topk_bitonic_step(u64* __restrict__ key_hi, u32* __restrict__ key_lo, long long m, long long size,
                                  long long stride) {
    for (long long t = gtid(); t < m / 2; t += gstride()) {
        const long long i = 2 * stride * (t / stride) + (t % stride);
        const long long j = i + stride;
        const bool desc = (i & size) == 0;
        const u64 ahi = key_hi[i], bhi = key_hi[j];
        const u32 alo = key_lo[i], blo = key_lo[j];
        if (desc ? key_less(ahi, alo, bhi, blo) : key_less(bhi, blo, ahi, alo)) {
            key_hi[i] = bhi;
            key_hi[j] = ahi;
            key_lo[i] = blo;
            key_lo[j] = alo;
        }
    }
}

// The whole bitonic sort in one block's shared memory (m <= TOPK_SORT_BLOCK_MAX).
__global__ void topk_sort_block(u64* __restrict__ key_hi, u32* __restrict__ key_lo, long long m) {
    __shared__ u64 shi[TOPK_SORT_BLOCK_MAX];
    __shared__ u32 slo[TOPK_SORT_BLOCK_MAX];
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        shi[i] = key_hi[i];
        slo[i] = key_lo[i];
    }
    __syncthreads();
    for (long long size = 2; size <= m; size <<= 1) {
        for (long long stride = size >> 1; stride > 0; stride >>= 1) {
            for (long long t = threadIdx.x; t < m / 2; t += blockDim.x) {
                const long long i = 2 * stride * (t / stride) + (t % stride);
                const long long j = i + stride;
                const bool desc = (i & size) == 0;
                const u64 ahi = shi[i], bhi = shi[j];
                const u32 alo = slo[i], blo = slo[j];
                if (desc ? key_less(ahi, alo, bhi, blo) : key_less(bhi, blo, ahi, alo)) {
                    shi[i] = bhi;
                    shi[j] = ahi;
                    slo[i] = blo;
                    slo[j] = alo;
                }
            }
            __syncthreads();
        }
    }
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        key_hi[i] = shi[i];
        key_lo[i] = slo[i];
    }
}

template <typename T>
__global__ void topk_emit(const T* __restrict__ vals, const u32* __restrict__ key_lo, const u64* __restrict__ state,
                          long long* __restrict__ out_idx, T* __restrict__ out_val) {
    const long long found = (long long)state[4];
    for (long long r = gtid(); r < found; r += gstride()) {
        const long long j = (long long)(~key_lo[r]);
        out_idx[r] = j;
        out_val[r] = vals[j];
    }
}
