// Sum tree / max tree kernels.
//
// Twin of gear_flow/ops/sumtree.py (set_leaves, set_leaves_const, find,
// range_sum, ring_tail_mass) and of gear_flow/ops/maxtree.py (set_leaves);
// Python wrappers in gear_flow/gpu/ops/sumtree.py and .../maxtree.py.
//
// Layout (identical to the twins): `tree` holds 2*P doubles, P a power of two;
// tree[1] is the root, leaf i is tree[P + i], tree[0] is unused.  A parent is
// always *recomputed* from its two children (a + b for the sum tree, the
// twin's `a if a >= b else b` for the max tree), never updated by a delta, so
// after any sequence of updates every node holds exactly the value the
// sequential twin computes: results are bitwise identical, not just close.
//
// Batched leaf update, deterministic with duplicate indices.  The twin applies
// the batch in order, so for an index given several times the LAST value wins.
// Here:
//   1. tree_mark_last:    owner[idx[k]] = max k over the batch (atomicMax is
//                         commutative, so the outcome does not depend on
//                         scheduling);
//   2. tree_set_marked:   only k == owner[idx[k]] writes its leaf;
//   3. tree_reset_owner:  owner[idx[k]] = -1 again (the scratch is all -1
//                         between calls, so it never needs an O(P) memset);
//   4. tree_repair_level: for level = 1..depth, the level-th ancestor of every
//                         touched leaf is recomputed from its children.  Threads
//                         whose leaves share an ancestor write the same value to
//                         it (benign: both read children finished by the
//                         previous launch).
// or, when the batch is large compared with the tree, 4'. tree_rebuild_level
// over every node of each level (same values: the tree was consistent before).
// For small batches tree_update_block does 1-4 in a single block, one launch,
// with __syncthreads() between the phases.
//
// Indices outside [0, P) are skipped (the twin would write out of bounds; the
// Python layer validates before calling).  `use_values == 0` means "every
// leaf gets `cval`" (set_leaves_const; `values` is then never read).

struct SumOp {
    __device__ __forceinline__ static double combine(double a, double b) { return a + b; }
};

struct MaxOp {
    // the twin's tie rule: `a if a >= b else b`
    __device__ __forceinline__ static double combine(double a, double b) { return a >= b ? a : b; }
};

__device__ __forceinline__ long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }

__device__ __forceinline__ long long gstride() { return (long long)gridDim.x * blockDim.x; }

template <typename I>
__device__ __forceinline__ bool leaf_ok(I i, long long P) {
    return (long long)i >= 0 && (long long)i < P;
}

// ---- batched update, large batches: one launch per phase / level -------------------

template <typename I>
__global__ void tree_mark_last(const I* __restrict__ idx, long long n, long long P, int* __restrict__ owner) {
    for (long long k = gtid(); k < n; k += gstride()) {
        const I i = idx[k];
        if (leaf_ok(i, P)) atomicMax(owner + (long long)i, (int)k);
    }
}

template <typename I, typename T>
__global__ void tree_set_marked(double* __restrict__ tree, long long P, const I* __restrict__ idx,
                                const T* __restrict__ values, int use_values, double cval, long long n,
                                const int* __restrict__ owner) {
    for (long long k = gtid(); k < n; k += gstride()) {
        const I i = idx[k];
        if (leaf_ok(i, P) && owner[(long long)i] == (int)k)
            tree[P + (long long)i] = use_values ? (double)values[k] : cval;
    }
}

template <typename I>
__global__ void tree_reset_owner(const I* __restrict__ idx, long long n, long long P, int* __restrict__ owner) {
    for (long long k = gtid(); k < n; k += gstride()) {
        const I i = idx[k];
        if (leaf_ok(i, P)) owner[(long long)i] = -1;
    }
}

template <class Op, typename I>
__global__ void tree_repair_level(double* __restrict__ tree, long long P, const I* __restrict__ idx, long long n,
                                  int level) {
    for (long long k = gtid(); k < n; k += gstride()) {
        const I i = idx[k];
        if (!leaf_ok(i, P)) continue;
        const long long node = (P + (long long)i) >> level;
        tree[node] = Op::combine(tree[2 * node], tree[2 * node + 1]);
    }
}

// Recompute every node in [lo, hi) (one tree level) from its children.
template <class Op>
__global__ void tree_rebuild_level(double* __restrict__ tree, long long lo, long long hi) {
    for (long long node = lo + gtid(); node < hi; node += gstride())
        tree[node] = Op::combine(tree[2 * node], tree[2 * node + 1]);
}

// ---- batched update, small batches: everything in one block ------------------------

