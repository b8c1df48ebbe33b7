// Window gather: copy B windows of steps out of a column ring into one batch.
//
// gather_windows: twin of gear_flow/ops/gather.py (gather_windows); Python
// wrapper gear_flow/gpu/ops/gather.py.  gather_columns (at the end) does the
// same for every column of a take in one launch.  Same arguments, same semantics:
//
//   src  uint8[cap, nb]   a column ring viewed as bytes (any dtype, any shape)
//   out  uint8[B, L, nb]  C-contiguous
//   for window b, the steps at ring positions (src_start[b] + j) mod cap,
//   0 <= j < n_valid[b], land at out[b, dst_offset[b] + j]; every other step of
//   out[b] is zeroed (head and tail padding).  A window crossing the ring's end
//   is two contiguous copies.
//
// Inputs are expected valid (0 <= src_start < cap, dst_offset >= 0,
// n_valid >= 0, dst_offset + n_valid <= L, n_valid <= cap); out-of-range values
// are clamped so that the kernel never touches memory outside src and out.
//
// `src` may be device memory or pinned (page-locked) host memory: with unified
// virtual addressing, memory from cudaHostAlloc/cudaMallocHost is mapped into
// the device's address space at the same address, so the same kernel reads it
// over the bus (zero-copy), with no staging copy.
//
// Work split: each output row (L * nb bytes) is cut into pieces of PIECE bytes;
// one warp copies one piece, grid-striding over all B * pieces.  A piece meets
// at most four regions (head zeros, first copy, wrapped copy, tail zeros).  No
// alignment is assumed (GEAR's kernel did): each region is copied with the
// widest access w in {16, 8, 4, 2, 1} bytes for which dst and src are congruent
// modulo w, after a byte-wise head that aligns dst to w, and a byte-wise tail.
// Zero fills always use 16-byte stores after their head.

typedef unsigned long long u64;

#define GATHER_WARP 32
#define GATHER_UNROLL 4
// bytes one warp moves per iteration at full width: 32 lanes x 16 B x 4
#define GATHER_PIECE (GATHER_WARP * 16 * GATHER_UNROLL)

template <typename V>
__device__ __forceinline__ void copy_words(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src,
                                           long long nw, int lane) {
    V* d = reinterpret_cast<V*>(dst);
    const V* s = reinterpret_cast<const V*>(src);
    long long w = lane;
    // several independent loads in flight before the first store
    for (; w + (GATHER_UNROLL - 1) * GATHER_WARP < nw; w += GATHER_UNROLL * GATHER_WARP) {
        V r[GATHER_UNROLL];
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; ++u) r[u] = s[w + u * GATHER_WARP];
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; ++u) d[w + u * GATHER_WARP] = r[u];
    }
    for (; w < nw; w += GATHER_WARP) d[w] = s[w];
}

// dst[0:n] = src[0:n], by the 32 lanes of one warp, any alignment.
__device__ void warp_copy(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src, long long n,
                          int lane) {
    if (n <= 0) return;
    const u64 diff = (u64)dst ^ (u64)src;  // equal low bits <=> congruent modulo w
    const int w = (diff & 15) == 0 ? 16 : (diff & 7) == 0 ? 8 : (diff & 3) == 0 ? 4 : (diff & 1) == 0 ? 2 : 1;
    long long head = (long long)((w - ((u64)dst & (u64)(w - 1))) & (u64)(w - 1));
    if (head > n) head = n;
    for (long long i = lane; i < head; i += GATHER_WARP) dst[i] = src[i];
    const long long nw = (n - head) / w;
    unsigned char* d = dst + head;
    const unsigned char* s = src + head;
    switch (w) {
        case 16:
            copy_words<uint4>(d, s, nw, lane);
            break;
        case 8:
            copy_words<uint2>(d, s, nw, lane);
            break;
        case 4:
            copy_words<unsigned int>(d, s, nw, lane);
            break;
        case 2:
            copy_words<unsigned short>(d, s, nw, lane);
            break;
        default:
            copy_words<unsigned char>(d, s, nw, lane);
            break;
    }
    for (long long i = head + nw * w + lane; i < n; i += GATHER_WARP) dst[i] = src[i];
}

// dst[0:n] = 0, by one warp.
__device__ void warp_zero(unsigned char* __restrict__ dst, long long n, int lane) {
    if (n <= 0) return;
    long long head = (long long)((16 - ((u64)dst & 15)) & 15);
    if (head > n) head = n;
    for (long long i = lane; i < head; i += GATHER_WARP) dst[i] = 0;
    const long long nw = (n - head) / 16;
    uint4* d = reinterpret_cast<uint4*>(dst + head);
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    for (long long i = lane; i < nw; i += GATHER_WARP) d[i] = z;
    for (long long i = head + nw * 16 + lane; i < n; i += GATHER_WARP) dst[i] = 0;
}

