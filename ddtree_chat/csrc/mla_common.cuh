// Pieces both MLA chunk kernels share (csrc/mla_attention.cu: the narrow one and the merge; csrc/mla_wide.cu:
// 64-row CTAs): the fixed positions' constants, the cp.async wrappers, the fold of two softmax
// states, the ancestor scan, the launch's arguments and which chunks and rows a CTA takes. A row's arithmetic is
// each kernel's own; what they share here moves no floating-point operation.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

namespace ddt_mla {

constexpr int kR = 512, kP = 64, kD = kR + kP;  // value, rope, key width
constexpr int kChunk = 256, kSuper = 8;           // keys per chunk, chunks per super (fixed by position)
constexpr int kMaxT = 1024;                        // round nodes a launch may hold (the ancestor table)

// 16 bytes global -> shared; bytes = 0 writes zeros and reads nothing (unused or poisoned slots stay unread).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// The one fold of two unnormalised softmax states (running max m, sum l, accumulators), the second after
// the first; an empty side (sum 0) leaves the other unchanged, bit for bit. Explicit roundings: the CTA's
// register fold and the merge's fold of stored states are the same operations.
struct Scales {
  float a, b;
};
__device__ __forceinline__ Scales fold_stats(float& m, float& l, float ms, float ls) {
  if (ls == 0.f) return {1.f, 0.f};
  if (l == 0.f) {
    m = ms;
    l = ls;
    return {0.f, 1.f};
  }
  const float mx = fmaxf(m, ms);
  const float a = exp2f(__fsub_rn(m, mx)), b = exp2f(__fsub_rn(ms, mx));
  m = mx;
  l = __fmaf_rn(l, a, __fmul_rn(ls, b));
  return {a, b};
}
__device__ __forceinline__ float fold_acc(float acc, float accs, Scales s) {
  if (s.b == 0.f) return acc;
  if (s.a == 0.f) return accs;
  return __fmaf_rn(acc, s.a, __fmul_rn(accs, s.b));
}

// Round node `node`'s ancestors in index order (their rank = depth): anc[rank] = index; returns the count
// (depth + 1). The mask row is [T] bytes; ancestors precede descendants in a round's numbering.
__device__ inline int scan_ancestors(const uint8_t* __restrict__ mask_row, int T, int* anc, int* warp_count) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int running = 0;
  for (int s0 = 0; s0 < T; s0 += blockDim.x) {
    const int j = s0 + threadIdx.x;
    const bool bit = j < T && mask_row[j] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, bit);
    if (lane == 0) warp_count[wid] = __popc(ballot);
    __syncthreads();
    int before = running;
    for (int w = 0; w < wid; ++w) before += warp_count[w];
    if (bit && anc != nullptr) anc[before + __popc(ballot & ((1u << lane) - 1u))] = j;
    for (int w = 0; w < nw; ++w) running += warp_count[w];
    __syncthreads();
  }
  return running;
}

struct Args {
  const __nv_bfloat16* q_lat;  // [T, NH, 512] (row strides sql_t, sql_h)
  const __nv_bfloat16* q_pe;   // [T, NH, 64]
  const __nv_bfloat16* ckv;    // [S, 512] row stride s_ckv
  const __nv_bfloat16* kpe;    // [S, 64] row stride s_kpe
  const void* plen;            // [1] int32 or int64: committed prefix length L
  const uint8_t* mask;         // [T, Tm] this launch's rows of the round's ancestor mask (self included)
  float* part_acc;             // [slots, M, 512] unnormalised states
  float* part_ml;              // [2, slots, M] their running max, then their sum
  int64_t sql_t, sql_h, sqp_t, sqp_h, s_ckv, s_kpe;
  int T, Tm, NH, M, plen64;   // this launch's nodes, the mask's row length (the round's nodes), heads, rows
  int F, NSU, SH, NTL, RB, HB;  // chunks per super CTA (1 or 8), super slots, shared slots, tail slots/node
  int FC;                       // F = 1: shared chunks a CTA takes in turn, each its own state
  int two_pass;                 // F = 1 with many chunks: supers folded in parallel first (fold_supers_kernel)
  float scale_log2;
};

__device__ __forceinline__ int load_len(const void* p, int is64) {
  return is64 ? (int)*(const int64_t*)p : *(const int*)p;
}

