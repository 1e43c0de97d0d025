// MLA attention's chunk pass in 64-row CTAs on Hopper's warpgroup MMA (the "wide" engine, sm_90a only;
// csrc/mla_attention.cu holds the launch, the 16-row "narrow" engine and the merge both engines share). Same
// contract and the same row invariance as the narrow engine: fixed 256-key chunks by position, each an online
// softmax from scratch over (here 64-key) tiles, chunks folded into supers and supers into the row in position order
// (mla_common.cuh's fold). Its own arithmetic, though: the engine is chosen per GPU, never per launch shape, so
// an AR step and a tree always share one.
//
// Why: every row of a launch (T nodes x NH heads) reads the same prefix keys, and an MMA's output element never
// sums over other rows, so a CTA scoring 64 rows against each key tile reads the cache once for 64 rows, and
// wgmma reads its operands straight from shared memory (no per-warp ldmatrix copies, as mma.sync needs).
//
// Per CTA: two warpgroups over the same 64 rows; warpgroup h owns value columns 256 h .. 256 h + 255. Key tiles
// come in pairs (A even, B odd; a chunk is two pairs): group 0 scores A while group 1 scores B (36 wgmma k-steps
// each, from shared memory), and each group's softmax runs under the other's MMAs (FlashMLA's "seesaw"): the
// groups swap each tile's new row maxima and P (bf16, written over the tile's rope columns, which the scores have
// read) through shared memory under named barriers, so every score is computed once. Warp w of a group holds rows
// 16 w + g and 16 w + g + 8 (the same rows in both groups). Copies: cp.async, each group loading the half of the
// next pair it frees last, completion tracked by a barrier per tile half (cp.async.mbarrier.arrive).
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
constexpr int kWBN = 64;            // keys a tile (the softmax's step)
constexpr int kWStages = 2;         // key tiles in shared memory (a pair)
constexpr int kWTileBytes = kWBN * kD * 2;
// Q, the two tiles, the ancestor table, four per-row exchanges between the groups, four tile barriers
constexpr int kWSmem = kWRows * kD * 2 + kWStages * kWTileBytes + kMaxT * 4 + 4 * kWRows * 4 + 4 * 8;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kChunks = kD / 8;     // 16-byte column chunks of a row (72)
constexpr int kWTiles = kChunk / kWBN;  // tiles a chunk

// A shared-memory matrix descriptor without swizzle: start address, LBO, SBO (bytes, 16-byte units).
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Registers an in-flight wgmma writes: no ordinary instruction may move across the fence/wait around them.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d [64 x 64] (+)= A [64 x 16] B [16 x 64], both K-major in shared memory.
__device__ __forceinline__ void wgmma_scores(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// The 128 accumulators of an m64n256 wgmma (a thread's share of a 64 x 256 float tile): operand text, constraints.
#define DDT_ACC128_STR \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"
#define DDT_ACC128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d [64 x 256] += A [64 x 16] (registers, bf16x2) B [16 x 256] (N-major in shared memory).
__device__ __forceinline__ void wgmma_values(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " DDT_ACC128_STR ", {%128, %129, %130, %131}, %132, "
      "p, 1, 1, 1;\n}\n"
      : DDT_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d [64 x 256] += A [64 x 16] (shared memory, K-major) B [16 x 256] (N-major in shared memory).
__device__ __forceinline__ void wgmma_values_ss(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " DDT_ACC128_STR ", %128, %129, p, 1, 1, 0, 1;\n}\n"
      : DDT_ACC128(d)
      : "l"(da), "l"(db));
}

// Two floats as a bf16x2 MMA operand register: lo in the low half (the smaller column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(const uint32_t*)&v;
}
// A bf16x2 register scaled by f, rounded back to bf16x2 (x * 1 == x: the identity when f is 1).
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t v, float f) {
  const float2 x = __bfloat1622float2(*(const __nv_bfloat162*)&v);
  return pack_bf16(__fmul_rn(x.x, f), __fmul_rn(x.y, f));
}

