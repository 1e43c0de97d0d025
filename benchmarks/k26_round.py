"""A K2.6-shaped DDTree round on one GPU: a random target with N real-size layers and a random drafter of
the public Kimi DFlash shape, over a committed context of random latents; each of the
round's programs (draft = drafter + tree build, verify = target over the tree, accept = walk + KV
compaction + drafter context) timed alone and against the bytes it must read at the copy ceiling
measured in the same process.

    PYTHONPATH=. python benchmarks/k26_round.py --synthetic-layers 4 --context 4096 --budgets 16 32 64 [--json OUT]
    PYTHONPATH=. python benchmarks/k26_round.py --tp-world 8 --collective-us 10 ...   # rank 0 of TP=8 (drafter too)
    python benchmarks/k26_round.py --tiny --device cpu        # scaled-down dims, uncaptured (a smoke run)

Random weights accept ~nothing, so this measures cost per round, not tokens per second; with a real
drafter's mean accepted length tau the speedup over AR is tau * (ar round ms) / (ddtree round ms) for
the same layer count. Bytes: verify = engine.memory.forward_bytes (distinct experts under uniform
routing); draft = the drafter's layers + the target's lm head + the drafter context it attends; accept
= the path's latent rows moved, plus (drafting rounds) fc + each layer's k/v projections."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_round import programs  # noqa: E402
from stand_in import stand_in_group  # noqa: E402

from ddtree_chat.engine.ddtree import Decoder  # noqa: E402
from ddtree_chat.engine.graphs import StaticRound  # noqa: E402
from ddtree_chat.engine.memory import forward_bytes  # noqa: E402
from ddtree_chat.engine.random_model import k26_config, k26_draft_config, random_drafter, random_target  # noqa: E402

TINY_TARGET = dict(vocab_size=512, hidden_size=64, num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32,
                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128,
                   moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2)
TINY_DRAFT = dict(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=512,
                  mask_token_id=511, kv_window=32)


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def program_bytes(dec: Decoder, key: tuple, context: int, world: int = 1) -> int:
    """Bytes a program must read (weights it touches, the cache part it attends) on one of `world` ranks (the
    models hold that rank's shard)."""
    drafter, target = dec.drafter, dec.target
    if key[0] == "verify":
        return int(forward_bytes(dec.tcfg, key[1], context, world)["total"])
    if key[0] == "draft":
        span = key[3]
        layers = _bytes(p for name, p in drafter.named_parameters() if not name.startswith(("fc.", "hidden_norm.")))
        ctx = 2 * span * dec.dcache.k.shape[2] * dec.dcache.k.shape[3] * dec.dcache.k.element_size() * len(drafter.layers)
        return layers + _bytes([target.lm_head.weight]) + ctx
    # accept ("accept", n, drafting, chain): a tree's path latent rows move (one per level, every layer: read +
    # write; a chain's are in place already); a drafting accept also reads fc and each layer's k/v projections
    levels = dec.graphs.tree(key[1]).depth_bound + 1
    row = dec.cache.ckv[0, 0].nbytes + dec.cache.kpe[0, 0].nbytes
    moved = 0 if key[3] else 2 * levels * dec.cache.ckv.shape[0] * row
    if not key[2]:
        return moved
    proj = [p for layer in drafter.layers for p in (layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight)]
    return moved + _bytes([drafter.fc.weight] + proj)


def fill_context(dec: Decoder, context: int) -> None:
    """A committed context of random latents and drafter entries (nothing is prefilled)."""
    dec.cache.ckv.normal_()
    dec.cache.kpe.normal_()
    dec.cache.length = context
    dec.tokens, dec.pending = [0] * context, 1
    dec.dcache.k.normal_()
    dec.dcache.v.normal_()
    dec.dcache.length = min(context, dec.dcache.capacity)
    dec.dcache.end_pos = context
    dec.dcache.make_room(2 * dec.block)  # NOTE: as the engine does before a round: a full window would overflow


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic-layers", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=6)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="scaled-down dimensions (CPU smoke run)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tp-world", type=int, default=1, help="time rank 0's shard of this many TP ranks (target and "
                    "drafter), each collective a timed stand-in (k26_forward.py)")
    ap.add_argument("--collective-us", type=float, default=0.0, help="the stand-in all-reduce's time under --tp-world")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tcfg = k26_config(layers=a.synthetic_layers, **(TINY_TARGET if a.tiny else {}))
    dcfg = k26_draft_config(a.synthetic_layers, a.draft_layers, **(TINY_DRAFT if a.tiny else {}))
    tp, stand_in = stand_in_group(a.tp_world)
    stand_in.set_us(a.collective_us if a.tp_world > 1 else 0.0)
    dec = Decoder(random_target(tcfg, dev, dtype, tp=tp), tcfg, random_drafter(dcfg, dev, dtype, tp=tp), dcfg,
                  max_len=a.context + 2 * (max(a.budgets) + 1))
    fill_context(dec, a.context)
    capture = dev.type == "cuda"
    dec.graphs = StaticRound(dec, capture)
    ceiling = None
    if capture:
        from kernels import copy_ceiling

        ceiling = copy_ceiling()
    rows = []
    with torch.no_grad():
        for mode, budget in [("ar", 0), ("dflash", dcfg.block_size - 1)] + [("ddtree", b) for b in a.budgets]:
            dec.graphs.begin(dec.cache.length, dec.dcache.length, dec.pending)
            for r in programs(dec.graphs, mode, budget, a.reps):
                need = program_bytes(dec, r.pop("key"), a.context, a.tp_world)
                r.update(mode=f"{mode} {budget}" if mode != "ar" else "ar", bytes=need)
                if ceiling and need:  # NOTE: ar's accept reads no weights: launches only, no byte bound
                    r["bound_ms"] = need / ceiling * 1e3
                rows.append(r)
    where = torch.cuda.get_device_name() if capture else "CPU (uncaptured)"
    shard = (f", rank 0 of TP={a.tp_world} (collectives: {a.collective_us:g} us stand-ins)" if a.tp_world > 1 else "")
    print(f"\nK2.6-shaped round: target {tcfg.num_layers} layers, drafter {dcfg.num_layers} layers, context "
          f"{a.context}{shard}, {dtype}, {where}" + (f", copy ceiling {ceiling / 1e9:.0f} GB/s" if ceiling else ""))
    print("| round | program | ms | kernels | bytes (GB) | bound ms | ms / bound |\n|---|---|---|---|---|---|---|")
    for r in rows:
        bound = f"{r['bound_ms']:.2f} | {r['ms'] / r['bound_ms']:.2f}x" if "bound_ms" in r else "- | -"
        print(f"| {r['mode']} | {r['program']} | {r['ms']:.3f} | {r['kernels'] or '-'} | {r['bytes'] / 1e9:.3f} | {bound} |")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        total = sum(r["ms"] for r in rows if r["mode"] == mode)
        print(f"{mode}: round {total:.3f} ms (programs summed)")
    if a.json:
        a.json.write_text(json.dumps({"target_layers": tcfg.num_layers, "draft_layers": dcfg.num_layers,
                                      "context": a.context, "tp_world": a.tp_world, "collective_us": a.collective_us,
                                      "ceiling": ceiling, "device": where, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
