// MLA attention's chunk pass in 64-row CTAs (the "wide" engine; csrc/mla_attention.cu holds the launch, the
// narrow engine and the merge both engines share). Same contract and the same row invariance as the narrow
// engine: fixed 256-key chunks by position, each an online softmax from scratch over 32-key tiles, chunks folded
// into supers and supers into the row in position order (mla_common.cuh's fold). Its own arithmetic, though:
// an engine is chosen per GPU, never per launch shape, so an AR step and a tree always share one.
//
// Why 64 rows: every row of a launch (T nodes x NH heads) reads the same prefix keys, and an MMA's output element
// never sums over other rows, so one CTA scoring 64 rows against each key tile reads the cache 4x less often than
// 16-row CTAs, and each warp's ldmatrix loads feed more MMAs.
//
// Per CTA: 8 warps; pair p = warps p and p + 4 owns rows 16 p .. 16 p + 15. Warp p scores its rows against the
// whole 32-key tile (S = Q K^T, rows as the MMA's M, Q read from shared memory by ldmatrix; two accumulator
// chains, even and odd k-steps, added at the end), so its rows' maxima and sums are warp-local; it keeps P (bf16)
// in registers as the value product's A operand for value columns 0..255 and hands P, the tile's rescale factor
// and, at a chunk's end, the fold's scales to warp p + 4 (columns 256..511) through shared memory and a pair
// barrier. One block barrier a tile (the key tile has landed; the previous tile's exchange is read).
#include "mla_common.cuh"
#include "pdl.cuh"

namespace ddt_mla {
namespace {

constexpr int kWRows = kWideRows;           // query rows per CTA: 4 pairs of warps x 16
constexpr int kWThreads = 256;              // 8 warps
constexpr int kWNT = kR / 2 / 8;            // value n8-tiles per warp (256 columns)
constexpr int kWStages = 3;                 // key tiles in flight (four do not fit beside Q's 64 rows)
// a pair's exchange: P [16][kPLd] bf16, then [3][16] floats: the tile's rescale factor, a chunk end's fold scales
constexpr int kPairBytes = kRows * kPLd * 2 + 3 * kRows * 4;
constexpr int kWSmem = kWRows * kLd * 2 + kWStages * kTileBytes + 4 * kPairBytes + kMaxT * 4;

__device__ __forceinline__ void pair_arrive(int pair) { asm volatile("bar.arrive %0, 64;" ::"r"(pair + 1) : "memory"); }
__device__ __forceinline__ void pair_sync(int pair) { asm volatile("bar.sync %0, 64;" ::"r"(pair + 1) : "memory"); }

// Two floats as a bf16x2 MMA operand register: lo in the low half (the smaller column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(const uint32_t*)&v;
}

__global__ void __launch_bounds__(kWThreads, 1) mla_wide_kernel(Args a) {
  release_dependents();
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int pair = w & 3, half = w >> 2;  // half 0 scores and takes value columns 0..255, half 1 256..511
  __nv_bfloat16* qs = (__nv_bfloat16*)smem;                         // Q [64 rows][kLd]
  __nv_bfloat16* tiles = qs + kWRows * kLd;                         // [kWStages][32 keys][kLd]
  unsigned char* xch = (unsigned char*)(tiles + kWStages * kBN * kLd);
  __nv_bfloat16* sp = (__nv_bfloat16*)(xch + pair * kPairBytes);    // the pair's P [16 rows][kPLd]
  float* sx = (float*)(xch + pair * kPairBytes + kRows * kPLd * 2);  // rescale [16], fold a [16], fold b [16]
  int* anc = (int*)(xch + 4 * kPairBytes);                          // [kMaxT]
  __shared__ int warp_count[kWThreads / 32];
  const int L = load_len(a.plen, a.plen64);
  Work wk;
  if (!decode_unit(a, blockIdx.x, kWRows, L, wk)) return;
  const int node = wk.node, lo = wk.first * kChunk;
  int hi = L;  // keys visible to this CTA's rows end here (exclusive)
  if (node >= 0) {
    hi = L + scan_ancestors(a.mask + (int64_t)node * a.Tm, a.Tm, anc, warp_count);
    if (lo >= hi) return;
  }
  auto slot_of = [&](int pos) -> int64_t { return pos < L ? pos : L + anc[pos - L]; };
  const int total = tile_count(lo, wk.nchunks, hi);
  const int limit = node >= 0 ? a.NH : a.M;  // CTA rows row0 + i with row0 + i < limit are real

  // the CTA's Q rows (zeros outside the launch) land with the first key tile
  for (int i = threadIdx.x; i < kWRows * (kD / 8); i += kWThreads) {
    const int r = i / (kD / 8), piece = i % (kD / 8), row = wk.row0 + r;
    const bool ok = row < limit;
    const int mr = ok ? (node >= 0 ? node * a.NH + row : row) : 0;
    const int t = mr / a.NH, hd = mr % a.NH;
    const __nv_bfloat16* src = piece < kR / 8 ? a.q_lat + t * a.sql_t + hd * a.sql_h + 8 * piece
                                              : a.q_pe + t * a.sqp_t + hd * a.sqp_h + 8 * (piece - kR / 8);
    cp_async16(qs + r * kLd + 8 * piece, src, ok ? 16 : 0);
  }
  for (int s = 0; s < kWStages - 1; ++s) {
    if (s < total) load_tile<kWThreads>(a, tiles + s * kBN * kLd, lo + s * kBN, hi, slot_of);
    cp_commit();
  }

  // ---- this lane's rows: g and g + 8 of the pair's 16
  const int rbase = wk.row0 + kRows * pair;
  const bool rows_here = rbase < limit;  // pair-uniform: some of the pair's rows are real
  int m_row[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = rbase + g + 8 * h;
    row_ok[h] = i < limit;
    m_row[h] = node >= 0 ? node * a.NH + i : i;
  }
  const int col0 = half * (kR / 2);
  float* out_acc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) out_acc[h] = a.part_acc + ((int64_t)wk.slot * a.M + m_row[h]) * kR + col0 + 2 * c;
  // super state (half 0; F = 8 CTAs keep its accumulators in the output slot), chunk state, value accumulators
  float fm[2] = {-INFINITY, -INFINITY}, fl[2] = {0.f, 0.f};
  float cm[2] = {-INFINITY, -INFINITY}, cl[2] = {0.f, 0.f}, acc[kWNT][4];
  const int mat = lane >> 3, r8 = lane & 7;  // ldmatrix: this lane addresses row r8 of 8x8 matrix mat

