"""Write the demo target in the exact K2.6 on-disk layout and the drafter in the public DFlash format."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .common import TARGET, target_config, write_json
from .qmoe import export_int4

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def target_tensors(tt) -> dict[str, torch.Tensor]:
    """TrainTarget -> {checkpoint name: tensor}: bf16 dense, INT4 group-32 routed experts, fp32 router bias."""
    out = {}
    for name, v in tt.model.state_dict().items():
        if name == "inv_freq":
            continue
        key = "language_model.lm_head.weight" if name == "lm_head.weight" else "language_model.model." + name
        out[key] = v.detach().float().cpu() if name.endswith("e_score_correction_bias") \
            else v.detach().to(torch.bfloat16).cpu()
    for li, p in tt.experts.items():
        base = f"language_model.model.layers.{li}.mlp.experts"
        for proj, which in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            w = p[which].detach().float().cpu()
            for e in range(w.shape[0]):
                packed, scale = export_int4(w[e])
                out[f"{base}.{e}.{proj}.weight_packed"] = packed
                out[f"{base}.{e}.{proj}.weight_scale"] = scale
                out[f"{base}.{e}.{proj}.weight_shape"] = torch.tensor(list(w[e].shape), dtype=torch.int32)
    return out


def write_shards(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    names = list(tensors)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total, per = sum(sizes), math.ceil(sum(sizes) / shards)
    groups, cur, acc = [], [], 0
    for n, s in zip(names, sizes):  # contiguous runs of roughly equal bytes
        if cur and acc + s > per and len(groups) < shards - 1:
            groups.append(cur)
            cur, acc = [], 0
        cur.append(n)
        acc += s
    groups.append(cur)
    weight_map = {}
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:06d}-of-{len(groups):06d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in g}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in g})
    write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def export_target(tt, tok_dir: Path, out: Path, vocab: int, n_ranks: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("model-*.safetensors"):
        f.unlink()
    write_json(out / "config.json", target_config(vocab, n_ranks))
    write_shards(out, target_tensors(tt), TARGET["shards"])
    for f in TOKENIZER_FILES:
        shutil.copy(tok_dir / f, out / f)
    return out


def export_drafter(drafter, out: Path, config: dict) -> Path:
    """config: the drafter's config.json (common.draft_config)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    t = {n: v.detach().to(torch.bfloat16).cpu().contiguous() for n, v in drafter.state_dict().items()
         if n != "inv_freq"}
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
