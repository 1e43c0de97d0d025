// The warp MMA both mma.sync kernels use (csrc/moe_int4.cu, the narrow engine of csrc/mla_attention.cu):
// d [16 x 8] += a [16 x 16] b [16 x 8], bf16 in, float accumulators, in mma.sync's fragment layouts.
#pragma once

#include <stdint.h>

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
