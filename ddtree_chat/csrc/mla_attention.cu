// MLA attention in the absorbed form over the 576-wide latent cache (512 value + 64 rope columns), bf16,
// row-invariant: a query's output row is computed by the same floating-point operations whatever the other
// rows of the launch are and however many there are (an AR step, a dflash block, a tree, a prefill chunk).
//
// Keys are walked in *logical position* order: the committed prefix 0..L-1 (cache slot = position), then
// the query's own ancestors (position L + depth = cache slot L + its index in the round). Positions are cut
// into fixed CHUNKs (256) and SUPERs (8 chunks); a chunk is one online softmax from scratch over 32-key
// tiles, a super is its chunks folded left to right (fold()), the row's result is its supers folded left to
// right, then normalised. Who computes what varies with the launch's shape, the arithmetic does not:
//   - a CTA holds RG groups of 16 query rows (the score MMAs' N, the value MMAs' M: an MMA output element never
//     sums over other rows) and 512/CS of the value columns (CS = 1, 2, 4 CTAs split the columns; each
//     recomputes the same scores); a group's four warps do exactly what a one-group CTA's do, the groups share
//     only the key tiles they read (RG = 2: a tile loaded once for 32 rows);
//   - a CTA either computes one chunk and stores its state, or (F = 8) a whole super, folding its chunks in
//     registers exactly as the merge would fold the stored chunk states;
//   - "shared" CTAs take chunks below L for any 16 rows; "tail" CTAs take one round node's heads and the
//     chunks from L's chunk on, reading positions >= L through the node's ancestors (its mask row).
// The merge kernel folds a row's stored states in position order; with a CTA per chunk and many chunks,
// fold_supers_kernel first folds each super's chunk states (in parallel over supers, the same folds). L is
// read from device memory, so a CUDA graph replays at any length up to the launch's bound.
//
// This file is the narrow engine (16-row groups, mma.sync, sm_90a and sm_120a), the merge and the launch;
// csrc/mla_wide.cu is the wide engine (64-row CTAs on wgmma, sm_90a) that stores the same chunk states for the
// same merge, with arithmetic of its own (ops/cuda_mla.py picks one per GPU, never per launch).
//
// Per row group: 4 warps. Scores are split by keys, keys as the MMA's M and query rows as its N (S^T = K Q^T):
// warp w takes keys 16 (w % 2) .. +15 of the 32-key tile for rows 8 (w / 2) .. +7, full 576-wide dots (its
// Q^T fragments live in registers), so one warp computes each score and no partial scores are exchanged; a
// warp whose 8 rows are all outside the launch skips them. The two key halves meet through shared memory
// twice per tile: their row maxima, then P (bf16) and their row sums. Values: warp w takes 128/CS value
// columns of all 16 rows, P read back by ldmatrix.
#include "mla_common.cuh"
#include "mma.cuh"
#include "pdl.cuh"

