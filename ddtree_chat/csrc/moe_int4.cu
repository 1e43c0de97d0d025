// INT4 W4A16 routed-expert MoE for the decode / tree-verify regime (1..256 tokens x top-k).
// Raw-pointer kernels, no torch headers. Weights are repacked at load time (ops/cuda_moe.py) so that
// each lane of a warp loads, with one 16-byte load, the A fragments of four m16n8k16 bf16 MMAs:
//
//   words  int32 [E, NT, KT, 32 lanes, 4]   NT = N/16 row tiles, KT = K/64 k-steps
//   scales u32   [E, NT, K/32, 8]           each u32 = {scale(row g), scale(row g+8)} as two bf16
//
// Inside a 64-wide k-step, lane (g = lane/4, c = lane%4) covers physical k = 64*it + 16*c + 0..15, so its
// activations are 32 contiguous bytes and its scales one group. Word w (0..3) holds, in nibble order
// 0..7: (g,4w) (g+8,4w) (g,4w+2) (g+8,4w+2) (g,4w+1) (g+8,4w+1) (g,4w+3) (g+8,4w+3), i.e. the pairs
// (nib j, nib j+4) are the four bf16x2 A registers; one lop3 per pair turns them into bf16 128+q+8.
// Nibbles are stored as on disk (q + 8). Dequant w = bf16(bf16(q) * scale), as the reference does.
//
// Forward: align (token->expert blocks of 8 pairs) -> gate/up GEMM + SiLU*up -> down GEMM -> top-k sum.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "mma.cuh"
#include "pdl.cuh"

namespace {

// kWarps: warps per CTA, splitting K and reducing through shared memory; kUnroll: k-steps whose loads are
// issued before the first MMA. Both are template parameters; ddt_moe_forward picks a variant.
constexpr int kSlots = 8;     // token slots (pairs) per block = MMA N

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t u) {
  __nv_bfloat162 v;
  memcpy(&v, &u, 4);
  return v;
}
__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// (q & 0x000f000f) | 0x43004300 as one LOP3: written in C, nvcc emits an AND and an OR (two immediates),
// half of the dequant's integer work (counted in the SASS).
__device__ __forceinline__ uint32_t low_nibbles_bf16(uint32_t q) {
  uint32_t t;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"(q), "n"(0x000f000f), "n"(0x43004300));  // (a & b) | c
  return t;
}

// One packed word -> four bf16x2 A registers, scaled per row.
__device__ __forceinline__ void dequant(uint32_t q, __nv_bfloat162 s_lo, __nv_bfloat162 s_hi, uint32_t (&a)[4]) {
  const __nv_bfloat162 off = as_bf162(0x43084308u);  // 136.0 = 128 + 8
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t t = low_nibbles_bf16(q >> (4 * j));  // bf16x2 {128+nib_j, 128+nib_j+4}
    a[j] = as_u32(__hmul2(__hsub2(as_bf162(t), off), (j & 1) ? s_hi : s_lo));
  }
}