// Query row `row` of a CTA (rows of the launch's M, or node's heads): its latent and rope parts; ok is false
// (and the pointers those of row 0) for rows past `limit`, which a CTA fills with zeros.
__device__ __forceinline__ bool q_row(const Args& a, int node, int row, int limit, const __nv_bfloat16*& ql,
                                      const __nv_bfloat16*& qp) {
  const bool ok = row < limit;
  const int mr = ok ? (node >= 0 ? node * a.NH + row : row) : 0;
  const int t = mr / a.NH, hd = mr % a.NH;
  ql = a.q_lat + t * a.sql_t + hd * a.sql_h;
  qp = a.q_pe + t * a.sqp_t + hd * a.sqp_h;
  return ok;
}

// What a chunk CTA computes: the chunks first .. first + nchunks - 1 (from position first * kChunk), folded into
// state slot `slot` (F = 8), or each chunk stored alone in slots slot, slot + 1, ... (F = 1), for CTA rows row0 ..
// row0 + rows - 1 (node < 0: rows of the launch's M = T x NH; else the heads of round node `node`, reading
// positions >= L through its ancestors).
struct Work {
  int first, nchunks, slot, node, row0;
};

// Unit u of the launch (a CTA, or CS CTAs splitting the value columns): super CTAs (F = 8), shared chunk CTAs (FC
// chunks each with F = 1), then tail CTAs (one node's heads from L's chunk on); false where the unit has nothing to
// do at this L.
__device__ __forceinline__ bool decode_unit(const Args& a, int unit, int rows, int L, Work& w) {
  const int nsf = L / (kChunk * kSuper), base = L / kChunk;
  const int n_super_units = a.F == kSuper ? a.NSU * a.RB : 0;
  const int n_shared_units = a.F == kSuper ? (kSuper - 1) * a.RB : (a.SH + a.FC - 1) / a.FC * a.RB;
  w.node = -1;
  if (unit < n_super_units) {
    const int s = unit / a.RB;
    w.row0 = (unit % a.RB) * rows, w.first = s * kSuper, w.nchunks = kSuper, w.slot = s;
    return s < nsf;
  }
  if (unit < n_super_units + n_shared_units) {
    const int u = unit - n_super_units, k = (u / a.RB) * (a.F == kSuper ? 1 : a.FC);
    w.row0 = (u % a.RB) * rows, w.first = (a.F == kSuper ? nsf * kSuper : 0) + k;
    w.nchunks = a.F == kSuper ? 1 : min(a.FC, base - w.first);  // NOTE: shared chunks end below L's chunk
    w.slot = (a.F == kSuper ? a.NSU : 0) + k;
    return w.first < base;
  }
  const int u = unit - n_super_units - n_shared_units;
  w.node = u / (a.NTL * a.HB);
  const int it = (u / a.HB) % a.NTL;
  w.row0 = (u % a.HB) * rows, w.first = base + it, w.nchunks = 1, w.slot = a.SH + it;
  return w.node < a.T;
}

// A state's max and sum for row m in slot `slot` (its accumulators are the CTA's to store).
__device__ __forceinline__ void store_ml(const Args& a, int slot, int m, float mx, float l) {
  const int64_t r = (int64_t)slot * a.M + m;
  a.part_ml[r] = mx;
  a.part_ml[(int64_t)(a.SH + a.NTL) * a.M + r] = l;
}

// After a chunk's state is stored: with F = 1 the CTA's next chunk starts from an empty state in the next slot
// (the rows' accumulator pointers one slot on); a super CTA (F = 8) keeps folding into its one slot.
__device__ __forceinline__ void next_chunk_slot(const Args& a, int& slot, float* (&out_acc)[2], float (&fm)[2],
                                                float (&fl)[2]) {
  if (a.F == kSuper) return;
  ++slot;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    out_acc[h] += (int64_t)a.M * kR;
    fm[h] = -INFINITY, fl[h] = 0.f;
  }
}

// The BN-key tiles of a CTA's chunks from position lo up to hi (exclusive): whole chunks, the last one cut at hi.
template <int BN>
__device__ __forceinline__ int tile_count(int lo, int nchunks, int hi) {
  return (nchunks - 1) * (kChunk / BN) + (min(lo + nchunks * kChunk, hi) - lo - (nchunks - 1) * kChunk + BN - 1) / BN;
}

// 64-row CTAs (csrc/mla_wide.cu): the dynamic shared memory one takes, and the launch of `units` of them.
constexpr int kWideRows = 64;  // its query rows a CTA
int wide_smem();
int launch_wide(const Args& a, int units, cudaStream_t stream);

}  // namespace ddt_mla