namespace {

using namespace ddt_mla;

constexpr int kRows = 16;                          // query rows per row group (an MMA's 16)
constexpr int kBN = 32;                            // keys per tile
constexpr int kTilesPerChunk = kChunk / kBN;
constexpr int kLd = kD + 8;                        // padded smem row (1168 B): ldmatrix rows hit distinct banks
constexpr int kTileBytes = kBN * kLd * 2;
constexpr int kKSteps = kD / 16;                   // 16-column k-steps of a score (36)
constexpr int kPLd = kBN + 8;                      // padded P row (80 B): ldmatrix rows hit distinct banks
constexpr int kWarps = 4, kThreads = kWarps * 32;  // a row group's
constexpr int kStatBytes = kRows * kPLd * 2 + 2 * 2 * kRows * 4;  // P [16][40] bf16, max and sum [2 halves][16]
// The merge: a row's 512 columns over kMergeGroups blocks of one warp x 4 columns each, so an AR step's few rows
// (8 at a TP=8 rank's 8 heads) still put several blocks' loads in flight
constexpr int kMergeThreads = 32, kMergeGroups = kR / (kMergeThreads * 4);

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Issue the cp.asyncs of one 32-key tile at positions pos0.. (keys at or past hi are zero-filled, unread) by
// NT threads, TPK = NT / 32 a key: thread i copies key i / TPK, the 16-byte pieces i % TPK + TPK j of its 1024
// value bytes and 128 rope bytes, so one slot lookup serves all its copies.
template <int NT, class SlotOf>
__device__ __forceinline__ void load_tile(const Args& a, __nv_bfloat16* dst, int pos0, int hi, SlotOf slot_of) {
  constexpr int kTPK = NT / kBN;
  static_assert(kTPK * kBN == NT && (kR / 8) % kTPK == 0, "whole keys per thread group");
  const int key = threadIdx.x / kTPK, part = threadIdx.x % kTPK, pos = pos0 + key;
  const bool ok = pos < hi;
  const int64_t slot = ok ? slot_of(pos) : 0;
  const int bytes = ok ? 16 : 0;
  const __nv_bfloat16* v = a.ckv + slot * a.s_ckv + 8 * part;
  __nv_bfloat16* d = dst + key * kLd + 8 * part;
  const __nv_bfloat16* pe = a.kpe + slot * a.s_kpe + 8 * part;
#pragma unroll
  for (int j = 0; j < kR / 8 / kTPK; ++j) cp_async16(d + 8 * kTPK * j, v + 8 * kTPK * j, bytes);
#pragma unroll
  for (int j = 0; j < (kP / 8 + kTPK - 1) / kTPK; ++j)
    if (part + kTPK * j < kP / 8) cp_async16(d + kR + 8 * kTPK * j, pe + 8 * kTPK * j, bytes);
}
// Shared memory of a chunk CTA: the key tiles, each row group's P and row statistics, the ancestor table.
__host__ __device__ constexpr int chunk_smem(int stages, int rg) {
  return stages * kTileBytes + rg * kStatBytes + kMaxT * 4;
}

template <int CS, int STAGES, int RG>
__global__ void __launch_bounds__(kThreads * RG, RG == 1 ? 2 : 1) mla_chunks_kernel(Args a) {
  release_dependents();
  constexpr int kNT = 16 / CS;  // value n8-tiles per warp
  constexpr int kThr = kThreads * RG;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int grp = w / kWarps, wl = w % kWarps;  // the warp's row group, its warp within the group
  const int kh = wl & 1, rh = wl >> 1;          // the warp's key half and row half of the score tile
  unsigned char* stats = smem + STAGES * kTileBytes;  // [RG][kStatBytes]
  __nv_bfloat16* tiles = (__nv_bfloat16*)smem;                          // [STAGES][32][kLd]
  __nv_bfloat16* sp = (__nv_bfloat16*)(stats + grp * kStatBytes);       // the group's P [16 rows][kPLd]
  float* smax = (float*)(stats + grp * kStatBytes + kRows * kPLd * 2);  // [2 key halves][16 rows]
  float* ssum = smax + 2 * kRows;                                       // [2 key halves][16 rows]
  int* anc = (int*)(stats + RG * kStatBytes);                           // [kMaxT]
  __shared__ int warp_count[kWarps * RG];
  const int cs = blockIdx.x % CS, unit = blockIdx.x / CS;
  const int L = load_len(a.plen, a.plen64);
  Work wk;
  if (!decode_unit(a, unit, kRows * RG, L, wk)) return;
  const int first = wk.first, nchunks = wk.nchunks, node = wk.node, row0 = wk.row0 + kRows * grp;
  int slot = wk.slot;  // the state's slot (F = 1: the chunk's, one on at each chunk end)
  int hi_all = L;  // keys visible to this CTA's rows end here (exclusive)
  if (node >= 0) {
    const int count = scan_ancestors(a.mask + (int64_t)node * a.Tm, a.Tm, anc, warp_count);
    hi_all = L + count;
    if (first * kChunk >= hi_all) return;
  }
  auto slot_of = [&](int pos) -> int64_t { return pos < L ? pos : L + anc[pos - L]; };

  // The CTA's tiles in position order: chunk ch = gt / 8 holds tiles 8 ch .. 8 ch + 7 (a tail CTA's one chunk
  // may hold fewer); the pipeline runs across chunk boundaries, the softmax restarts at each.
  const int hi = node >= 0 ? hi_all : L, lo = first * kChunk;
  const int total = tile_count<kBN>(lo, nchunks, hi);
  for (int s = 0; s < STAGES - 1; ++s) {  // issued before the Q loads: both latencies overlap
    if (s < total) load_tile<kThr>(a, tiles + s * kBN * kLd, lo + s * kBN, hi, slot_of);
    cp_commit();
  }

  // P and the row statistics start at zero: rows no warp scores stay finite (and are never stored)
  for (int i = threadIdx.x; i < RG * kStatBytes / 4; i += kThr) ((float*)stats)[i] = 0.f;

  // ---- this lane's value rows: g and g + 8 of the CTA's 16
  const int limit = node >= 0 ? a.NH : a.M;  // CTA rows row0 + i with row0 + i < limit are real
  int m_row[2];
  bool row_ok[2];
  for (int h = 0; h < 2; ++h) {
    const int i = row0 + g + 8 * h;
    row_ok[h] = i < limit;
    m_row[h] = node >= 0 ? node * a.NH + i : i;
  }
  // ---- Q^T fragments (the score product's B operand) of score row 8 rh + g: 36 k-steps x 2 registers, from
  // global (zeros for rows outside the launch)
  const bool scores_here = row0 + 8 * rh < limit;  // warp-uniform: some of the warp's 8 score rows are real
  uint32_t qf[kKSteps][2];
  {
    const __nv_bfloat16 *ql, *qp;
    const bool ok = q_row(a, node, row0 + 8 * rh + g, limit, ql, qp);
#pragma unroll
    for (int s = 0; s < kKSteps; ++s)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int col = 16 * s + 8 * r + 2 * c;
        qf[s][r] = ok ? *(const uint32_t*)(col < kR ? ql + col : qp + (col - kR)) : 0u;
      }
  }