// Programmatic dependent launch (sm_90+): a kernel launched with the PDL attribute may start while its
// predecessor drains; it must wait before touching the predecessor's outputs. Without the attribute (or
// without PDL support) wait returns at once and launch_dependents does nothing.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// ---------------------------------------------------------------------------------------------
// align: pairs p = t*topk + k sorted into blocks of <= 8 pairs of one expert.
// block_expert[max_blocks], block_pairs[max_blocks*8] (-1 = empty), num_blocks[1]. One CTA.
__global__ void moe_align_kernel(const int64_t* __restrict__ ids, int n_pairs, int E, int max_blocks,
                                 int* __restrict__ block_expert, int* __restrict__ block_pairs,
                                 int* __restrict__ num_blocks) {
  release_dependents();
  extern __shared__ int sm[];
  int* count = sm;          // [E]
  int* start = sm + E;      // [E] first block of expert e
  int* cursor = sm + 2 * E; // [E]
  __shared__ int total;
  pdl_wait();
  for (int e = threadIdx.x; e < E; e += blockDim.x) { count[e] = 0; cursor[e] = 0; }
  for (int b = threadIdx.x; b < max_blocks; b += blockDim.x) {
    block_expert[b] = 0;
    for (int s = 0; s < kSlots; ++s) block_pairs[b * kSlots + s] = -1;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = (int)ids[p];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  {  // start[e] = blocks of the experts before e: a block-wide scan (it was serial: E dependent steps on one thread)
    __shared__ int warp_total[32];
    const int per = (E + blockDim.x - 1) / blockDim.x, e0 = threadIdx.x * per, e1 = min(e0 + per, E);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int mine = 0;
    for (int e = e0; e < e1; ++e) mine += (count[e] + kSlots - 1) / kSlots;
    int incl = mine;  // inclusive scan inside the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) warp_total[wid] = incl;
    __syncthreads();
    if (wid == 0) {  // scan of the warps' totals
      int w = lane < (int)(blockDim.x >> 5) ? warp_total[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += v;
      }
      warp_total[lane] = w;
    }
    __syncthreads();
    int acc = incl - mine + (wid > 0 ? warp_total[wid - 1] : 0);
    for (int e = e0; e < e1; ++e) { start[e] = acc; acc += (count[e] + kSlots - 1) / kSlots; }
    if (threadIdx.x == blockDim.x - 1) total = acc < max_blocks ? acc : max_blocks;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int nb = (count[e] + kSlots - 1) / kSlots;
    for (int j = 0; j < nb; ++j)
      if (start[e] + j < max_blocks) block_expert[start[e] + j] = e;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = (int)ids[p];
    if (e < 0 || e >= E) continue;
    const int r = atomicAdd(&cursor[e], 1);
    const int slot = start[e] * kSlots + r;
    if (slot < max_blocks * kSlots) block_pairs[slot] = p;
  }
  if (threadIdx.x == 0) *num_blocks = total;
}

// One 64-wide k-step of a 16-row tile: dequantise the lane's four packed words (scales for rows g and
// g+8) and accumulate four m16n8k16 products against the activations' fragments xs.
__device__ __forceinline__ void mma_k64(float (&acc)[4], const uint4 q, const uint32_t scale, const uint32_t xs[8]) {
  const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
  const __nv_bfloat162 s2 = as_bf162(scale);
  const __nv_bfloat162 lo = __low2bfloat162(s2), hi = __high2bfloat162(s2);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t a[4];
    dequant(wq[w], lo, hi, a);
    mma_bf16(acc, a, xs[2 * w], xs[2 * w + 1]);
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM over (row tiles of 16, one block of 8 pairs). kMode: kGateUp reads a gate and an up tile and writes
// h[pair, n] = silu(gate) * up in bf16; kDown one down tile, kDown2 two adjacent down tiles (they share the
// activation fragments: half the CTAs and half the activation reads of kDown), y[pair, n] in fp32. kFull: KT
// is a multiple of kWarps * kUnroll, so no load needs a bounds predicate (ncu: the integer ALU pipe is the
// busiest; each predicated load also zeroes its registers first).
enum Mode { kDown = 0, kGateUp = 1, kDown2 = 2 };

// The registers of kUnroll k-steps: packed weights and scales of one or two streams, activation fragments.
template <int kUnroll>
struct Stage {
  uint4 qa[kUnroll], qb[kUnroll], x0[kUnroll], x1[kUnroll];
  uint32_t s_a[kUnroll], s_b[kUnroll];
};

template <bool kTwo, bool kFull, int kUnroll>
__device__ __forceinline__ void load_stage(Stage<kUnroll>& st, int base, int KT, const uint4* pa, const uint4* pb,
                                           const uint32_t* psa, const uint32_t* psb, const uint4* xrow, int c) {
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int it = base + u;
    const bool ok = kFull || it < KT;
    st.qa[u] = ok ? ldg_stream(pa + (size_t)it * 32) : z4;
    st.s_a[u] = ok ? __ldg(psa + (size_t)it * 16) : 0u;
    if (kTwo) {
      st.qb[u] = ok ? ldg_stream(pb + (size_t)it * 32) : z4;
      st.s_b[u] = ok ? __ldg(psb + (size_t)it * 16) : 0u;
    }
    st.x0[u] = ok ? __ldg(xrow + it * 8 + c * 2) : z4;
    st.x1[u] = ok ? __ldg(xrow + it * 8 + c * 2 + 1) : z4;
  }
}

template <bool kTwo, int kUnroll>
__device__ __forceinline__ void mma_stage(const Stage<kUnroll>& st, float (&acc_a)[4], float (&acc_b)[4]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t xs[8] = {st.x0[u].x, st.x0[u].y, st.x0[u].z, st.x0[u].w,
                            st.x1[u].x, st.x1[u].y, st.x1[u].z, st.x1[u].w};
    mma_k64(acc_a, st.qa[u], st.s_a[u], xs);
    if (kTwo) mma_k64(acc_b, st.qb[u], st.s_b[u], xs);
  }
}

