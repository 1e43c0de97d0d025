// Small hot-path ops: noaux_tc router (sigmoid + bias top-k, unbiased renormalised weights) and RMSNorm
// (optionally fused with the residual add). Raw-pointer kernels, no torch headers.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int kMaxPerLane = 16;  // E <= 512

// One warp per token. Ties go to the lower expert index.
__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int T, int E,
                             int topk, float scale, int normalize, int64_t* __restrict__ ids,
                             float* __restrict__ weights) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  float s[kMaxPerLane], bsel[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e < E) {
      const float v = 1.f / (1.f + __expf(-logits[(size_t)t * E + e]));
      s[j] = v;
      bsel[j] = v + bias[e];
    } else {
      s[j] = 0.f;
      bsel[j] = -INFINITY;
    }
  }
  float wsum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int k = 0; k < topk; ++k) {
    float best = -INFINITY;
    int bj = -1;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j)
      if (bsel[j] > best) { best = bsel[j]; bj = j; }
    int be = bj >= 0 ? lane + 32 * bj : 0x7fffffff;
    float bv = best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ov > bv || (ov == bv && oe < be)) { bv = ov; be = oe; }
    }
    const int owner = be & 31, oj = be >> 5;
    float sv = 0.f;
    if (lane == owner) {
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j)
        if (j == oj) { sv = s[j]; bsel[j] = -INFINITY; }
    }
    sv = __shfl_sync(0xffffffffu, sv, owner);
    wsum += sv;
    if (lane == k) { my_id = be; my_w = sv; }
  }
  if (lane < topk) {
    const float w = normalize ? my_w / wsum : my_w;
    ids[(size_t)t * topk + lane] = my_id;
    weights[(size_t)t * topk + lane] = w * scale;
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
  if (E > 32 * kMaxPerLane || topk > 32) return (int)cudaErrorInvalidValue;
  const int warps = 4;
  route_kernel<<<(T + warps - 1) / warps, warps * 32, 0, (cudaStream_t)stream>>>(logits, bias, T, E, topk, scale,
                                                                                normalize, ids, weights);
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