  for (int gt = 0; gt < total; ++gt) {
    if (gt % kTilesPerChunk == 0) {  // a chunk starts: its softmax from scratch
      cm[0] = cm[1] = -INFINITY;
      cl[0] = cl[1] = 0.f;
#pragma unroll
      for (int t = 0; t < kWNT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    }
    cp_wait<kWStages - 2>();
    __syncthreads();  // the tile has landed; the previous tile's exchange has been read
    {
      const int nx = gt + kWStages - 1;
      if (nx < total) load_tile<kWThreads>(a, tiles + (nx % kWStages) * kBN * kLd, lo + nx * kBN, hi, slot_of);
      cp_commit();
    }
    if (!rows_here) continue;
    const __nv_bfloat16* tile = tiles + (gt % kWStages) * kBN * kLd;
    const bool chunk_end = gt % kTilesPerChunk == kTilesPerChunk - 1 || gt == total - 1;
    uint32_t pa[2][4];  // P as the value product's A operand, keys 16 q .. 16 q + 15
    float alpha[2];
    Scales fold[2] = {{1.f, 0.f}, {1.f, 0.f}};  // set where a chunk ends
    if (half == 0) {
      // scores S [16 rows x 32 keys]: s{0,1}[j][e] is row g + 8 (e / 2), key 8 j + 2 c + (e % 2)
      float s0[4][4] = {}, s1[4][4] = {};
      const __nv_bfloat16* qa_p = qs + (kRows * pair + 8 * (mat & 1) + r8) * kLd + 8 * (mat >> 1);
      const __nv_bfloat16* kb_p = tile + (8 * (mat >> 1) + r8) * kLd + 8 * (mat & 1);
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
        uint32_t qa[4];
        ldsm_x4(qa, qa_p + 16 * s);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          uint32_t kb[4];
          ldsm_x4(kb, kb_p + 16 * jj * kLd + 16 * s);
          if (s & 1) {
            mma16816(s1[2 * jj], qa, kb[0], kb[1]);
            mma16816(s1[2 * jj + 1], qa, kb[2], kb[3]);
          } else {
            mma16816(s0[2 * jj], qa, kb[0], kb[1]);
            mma16816(s0[2 * jj + 1], qa, kb[2], kb[3]);
          }
        }
      }
      const int pos0 = lo + gt * kBN;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = __fadd_rn(s0[j][e], s1[j][e]);
          s0[j][e] = pos0 + 8 * j + 2 * c + (e & 1) < hi ? __fmul_rn(v, a.scale_log2) : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s0[j][e]);
        }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1)
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o));
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the chunk's new running max (a max: exact in any order)
        const float mn = fmaxf(cm[h], mx[h]);
        alpha[h] = exp2f(__fsub_rn(cm[h], mn));
        cm[h] = mn;
      }
      float ps[2] = {0.f, 0.f};  // the row sums: this lane's keys in order, then a fixed xor tree over c
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s0[j][e] = s0[j][e] == -INFINITY ? 0.f : exp2f(__fsub_rn(s0[j][e], cm[e >> 1]));
          if (e & 1) ps[e >> 1] = __fadd_rn(ps[e >> 1], __fadd_rn(s0[j][e - 1], s0[j][e]));
        }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1)