// kPipe: two register stages, the next one's loads issued before this one's MMAs (loads stay in flight while
// a warp dequantises; the plain loop issues a stage's loads, then waits on them with nothing else in flight).
template <int kMode, int kWarps, int kUnroll, bool kFull, bool kPipe>
__global__ void __launch_bounds__(kWarps * 32) moe_gemm_kernel(
    const uint4* __restrict__ wa, const uint4* __restrict__ wb, const uint32_t* __restrict__ sa,
    const uint32_t* __restrict__ sb, const __nv_bfloat16* __restrict__ act, int act_div,
    const int* __restrict__ block_expert, const int* __restrict__ block_pairs, const int* __restrict__ num_blocks,
    int NT, int KT, __nv_bfloat16* __restrict__ h_out, float* __restrict__ y_out) {
  constexpr bool kTwo = kMode != kDown;  // two weight streams
  constexpr int NACC = kTwo ? 8 : 4;
  __shared__ float red[kWarps][32][NACC];
  // gate/up reads align's blocks, so it waits first; down reads only blocks (align finished before every
  // gate/up CTA passed its wait) until it needs h.
  if (kMode == kGateUp) pdl_wait();
  // NOTE: gate/up releases only after its wait: down reads align's blocks before its own wait
  release_dependents();
  const int b = blockIdx.y;
  if (b >= *num_blocks) return;
  const int tile = kMode == kDown2 ? 2 * blockIdx.x : blockIdx.x;  // the first (or only) row tile
  const int e = block_expert[b];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int pair_g = block_pairs[b * kSlots + g];
  const int K = KT * 64;
  // An empty slot reads slot 0's row (every block has one): its MMA column is never stored, so no predicate.
  const int src = pair_g >= 0 ? pair_g : block_pairs[b * kSlots];
  const uint4* xrow = reinterpret_cast<const uint4*>(act + (size_t)(src / act_div) * K);
  if (kMode != kGateUp) pdl_wait();
  const size_t tile_id = (size_t)e * NT + tile;
  const size_t tile_b = kMode == kDown2 ? tile_id + 1 : tile_id;  // kGateUp: the same tile of the up matrix
  const uint4* pa = wa + tile_id * KT * 32 + lane;
  const uint4* pb = kTwo ? wb + tile_b * KT * 32 + lane : nullptr;
  const uint32_t* psa = sa + tile_id * KT * 16 + (c >> 1) * 8 + g;
  const uint32_t* psb = kTwo ? sb + tile_b * KT * 16 + (c >> 1) * 8 + g : nullptr;

  float acc_a[4] = {0.f, 0.f, 0.f, 0.f}, acc_b[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr int kStep = kWarps * kUnroll;
  if (!kPipe) {
    for (int base = warp * kUnroll; base < KT; base += kStep) {
      Stage<kUnroll> st;
      load_stage<kTwo, kFull>(st, base, KT, pa, pb, psa, psb, xrow, c);
      mma_stage<kTwo>(st, acc_a, acc_b);
    }
  } else if (warp * kUnroll < KT) {
    Stage<kUnroll> s0, s1;  // ping-pong, unrolled by two so both stay in registers
    load_stage<kTwo, kFull>(s0, warp * kUnroll, KT, pa, pb, psa, psb, xrow, c);
    for (int base = warp * kUnroll;; base += 2 * kStep) {
      const bool more = base + kStep < KT;
      if (more) load_stage<kTwo, kFull>(s1, base + kStep, KT, pa, pb, psa, psb, xrow, c);
      mma_stage<kTwo>(s0, acc_a, acc_b);
      if (!more) break;
      const bool again = base + 2 * kStep < KT;
      if (again) load_stage<kTwo, kFull>(s0, base + 2 * kStep, KT, pa, pb, psa, psb, xrow, c);
      mma_stage<kTwo>(s1, acc_a, acc_b);
      if (!again) break;
    }
  }
  pdl_launch_dependents();  // the next kernel's CTAs may take SMs this CTA's reduction leaves idle
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    red[warp][lane][i] = acc_a[i];
    if (kTwo) red[warp][lane][4 + i] = acc_b[i];
  }
  __syncthreads();
  if (warp != 0) return;
  float v[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][lane][i];
    v[i] = s;
  }
  const int N = NT * 16;
  // C fragment: v[0] (row g, slot 2c), v[1] (row g, slot 2c+1), v[2] (row g+8, slot 2c), v[3] (row g+8, 2c+1);
  // v[4..7] the same places of the second stream
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int slot = 2 * c + (i & 1);
    const int row = tile * 16 + g + ((i >> 1) ? 8 : 0);
    const int pair = block_pairs[b * kSlots + slot];
    if (pair < 0) continue;
    if (kMode == kGateUp) {
      const float gt = v[i], up = v[4 + i];
      const float hv = gt / (1.f + __expf(-gt)) * up;
      h_out[(size_t)pair * N + row] = __float2bfloat16(hv);
    } else {
      y_out[(size_t)pair * N + row] = v[i];
      if (kMode == kDown2) y_out[(size_t)pair * N + row + 16] = v[4 + i];
    }
  }
}

