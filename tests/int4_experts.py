"""Random INT4 routed experts in the checkpoint layout (group 32), for the MoE kernel's GPU tests."""

import torch

from ddtree_chat.engine.ops.int4 import Int4Weight
from ddtree_chat.engine.ops.moe import ExpertWeights


def random_int4(e, out, inp, device, gen):
    packed = torch.randint(-2**31, 2**31 - 1, (e, out, inp // 8), dtype=torch.int32, device=device, generator=gen)
    scale = (torch.rand(e, out, inp // 32, device=device, generator=gen) * 0.02 + 0.002).to(torch.bfloat16)
    return Int4Weight(packed, scale, 32)


def random_experts(e, h, i, device, seed=0):
    """e experts of hidden h and intermediate i: gate, up [e, i, h], down [e, h, i]."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return ExpertWeights(random_int4(e, i, h, device, gen), random_int4(e, i, h, device, gen),
                         random_int4(e, h, i, device, gen))