template <class Op, typename I, typename T>
__global__ void tree_update_block(double* __restrict__ tree, long long P, int depth, const I* __restrict__ idx,
                                  const T* __restrict__ values, int use_values, double cval, long long n,
                                  int* __restrict__ owner) {
    // __syncthreads() makes this block's global writes visible to its own threads.
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
        const I i = idx[k];
        if (leaf_ok(i, P)) atomicMax(owner + (long long)i, (int)k);
    }
    __syncthreads();
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
        const I i = idx[k];
        if (leaf_ok(i, P) && owner[(long long)i] == (int)k)
            tree[P + (long long)i] = use_values ? (double)values[k] : cval;
    }
    __syncthreads();
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
        const I i = idx[k];
        if (leaf_ok(i, P)) owner[(long long)i] = -1;  // repairs below never read owner
    }
    for (int level = 1; level <= depth; ++level) {
        for (long long k = threadIdx.x; k < n; k += blockDim.x) {
            const I i = idx[k];
            if (!leaf_ok(i, P)) continue;
            const long long node = (P + (long long)i) >> level;
            tree[node] = Op::combine(tree[2 * node], tree[2 * node + 1]);
        }
        __syncthreads();
    }
}

// ---- inverse CDF -----------------------------------------------------------------------

// The twin's descent, step for step (same comparisons, same subtraction), so the
// same target gives the same leaf.  Never enters a subtree of zero mass while
// the root is positive, hence never returns a zero-weight leaf.
__device__ __forceinline__ long long descend(const double* __restrict__ tree, long long P, double u) {
    long long i = 1;
    while (i < P) {
        const double left = tree[2 * i];
        if ((u < left && left > 0.0) || tree[2 * i + 1] <= 0.0) {
            i = 2 * i;
        } else {
            u -= left;
            i = 2 * i + 1;
        }
    }
    return i - P;
}

// out[k]: the leaf whose cumulative range holds targets[k] (targets in [0, tree[1])).
template <typename T>
__global__ void tree_find(const double* __restrict__ tree, long long P, const T* __restrict__ targets, long long n,
                          long long* __restrict__ out) {
    for (long long k = gtid(); k < n; k += gstride()) out[k] = descend(tree, P, (double)targets[k]);
}

// Draw n leaves with probability weight / total from n uniforms in [0, 1):
// target = uniforms[k] * tree[1], exactly the twin's `find(tree, u * tree[1], out)`.
// With want_weight != 0, out_weight[k] receives the drawn leaf's weight.
template <typename T>
__global__ void tree_sample(const double* __restrict__ tree, long long P, const T* __restrict__ uniforms, long long n,
                            long long* __restrict__ out, int want_weight, double* __restrict__ out_weight) {
    const double root = tree[1];
    for (long long k = gtid(); k < n; k += gstride()) {
        const long long leaf = descend(tree, P, (double)uniforms[k] * root);
        out[k] = leaf;
        if (want_weight) out_weight[k] = tree[P + leaf];
    }
}

// ---- mass --------------------------------------------------------------------------------

// The twin's range_sum(tree, lo, hi), same order of additions.
// The range is clamped to the leaves [0, P): no bound reads outside the tree (the twin's rule).
__device__ double range_sum(const double* __restrict__ tree, long long P, long long lo, long long hi) {
    double s = 0.0;
    lo = lo < 0 ? 0 : lo;
    hi = hi > P ? P : hi;
    long long a = lo + P;
    long long b = hi + P;
    while (a < b) {
        if (a & 1) {
            s += tree[a];
            a += 1;
        }
        if (b & 1) {
            b -= 1;
            s += tree[b];
        }
        a >>= 1;
        b >>= 1;
    }
    return s;
}

// out[k] = sum of leaves lo[k] <= i < hi[k].
__global__ void tree_range_sums(const double* __restrict__ tree, long long P, const long long* __restrict__ lo,
                                const long long* __restrict__ hi, long long n, double* __restrict__ out) {
    for (long long k = gtid(); k < n; k += gstride()) out[k] = range_sum(tree, P, lo[k], hi[k]);
}

// parts[e]: mass of the last min(k, lengths[e]) leaves of ring segment e (the
// twin's per-segment term of ring_tail_mass); summed in order by sum_in_order.
__global__ void tree_ring_tail_parts(const double* __restrict__ tree, long long P, long long capacity,
                                     const long long* __restrict__ starts, const long long* __restrict__ lengths,
                                     long long n, long long k, double* __restrict__ parts) {
    for (long long e = gtid(); e < n; e += gstride()) {
        const long long len = lengths[e];
        const long long m = k < len ? k : len;
        double t = 0.0;
        if (m > 0) {
            const long long a = (starts[e] + len - m) % capacity;
            const long long b = a + m;
            if (b <= capacity)
                t = range_sum(tree, P, a, b);
            else
                t = range_sum(tree, P, a, capacity) + range_sum(tree, P, 0, b - capacity);
        }
        parts[e] = t;
    }
}

// out[0] = ((0 + x[0]) + x[1]) + ...: the twin's sequential accumulation order.
__global__ void sum_in_order(const double* __restrict__ x, long long n, double* __restrict__ out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double s = 0.0;
    for (long long i = 0; i < n; ++i) s += x[i];
    out[0] = s;
}
