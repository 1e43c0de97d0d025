"""The row-invariant MLA's merge built with and without FMA contraction (triton_mla_exact.MERGE_FP_FUSION):
for chains of 17 and 65 nodes over 8k / 32k / 40k keys at 8 and 64 heads, each launch's rows against the AR step
of each (one-token launches: every row of a 17-node chain, every 4th of a 65-node one), and the launch with one
program per chunk against one per sub-chunk (FOLD forced both ways: two builds of the merge). Counts bf16 output
rows that differ; one process, same inputs for both settings. GPU only.

    PYTHONPATH=. python benchmarks/mla_merge_fusion.py
"""

from __future__ import annotations

import torch

from ddtree_chat.engine.ops import triton_mla_exact as ex

SCALE = 0.14468


def main() -> int:
    torch.manual_seed(0)
    cache = torch.randn(131072 + 200, 576, device="cuda").to(torch.bfloat16)
    one_mask = torch.ones(1, 1, dtype=torch.bool, device="cuda")
    for fusion in (True, False):
        ex.MERGE_FP_FUSION = fusion
        rows_seen = rows_bad = folds_bad = 0
        for ctx in (8192, 32768, 40000):
            for nh in (8, 64):
                for t in (17, 65):
                    q = torch.randn(t, nh, 512, device="cuda").to(torch.bfloat16) * 0.3
                    qp = torch.randn(t, nh, 64, device="cuda").to(torch.bfloat16)
                    mask = torch.ones(t, t, device="cuda").tril().bool()
                    ckv, kpe = cache[: ctx + t, :512], cache[: ctx + t, 512:]
                    outs = {}
                    for fold in (None, True, False):
                        ex.FOLD = fold
                        outs[fold] = ex.mla_attention_exact(q, qp, ckv, kpe, ctx, mask, SCALE)
                    ex.FOLD = None
                    fold_eq = torch.equal(outs[True], outs[False])
                    rows = list(range(t)) if t <= 17 else list(range(0, t, 4))
                    bad = []
                    for i in rows:  # node i of the chain is the AR step at position ctx + i
                        one = ex.mla_attention_exact(q[i:i + 1], qp[i:i + 1], cache[: ctx + i + 1, :512],
                                                     cache[: ctx + i + 1, 512:], ctx + i, one_mask, SCALE)
                        if not torch.equal(one[0], outs[None][i]):
                            bad.append(i)
                    rows_seen, rows_bad, folds_bad = rows_seen + len(rows), rows_bad + len(bad), folds_bad + (not fold_eq)
                    print(f"fusion={fusion} ctx={ctx} nh={nh} t={t} fold_eq={fold_eq} "
                          f"F(T)={ex.layout(t, nh, ctx, q.device)[2]} F(1)={ex.layout(1, nh, ctx, q.device)[2]} "
                          f"rows_bad={len(bad)}/{len(rows)} {bad[:8]}", flush=True)
        print(f"TOTAL merge fusion={fusion}: rows mismatched {rows_bad}/{rows_seen}, fold modes differing in "
              f"{folds_bad} launches", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
