// MLA attention's chunk pass in 64-row CTAs on Hopper's warpgroup MMA (the "wide" engine, sm_90a only;
// csrc/mla_attention.cu holds the launch, the 16-row "narrow" engine and the merge both engines share). Same
// contract and the same row invariance as the narrow engine: fixed 256-key chunks by position, each an online
// softmax from scratch over 32-key tiles, chunks folded into supers and supers into the row in position order
// (mla_common.cuh's fold). Its own arithmetic, though: the engine is chosen per GPU, never per launch shape, so
// an AR step and a tree always share one.
//
// Why: every row of a launch (T nodes x NH heads) reads the same prefix keys, and an MMA's output element never
// sums over other rows, so a CTA scoring 64 rows against each key tile reads the cache once for 64 rows, and
// wgmma reads its operands straight from shared memory (mma.sync's per-warp ldmatrix traffic was the limit).
//
// Per CTA: two warpgroups over the same 64 rows; warpgroup h takes value columns 256 h .. 256 h + 255. Each
// computes the tile's scores S [64 rows x 32 keys] = Q K^T itself (36 wgmma k-steps from shared memory; the same
// instructions in both, so the same bits) and its rows' softmax in registers (warp w of a group holds rows
// 16 w + g and 16 w + g + 8, as mma.sync's fragments), then O += P V with P (bf16) as the register A operand and
// the tile's value columns as B. No exchange between the groups: one block barrier a tile (the tile has landed).
//
// Shared memory (no swizzle, wgmma's canonical layouts): a tile of R rows x 576 columns is stored column-chunk
// major, chunk ch (columns 8 ch .. 8 ch + 7) holding its R rows of 16 bytes contiguously. Then 8 rows x one chunk
// is a contiguous 128-byte core matrix: as a K-major operand (Q, and K for the scores) the next 8 rows are 128 B
// on (SBO) and the next chunk R x 16 B on (LBO); as the N-major B of the values (keys as K, columns as N) the
// next 8 keys are 128 B on (LBO) and the next 8 columns a chunk on (SBO).
#include "mla_common.cuh"
#include "pdl.cuh"