  // super state (F = 8 CTAs; its accumulators live in the CTA's own output slot; F = 1, the chunk's alone) and
  // chunk state, per row g / g + 8; value accumulators of kNT n8-tiles
  float fm[2] = {-INFINITY, -INFINITY}, fl[2] = {0.f, 0.f};
  float cm[2], cl[2], acc[kNT][4];
  const int col0 = cs * (kR / CS) + wl * (128 / CS);  // the warp's first value column
  float* out_acc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) out_acc[h] = a.part_acc + ((int64_t)slot * a.M + m_row[h]) * kR + col0 + 2 * c;

  const int mat = lane >> 3, r8 = lane & 7;  // ldmatrix: this lane addresses row r8 of 8x8 matrix mat
  for (int gt = 0; gt < total; ++gt) {
    if (gt % kTilesPerChunk == 0) {  // a chunk starts: its softmax from scratch
      cm[0] = cm[1] = -INFINITY;
      cl[0] = cl[1] = 0.f;
#pragma unroll
      for (int t = 0; t < kNT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    }
    cp_wait<STAGES - 2>();
    __syncthreads();  // the tile has landed; everyone is done with the previous tile's P and statistics
    {
      const int nx = gt + STAGES - 1;
      if (nx < total) load_tile<kThr>(a, tiles + (nx % STAGES) * kBN * kLd, lo + nx * kBN, hi, slot_of);
      cp_commit();
    }
    if (gt >= kTilesPerChunk && gt % kTilesPerChunk == kTilesPerChunk - 1) {
      // a super CTA's later chunk ends with this tile: its stored super state (128 / CS columns = kNT / 4
      // lines per row) comes to L1 while the tile computes, so the fold's read-back does not wait on L2
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < (kNT + 3) / 4; ++j)
          if (row_ok[h]) asm volatile("prefetch.global.L1 [%0];" ::"l"(out_acc[h] + 32 * j));
    }
    const __nv_bfloat16* tile = tiles + (gt % STAGES) * kBN * kLd;
    const int pos0 = lo + gt * kBN;
    // scores S^T [16 keys x 8 rows]: x[e] is key 16 kh + g + 8 (e / 2), score row 8 rh + 2 c + (e % 2);
    // four accumulator chains (k-steps s % 4) added in a fixed order at the end
    float x[4] = {};
    if (scores_here) {
      float sacc[4][4] = {};
      const __nv_bfloat16* ap = tile + (16 * kh + 8 * (mat & 1) + r8) * kLd + 8 * (mat >> 1);
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
        uint32_t af[4];
        ldsm_x4(af, ap + 16 * s);
        mma_bf16(sacc[s & 3], af, qf[s][0], qf[s][1]);
      }
      float pm[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = __fadd_rn(__fadd_rn(sacc[0][e], sacc[1][e]), __fadd_rn(sacc[2][e], sacc[3][e]));
        x[e] = pos0 + 16 * kh + g + 8 * (e >> 1) < hi ? __fmul_rn(v, a.scale_log2) : -INFINITY;
      }
      pm[0] = fmaxf(x[0], x[2]);
      pm[1] = fmaxf(x[1], x[3]);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < 2; ++e) pm[e] = fmaxf(pm[e], __shfl_xor_sync(0xffffffffu, pm[e], o));
      if (g == 0) {
        smax[16 * kh + 8 * rh + 2 * c] = pm[0];
        smax[16 * kh + 8 * rh + 2 * c + 1] = pm[1];
      }
    }
    __syncthreads();  // both key halves' row maxima are in
    // the tile's max of value rows g / g + 8 (a max: exact in any order), the chunk's new running max
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float tmax = fmaxf(smax[g + 8 * h], smax[16 + g + 8 * h]);
      const float mn = fmaxf(cm[h], tmax);
      alpha[h] = exp2f(__fsub_rn(cm[h], mn));
      cm[h] = mn;
    }
    if (scores_here) {
      // the running max of score rows 8 rh + 2 c + e, from the lanes holding them as value rows (g = 2 c + e)
      const float mine = rh ? cm[1] : cm[0];
      const float mrow[2] = {__shfl_sync(0xffffffffu, mine, 8 * c), __shfl_sync(0xffffffffu, mine, 8 * c + 4)};
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = x[e] == -INFINITY ? 0.f : exp2f(__fsub_rn(x[e], mrow[e & 1]));
      __nv_bfloat16* pp = sp + (8 * rh + 2 * c) * kPLd + 16 * kh + g;
      pp[0] = __float2bfloat16_rn(p[0]);
      pp[kPLd] = __float2bfloat16_rn(p[1]);
      pp[8] = __float2bfloat16_rn(p[2]);
      pp[kPLd + 8] = __float2bfloat16_rn(p[3]);
      // the key half's row sums: keys g and g + 8 of each lane, then a fixed xor tree over g
      float ps[2] = {__fadd_rn(p[0], p[2]), __fadd_rn(p[1], p[3])};
#pragma unroll
      for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < 2; ++e) ps[e] = __fadd_rn(ps[e], __shfl_xor_sync(0xffffffffu, ps[e], o));
      if (g == 0) {
        ssum[16 * kh + 8 * rh + 2 * c] = ps[0];
        ssum[16 * kh + 8 * rh + 2 * c + 1] = ps[1];
      }
    }
    __syncthreads();  // P and both halves' row sums are in