// out[t, n] = sum_k w[t, k] * y[t*topk + k, n]; grid (T, column chunks of blockDim*4), so one token's row
// is spread over several SMs (it was one CTA per token; with the parallel align scan: T=1 94 -> 71 us). Every
// pair's loads are issued before the first sum (a load behind a skip test waits on the one before it: a chain
// of top-k round trips); the sum runs in list order as before. res (or null): out = res + the sum rounded to
// bf16, both as bf16, the way a separate bf16 add computes it (one launch fewer a layer).
// NOTE: a pair whose id is outside [0, E) (-1: expert held by another rank) contributes nothing.
constexpr int kCombineTopk = 16;  // the most pairs per token the combine takes
__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ w,
                                   const int64_t* __restrict__ ids, int E, int topk, int N,
                                   const __nv_bfloat16* __restrict__ res, __nv_bfloat16* __restrict__ out) {
  release_dependents();
  __shared__ float wk[kCombineTopk];  // [topk] route weights
  __shared__ bool use[kCombineTopk];  // [topk] the pair's expert is on this rank
  pdl_wait();
  const int t = blockIdx.x;
  if (threadIdx.x < topk) {
    const int64_t id = ids[t * topk + threadIdx.x];
    use[threadIdx.x] = id >= 0 && id < E;
    wk[threadIdx.x] = w[t * topk + threadIdx.x];
  }
  __syncthreads();
  for (int n = (blockIdx.y * blockDim.x + threadIdx.x) * 4; n < N; n += gridDim.y * blockDim.x * 4) {
    float4 v[kCombineTopk];
#pragma unroll
    for (int k = 0; k < kCombineTopk; ++k)
      if (k < topk && use[k]) v[k] = *reinterpret_cast<const float4*>(y + ((size_t)t * topk + k) * N + n);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kCombineTopk; ++k) {
      if (k >= topk || !use[k]) continue;
      acc.x += wk[k] * v[k].x; acc.y += wk[k] * v[k].y; acc.z += wk[k] * v[k].z; acc.w += wk[k] * v[k].w;
    }
    __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y), hi = __floats2bfloat162_rn(acc.z, acc.w);
    if (res) {
      const __nv_bfloat162 r_lo = *reinterpret_cast<const __nv_bfloat162*>(res + (size_t)t * N + n);
      const __nv_bfloat162 r_hi = *reinterpret_cast<const __nv_bfloat162*>(res + (size_t)t * N + n + 2);
      lo = __floats2bfloat162_rn(__low2float(r_lo) + __low2float(lo), __high2float(r_lo) + __high2float(lo));
      hi = __floats2bfloat162_rn(__low2float(r_hi) + __low2float(hi), __high2float(r_hi) + __high2float(hi));
    }
    *reinterpret_cast<__nv_bfloat162*>(out + (size_t)t * N + n) = lo;
    *reinterpret_cast<__nv_bfloat162*>(out + (size_t)t * N + n + 2) = hi;
  }
}

