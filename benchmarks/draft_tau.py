"""The drafter's acceptance measured two ways on the same held-out prompts: what the engine's dflash rounds
accept (tokens per target forward), and the demo training's block tau (`demo.train.block_logits`: 1 + the
drafted prefix that matches) at every anchor of ar's continuation. The two differ only by where the anchors
fall (rounds vs every position); a large gap means the engine's drafter sees another context than training
did. The training log's validation tau comes from another split: compare this script's two columns.

At the same anchors it also builds each budget's best-first tree from the block's top-K log-probs (the
engine's tree: tree.build_tree) and counts what the target's continuation accepts there (tokens per round
at every anchor: an offline, CPU-fast measure of a tree policy or a drafter), and prints the drafter's
calibration per depth given the chain before it matched: mean top-1 probability vs how often top-1 is
right, the same for ranks 2-4 (a best-first tree assumes the two agree); and the block tau by where the
anchor lies in the reply.

    python benchmarks/draft_tau.py [--target DIR --draft DIR] [--prompts 6] [--max-new 128] [--device cpu]
                                   [--budgets 8 16 32 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tree's list-based walk (an oracle)


def features(target, ids: list[int], feature_layers) -> tuple[torch.Tensor, torch.Tensor]:
    """ids -> (tokens [1, n], the target's features of the drafter's layers [1, n, len(feature_layers) * H])."""
    from ddtree_chat.dev.demo.draft_data import BatchCache
    from ddtree_chat.engine.model import causal_mask

    cfg, dev = target.cfg, next(target.parameters()).device
    toks = torch.tensor([ids], device=dev)
    n = toks.shape[1]
    cache = BatchCache(cfg.num_layers, 1, n, cfg.kv_lora_rank, cfg.qk_rope_head_dim, torch.float32, dev)
    return toks, target(toks, torch.arange(n, device=dev), causal_mask(n, dev), cache, feature_layers)[1]


POSITIONS = ((0, 8), (8, 32), (32, 64), (64, None))  # anchor offsets in the reply the block tau is split by


def tree_tau(top_logp: torch.Tensor, top_ids: torch.Tensor, labels: torch.Tensor, budget: int) -> int:
    """Tokens one round emits (accepted drafted tokens + the bonus) with the best-first `budget` tree over
    top_logp/top_ids [D, K] when the target's continuation is labels [D]."""
    from ddtree_chat.engine.tree import build_tree
    from tree_oracle import walk

    tree = build_tree(0, top_logp, top_ids, budget)
    depth = tree.depth.clamp(max=labels.numel() - 1)
    path, _ = walk(tree, labels[depth])  # NOTE: a node's choice is the next label (only matched paths are walked)
    return len(path)