// Named barriers between the two warpgroups (one arrives, the other waits; 0 is __syncthreads').
enum Bar : int { kMaxReady = 1, kP0Ready, kP1Ready, kSumReady, kScaledP0 };  // kScaledP0: group 1 alone
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_wait(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }

// Tile-arrival barriers: each thread of the loading warpgroup arrives once its own cp.asyncs have landed.
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((uint32_t)__cvta_generic_to_shared(b)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"((uint32_t)__cvta_generic_to_shared(b))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)),
      "r"(parity)
      : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async's writes, visible to wgmma's reads
}

// cp.asyncs of 64 keys from position pos0 (zeros at or past hi) into the column-chunk-major tile, this warpgroup's
// share: 16-byte column chunks c0 .. c1 - 1 and, with rope, the 8 rope chunks. Thread i of the group takes key i / 2
// and every other chunk from parity i % 2, so a warp writes 16 keys x 2 chunks (no bank conflict).
template <class SlotOf>
__device__ __forceinline__ void load_part(const Args& a, __nv_bfloat16* dst, int pos0, int hi, SlotOf slot_of, int c0,
                                          int c1, bool rope) {
  const int key = (threadIdx.x & 127) >> 1, par = threadIdx.x & 1, pos = pos0 + key;
  const bool ok = pos < hi;
  const int64_t slot = ok ? slot_of(pos) : 0;
  const int bytes = ok ? 16 : 0;
  const __nv_bfloat16* v = a.ckv + slot * a.s_ckv + 8 * (c0 + par);
  __nv_bfloat16* d = dst + (c0 + par) * (kWBN * 8) + key * 8;
  // NOTE: not unrolled: unrolled, the compiler keeps every copy's offsets live across the tiles (registers)
#pragma unroll 1
  for (int j = 0; j < (c1 - c0) / 2; ++j, v += 16, d += 2 * kWBN * 8) cp_async16(d, v, bytes);
  if (rope) {
    const __nv_bfloat16* pe = a.kpe + slot * a.s_kpe + 8 * par;
    __nv_bfloat16* dp = dst + (kR / 8 + par) * (kWBN * 8) + key * 8;
#pragma unroll
    for (int j = 0; j < kP / 8 / 2; ++j) cp_async16(dp + j * 2 * kWBN * 8, pe + 16 * j, bytes);
  }
}

// The score chain's k-steps KS0 .. KS1 - 1 (16 columns each) into s, the chain's first starting from zero.
// NOTE: fully unrolled: a rolled loop's register copies between chains would serialise the wgmmas
template <int KS0, int KS1, bool kFirst>
__device__ __forceinline__ void score_steps(float (&s)[32], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int ks = KS0; ks < KS1; ++ks)
    wgmma_scores(s, q_desc + ks * (2 * kWRows * 16 >> 4), k_desc + ks * (2 * kWBN * 16 >> 4), !(kFirst && ks == KS0));
}

// Masks keys at or past hi, scales to log2 units; the rows' maxima over this tile (4 lanes a row).
__device__ __forceinline__ void mask_max(float (&s)[32], int pos0, int hi, float scale_log2, int c, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * j + e] = pos0 + 8 * j + 2 * c + (e & 1) < hi ? __fmul_rn(s[4 * j + e], scale_log2) : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
    }
#pragma unroll
  for (int sh = 1; sh < 4; sh <<= 1)
#pragma unroll
    for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], sh));
}

// P = exp2(s - m) (masked keys 0) as bf16 A fragments (keys 16 q .. 16 q + 15), and its row sums: this lane's keys
// in order, then a fixed xor tree over the row's 4 lanes.
__device__ __forceinline__ void exp_pack(const float (&s)[32], const float (&m)[2], uint32_t (&pa)[4][4], float (&ps)[2]) {
  ps[0] = ps[1] = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = s[4 * j + e] == -INFINITY ? 0.f : exp2f(__fsub_rn(s[4 * j + e], m[e >> 1]));
    ps[0] = __fadd_rn(ps[0], __fadd_rn(p[0], p[1]));
    ps[1] = __fadd_rn(ps[1], __fadd_rn(p[2], p[3]));
    pa[j >> 1][2 * (j & 1)] = pack_bf16(p[0], p[1]);
    pa[j >> 1][2 * (j & 1) + 1] = pack_bf16(p[2], p[3]);
  }
