"""The Triton tree-build kernel's logic on CPU, in Triton's interpreter (TRITON_INTERPRET=1, numpy
semantics; no GPU). Runs in a subprocess because the interpreter is chosen when kernels are defined.
Kernels that autotune (MLA, small-M products) need a GPU driver and are checked by the GPU tests only."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_tree import build_tree_triton
from ddtree_chat.engine.tree import build_tree_topk_ref
bad = []
for d, k, b in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(d * 1000 + b)
    lp = torch.log_softmax(torch.randn(d, 500, generator=g) * 3, -1)
    vals, ids = lp.max(-1, keepdim=True) if k == 1 else lp.topk(k, dim=-1)
    ref = build_tree_topk_ref(torch.tensor([5]), vals, ids, b)
    got = build_tree_triton(torch.tensor([5]), vals, ids, b)
    same = all(torch.equal(x, y) for x, y in zip(got[:3], (ref.tokens, ref.parents, ref.depth)))
    if not (same and torch.allclose(got[3], ref.logprobs, atol=1e-5)):
        bad.append([d, k, b])
print(json.dumps(bad))
"""


def test_tree_kernel_in_the_interpreter_equals_the_reference():
    cases = [(7, 32, 32), (7, 1, 7), (3, 4, 5), (1, 8, 8), (7, 64, 64), (15, 2, 9), (2, 3, 9)]
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
