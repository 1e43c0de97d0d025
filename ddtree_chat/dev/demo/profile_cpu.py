"""Where a decoding round's time goes on this CPU, per piece (issue 7):

    python -m ddtree_chat.dev.demo.profile_cpu [--target DIR --draft DIR] [--budgets 8 16 32 64]

Loads the pair as the engine does (drafter in bf16 where this CPU multiplies faster in bf16), brings the
cache to a held-out prompt + 60 tokens, then times each piece of a round in isolation (mean of many
calls, milliseconds): the drafter forward over one block, its lm head, the tree build, the target's
verify forward at each budget's tree size against one AR step, the walk, and the drafter context update."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _ms(f, n: int = 200) -> float:
    for _ in range(10):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e3


@torch.no_grad()
def main(argv=None) -> int:
    from ddtree_chat.engine import Engine
    from ddtree_chat.engine.default_model import resolve_model_dirs
    from ddtree_chat.engine.model import causal_mask
    from ddtree_chat.engine.tree import target_choice, walk_topk

    from .common import heldout_prompts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    a = ap.parse_args(argv)
    target, draft = resolve_model_dirs(a.target, a.draft)  # as the CLI: --draft alone keeps the default target
    eng = Engine.load(target, draft, device="cpu")
    dec = eng.decoder
    ids = heldout_prompts(1)[0]["prompt_ids"] + list(range(300, 360))
    dec.prefill(ids)
    dec.pending = 5
    n_ctx = dec.cache.length
    print(f"drafter {dec.dcfg.num_layers} layers x {dec.dcfg.intermediate_size}, {dec.draft_dtype}; "
          f"{torch.get_num_threads()} thread(s); context {n_ctx} tokens")
    b = dec.dcfg.block_size
    block = torch.full((b,), dec.dcfg.mask_token_id)
    block[0] = 5
    emb = F.embedding(block, dec.draft_embed) if dec.draft_embed is not None else dec.target.embed_tokens(block)
    pos, kv = torch.arange(n_ctx, n_ctx + b), dec.dcache.layers()
    head = dec.draft_head if dec.draft_head is not None else dec.target.lm_head.weight
    hidden = dec.drafter(emb, pos, kv)
    print(f"drafter layers over one block of {b}: {_ms(lambda: dec.drafter(emb, pos, kv)):.2f} ms; "
          f"its lm head: {_ms(lambda: hidden[1:] @ head.T):.2f} ms; "
          f"draft_logits in all: {_ms(lambda: dec.draft_logits(5)):.2f} ms")
    one = (torch.tensor([5]), torch.tensor([n_ctx]), causal_mask(1))
    print(f"AR step (target forward of 1 token + lm head): {_ms(lambda: dec.forward(*one), 100):.2f} ms")
    print("| budget | draft + tree | tree mask | target verify forward | choice + walk | drafter context (4 tokens) |")
    print("|---|---|---|---|---|---|")
    for budget in a.budgets:
        tree = dec.draft(5, "ddtree", budget)
        m, p = tree.mask(), tree.positions(n_ctx)
        logits, feats = dec.forward(tree.tokens, p, m)
        fe = feats[:4].to(dec.draft_dtype)
        row = (_ms(lambda: dec.draft(5, "ddtree", budget)), _ms(tree.mask),
               _ms(lambda: dec.forward(tree.tokens, p, m), 100),
               _ms(lambda: walk_topk(tree, target_choice(logits, 0.0, 1.0, None))),
               _ms(lambda: dec.drafter.context_kv(fe, torch.arange(n_ctx, n_ctx + 4))))
        print(f"| {budget} ({tree.size} nodes) | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