#pragma unroll
        for (int h = 0; h < 2; ++h) ps[h] = __fadd_rn(ps[h], __shfl_xor_sync(0xffffffffu, ps[h], o));
#pragma unroll
      for (int h = 0; h < 2; ++h) cl[h] = __fmaf_rn(cl[h], alpha[h], ps[h]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t top = pack_bf16(s0[j][0], s0[j][1]), bottom = pack_bf16(s0[j][2], s0[j][3]);
        pa[j >> 1][2 * (j & 1)] = top;
        pa[j >> 1][2 * (j & 1) + 1] = bottom;
        *(uint32_t*)(sp + g * kPLd + 8 * j + 2 * c) = top;
        *(uint32_t*)(sp + (g + 8) * kPLd + 8 * j + 2 * c) = bottom;
      }
      if (chunk_end) {
#pragma unroll
        for (int h = 0; h < 2; ++h) fold[h] = fold_stats(fm[h], fl[h], cm[h], cl[h]);
      }
      if (c == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sx[g + 8 * h] = alpha[h];
          if (chunk_end) sx[kRows + g + 8 * h] = fold[h].a, sx[2 * kRows + g + 8 * h] = fold[h].b;
        }
      }
      pair_arrive(pair);
    } else {
      pair_sync(pair);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        alpha[h] = sx[g + 8 * h];
        if (chunk_end) fold[h] = {sx[kRows + g + 8 * h], sx[2 * kRows + g + 8 * h]};
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) ldsm_x4(pa[q], sp + (8 * (mat & 1) + r8) * kPLd + 16 * q + 8 * (mat >> 1));
    }
    // x * 1 == x bit for bit, so a warp whose rows' maxima all stood skips the rescale
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int t = 0; t < kWNT; ++t) {
        acc[t][0] = __fmul_rn(acc[t][0], alpha[0]);
        acc[t][1] = __fmul_rn(acc[t][1], alpha[0]);
        acc[t][2] = __fmul_rn(acc[t][2], alpha[1]);
        acc[t][3] = __fmul_rn(acc[t][3], alpha[1]);
      }
    }
    // values: the warp's 256 columns as B (transposed ldmatrix), 16 keys a k-step in order
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const __nv_bfloat16* vp = tile + (16 * q + 8 * (mat & 1) + r8) * kLd + col0 + 8 * (mat >> 1);
#pragma unroll
      for (int t = 0; t < kWNT; t += 2) {
        uint32_t b[4];
        ldsm_x4_t(b, vp + 8 * t);
        mma16816(acc[t], pa[q], b[0], b[1]);
        mma16816(acc[t + 1], pa[q], b[2], b[3]);
      }
    }
    if (chunk_end) {
      // fold the chunk into the super state stored in the output slot; a first chunk (scale a = 0) replaces it
      // unread, as fold_acc would; each thread reads back only what it wrote
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!row_ok[h]) continue;
#pragma unroll
        for (int t = 0; t < kWNT; ++t) {
          float2 o = make_float2(0.f, 0.f);
          if (fold[h].a != 0.f) o = *(const float2*)(out_acc[h] + 8 * t);
          *(float2*)(out_acc[h] + 8 * t) =
              make_float2(fold_acc(o.x, acc[t][2 * h], fold[h]), fold_acc(o.y, acc[t][2 * h + 1], fold[h]));
        }
      }
    }
  }
  cp_wait<0>();
  // ---- the state's max and sum (its accumulators are stored)
  if (half == 0 && rows_here && c == 0) {
    const int slots = a.SH + a.NTL;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!row_ok[h]) continue;
      const int64_t r = (int64_t)wk.slot * a.M + m_row[h];
      a.part_ml[r] = fm[h];
      a.part_ml[(int64_t)slots * a.M + r] = fl[h];
    }
  }
}

}  // namespace

int wide_smem() { return kWSmem; }

int launch_wide(const Args& a, int units, cudaStream_t stream) {
  static bool opted_in = false;  // NOTE: once, so no attribute call falls inside a graph capture
  if (!opted_in) {
    const cudaError_t e = cudaFuncSetAttribute(mla_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWSmem);
    if (e != cudaSuccess) return (int)e;
    opted_in = true;
  }
  mla_wide_kernel<<<units, kWThreads, kWSmem, stream>>>(a);
  return (int)cudaGetLastError();
}

}  // namespace ddt_mla