__device__ __forceinline__ long long clampll(long long x, long long lo, long long hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

// One piece of one output row: bytes [p0, min(p0 + GATHER_PIECE, L * nb)) of window
// `o` (L steps of nb bytes), for the window (s, d, n) as gather_windows takes them
// (clamped here).  Shared by gather_windows and gather_columns, so that both have
// exactly the same semantics.
__device__ __forceinline__ void gather_piece(const unsigned char* __restrict__ src, long long cap, long long nb,
                                             long long s, long long d, long long n, unsigned char* __restrict__ o,
                                             long long L, long long p0, int lane) {
    const long long row = L * nb;
    const long long p1 = p0 + GATHER_PIECE < row ? p0 + GATHER_PIECE : row;
    s = clampll(s, 0, cap > 0 ? cap - 1 : 0);
    d = clampll(d, 0, L);
    n = clampll(n, 0, L - d);
    if (n > cap) n = cap;
    const long long first = n < cap - s ? n : cap - s;
    // regions of the output row, in bytes: [0, r1) zeros, [r1, r2) from src[s],
    // [r2, r3) from src[0] (after the wrap), [r3, row) zeros
    const long long r1 = d * nb, r2 = (d + first) * nb, r3 = (d + n) * nb;
    long long a, e;
    a = p0;
    e = r1 < p1 ? r1 : p1;
    if (a < e) warp_zero(o + a, e - a, lane);
    a = r1 > p0 ? r1 : p0;
    e = r2 < p1 ? r2 : p1;
    if (a < e) warp_copy(o + a, src + s * nb + (a - r1), e - a, lane);
    a = r2 > p0 ? r2 : p0;
    e = r3 < p1 ? r3 : p1;
    if (a < e) warp_copy(o + a, src + (a - r2), e - a, lane);
    a = r3 > p0 ? r3 : p0;
    e = p1;
    if (a < e) warp_zero(o + a, e - a, lane);
}

__global__ void gather_windows(const unsigned char* __restrict__ src, long long cap, long long nb,
                               const long long* __restrict__ src_start, const long long* __restrict__ dst_offset,
                               const long long* __restrict__ n_valid, unsigned char* __restrict__ out, long long B,
                               long long L) {
    const int lane = threadIdx.x & (GATHER_WARP - 1);
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / GATHER_WARP;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) / GATHER_WARP;
    const long long row = L * nb;
    const long long pieces = (row + GATHER_PIECE - 1) / GATHER_PIECE;
    const long long total = B * pieces;
    for (long long p = warp; p < total; p += nwarps) {
        const long long b = p / pieces;
        gather_piece(src, cap, nb, src_start[b], dst_offset[b], n_valid[b], out + b * row, L,
                     (p - b * pieces) * GATHER_PIECE, lane);
    }
}

// Fused gather: every column of one take in one launch.
//
// A sample's columns share their windows but not their widths: a take of the
// reference workload is obs (1024 B a step) plus action, reward and done (8, 4
// and 1 B).  Launched per column, each small column costs a launch and a grid's
// tail (microseconds) for a few hundred kilobytes; here they are work items of
// the same grid as obs.
//
//   cols     int64[C, GATHER_DESC], per column: src address, out address,
//            cap, nb, pieces (= ceil(L * nb / GATHER_PIECE)), first work item
//            (prefix sum of B * pieces over the columns before it)
//   windows  int64[3, B]: src_start, dst_offset, n_valid (shared by every column)
//   out_c    uint8[B, L, nb_c] C-contiguous at its address
//
// Work items are (column, window, piece), numbered column by column; one warp
// copies one item (gather_piece, the per-column kernel's code), grid-striding
// over all of them.  Per column the result is exactly gather_windows's.  At most
// GATHER_MAX_COLUMNS columns per launch (the wrapper splits larger takes); the
// descriptors are staged in shared memory once per block.  Addresses may be
// device memory or pinned host memory (UVA), as for gather_windows.
#define GATHER_DESC 6
#define GATHER_MAX_COLUMNS 32

__global__ void gather_columns(const long long* __restrict__ cols, long long C,
                               const long long* __restrict__ windows, long long B, long long L) {
    __shared__ long long desc[GATHER_MAX_COLUMNS * GATHER_DESC];
    const int nc = (int)clampll(C, 0, GATHER_MAX_COLUMNS);
    for (int i = threadIdx.x; i < nc * GATHER_DESC; i += blockDim.x) desc[i] = cols[i];
    __syncthreads();
    if (nc == 0) return;
    const int lane = threadIdx.x & (GATHER_WARP - 1);
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / GATHER_WARP;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) / GATHER_WARP;
    const long long* last = desc + (nc - 1) * GATHER_DESC;
    const long long total = last[5] + B * last[4];
    for (long long p = warp; p < total; p += nwarps) {
        int c = 0;  // the column of item p: the last whose first item is <= p
        while (c + 1 < nc && p >= desc[(c + 1) * GATHER_DESC + 5]) ++c;
        const long long* k = desc + c * GATHER_DESC;
        const long long pieces = k[4];
        const long long q = p - k[5];
        if (pieces <= 0) continue;  // an empty column owns no items; never taken for one
        const long long b = q / pieces;
        const long long nb = k[3];
        const unsigned char* src = reinterpret_cast<const unsigned char*>((u64)k[0]);
        unsigned char* out = reinterpret_cast<unsigned char*>((u64)k[1]);
        gather_piece(src, k[2], nb, windows[b], windows[B + b], windows[2 * B + b], out + b * L * nb, L,
                     (q - b * pieces) * GATHER_PIECE, lane);
    }
}