struct Variant {
  int gu_warps, gu_unroll, dn_warps, dn_unroll;
  bool dn_two, checked;  // dn_two: kDown2 (two row tiles per CTA); checked: every load bounds-checked (no kFull)
  bool pdl;              // align, gate/up, down and combine launched with programmatic dependent launch
  bool gu_pipe;          // a kPipe gate/up GEMM (4 warps x 2 or 4 k-steps: the tile fields say which)
  bool dn_pipe;          // a kPipe down GEMM (kDown2, 2 x 2)
};
// 0-3: one tile set; 4-7: the same, bounds-checked; 8-13: down tiles paired apart from gate/up, kDown2;
// 14, 15: 10 and 4 with programmatic dependent launch; 16, 17: kPipe, with and without PDL; 18: 14's tiles with
// its gate/up pipelined (the same k-steps per warp in the same order as 14 and 10: row-invariant beside them).
constexpr Variant kVariants[] = {
    {2, 8, 2, 8, false, false, false}, {4, 4, 4, 4, false, false, false},  // 0, 1
    {2, 4, 2, 4, false, false, false}, {4, 8, 4, 4, false, false, false},  // 2, 3
    {2, 8, 2, 8, false, true, false}, {4, 4, 4, 4, false, true, false},  // 4, 5
    {2, 4, 2, 4, false, true, false}, {4, 8, 4, 4, false, true, false},  // 6, 7
    {4, 4, 2, 8, false, false, false}, {4, 4, 4, 4, true, false, false},  // 8, 9
    {4, 4, 2, 8, true, false, false}, {4, 4, 2, 4, true, false, false},  // 10, 11
    {2, 8, 2, 8, true, true, false}, {2, 8, 2, 4, true, true, false},  // 12, 13
    {4, 4, 2, 8, true, false, true}, {2, 8, 2, 8, false, true, true},  // 14, 15
    {4, 2, 2, 2, true, false, true, true, true}, {4, 2, 2, 2, true, false, false, true, true},  // 16, 17
    {4, 4, 2, 8, true, false, true, true, false},                                                // 18
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// launch_gateup / launch_down instantiate the kPipe GEMMs at fixed tiles: the table's rows must say the same.
constexpr bool pipe_rows_match(int i = 0) {
  return i == kNumVariants ||
         ((!kVariants[i].gu_pipe || (kVariants[i].gu_warps == 4 && (kVariants[i].gu_unroll == 2 ||
                                                                     kVariants[i].gu_unroll == 4))) &&
          (!kVariants[i].dn_pipe || (kVariants[i].dn_warps == 2 && kVariants[i].dn_unroll == 2 && kVariants[i].dn_two)) &&
          pipe_rows_match(i + 1));
}
static_assert(pipe_rows_match(), "a kPipe variant's tile fields differ from the tiles launch_gateup/launch_down use");

struct GemmArgs {
  const int *block_expert, *block_pairs, *num_blocks;
  int max_blocks;
  cudaStream_t st;
  bool pdl;
};

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

template <int kMode, int W, int U, bool kPipe = false>
void gemm(bool checked, int NT, int KT, const GemmArgs& a, const uint4* wa, const uint4* wb, const uint32_t* sa,
          const uint32_t* sb, const __nv_bfloat16* act, int act_div, __nv_bfloat16* h_out, float* y_out) {
  const dim3 grid(kMode == kDown2 ? NT / 2 : NT, a.max_blocks);
  auto kernel = !checked && KT % (W * U) == 0 ? moe_gemm_kernel<kMode, W, U, true, kPipe>
                                              : moe_gemm_kernel<kMode, W, U, false, kPipe>;
  launch(kernel, grid, dim3(W * 32), 0, a.st, a.pdl, wa, wb, sa, sb, act, act_div, a.block_expert, a.block_pairs,
         a.num_blocks, NT, KT, h_out, y_out);
}

using GemmFn = void (*)(bool, int, int, const GemmArgs&, const uint4*, const uint4*, const uint32_t*, const uint32_t*,
                       const __nv_bfloat16*, int, __nv_bfloat16*, float*);

// Without DDT_MOE_SWEEP only the variants ops/cuda_moe.default_variant picks are built (their 16 GEMM kernels
// instead of all 32): each one instantiated costs first-start nvcc time; the benchmark sweep builds them all.
constexpr bool picked(int i) { return i == 10 || i == 14 || i == 16 || i == 18; }
constexpr bool picked_tiles_match() {
  return kVariants[10].gu_warps == 4 && kVariants[10].gu_unroll == 4 && kVariants[10].dn_two && kVariants[10].dn_warps == 2 &&
         kVariants[10].dn_unroll == 8 && !kVariants[10].gu_pipe && !kVariants[10].dn_pipe && !kVariants[10].checked &&
         kVariants[14].gu_warps == 4 && kVariants[14].gu_unroll == 4 && kVariants[14].dn_two && kVariants[14].dn_warps == 2 &&
         kVariants[14].dn_unroll == 8 && !kVariants[14].gu_pipe && !kVariants[14].dn_pipe && !kVariants[14].checked &&
         kVariants[16].gu_pipe && kVariants[16].gu_unroll == 2 && kVariants[16].dn_pipe && !kVariants[16].checked &&
         kVariants[18].gu_pipe && kVariants[18].gu_warps == 4 && kVariants[18].gu_unroll == 4 && !kVariants[18].dn_pipe &&
         kVariants[18].dn_two && kVariants[18].dn_warps == 2 && kVariants[18].dn_unroll == 8 && !kVariants[18].checked;
}
static_assert(picked_tiles_match(), "variants 10, 14, 16 and 18 must keep the tiles the default build instantiates");
#ifdef DDT_MOE_SWEEP
constexpr bool kAllVariants = true;
#else
constexpr bool kAllVariants = false;
#endif

// A TP rank's slice of an expert's intermediate (K2.6 at TP=8: NT = 16 row tiles) gives one token's gate/up
// product ~130 CTAs, about one an SM, and 4 warps an SM keep ~32 KB of weights in flight. Up to kFewRowTiles
// the 4 x 4 tile runs as 7 warps x 4 where 28 divides KT (K2.6's 112: 7 warps, 4 rounds each, no checked
// load): 7/4 of the loads in flight. Chosen by shape, at every token count (18, 14 and 10 keep one K order).
constexpr int kFewRowTiles = 32;

void launch_gateup(const Variant& v, const GemmArgs& a, const uint4* wg, const uint4* wu, const uint32_t* sg,
                   const uint32_t* su, const __nv_bfloat16* x, int topk, int NT, int KT, __nv_bfloat16* h) {
  const bool four_by_four = v.gu_warps == 4 && v.gu_unroll == 4;  // 10, 14, 18
#ifdef DDT_MOE_SWEEP
  GemmFn f = gemm<kGateUp, 2, 8>;
  if (v.gu_pipe) f = v.gu_unroll == 4 ? gemm<kGateUp, 4, 4, true> : gemm<kGateUp, 4, 2, true>;
  else if (v.gu_warps == 4) f = v.gu_unroll == 8 ? gemm<kGateUp, 4, 8> : gemm<kGateUp, 4, 4>;
  else if (v.gu_unroll == 4) f = gemm<kGateUp, 2, 4>;
#else
  GemmFn f = !v.gu_pipe ? gemm<kGateUp, 4, 4> : v.gu_unroll == 4 ? gemm<kGateUp, 4, 4, true>  // 10, 14 | 18
                                                                  : gemm<kGateUp, 4, 2, true>;  // 16
#endif
  if (four_by_four && NT <= kFewRowTiles && KT % 28 == 0) f = v.gu_pipe ? gemm<kGateUp, 7, 4, true> : gemm<kGateUp, 7, 4>;
  f(v.checked, NT, KT, a, wg, wu, sg, su, x, topk, h, nullptr);
}

// A TP rank's slice of an expert's intermediate (K2.6 at TP=8: 256, KT = 4) is shorter than one 2 x 8 step of
// k-steps: its second warp idles, every load is bounds-checked, and ~90 registers a thread leave ~11 CTAs an SM
// for the ~2,000 CTAs of a token's down products. Up to kShortKT k-steps the 2 x 8 tile runs as one warp x 4
// (the same rule at every token count, so a row's K order does not depend on the launch).
constexpr int kShortKT = 8;

// NT: row tiles of H (even: H % 64 == 0), so kDown2's tile pairs cover it.
void launch_down(const Variant& v, const GemmArgs& a, const uint4* wd, const uint32_t* sd, const __nv_bfloat16* h,
                 int NT, int KT, float* y) {
  const bool two_by_eight = v.dn_two && !v.dn_pipe && v.dn_warps == 2 && v.dn_unroll == 8;  // 10, 14, 18
#ifdef DDT_MOE_SWEEP
  GemmFn f = v.dn_two ? gemm<kDown2, 2, 8> : gemm<kDown, 2, 8>;
  if (v.dn_pipe) f = gemm<kDown2, 2, 2, true>;  // the kPipe down GEMM is kDown2's
  else if (v.dn_warps == 4) f = v.dn_two ? gemm<kDown2, 4, 4> : gemm<kDown, 4, 4>;
  else if (v.dn_unroll == 4) f = v.dn_two ? gemm<kDown2, 2, 4> : gemm<kDown, 2, 4>;
#else
  GemmFn f = v.dn_pipe ? gemm<kDown2, 2, 2, true> : gemm<kDown2, 2, 8>;  // 16 | 10, 14, 18
#endif
  if (two_by_eight && KT <= kShortKT) f = gemm<kDown2, 1, 4>;
  f(v.checked, NT, KT, a, wd, wd, sd, sd, h, 1, nullptr, y);
}

}  // namespace

