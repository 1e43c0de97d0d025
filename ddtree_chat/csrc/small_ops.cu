// Small hot-path ops: noaux_tc router (sigmoid + bias top-k, unbiased renormalised weights) and RMSNorm
// (optionally fused with the residual add). Raw-pointer kernels, no torch headers.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "pdl.cuh"

namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopk = 32;

// One block per token, a thread per expert. An expert's place in the selection order is the count of experts
// that beat it (a higher biased score, or an equal one and a lower index: ties go to the lower index), counted
// among candidates only: the experts at or above the top-k-th of the warps' maxima (k warps have a score that
// high, so no expert below it is picked and none beats a candidate). No thread waits on another's pick (a warp
// picking the k best one after another is a chain of k reductions).
__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int E, int topk,
                             float scale, int normalize, int64_t* __restrict__ ids, float* __restrict__ weights) {
  release_dependents();
  __shared__ float warp_max[kMaxExperts / 32];
  __shared__ float cand_v[kMaxExperts];  // [candidates] biased scores
  __shared__ int cand_e[kMaxExperts];
  __shared__ float pick_s[kMaxTopk];  // [topk] unbiased scores in selection order
  __shared__ int pick_id[kMaxTopk];
  __shared__ float threshold;
  __shared__ int n_cand;
  const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warps = blockDim.x / 32;
  float s = 0.f, v = -INFINITY;
  if (e < E) {
    s = 1.f / (1.f + __expf(-logits[(size_t)t * E + e]));
    v = s + bias[e];
  }
  float m = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[e / 32] = m;
  if (e < topk) { pick_s[e] = 0.f; pick_id[e] = 0; }  // NOTE: defined output should NaN scores leave a slot empty
  if (e == 0) { n_cand = 0; threshold = -INFINITY; }  // fewer warps than picks: every expert is a candidate
  __syncthreads();
  if (e < warps && warps >= topk) {
    const float mine = warp_max[e];
    int rank = 0;
    for (int w = 0; w < warps; ++w) rank += (warp_max[w] > mine) | ((warp_max[w] == mine) & (w < e));
    if (rank == topk - 1) threshold = mine;
  }
  __syncthreads();
  const bool cand = e < E && v >= threshold;
  if (cand) {
    const int i = atomicAdd(&n_cand, 1);  // NOTE: slot order varies run to run; the ranks below do not
    cand_v[i] = v;
    cand_e[i] = e;
  }
  __syncthreads();
  if (cand) {
    const int n = n_cand;
    int rank = 0;
    for (int i = 0; i < n; ++i) rank += (cand_v[i] > v) | ((cand_v[i] == v) & (cand_e[i] < e));
    if (rank < topk) { pick_s[rank] = s; pick_id[rank] = e; }
  }
  __syncthreads();
  if (e == 0) {
    float wsum = 0.f;  // summed in selection order
    for (int k = 0; k < topk; ++k) wsum += pick_s[k];
    for (int k = 0; k < topk; ++k) {
      ids[(size_t)t * topk + k] = pick_id[k];
      weights[(size_t)t * topk + k] = (normalize ? pick_s[k] / wsum : pick_s[k]) * scale;
    }
  }
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// One CTA per row. If res != nullptr: x = x + res is written to res_out (the new residual) first.
// x's row r starts at (r / inner) * s_outer + (r % inner) * s_inner (a slice of a fused projection, e.g.
// [T, heads, d] inside [T, width]); res, y and res_out are contiguous [rows, D].
// NOTE: like the reference, the sum is rounded to the activation dtype before the norm.
template <typename TX, typename TW>
__global__ void rms_norm_kernel(const TX* __restrict__ x, const TX* __restrict__ res, const TW* __restrict__ w,
                                int D, int inner, int64_t s_outer, int64_t s_inner, float eps, TX* __restrict__ y,
                                TX* __restrict__ res_out) {
  release_dependents();
  extern __shared__ float row[];  // [D]
  __shared__ float warp_sum[32];
  const size_t r = blockIdx.x;
  const TX* xr = x + (int64_t)(r / inner) * s_outer + (int64_t)(r % inner) * s_inner;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = to_f(xr[i]);
    if (res) {
      const TX sum = from_f<TX>(v + to_f(res[r * D + i]));
      res_out[r * D + i] = sum;
      v = to_f(sum);
    }
    row[i] = v;
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? warp_sum[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) warp_sum[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(warp_sum[0] / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) y[r * D + i] = from_f<TX>(row[i] * inv * to_f(w[i]));
}

}  // namespace

extern "C" {

int ddt_route(const float* logits, const float* bias, int T, int E, int topk, float scale, int normalize,
              int64_t* ids, float* weights, void* stream) {
  if (E > kMaxExperts || topk > kMaxTopk || topk > E) return (int)cudaErrorInvalidValue;
  const int threads = (E + 31) / 32 * 32;
  route_kernel<<<T, threads, 0, (cudaStream_t)stream>>>(logits, bias, E, topk, scale, normalize, ids, weights);
  return (int)cudaGetLastError();
}

// dtype codes: 0 = float32, 1 = bfloat16 (x/y/res share one; w has its own). Strides in elements.
int ddt_rms_norm(const void* x, const void* res, const void* w, int rows, int D, int inner, int64_t s_outer,
                 int64_t s_inner, float eps, int xdt, int wdt, void* y, void* res_out, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  const int threads = D >= 2048 ? 512 : 256;
  const size_t smem = (size_t)D * sizeof(float);
  if (smem > 48 * 1024 || inner < 1) return (int)cudaErrorInvalidValue;
#define DDT_LAUNCH(TX, TW)                                                                                  \
  rms_norm_kernel<TX, TW><<<rows, threads, smem, st>>>((const TX*)x, (const TX*)res, (const TW*)w, D, inner, \
                                                       s_outer, s_inner, eps, (TX*)y, (TX*)res_out)
  if (xdt == 1 && wdt == 1) DDT_LAUNCH(__nv_bfloat16, __nv_bfloat16);
  else if (xdt == 1 && wdt == 0) DDT_LAUNCH(__nv_bfloat16, float);
  else if (xdt == 0 && wdt == 0) DDT_LAUNCH(float, float);
  else if (xdt == 0 && wdt == 1) DDT_LAUNCH(float, __nv_bfloat16);
  else return (int)cudaErrorInvalidValue;
#undef DDT_LAUNCH
  return (int)cudaGetLastError();
}

}  // extern "C"
