// Programmatic dependent launch (sm_90 and later): a kernel that calls release_dependents() at its start lets
// the kernel after it, when that one is launched as a programmatic dependent (ops/pdl.py: the Triton kernels
// under DDTREE_PDL=1), launch and run its prologue (a prefetch of its weights) while this one still runs. That
// kernel waits for this one to finish before it reads anything this one writes; an ordinary launch after this
// one is unaffected. A kernel whose dependent reads before its wait (the MoE's down kernel reads align's blocks)
// releases only after its own wait, so everything before it has finished.
#pragma once

__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