extern "C" {

// Sizes: H % 64 == 0, I % 64 == 0, group 32. ws_int holds max_blocks*(1+8)+1 ints.
// h_buf bf16 [T*topk, I]; y_buf fp32 [T*topk, H]; out bf16 [T, H]; residual bf16 [T, H] or null (added to out).
int ddt_moe_forward(const void* x, const int64_t* ids, const float* route_w, int T, int topk, int E, int H, int I,
                    const void* wg, const void* wu, const void* sg, const void* su, const void* wd, const void* sd,
                    int* ws_int, int max_blocks, void* h_buf, float* y_buf, void* out, const void* residual,
                    int variant, void* stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  if (variant < 0 || variant >= kNumVariants || !(kAllVariants || picked(variant)) || topk > kCombineTopk)
    return (int)cudaErrorInvalidValue;
  const int n_pairs = T * topk;
  int* block_expert = ws_int;
  int* block_pairs = ws_int + max_blocks;
  int* num_blocks = ws_int + max_blocks * (1 + kSlots);
  const Variant v = kVariants[variant];
  launch(moe_align_kernel, dim3(1), dim3(512), 3 * E * sizeof(int), st, v.pdl, ids, n_pairs, E, max_blocks, block_expert,
         block_pairs, num_blocks);
  // variant: gate/up tile (warps x unroll), down tile, checked = every load bounds-checked (kFull off).
  // ops/cuda_moe.default_variant picks by token count (BENCHMARKS.md).
  const GemmArgs a{block_expert, block_pairs, num_blocks, max_blocks, st, v.pdl};
  launch_gateup(v, a, (const uint4*)wg, (const uint4*)wu, (const uint32_t*)sg, (const uint32_t*)su,
                (const __nv_bfloat16*)x, topk, I / 16, H / 64, (__nv_bfloat16*)h_buf);
  launch_down(v, a, (const uint4*)wd, (const uint32_t*)sd, (const __nv_bfloat16*)h_buf, H / 16, I / 64, y_buf);
  launch(moe_combine_kernel, dim3(T, (H + 511) / 512), dim3(128), 0, st, v.pdl, (const float*)y_buf, route_w, ids, E,
         topk, H, (const __nv_bfloat16*)residual, (__nv_bfloat16*)out);
  return (int)cudaGetLastError();
}

}  // extern "C"