#pragma unroll
    for (int h = 0; h < 2; ++h)
      cl[h] = __fmaf_rn(cl[h], alpha[h], __fadd_rn(ssum[g + 8 * h], ssum[16 + g + 8 * h]));
    // x * 1 == x bit for bit, so a warp whose rows' maxima all stood skips the rescale
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        acc[t][0] = __fmul_rn(acc[t][0], alpha[0]);
        acc[t][1] = __fmul_rn(acc[t][1], alpha[0]);
        acc[t][2] = __fmul_rn(acc[t][2], alpha[1]);
        acc[t][3] = __fmul_rn(acc[t][3], alpha[1]);
      }
    }
    // values: P [16 rows x 16 keys] of key half q as the A operand (ldmatrix), the warp's columns as B
    // (transposed ldmatrix)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      uint32_t pa[4];
      ldsm_x4(pa, sp + (8 * (mat & 1) + r8) * kPLd + 16 * q + 8 * (mat >> 1));
      const __nv_bfloat16* vp = tile + (16 * q + 8 * (mat & 1) + r8) * kLd + col0 + 8 * (mat >> 1);
#pragma unroll
      for (int t = 0; t < kNT; t += 2) {
        uint32_t b[4];
        ldsm_x4_t(b, vp + 8 * t);
        mma_bf16(acc[t], pa, b[0], b[1]);
        mma_bf16(acc[t + 1], pa, b[2], b[3]);
      }
    }
    if (gt % kTilesPerChunk == kTilesPerChunk - 1 || gt == total - 1) {
      // a chunk ends: fold it into the super state stored in the output slot (the first chunk folds into the
      // empty state unchanged); each thread reads back only what it wrote
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool first_chunk = fl[h] == 0.f;
        const Scales f = fold_stats(fm[h], fl[h], cm[h], cl[h]);
        if (!row_ok[h]) continue;
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          float2 o = make_float2(0.f, 0.f);
          if (!first_chunk) o = *(const float2*)(out_acc[h] + 8 * t);
          *(float2*)(out_acc[h] + 8 * t) =
              make_float2(fold_acc(o.x, acc[t][2 * h], f), fold_acc(o.y, acc[t][2 * h + 1], f));
        }
        // the state's max and sum (its accumulators are stored; a super's, again at each of its chunks)
        if (cs == 0 && wl == 0 && c == 0) store_ml(a, slot, m_row[h], fm[h], fl[h]);
      }
      next_chunk_slot(a, slot, out_acc, fm, fl);
    }
  }
  cp_wait<0>();
}