namespace ddt_mla {
namespace {

constexpr int kWRows = kWideRows;   // query rows per CTA
constexpr int kWThreads = 256;      // two warpgroups
constexpr int kWStages = 4;         // key tiles in flight
constexpr int kWTileBytes = kBN * kD * 2;
constexpr int kWSmem = kWRows * kD * 2 + kWStages * kWTileBytes + kMaxT * 4;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kChunks = kD / 8;  // 16-byte column chunks of a row (72)

// A shared-memory matrix descriptor without swizzle: start address, LBO, SBO (bytes, 16-byte units).
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Registers an in-flight wgmma writes: no ordinary instruction may move across the fence/wait around them.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d [64 x 32] (+)= A [64 x 16] B [16 x 32], both K-major in shared memory.
__device__ __forceinline__ void wgmma_scores(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

// d [64 x 256] += A [64 x 16] (registers, bf16x2) B [16 x 256] (N-major in shared memory).
__device__ __forceinline__ void wgmma_values(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Two floats as a bf16x2 MMA operand register: lo in the low half (the smaller column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(const uint32_t*)&v;
}

// cp.asyncs of 32 keys from position pos0 (zeros at or past hi) into the column-chunk-major tile: thread i takes
// key (i % 64) / 2 and the chunks of parity i % 2 in pairs i / 64 + 4 j, so a warp writes 16 keys x 2 chunks
// (no bank conflict) and a thread pair reads a key's 32 contiguous bytes.
template <class SlotOf>
__device__ __forceinline__ void load_keys(const Args& a, __nv_bfloat16* dst, int pos0, int hi, SlotOf slot_of) {
  const int key = (threadIdx.x & 63) >> 1, par = threadIdx.x & 1, pos = pos0 + key;
  const bool ok = pos < hi;
  const int64_t slot = ok ? slot_of(pos) : 0;
  const __nv_bfloat16* v = a.ckv + slot * a.s_ckv;
  const __nv_bfloat16* pe = a.kpe + slot * a.s_kpe;
#pragma unroll
  for (int j = 0; j < kChunks / 2 / 4; ++j) {
    const int ch = 2 * ((threadIdx.x >> 6) + 4 * j) + par;
    cp_async16(dst + ch * (kBN * 8) + key * 8, ch < kR / 8 ? v + 8 * ch : pe + 8 * (ch - kR / 8), ok ? 16 : 0);
  }
}
#endif

__global__ void __launch_bounds__(kWThreads, 1) mla_wide_kernel(Args a) {
  release_dependents();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wl = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7, g = lane >> 2, c = lane & 3;
  __nv_bfloat16* qs = (__nv_bfloat16*)smem;              // Q [72 chunks][64 rows][8]
  __nv_bfloat16* tiles = qs + kWRows * kD;               // [kWStages][72 chunks][32 keys][8]
  int* anc = (int*)(tiles + kWStages * kBN * kD);        // [kMaxT]
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

  {  // the CTA's Q rows (zeros outside the launch) land with the first key tile; thread: one row, one parity
    const int r = (threadIdx.x & 127) >> 1, par = threadIdx.x & 1, row = wk.row0 + r;
    const bool ok = row < limit;
    const int mr = ok ? (node >= 0 ? node * a.NH + row : row) : 0;
    const int t = mr / a.NH, hd = mr % a.NH;
    const __nv_bfloat16* ql = a.q_lat + t * a.sql_t + hd * a.sql_h;
    const __nv_bfloat16* qp = a.q_pe + t * a.sqp_t + hd * a.sqp_h;
#pragma unroll
    for (int j = 0; j < kChunks / 2 / 2; ++j) {
      const int ch = 2 * ((threadIdx.x >> 7) + 2 * j) + par;
      cp_async16(qs + ch * (kWRows * 8) + r * 8, ch < kR / 8 ? ql + 8 * ch : qp + 8 * (ch - kR / 8), ok ? 16 : 0);
    }
  }
  for (int s = 0; s < kWStages - 1; ++s) {
    if (s < total) load_keys(a, tiles + s * kBN * kD, lo + s * kBN, hi, slot_of);
    cp_commit();
  }

  // ---- this lane's rows: 16 wl + g and + 8 of the CTA's 64; its warpgroup's value columns
  int m_row[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = wk.row0 + 16 * wl + g + 8 * h;
    row_ok[h] = i < limit;
    m_row[h] = node >= 0 ? node * a.NH + i : i;
  }
  const int col0 = wg * (kR / 2);
  float* out_acc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) out_acc[h] = a.part_acc + ((int64_t)wk.slot * a.M + m_row[h]) * kR + col0 + 2 * c;
  const uint64_t q_desc = smem_desc(qs, kWRows * 16, 128);
  // super state (F = 8 CTAs keep its accumulators in the output slot), chunk state, value accumulators:
  // o[4 t + e] is row 16 wl + g + 8 (e / 2), column col0 + 8 t + 2 c + (e % 2)
  float fm[2] = {-INFINITY, -INFINITY}, fl[2] = {0.f, 0.f};
  float cm[2] = {-INFINITY, -INFINITY}, cl[2] = {0.f, 0.f}, o[128];

  for (int gt = 0; gt < total; ++gt) {
    if (gt % kTilesPerChunk == 0) {  // a chunk starts: its softmax from scratch
      cm[0] = cm[1] = -INFINITY;
      cl[0] = cl[1] = 0.f;
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
    }
    cp_wait<kWStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async's writes, visible to wgmma's reads
    __syncthreads();  // the tile has landed; every warpgroup is done with the tile this load overwrites
    {
      const int nx = gt + kWStages - 1;
      if (nx < total) load_keys(a, tiles + (nx % kWStages) * kBN * kD, lo + nx * kBN, hi, slot_of);
      cp_commit();
    }
    const __nv_bfloat16* tile = tiles + (gt % kWStages) * kBN * kD;
    const bool chunk_end = gt % kTilesPerChunk == kTilesPerChunk - 1 || gt == total - 1;
    if (chunk_end && gt >= kTilesPerChunk) {
      // a super CTA's later chunk ends with this tile: the stored super state (this thread's 256 columns of a row:
      // 8 lines) comes to L1 while the tile computes, so the fold's read-back does not wait on L2
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (row_ok[h]) asm volatile("prefetch.global.L1 [%0];" ::"l"(out_acc[h] + 32 * j));
    }
    // scores S [64 rows x 32 keys]: s[4 j + e] is row 16 wl + g + 8 (e / 2), key 8 j + 2 c + (e % 2)
    float s[16];
    {
      const uint64_t k_desc = smem_desc(tile, kBN * 16, 128);
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        wgmma_scores(s, q_desc + ks * (2 * kWRows * 16 >> 4), k_desc + ks * (2 * kBN * 16 >> 4), ks);
      wg_commit();
      wg_wait_all();
      pin(s);
    }
    const int pos0 = lo + gt * kBN;
    float mx[2] = {-INFINITY, -INFINITY}, alpha[2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = pos0 + 8 * j + 2 * c + (e & 1) < hi ? __fmul_rn(s[4 * j + e], a.scale_log2) : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      }
#pragma unroll
    for (int sh = 1; sh < 4; sh <<= 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], sh));
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
        s[4 * j + e] = s[4 * j + e] == -INFINITY ? 0.f : exp2f(__fsub_rn(s[4 * j + e], cm[e >> 1]));
        if (e & 1) ps[e >> 1] = __fadd_rn(ps[e >> 1], __fadd_rn(s[4 * j + e - 1], s[4 * j + e]));
      }
#pragma unroll
    for (int sh = 1; sh < 4; sh <<= 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) ps[h] = __fadd_rn(ps[h], __shfl_xor_sync(0xffffffffu, ps[h], sh));
#pragma unroll
    for (int h = 0; h < 2; ++h) cl[h] = __fmaf_rn(cl[h], alpha[h], ps[h]);
    uint32_t pa[2][4];  // P as the values' A operand, keys 16 q .. 16 q + 15 (mma.sync's A fragment per warp)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pa[j >> 1][2 * (j & 1)] = pack_bf16(s[4 * j], s[4 * j + 1]);
      pa[j >> 1][2 * (j & 1) + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
    }
    // x * 1 == x bit for bit, so a warp whose rows' maxima all stood skips the rescale
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int t = 0; t < 32; ++t) {
        o[4 * t] = __fmul_rn(o[4 * t], alpha[0]);
        o[4 * t + 1] = __fmul_rn(o[4 * t + 1], alpha[0]);
        o[4 * t + 2] = __fmul_rn(o[4 * t + 2], alpha[1]);
        o[4 * t + 3] = __fmul_rn(o[4 * t + 3], alpha[1]);
      }
    }
    {  // values: 16 keys a k-step in order; B = the tile's 32 column chunks of this warpgroup, keys as K
      const uint64_t v_desc = smem_desc(tile + col0 / 8 * (kBN * 8), 128, kBN * 16);
      pin(o);
      wg_fence();
#pragma unroll
      for (int q = 0; q < 2; ++q) wgmma_values(o, pa[q], v_desc + q * (16 * 16 >> 4));
      wg_commit();
      wg_wait_all();
      pin(o);
    }
    if (chunk_end) {
      // fold the chunk into the super state stored in the output slot; a first chunk (scale a = 0) replaces it
      // unread, as fold_acc would; each thread reads back only what it wrote
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Scales f = fold_stats(fm[h], fl[h], cm[h], cl[h]);
        if (!row_ok[h]) continue;
#pragma unroll
        for (int t0 = 0; t0 < 32; t0 += 8) {  // eight loads in flight, then their stores (they may alias)
          float2 v[8];
#pragma unroll
          for (int u = 0; u < 8; ++u)
            v[u] = f.a != 0.f ? *(const float2*)(out_acc[h] + 8 * (t0 + u)) : make_float2(0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int t = t0 + u;
            *(float2*)(out_acc[h] + 8 * t) =
                make_float2(fold_acc(v[u].x, o[4 * t + 2 * h], f), fold_acc(v[u].y, o[4 * t + 2 * h + 1], f));
          }
        }
      }
    }
  }
  cp_wait<0>();
  // ---- the state's max and sum (its accumulators are stored)
  if (wg == 0 && c == 0) {
    const int slots = a.SH + a.NTL;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!row_ok[h]) continue;
      const int64_t r = (int64_t)wk.slot * a.M + m_row[h];
      a.part_ml[r] = fm[h];
      a.part_ml[(int64_t)slots * a.M + r] = fl[h];
    }
  }
#endif
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