def calibration(logp: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> list[dict]:
    """Per depth, over anchors whose drafted chain matched up to it: mean probability and hit rate of the
    top-1 token and of ranks 2-4. logp/ids [A, D, K] (top-K, sorted), labels [A, D]."""
    hit = ids == labels[..., None]
    chain = torch.cat([torch.ones_like(hit[:, :1, 0]), hit[:, :-1, 0].cumprod(-1).bool()], 1)  # [A, D]
    rows = []
    for d in range(logp.shape[1]):
        p, h = logp[chain[:, d], d].exp(), hit[chain[:, d], d].float()
        n = int(chain[:, d].sum())

        def mean(x):  # no chain reached this depth: no figure
            return x.mean().item() if n else None

        rows.append({"depth": d + 1, "anchors": n, "top1_p": mean(p[:, 0]), "top1_hit": mean(h[:, 0]),
                     "rank2_4_p": mean(p[:, 1:4]), "rank2_4_hit": mean(h[:, 1:4])})
    return rows


def main(argv=None) -> int:
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.dev.demo.train import block_logits
    from ddtree_chat.engine.default_model import resolve_model_dirs
    from ddtree_chat.engine.engine import Engine
    from ddtree_chat.engine.generation import GenerationConfig
    from ddtree_chat.engine.loader import load_drafter

    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--budgets", type=int, nargs="*", default=[8, 16, 32, 64])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    target_dir, draft_dir = resolve_model_dirs(a.target, a.draft)  # as the CLI: --draft alone keeps the default target
    eng = Engine.load(target_dir, draft_dir, device=a.device, dtype=torch.float32)
    dev = eng.device
    # NOTE: its own float32 drafter: the engine may run its copy in bf16 on a CPU (speed only)
    dcfg, drafter = load_drafter(draft_dir, eng.tcfg, dev, torch.float32)
    block, rows, tops, offsets = dcfg.block_size, [], [], []
    k = max([1] + a.budgets)
    with torch.no_grad():
        for p in heldout_prompts(a.prompts):
            ids = p["prompt_ids"]
            out = {}
            for mode in ("ar", "dflash"):
                for ev in eng.generate(ids, GenerationConfig(mode=mode, budget=block - 1, max_new_tokens=a.max_new)):
                    pass
                out[mode] = ev
            seq = ids + out["ar"]["token_ids"]
            if len(seq) - block < len(ids):
                continue  # too short a reply for one block
            toks, feats = features(eng.target, seq, tuple(dcfg.target_layer_ids))
            anchors = torch.arange(len(ids), len(seq) - block + 1, device=dev)[None]
            logits, labels = block_logits(drafter, eng.target.embed_tokens, eng.target.lm_head, toks, feats,
                                          torch.tensor([0], device=dev), anchors, dcfg.mask_token_id, block,
                                          torch.autocast(dev.type, enabled=False))
            tau = (1 + (logits.argmax(-1) == labels).long().cumprod(-1).sum(-1)).float().flatten()
            top_logp, top_ids = torch.log_softmax(logits[0].float(), -1).topk(min(k, logits.shape[-1]), -1)
            tops.append((top_logp, top_ids, labels[0]))
            offsets.append((anchors[0] - len(ids), tau))  # each anchor's place in the reply, its block tau
            trees = {b: sum(tree_tau(top_logp[i, :, :b], top_ids[i, :, :b], labels[0, i], b)
                            for i in range(top_logp.shape[0])) / top_logp.shape[0] for b in a.budgets}
            rows.append({"prompt_tokens": len(ids), "reply_tokens": len(out["ar"]["token_ids"]),
                         "engine_tokens_per_forward": len(out["dflash"]["token_ids"]) / out["dflash"]["target_forwards"],
                         "anchors": tau.numel(), "block_tau": tau.mean().item(), "tree_tau": trees})
            print(rows[-1], flush=True)
    if not rows:
        raise SystemExit("no prompt gave a reply of one block or more")
    fw = sum(r["reply_tokens"] for r in rows) / sum(r["reply_tokens"] / r["engine_tokens_per_forward"] for r in rows)
    tau = sum(r["block_tau"] * r["anchors"] for r in rows) / sum(r["anchors"] for r in rows)
    n = sum(r["anchors"] for r in rows)
    trees = {b: sum(r["tree_tau"][b] * r["anchors"] for r in rows) / n for b in a.budgets}
    cal = calibration(*(torch.cat(t) for t in zip(*tops)))
    off, taus = (torch.cat(t) for t in zip(*offsets))
    along = {}
    for lo, hi in POSITIONS:
        m = (off >= lo) & (off < hi if hi else True)
        if m.any():
            along[f"{lo}-{hi}" if hi else f"{lo}+"] = taus[m].mean().item()
    print(f"{len(rows)} prompts: engine dflash {fw:.2f} tokens per target forward; training block tau {tau:.2f} "
          f"over {n} anchors (block {block}); best-first tree at every anchor: "
          + ", ".join(f"budget {b} {t:.2f}" for b, t in trees.items()))
    print("block tau by the anchor's place in the reply: " + ", ".join(f"tokens {k}: {v:.2f}" for k, v in along.items()))
    for c in cal:
        f = {k: "-" if v is None else f"{v:.3f}" for k, v in c.items()}
        print(f"depth {c['depth']} (chain matched: {c['anchors']} anchors): top-1 p {f['top1_p']} hit "
              f"{f['top1_hit']}; ranks 2-4 p {f['rank2_4_p']} hit {f['rank2_4_hit']}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "engine_tokens_per_forward": fw, "block_tau": tau,
                                      "tree_tau": trees, "calibration": cal, "tau_along_reply": along}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