#pragma unroll
  for (int sh = 1; sh < 4; sh <<= 1)
#pragma unroll
    for (int h = 0; h < 2; ++h) ps[h] = __fadd_rn(ps[h], __shfl_xor_sync(0xffffffffu, ps[h], sh));
}

// o *= f (rows g, g + 8); x * 1 == x bit for bit, so a warp whose factors are all 1 skips it.
__device__ __forceinline__ void rescale(float (&o)[128], const float (&f)[2]) {
  if (!__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) return;
#pragma unroll
  for (int t = 0; t < 32; ++t) {
    o[4 * t] = __fmul_rn(o[4 * t], f[0]);
    o[4 * t + 1] = __fmul_rn(o[4 * t + 1], f[0]);
    o[4 * t + 2] = __fmul_rn(o[4 * t + 2], f[1]);
    o[4 * t + 3] = __fmul_rn(o[4 * t + 3], f[1]);
  }
}

// P fragments into a [8 key chunks][64 rows][8 keys] area (the values' K-major A operand, as Q is stored).
__device__ __forceinline__ void store_p(__nv_bfloat16* area, const uint32_t (&pa)[4][4], int r0, int c) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *(uint32_t*)(area + j * (kWRows * 8) + r0 * 8 + 2 * c) = pa[j >> 1][2 * (j & 1)];
    *(uint32_t*)(area + j * (kWRows * 8) + (r0 + 8) * 8 + 2 * c) = pa[j >> 1][2 * (j & 1) + 1];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // these writes, visible to the other group's wgmma
}
#endif