// The slot of chunk ch's state with a CTA per chunk (F = 1): shared chunks below L's chunk, then the tail's.
__device__ __forceinline__ int chunk_slot(const Args& a, int ch, int base) {
  return ch < base ? ch : a.SH + (ch - base);
}

// Pass one of the two-pass merge (F = 1): block (m, j) folds super j's chunk states of row m left to right,
// exactly as the one-pass merge folds them, and stores the super's state over its first chunk's. Block: 128
// threads x 4 columns; a super's 8 states are read at once.
__global__ void __launch_bounds__(128) mla_fold_supers_kernel(Args a) {
  release_dependents();
  __shared__ int warp_count[4];
  const int m = blockIdx.x, j = blockIdx.y, node = m / a.NH, col = threadIdx.x * 4;
  const int L = load_len(a.plen, a.plen64);
  const int count = scan_ancestors(a.mask + (int64_t)node * a.Tm, a.Tm, nullptr, warp_count);
  const int nch = (L + count - 1) / kChunk + 1, base = L / kChunk;
  if (j * kSuper >= nch) return;
  const int n = min(kSuper, nch - j * kSuper), slots = a.SH + a.NTL;
  float4 v[kSuper];
  float ms[kSuper], ls[kSuper];
#pragma unroll
  for (int b = 0; b < kSuper; ++b) {
    if (b < n) {
      const int64_t r = (int64_t)chunk_slot(a, j * kSuper + b, base) * a.M + m;
      v[b] = *(const float4*)(a.part_acc + r * kR + col);
      ms[b] = a.part_ml[r];
      ls[b] = a.part_ml[(int64_t)slots * a.M + r];
    }
  }
  float sm = -INFINITY, sl = 0.f, sacc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int b = 0; b < kSuper; ++b) {
    if (b >= n) break;
    const Scales f = fold_stats(sm, sl, ms[b], ls[b]);
    sacc[0] = fold_acc(sacc[0], v[b].x, f);
    sacc[1] = fold_acc(sacc[1], v[b].y, f);
    sacc[2] = fold_acc(sacc[2], v[b].z, f);
    sacc[3] = fold_acc(sacc[3], v[b].w, f);
  }
  __syncthreads();  // every thread has read the first chunk's max and sum before thread 0 overwrites them
  const int64_t r = (int64_t)chunk_slot(a, j * kSuper, base) * a.M + m;
  *(float4*)(a.part_acc + r * kR + col) = make_float4(sacc[0], sacc[1], sacc[2], sacc[3]);
  if (threadIdx.x == 0) {
    a.part_ml[r] = sm;
    a.part_ml[(int64_t)slots * a.M + r] = sl;
  }
}

