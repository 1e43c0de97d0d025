"""Loading at disk speed: one tensor-parallel rank's load of its K2.6 slices against the disk's sequential read.

    PYTHONPATH=. python benchmarks/load_speed.py --dir /tmp/k26-shards --layers 3 --tp-world 8 [--device cuda | --device cpu --packed]
        [--json OUT]
    python benchmarks/load_speed.py --dir /tmp/tiny-shards --tiny --device cpu        # CPU smoke run

Writes (once; kept in --dir) a K2.6-format checkpoint of `--layers` real-size layers (layer 0 dense, the rest
MoE with 384 INT4 experts in the compressed-tensors layout, random values, one safetensors file per layer plus
one for the embedding and the lm head). Then, each in a fresh process with the files' page cache dropped
first (posix_fadvise DONTNEED, no root needed): the disk's sequential read of every file, and rank --rank's
load of its slices (engine.loader.load_target). Reports GB/s of the bytes the rank needs (its slices) and of
the files' bytes, the bytes the load fetched from storage (Linux) and its peak host memory (the child's
ru_maxrss)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtree_chat.engine.config import load_target_config  # noqa: E402
from ddtree_chat.engine.parallel import shard_dim  # noqa: E402
from ddtree_chat.engine.synthetic import layer_tensors, quant_config, text_config  # noqa: E402

K26 = dict(hidden=7168, heads=64, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128, inter=18432, moe_inter=2048,
           experts=384, top_k=8, vocab=163840)
TINY = dict(hidden=64, heads=8, q_lora=32, kv_lora=32, nope=16, rope=8, v=16, inter=128, moe_inter=64, experts=8,
            top_k=2, vocab=1024)
CHUNK = 64 << 20  # bytes per read() of the baseline


def _mat(out: int, inp: int, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(out, inp, generator=g) / inp**0.5).to(torch.bfloat16)


def _layer(p: dict, i: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Layer i's tensors, K2 names; experts as random packed words and group-32 scales (no quantisation pass)."""
    def expert(o, k):
        return (torch.randint(-2**31, 2**31 - 1, (o, k // 8), dtype=torch.int32, generator=g),
                torch.full((o, k // 32), 1 / (4.5 * k**0.5), dtype=torch.bfloat16))

    t = layer_tensors(p, i, lambda o, k, gain=1.0: _mat(o, k, g), lambda n: torch.ones(n, dtype=torch.bfloat16),
                      torch.zeros, expert)
    return {"model." + n: v for n, v in t.items()}


def write_checkpoint(out: Path, p: dict, layers: int) -> Path:
    """The K2-layout checkpoint (kept: a second run reuses it)."""
    from safetensors.torch import save_file

    if (out / "model.safetensors.index.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(text_config(dict(p, layers=layers, shards=1), p["vocab"]), quantization_config=quant_config())
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    parts = [("model-embed.safetensors", {"model.embed_tokens.weight": _mat(p["vocab"], p["hidden"], g),
                                          "model.norm.weight": torch.ones(p["hidden"], dtype=torch.bfloat16),
                                          "lm_head.weight": _mat(p["vocab"], p["hidden"], g)})]
    parts += [(f"model-layer{i:03d}.safetensors", None) for i in range(layers)]
    for i, (fname, tensors) in enumerate(parts):
        tensors = tensors if tensors is not None else _layer(p, i - 1, g)  # NOTE: one layer in memory at a time
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(v.numel() * v.element_size() for v in tensors.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}, indent=1))
    return out


def rank_bytes(ckpt: Path, world: int) -> int:
    """Bytes of the checkpoint one of `world` TP ranks reads: 1/world of each split tensor and of each routed
    expert (gate/up rows, down columns, their scales), the rest whole."""
    from safetensors import safe_open

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    total = 0
    for fname in sorted(set(index["weight_map"].values())):
        with safe_open(str(ckpt / fname), "pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                n = sl.get_shape()
                size = {"I32": 4, "BF16": 2, "F32": 4}[sl.get_dtype()]
                for d in n:
                    size *= d
                short = name.removeprefix("model.")
                split = ".experts." in name and not name.endswith("weight_shape") or shard_dim(short) is not None
                total += size // world if split else size
    return total


def drop_cache(ckpt: Path) -> None:
    for f in ckpt.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(ckpt: Path) -> tuple[int, float]:
    """(bytes, seconds) of reading every file sequentially in CHUNK pieces."""
    buf, n = bytearray(CHUNK), 0
    t0 = time.perf_counter()
    for f in sorted(ckpt.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            while (got := fh.readinto(buf)) > 0:
                n += got
    return n, time.perf_counter() - t0


def _child(ckpt: str, rank: int, world: int, device: str, packed: bool = False) -> None:
    """The timed load, in its own process (its ru_maxrss is the load's peak host memory). packed: the routed
    experts kept packed on the CPU, as a GPU keeps them (the CPU's own form dequantises them, which then
    dominates the time): the same reads, without the dequantisation."""
    from ddtree_chat.engine import loader
    from ddtree_chat.engine.parallel import TPGroup

    t0 = time.perf_counter()
    _, model = loader.load_target(ckpt, torch.device(device), torch.bfloat16, tp=TPGroup(rank, world),
                                  packed_experts=True if packed else None)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    experts = [layer.mlp.experts.gate for layer in model.layers if getattr(layer.mlp, "experts", None) is not None]
    print(json.dumps({"load_s": load_s, "storage_read_bytes": _storage_read_bytes(),
                      "experts_packed": bool(experts) and all(not torch.is_tensor(e) for e in experts)}))


def _storage_read_bytes() -> int | None:
    """Bytes this process made the kernel fetch from storage (Linux /proc/self/io; None elsewhere): a slice
    smaller than a page's stride (the down projections' column slices) pulls in whole pages."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="where the checkpoint is written (kept)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--tp-world", type=int, default=8)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="scaled-down dimensions (CPU smoke run)")
    ap.add_argument("--packed", action="store_true",
                    help="--device cpu: keep the routed experts packed, as a GPU does (times the reading alone)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.child:
        _child(str(a.dir), a.rank, a.tp_world, a.device, a.packed)
        return 0
    t0 = time.perf_counter()
    ckpt = write_checkpoint(a.dir, TINY if a.tiny else K26, a.layers)
    write_s = time.perf_counter() - t0
    cfg = load_target_config(ckpt)
    drop_cache(ckpt)
    disk_bytes, disk_s = read_all(ckpt)
    drop_cache(ckpt)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--dir", str(ckpt), "--rank", str(a.rank),
           "--tp-world", str(a.tp_world), "--device", a.device] + (["--packed"] if a.packed else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:  # NOTE: a signal (-9: the kernel's out-of-memory kill) or the loader's own error
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"load_speed: the rank's load failed (exit {out.returncode}): {last}", file=sys.stderr)
        return 1
    child = json.loads(out.stdout.strip().splitlines()[-1])
    load_s, fetched = child["load_s"], child["storage_read_bytes"]
    if a.packed and not child["experts_packed"]:
        print("load_speed: --packed, yet the rank's experts were loaded dense", file=sys.stderr)
        return 1
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    need = rank_bytes(ckpt, a.tp_world)
    res = {"layers": cfg.num_layers, "tp_world": a.tp_world, "rank": a.rank, "device": a.device,
           "experts_packed": child["experts_packed"],
           "write_s": write_s, "file_bytes": disk_bytes, "disk_GBps": disk_bytes / disk_s / 1e9,
           "rank_bytes": need, "load_s": load_s, "rank_GBps": need / load_s / 1e9,
           "files_GBps_during_load": disk_bytes / load_s / 1e9, "storage_read_bytes": fetched,
           "peak_rss_bytes": peak}
    print(f"{cfg.num_layers} K2.6-sized layers{' (tiny)' if a.tiny else ''}: files {disk_bytes / 1e9:.2f} GB, read "
          f"at {res['disk_GBps']:.2f} GB/s (page cache dropped); rank {a.rank} of {a.tp_world} needs "
          f"{need / 1e9:.2f} GB, loaded in {load_s:.1f} s = {res['rank_GBps']:.2f} GB/s "
          f"({res['rank_GBps'] / res['disk_GBps']:.0%} of the disk), peak host memory {peak / 1e9:.2f} GB"
          + (f"; it fetched {fetched / 1e9:.2f} GB from storage ({fetched / disk_bytes:.0%} of the files)"
             if fetched is not None else ""))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