__global__ void __launch_bounds__(kWThreads, 1) mla_wide_kernel(Args a) {
  release_dependents();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wl = (threadIdx.x >> 5) & 3, g = lane >> 2, c = lane & 3;
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);  // NOTE: a shuffle, so ptxas sees it warp-uniform
  __nv_bfloat16* qs = (__nv_bfloat16*)smem;              // Q [72 chunks][64 rows][8]
  __nv_bfloat16* tiles = qs + kWRows * kD;               // [2: tile A, tile B][72 chunks][64 keys][8]
  int* anc = (int*)(tiles + kWStages * kWBN * kD);       // [kMaxT]
  float* xm0 = (float*)(anc + kMaxT);                    // [64] per row: tile A's new max (group 0 -> 1)
  float* xm1 = xm0 + kWRows;                             // [64] tile B's new max (group 1 -> 0)
  float* xs1 = xm1 + kWRows;                             // [64] tile B's row sums (group 1 -> 0)
  float* xl = xs1 + kWRows;                              // [64] the chunk's sum at its end (group 0 -> 1)
  uint64_t* mbar = (uint64_t*)(xl + kWRows);             // [2 tiles][2 halves]: tile t's half h landed
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
  const int total = tile_count<kWBN>(lo, wk.nchunks, hi);
  const int limit = node >= 0 ? a.NH : a.M;  // CTA rows row0 + i with row0 + i < limit are real
  if (threadIdx.x < 4) mbar_init(mbar + threadIdx.x, kWThreads / 2);

  {  // the CTA's Q rows (zeros outside the launch); thread: one row, one parity
    const int r = (threadIdx.x & 127) >> 1, par = threadIdx.x & 1;
    const __nv_bfloat16 *ql, *qp;
    const bool ok = q_row(a, node, wk.row0 + r, limit, ql, qp);
#pragma unroll
    for (int j = 0; j < kChunks / 2 / 2; ++j) {
      const int ch = 2 * ((threadIdx.x >> 7) + 2 * j) + par;
      cp_async16(qs + ch * (kWRows * 8) + r * 8, ch < kR / 8 ? ql + 8 * ch : qp + 8 * (ch - kR / 8), ok ? 16 : 0);
    }
    cp_commit();
  }
  __syncthreads();  // the barriers are initialised
  // Tile A (even) and tile B (odd) of a pair: group 0 loads A's columns 0-255 and B's 0-255 + rope, group 1 A's
  // 256-511 + rope and B's 256-511: each group the part whose last reader it is, as soon as that read is done
  __nv_bfloat16* ta = tiles;
  __nv_bfloat16* tb = tiles + kWBN * kD;
  __nv_bfloat16* pa_area = ta + kR / 8 * (kWBN * 8);  // P_A over A's rope columns (read by then)
  __nv_bfloat16* pb_area = tb + kR / 8 * (kWBN * 8);  // P_B over B's
  auto load_a = [&](int gt) {
    if (gt >= total) return;
    load_part(a, ta, lo + gt * kWBN, hi, slot_of, wg ? kR / 16 : 0, wg ? kR / 8 : kR / 16, wg == 1);
    mbar_arrive_on_copies(mbar + wg);
  };
  auto load_b = [&](int gt) {
    if (gt >= total) return;
    load_part(a, tb, lo + gt * kWBN, hi, slot_of, wg ? kR / 16 : 0, wg ? kR / 8 : kR / 16, wg == 0);
    mbar_arrive_on_copies(mbar + 2 + wg);
  };
  load_a(0);
  load_b(1);
  cp_wait<0>();  // NOTE: this thread's Q chunks (the tile copies are in no group: their barriers track them)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();  // every Q chunk has landed

  // ---- this lane's rows: 16 wl + g and + 8 of the CTA's 64 (the same in both groups); its group's value columns
  int m_row[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = wk.row0 + 16 * wl + g + 8 * h;
    row_ok[h] = i < limit;
    m_row[h] = node >= 0 ? node * a.NH + i : i;
  }
  const int col0 = wg * (kR / 2), r0 = 16 * wl + g;
  int slot = wk.slot;  // the state's slot (F = 1: the chunk's, one on at each chunk end)
  float* out_acc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) out_acc[h] = a.part_acc + ((int64_t)slot * a.M + m_row[h]) * kR + col0 + 2 * c;
  const uint64_t q_desc = smem_desc(qs, kWRows * 16, 128);
  // super state (F = 8 CTAs keep its accumulators in the output slot; F = 1, the chunk's alone), chunk state (cm
  // in both groups, cl kept by group 0), value accumulators: o[4 t + e] is row r0 + 8 (e / 2), column
  // col0 + 8 t + 2 c + (e % 2)
  float fm[2] = {-INFINITY, -INFINITY}, fl[2] = {0.f, 0.f};
  float cm[2] = {-INFINITY, -INFINITY}, cl[2] = {0.f, 0.f}, o[128];

  // The seesaw (two tiles a step, as FlashMLA's decode kernel): group 0 scores A while group 1 scores B; with m0 =
  // max(m, rowmax A), m1 = max(m0, rowmax B), a0 = exp2(m - m0), a1 = exp2(m0 - m1), P_A = exp2(S_A - m0),
  // P_B = exp2(S_B - m1): O_left = (O_left a0 + P_A V_A) a1 + P_B V_B, O_right = O_right (a0 a1) + P_B V_B +
  // (P_A a1) V_A, l = (l a0 + sum P_A) a1 + sum P_B. Each group's softmax runs under the other's MMAs.
  for (int ga = 0; ga < total; ga += 2) {
    const int ph = (ga >> 1) & 1;
    const bool has_b = ga + 1 < total;
    const bool chunk_end = (ga + 2) % kWTiles == 0 || ga + 2 >= total;
    if (ga % kWTiles == 0) {  // a chunk starts: its softmax from scratch
      cm[0] = cm[1] = -INFINITY;
      cl[0] = cl[1] = 0.f;
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
    }
    if (chunk_end && ga >= kWTiles && a.F == kSuper) {
      // a super CTA's later chunk ends with this pair: the stored super state (this thread's 256 columns of a row:
      // 8 lines) comes to L1 while the pair computes, so the fold's read-back does not wait on L2
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (row_ok[h]) asm volatile("prefetch.global.L1 [%0];" ::"l"(out_acc[h] + 32 * j));
    }
    float s[32], mx[2], m0[2], a0[2], a1[2];
    uint32_t pa[4][4];
    if (wg == 0) {
      {  // S_A: columns 0-255 (loaded by this group) first, then the rest
        const uint64_t k_desc = smem_desc(ta, kWBN * 16, 128);
        mbar_wait(mbar + 0, ph);
        wg_fence();
        score_steps<0, kR / 32, true>(s, q_desc, k_desc);
        mbar_wait(mbar + 1, ph);
        score_steps<kR / 32, kD / 16, false>(s, q_desc, k_desc);
        wg_commit();
        wg_wait_all();
        pin(s);
      }
      mask_max(s, lo + ga * kWBN, hi, a.scale_log2, c, mx);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m0[h] = fmaxf(cm[h], mx[h]);
        a0[h] = exp2f(__fsub_rn(cm[h], m0[h]));
      }
      if (c == 0) xm0[r0] = m0[0], xm0[r0 + 8] = m0[1];
      bar_arrive(kMaxReady);
      exp_pack(s, m0, pa, mx);  // mx: now the rows' sums of P_A
#pragma unroll
      for (int h = 0; h < 2; ++h) cl[h] = __fmaf_rn(cl[h], a0[h], mx[h]);
      store_p(pa_area, pa, r0, c);  // group 1 scales it by a1 (NOTE: not here: pa is in flight then)
      bar_arrive(kP0Ready);
      rescale(o, a0);
      pin(o);
      wg_fence();
#pragma unroll
      for (int q = 0; q < 4; ++q) wgmma_values(o, pa[q], smem_desc(ta + q * 16 * 8, 128, kWBN * 16));
      wg_commit();
      if (has_b) {
        bar_wait(kP1Ready);  // B's row maxima, P_B and its row sums
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float m1 = xm1[r0 + 8 * h];
          a1[h] = exp2f(__fsub_rn(m0[h], m1));
          cm[h] = m1;
          cl[h] = __fmaf_rn(cl[h], a1[h], xs1[r0 + 8 * h]);
        }
      } else {
        cm[0] = m0[0], cm[1] = m0[1];
      }
      wg_wait_all();
      pin(o);
      load_a(ga + 2);  // A's columns 0-255 are read
      if (has_b) {
        rescale(o, a1);
        pin(o);
        wg_fence();
        const uint64_t p_desc = smem_desc(pb_area, kWRows * 16, 128);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          wgmma_values_ss(o, p_desc + q * (2 * kWRows * 16 >> 4), smem_desc(tb + q * 16 * 8, 128, kWBN * 16));
        wg_commit();
        wg_wait_all();
        pin(o);
      }
      load_b(ga + 3);  // B's columns 0-255 and P_B are read
      if (chunk_end) {
        // NOTE: a last pair without B waited on group 1 nowhere: wait until it has read the chunk sum before
        if (!has_b) bar_wait(kP1Ready);
        if (c == 0) xl[r0] = cl[0], xl[r0 + 8] = cl[1];
        bar_arrive(kSumReady);
      }
    } else {
      if (has_b) {  // S_B: columns 256-511 (loaded by this group) first, then the rest
        const uint64_t k_desc = smem_desc(tb, kWBN * 16, 128);
        mbar_wait(mbar + 3, ph);
        wg_fence();
        score_steps<kR / 32, kR / 16, true>(s, q_desc, k_desc);
        mbar_wait(mbar + 2, ph);
        score_steps<0, kR / 32, false>(s, q_desc, k_desc);
        score_steps<kR / 16, kD / 16, false>(s, q_desc, k_desc);
        wg_commit();
        wg_wait_all();
        pin(s);
        mask_max(s, lo + (ga + 1) * kWBN, hi, a.scale_log2, c, mx);
      }
      bar_wait(kMaxReady);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m0[h] = xm0[r0 + 8 * h];
        a0[h] = exp2f(__fsub_rn(cm[h], m0[h]));
        cm[h] = has_b ? fmaxf(m0[h], mx[h]) : m0[h];
        a1[h] = exp2f(__fsub_rn(m0[h], cm[h]));
      }
      {
        const float f[2] = {__fmul_rn(a0[0], a1[0]), __fmul_rn(a0[1], a1[1])};
        rescale(o, f);
      }
      if (has_b) {
        exp_pack(s, cm, pa, mx);  // mx: now the rows' sums of P_B
        store_p(pb_area, pa, r0, c);
        if (c == 0) xm1[r0] = cm[0], xm1[r0 + 8] = cm[1], xs1[r0] = mx[0], xs1[r0 + 8] = mx[1];
        bar_arrive(kP1Ready);
        pin(o);
        wg_fence();
#pragma unroll
        for (int q = 0; q < 4; ++q)
          wgmma_values(o, pa[q], smem_desc(tb + col0 / 8 * (kWBN * 8) + q * 16 * 8, 128, kWBN * 16));
        wg_commit();
      }
      bar_wait(kP0Ready);
      if (has_b) {  // P_A a1, in place: this thread's entries are those group 0's twin stored
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t* e = (uint32_t*)(pa_area + j * (kWRows * 8) + (r0 + 8 * h) * 8 + 2 * c);
            *e = scale_bf16x2(*e, a1[h]);
          }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"((int)kScaledP0) : "memory");  // the whole group's rows are scaled
      }
      pin(o);
      wg_fence();
      {
        const uint64_t p_desc = smem_desc(pa_area, kWRows * 16, 128);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          wgmma_values_ss(o, p_desc + q * (2 * kWRows * 16 >> 4),
                          smem_desc(ta + col0 / 8 * (kWBN * 8) + q * 16 * 8, 128, kWBN * 16));
      }
      wg_commit();
      wg_wait_one();
      load_b(ga + 3);  // B's columns 256-511 are read (the values of B, the group before)
      wg_wait_all();
      pin(o);
      load_a(ga + 2);  // A's columns 256-511 and P_A are read
      if (chunk_end) {
        if (!has_b) bar_arrive(kP1Ready);  // the chunk sum before is read (group 0 writes the next)
        bar_wait(kSumReady);
        cl[0] = xl[r0], cl[1] = xl[r0 + 8];
      }
    }
    if (chunk_end) {
      // fold the chunk into the super state stored in the output slot; a first chunk (scale a = 0) replaces it
      // unread, as fold_acc would; each thread reads back only what it wrote
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Scales f = fold_stats(fm[h], fl[h], cm[h], cl[h]);
        if (!row_ok[h]) continue;
#pragma unroll
        for (int t0 = 0; t0 < 32; t0 += 4) {  // four loads in flight, then their stores (they may alias)
          float2 v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            v[u] = f.a != 0.f ? *(const float2*)(out_acc[h] + 8 * (t0 + u)) : make_float2(0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int t = t0 + u;
            *(float2*)(out_acc[h] + 8 * t) =
                make_float2(fold_acc(v[u].x, o[4 * t + 2 * h], f), fold_acc(v[u].y, o[4 * t + 2 * h + 1], f));
          }
        }
      }
      // the state's max and sum (its accumulators are stored; a super's, again at each of its chunks)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (wg == 0 && c == 0 && row_ok[h]) store_ml(a, slot, m_row[h], fm[h], fl[h]);
      next_chunk_slot(a, slot, out_acc, fm, fl);
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