// Row m's stored states folded in position order (chunks into supers, supers into the row), normalised;
// after fold_supers_kernel the states are the supers' (each folds into an empty super state unchanged).
// Block (m, g): one warp x 4 columns of row m's column group g (every column folds alone: the grouping moves
// no operation). The states are read 16 at a time ahead of their folds (the loads of a batch overlap; the
// folds stay in order).
__global__ void __launch_bounds__(kMergeThreads) mla_merge_kernel(Args a, __nv_bfloat16* __restrict__ out) {
  release_dependents();
  constexpr int kBatch = 16;
  __shared__ int warp_count[kMergeThreads / 32];
  const int m = blockIdx.x, node = m / a.NH, col = (blockIdx.y * kMergeThreads + threadIdx.x) * 4;
  const int L = load_len(a.plen, a.plen64);
  const int count = scan_ancestors(a.mask + (int64_t)node * a.Tm, a.Tm, nullptr, warp_count);
  const int nch = (L + count - 1) / kChunk + 1, base = L / kChunk, nsf = L / (kChunk * kSuper);
  const int slots = a.SH + a.NTL;
  // the row's states in order: with F = 8 one per full super, then the chunks from the first partial super on
  const int stored = a.F == kSuper ? nsf : 0;
  const int n_states = a.two_pass ? (nch - 1) / kSuper + 1 : stored + nch - stored * kSuper;
  float tm = -INFINITY, tl = 0.f, tacc[4] = {0.f, 0.f, 0.f, 0.f};
  float sm = -INFINITY, sl = 0.f, sacc[4] = {0.f, 0.f, 0.f, 0.f};
  int super_of_state = 0;
  for (int k0 = 0; k0 < n_states; k0 += kBatch) {
    float4 v[kBatch];
    float ms[kBatch], ls[kBatch];
    int sup[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int k = k0 + b;
      int slot = 0;
      if (a.two_pass) {
        slot = chunk_slot(a, k * kSuper, base), sup[b] = k;
      } else if (k < stored) {
        slot = k, sup[b] = k;
      } else {
        const int ch = stored * kSuper + (k - stored);
        sup[b] = ch / kSuper;
        slot = ch < base ? (a.F == kSuper ? a.NSU + (ch - nsf * kSuper) : ch) : a.SH + (ch - base);
      }
      const int64_t r = (int64_t)slot * a.M + m;
      if (k < n_states) {
        v[b] = *(const float4*)(a.part_acc + r * kR + col);
        ms[b] = a.part_ml[r];
        ls[b] = a.part_ml[(int64_t)slots * a.M + r];
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (k0 + b >= n_states) break;
      if (sup[b] != super_of_state) {  // a super is complete: into the row's state
        const Scales f = fold_stats(tm, tl, sm, sl);
        for (int e = 0; e < 4; ++e) tacc[e] = fold_acc(tacc[e], sacc[e], f);
        sm = -INFINITY, sl = 0.f;
        for (int e = 0; e < 4; ++e) sacc[e] = 0.f;
        super_of_state = sup[b];
      }
      const Scales f = fold_stats(sm, sl, ms[b], ls[b]);
      sacc[0] = fold_acc(sacc[0], v[b].x, f);
      sacc[1] = fold_acc(sacc[1], v[b].y, f);
      sacc[2] = fold_acc(sacc[2], v[b].z, f);
      sacc[3] = fold_acc(sacc[3], v[b].w, f);
    }
  }
  const Scales f = fold_stats(tm, tl, sm, sl);
  for (int e = 0; e < 4; ++e) tacc[e] = fold_acc(tacc[e], sacc[e], f);
  const int t = m / a.NH, hd = m % a.NH;
  __nv_bfloat16* o = out + ((int64_t)t * a.NH + hd) * kR + col;
  for (int e = 0; e < 4; ++e) o[e] = __float2bfloat16_rn(__fdiv_rn(tacc[e], tl));
}

template <int CS, int STAGES, int RG>
int launch_chunks(const Args& a, int grid, cudaStream_t stream) {
  constexpr int smem = chunk_smem(STAGES, RG);
  static bool opted_in = false;  // NOTE: once per kernel, so no attribute call falls inside a graph capture
  if (!opted_in) {
    cudaError_t e =
        cudaFuncSetAttribute(mla_chunks_kernel<CS, STAGES, RG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    opted_in = true;
  }
  mla_chunks_kernel<CS, STAGES, RG><<<grid * CS, kThreads * RG, smem, stream>>>(a);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" {

// Shared memory one chunk CTA of `rg` row groups needs at `stages` pipeline stages (the launcher checks it
// against the GPU).
int ddt_mla_smem_bytes(int stages, int rg) { return chunk_smem(stages, rg); }

// Shared memory one 64-row CTA (csrc/mla_wide.cu) needs.
int ddt_mla_wide_smem_bytes() { return wide_smem(); }

// The shared memory a block may opt into on `device` (0 if the query fails).
int ddt_mla_smem_optin(int device) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? v : 0;
}

// The shared memory one SM holds on `device` (0 if the query fails): how many CTAs share it (the plan's wave).
int ddt_mla_smem_per_sm(int device) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess ? v : 0;
}

// q_lat [T, NH, 512], q_pe [T, NH, 64] (bf16, unit column stride), ckv/kpe rows of the cache, plen [1] (int32
// or int64), mask [T, Tm] uint8 (this launch's rows of a round of Tm nodes, which may come in several launches),
// part_acc [(SH + NTL) * M * 512] and part_ml [2 * (SH + NTL) * M] float32 scratch (M = T * NH), out [T, NH, 512]
// bf16. F: 1 or 8 chunks per super CTA; cs: 1, 2 or 4 CTAs per column set; stages: 2 or 4; rg: 1 or 2 row
// groups of 16 a CTA (2 only with cs = 1); wide: csrc/mla_wide.cu's 64-row CTAs instead (cs = rg = 1, its own
// stages).
int ddt_mla_attention(const void* q_lat, const void* q_pe, const void* ckv, const void* kpe, const void* plen,
                      int plen64, const void* mask, void* part_acc, void* part_ml, void* out, int64_t sql_t,
                      int64_t sql_h, int64_t sqp_t, int64_t sqp_h, int64_t s_ckv, int64_t s_kpe, int T, int Tm, int NH,
                      int F, int NSU, int SH, int NTL, int FC, int cs, int stages, int rg, int wide, float scale_log2,
                      void* stream_) {
  if (T < 1 || Tm < T || Tm > kMaxT || (F != 1 && F != kSuper) || (cs != 1 && cs != 2 && cs != 4) ||
      (!wide && stages != 2 && stages != 4) || (rg != 1 && rg != 2) || (rg == 2 && cs != 1) ||
      (wide && (rg != 1 || cs != 1)) || FC < 1 || (FC != 1 && F != 1))
    return (int)cudaErrorInvalidValue;
  cudaStream_t stream = (cudaStream_t)stream_;
  Args a{(const __nv_bfloat16*)q_lat, (const __nv_bfloat16*)q_pe, (const __nv_bfloat16*)ckv, (const __nv_bfloat16*)kpe,
         plen, (const uint8_t*)mask, (float*)part_acc, (float*)part_ml, sql_t, sql_h, sqp_t, sqp_h, s_ckv, s_kpe,
         T, Tm, NH, T * NH, plen64, F, NSU, SH, NTL, 0, 0, FC, 0, scale_log2};
  const int rows = wide ? kWideRows : kRows * rg;  // query rows a CTA holds
  a.RB = (a.M + rows - 1) / rows;
  a.HB = (NH + rows - 1) / rows;
  const int units = (F == kSuper ? (NSU + kSuper - 1) * a.RB : (SH + FC - 1) / FC * a.RB) + T * NTL * a.HB;
  int rc;
  if (wide)
    rc = launch_wide(a, units, stream);
  else if (rg == 2)
    rc = stages == 2 ? launch_chunks<1, 2, 2>(a, units, stream) : launch_chunks<1, 4, 2>(a, units, stream);
  else if (stages == 2)
    rc = cs == 1 ? launch_chunks<1, 2, 1>(a, units, stream) : cs == 2 ? launch_chunks<2, 2, 1>(a, units, stream)
                                                                      : launch_chunks<4, 2, 1>(a, units, stream);
  else
    rc = cs == 1 ? launch_chunks<1, 4, 1>(a, units, stream) : cs == 2 ? launch_chunks<2, 4, 1>(a, units, stream)
                                                                      : launch_chunks<4, 4, 1>(a, units, stream);
  if (rc != 0) return rc;
  // a chunk per CTA and more than two supers' worth of chunk slots per row: the supers fold in parallel
  // first, so the row's serial fold reads one state per super instead of one per chunk
  a.two_pass = F == 1 && SH + NTL > 2 * kSuper;
  if (a.two_pass) {
    mla_fold_supers_kernel<<<dim3(a.M, (SH + NTL + kSuper - 1) / kSuper), 128, 0, stream>>>(a);
    rc = (int)cudaGetLastError();
    if (rc != 0) return rc;
  }
  mla_merge_kernel<<<dim3(a.M, kMergeGroups), kMergeThreads, 0, stream>>>(a, (__nv_bfloat16*)out);
  return (int)cudaGetLastError();
}

}  // extern "C"
