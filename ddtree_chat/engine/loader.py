"""Build the target / drafter on the meta device and load weights by assignment, tensor by tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .checkpoint import CheckpointReader
from .config import DraftConfig, TargetConfig, load_draft_config, load_target_config
from .errors import CheckpointError
from .model import KimiModel, MoE
from .ops.int4 import Int4Weight, dequant_int4
from .ops.moe import ExpertWeights, prepare_experts
from .ops.router import float32_weight
from .parallel import SINGLE, TPGroup, shard_dim
from .progress import Progress



def _prefixes(cfg: TargetConfig) -> tuple[str, str]:
    return ("language_model.model.", "language_model.lm_head.weight") if cfg.layout == "k25" \
        else ("model.", "lm_head.weight")


def _check_float(t: torch.Tensor, name: str) -> None:
    if not t.is_floating_point():
        raise CheckpointError(f"tensor {name} has dtype {t.dtype}, expected a floating-point dtype.")


def _load_dense(module: nn.Module, reader: CheckpointReader, key_of: Callable[[str], str], device, dtype,
                tick: Callable[[str], None], tp: TPGroup = SINGLE) -> None:
    """Assign every parameter/persistent buffer of `module` from the checkpoint. Under TP each rank
    reads only its contiguous slice (the module was built with local shapes)."""
    state = {}
    for name, ref in module.state_dict(keep_vars=True).items():
        key = key_of(name)
        keep_fp32 = name.endswith("e_score_correction_bias")
        dim = shard_dim(name) if tp.world > 1 else None
        sl = {}
        if dim is not None:
            n = ref.shape[dim]
            sl["rows" if dim == 0 else "cols"] = slice(tp.rank * n, (tp.rank + 1) * n)
        t = reader.get(key, shape=tuple(ref.shape), dtype=torch.float32 if keep_fp32 else None, **sl)
        _check_float(t, key)
        state[name] = t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)
        tick(key)
    module.load_state_dict(state, assign=True, strict=True)


def _expert_slices(cfg: TargetConfig, tp: TPGroup) -> tuple[range, slice]:
    """(experts this rank holds, its slice of each expert's intermediate features)."""
    if tp.world == 1:
        return range(cfg.n_routed_experts), slice(0, cfg.moe_intermediate_size)
    if tp.expert_parallel:
        return range(*tp.split(cfg.n_routed_experts, "n_routed_experts")), slice(0, cfg.moe_intermediate_size)
    i0, i1 = tp.split(cfg.moe_intermediate_size, "moe_intermediate_size")
    g = cfg.quant.group_size if cfg.quant else 8
    if (i1 - i0) % g:
        raise CheckpointError(f"moe_intermediate_size {cfg.moe_intermediate_size} split over {tp.world} ranks "
                              f"cuts INT4 groups of {g}; use --expert-parallel or fewer ranks.")
    return range(cfg.n_routed_experts), slice(i0, i1)


def _load_experts(cfg: TargetConfig, reader: CheckpointReader, base: str, device, dtype, dense: bool,
                  tick: Callable[[str], None], tp: TPGroup = SINGLE) -> ExpertWeights:
    h, inter = cfg.hidden_size, cfg.moe_intermediate_size
    experts, isl = _expert_slices(cfg, tp)
    shapes = {"gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    g = cfg.quant.group_size if cfg.quant else 1
    out = {}
    for proj, (n, k) in shapes.items():
        # NOTE: gate/up are split along their rows (outputs), down along its columns (inputs).
        down = proj == "down_proj"
        rows = None if down else isl
        n_local = n if down else isl.stop - isl.start
        k_local = isl.stop - isl.start if down else k

        def cols(div: int):
            return slice(isl.start // div, isl.stop // div) if down else None

        # NOTE: each expert's slice is read and copied into its place at once: the host holds one slice, not
        # a projection's slices of every expert (hundreds of MB per rank at K2.6 shapes)
        if cfg.quant is None:
            w = torch.empty((len(experts), n_local, k_local), dtype=dtype, device=device)
            for i, e in enumerate(experts):
                w[i].copy_(reader.get(f"{base}.{e}.{proj}.weight", shape=(n_local, k_local), rows=rows, cols=cols(1)))
            out[proj] = w
            tick(f"{base}.*.{proj}")
            continue
        if k % g:
            raise CheckpointError(f"{base}.*.{proj}: input size {k} is not a multiple of group_size {g}.")
        # NOTE: dense (the CPU reference path): each expert is dequantised into its place as it is read, so the
        # transient int32 unpacking stays one expert's slice, not a whole layer's (GBs at K2.6 shapes)
        w = torch.empty((len(experts), n_local, k_local), dtype=dtype, device=device) if dense else None
        p = torch.empty((1 if dense else len(experts), n_local, k_local // 8), dtype=torch.int32, device=device)
        s = torch.empty((1 if dense else len(experts), n_local, k_local // g), dtype=dtype, device=device)
        for i, e in enumerate(experts):
            name = f"{base}.{e}.{proj}"
            if f"{name}.weight_shape" in reader:
                ws = reader.get(f"{name}.weight_shape").tolist()
                if [int(v) for v in ws] != [n, k]:
                    raise CheckpointError(f"tensor {name}.weight_shape is {ws}, expected {[n, k]}.")
            j = 0 if dense else i
            p[j].copy_(reader.get(f"{name}.weight_packed", shape=(n_local, k_local // 8), dtype=torch.int32,
                                  rows=rows, cols=cols(8)))
            scale = reader.get(f"{name}.weight_scale", shape=(n_local, k_local // g), rows=rows, cols=cols(g))
            _check_float(scale, f"{name}.weight_scale")
            s[j].copy_(scale)
            if dense:
                w[i].copy_(dequant_int4(p[0], s[0], g, dtype))
        # NOTE: on CPU the reference path computes with dense weights; GPU kernels keep them packed.
        out[proj] = w if dense else Int4Weight(p, s, g)
        tick(f"{base}.*.{proj}")
    return ExpertWeights(out["gate_proj"], out["up_proj"], out["down_proj"])


def _count(module: nn.Module, cfg: TargetConfig | None = None) -> int:
    n = len(module.state_dict())
    if cfg is not None:
        n += 3 * sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    return n


def load_target(model_dir: str | Path, device: torch.device, dtype: torch.dtype,
                progress: Progress = None, tp: TPGroup = SINGLE,
                packed_experts: bool | None = None) -> tuple[TargetConfig, KimiModel]:
    """packed_experts: keep INT4 routed experts packed (True) or dequantise them (False); None: the device's
    and dtype's own form (packed where a kernel serves them: a GPU in bf16/fp16)."""
    cfg = load_target_config(model_dir)
    reader = CheckpointReader(model_dir)
    with torch.device("meta"):
        model = KimiModel(cfg, tp)
    prefix, head = _prefixes(cfg)
    total, done = _count(model, cfg), 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    _load_dense(model, reader, lambda n: head if n == "lm_head.weight" else prefix + n, device, dtype, tick, tp)
    # NOTE: no kernel serves float32 (CPU, small models on GPU): its reference path wants dense experts.
    dense_experts = torch.device(device).type == "cpu" or dtype == torch.float32
    if packed_experts is not None:
        dense_experts = not packed_experts
    for i, layer in enumerate(model.layers):
        if isinstance(layer.mlp, MoE):
            experts = _load_experts(cfg, reader, f"{prefix}layers.{i}.mlp.experts", device, dtype, dense_experts,
                                    tick, tp)
            layer.mlp.experts = prepare_experts(experts)
            float32_weight(layer.mlp.gate.weight)  # NOTE: the router's float32 copy, made once here
    model.reset_rope(device)
    reader.close()
    return cfg, model.eval().requires_grad_(False)


def load_drafter(draft_dir: str | Path, target: TargetConfig, device: torch.device, dtype: torch.dtype,
                 progress: Progress = None, tp: TPGroup = SINGLE) -> tuple[DraftConfig, nn.Module]:
    """Under TP each rank reads its slices (heads, MLP features, fc input features), like the target."""
    from .drafter import DFlashDrafter

    dcfg = load_draft_config(draft_dir)
    dcfg.check_against(target)
    reader = CheckpointReader(draft_dir)
    with torch.device("meta"):
        drafter = DFlashDrafter(dcfg, tp)
    total, done = _count(drafter), 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    # NOTE: public DFlash checkpoints store keys at top level; some exports prefix them with "model.".
    key_prefix = "model." if "model.fc.weight" in reader else ""
    _load_dense(drafter, reader, lambda n: key_prefix + n, device, dtype, tick, tp)
    drafter.reset_rope(device)
    reader.close()
    return dcfg, drafter.eval().requires_grad_(False)

