"""The Triton kernels' logic on CPU, in Triton's interpreter (TRITON_INTERPRET=1, numpy semantics; no
GPU): tree build, ancestor mask, walk, rope, latent cache write, wide RMSNorm, top-k log-softmax, the top-p
filter's running sum; and, where the interpreter runs loops
over runtime bounds (Triton 3.9, CI's), the small-M product, the drafter attention and the MLA kernel (at fixed tiles:
its autotuner is the GPU tests' business). Each runs in a subprocess because the interpreter is chosen when kernels
are defined."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TREE_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_tree import build_tree_triton
from ddtree_chat.engine.tree import build_tree_ref
bad = []
for d, k, b in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(d * 1000 + b)
    lp = torch.log_softmax(torch.randn(d, 500, generator=g) * 3, -1)
    vals, ids = lp.max(-1, keepdim=True) if k == 1 else lp.topk(k, dim=-1)
    ref = build_tree_ref(torch.tensor([5]), vals, ids, b)
    bufs = (torch.full((b + 1,), -7), torch.full((b + 1,), -7), torch.full((b + 1,), -7), torch.full((b + 1,), 9.0))
    got = build_tree_triton(torch.tensor([5]), vals, ids, b, out=bufs)
    same = all(torch.equal(x, y) for x, y in zip(got[:3], (ref.tokens, ref.parents, ref.depth)))
    same &= all(x is y for x, y in zip(got, bufs))  # built in place
    if not (same and torch.allclose(got[3], ref.logprobs, atol=1e-5)):
        bad.append([d, k, b])
print(json.dumps(bad))
"""


ROPE_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_rope import rope_triton
from ddtree_chat.engine.ops.rope import apply_rope_interleaved_ref, apply_rope_half_ref
from ddtree_chat.engine.ops.norm import rms_norm_ref
g = torch.Generator().manual_seed(0)
bad = []
for lead, t, h, d, width, inter, dt, norm in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    if norm:  # h heads of d inside a wider row (the drafter's q or k inside its fused q/k/v product)
        shape = tuple(lead) + (t, width)
        x = torch.randn(*shape, generator=g).to(dtype)[..., d : d + h * d].unflatten(-1, (h, d))
    else:
        shape = tuple(lead) + (t,) + ((h,) if h else ()) + (width,)
        x = torch.randn(*shape, generator=g).to(dtype)[..., width - d:]  # the rope part is a strided slice
    ang = torch.randn(t, d // 2, generator=g) * 3
    cos, sin = torch.cat([ang.cos(), ang.sin()], -1).to(dtype).chunk(2, -1)  # a rope table's rows: halves of one tensor
    w = (torch.rand(*((h, d) if norm == 2 else (d,)), generator=g) + 0.5).to(dtype) if norm else None  # 2: per head
    xin = rms_norm_ref(x.float(), w.float(), 1e-6) if norm else x.float()
    ref = (apply_rope_interleaved_ref if inter else apply_rope_half_ref)(xin, cos.float(), sin.float(), h is not None)
    got = rope_triton(x, cos, sin, h is not None, inter, w, 1e-6)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    if got is None or got.shape != ref.shape or not got.is_contiguous() or got.dtype != dtype or \
            (got.float() - ref).abs().max() > tol * ref.abs().max():
        bad.append(shape)
print(json.dumps(bad))
"""

NORM_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_norm import rms_norm_triton
from ddtree_chat.engine.ops.norm import add_rms_norm_ref, rms_norm_ref
g = torch.Generator().manual_seed(0)
bad = []
for t, d, extra, residual, dt in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    x = torch.randn(t, d + extra, generator=g).to(dtype)[:, extra:]  # a slice of a wider row
    w = (torch.rand(d, generator=g) + 0.5).to(dtype)
    res = torch.randn(t, d, generator=g).to(dtype) if residual else None
    got = rms_norm_triton(x, res, w, 1e-6)
    want = add_rms_norm_ref(x, res, w, 1e-6) if residual else (rms_norm_ref(x, w, 1e-6), None)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    # NOTE: the interpreter rounds float32 -> bf16 its own way (the GPU test checks the sum bit for bit)
    same_sum = residual and torch.allclose(got[1].float(), want[1].float(), atol=0, rtol=0 if dt == "float32" else 1e-2)
    if got is None or not torch.allclose(got[0].float(), want[0].float(), atol=tol, rtol=tol) or \
            (residual and not same_sum) or (not residual and got[1] is not None):
        bad.append([t, d, residual, dt])
print(json.dumps(bad))
"""

LATENT_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_latent import latent_write_triton
from ddtree_chat.engine.ops.latent import latent_write_ref
g = torch.Generator().manual_seed(0)
bad = []
for t, q, r, p, s, slots, dt in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    kv = torch.randn(t, q + r + p, generator=g).to(dtype)[:, q:]  # the kv_a part of a fused projection
    w = (torch.rand(r, generator=g) + 0.5).to(dtype)
    ang = torch.randn(t, p // 2, generator=g) * 3
    both = torch.cat([ang.cos(), ang.sin()], -1).to(dtype).chunk(2, -1)  # a rope table's rows: halves of one tensor
    cos, sin = both if t % 2 else (ang.cos().to(dtype), ang.sin().to(dtype))
    where = torch.randperm(s, generator=g)[:t] if slots else s - t
    bufs = [torch.full((s, n), float("nan"), dtype=dtype) for n in (r, p)]  # untouched slots stay NaN
    got = latent_write_triton(kv, w, 1e-6, cos, sin, *[b.clone() for b in bufs], where)
    ref = latent_write_ref(kv.float(), w.float(), 1e-6, cos.float(), sin.float(), *[b.float() for b in bufs], where)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(got, ref):
        if not (torch.equal(a.isnan(), b.isnan()) and torch.allclose(a.float().nan_to_num(), b.nan_to_num(), atol=tol, rtol=tol)):
            bad.append([t, r, p, slots, dt])
print(json.dumps(bad))
"""

MOVE_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_latent import move_rows_triton
from ddtree_chat.engine.ops.latent import move_rows_ref
g = torch.Generator().manual_seed(0)
bad = []
for layers, s, r, p, start, n, depth, m, dt in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    # an accepted path as accept() moves it: nodes rising with depth (node >= depth), node 0 past its end
    nodes = sorted(torch.randperm(n - 1, generator=g)[: m].add(1).tolist())
    path = torch.tensor([0] + nodes + [0] * (depth - m))
    src, dst = start + path[1:], start + torch.arange(1, depth + 1)
    bufs = [torch.randn(layers, s, w, generator=g).to(dtype) for w in (r, p)]
    ref = [b.clone() for b in bufs]
    move_rows_ref(*ref, src, dst)
    if move_rows_triton(*bufs, src, dst) is None or not all(torch.equal(a, b) for a, b in zip(bufs, ref)):
        bad.append([layers, s, r, p, start, n, depth, m, dt])
print(json.dumps(bad))
"""

WALK_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.tree import pack_round_ref
from ddtree_chat.engine.ops.triton_tree import ancestor_mask_triton, pack_round_triton, walk_commit_triton, walk_triton
from ddtree_chat.engine.tree import build_tree_ref, walk_commit_ref, walk_topk_ref
bad = []
for d, k, b, follow in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(d * 100 + b + follow)
    lp = torch.log_softmax(torch.randn(d, 100, generator=g) * 3, -1)
    vals, ids = lp.topk(k, dim=-1)
    tree = build_tree_ref(torch.tensor([5]), vals, ids, b)
    tree.max_depth = d
    n = tree.size
    # a target that agrees along a random root-to-node path for `follow` steps, random elsewhere
    choice = torch.randint(0, 100, (n,), generator=g)
    node = int(torch.randint(0, n, (1,), generator=g))
    chain = [node]
    while tree.parents[chain[-1]] >= 0:
        chain.append(int(tree.parents[chain[-1]]))
    for child in reversed(chain[:-1][-follow:] if follow else []):
        choice[tree.parents[child]] = tree.tokens[child]
    ok, bonus = walk_triton(tree, choice)
    rok, rbonus = walk_topk_ref(tree, choice)
    packed = pack_round_triton(tree, choice, ok, bonus)
    # the round's bookkeeping: path, slots and the state update, drafting or not
    committed = True
    for drafting in (True, False):
        state, rstate = torch.tensor([40 + d, 17, 3]), torch.tensor([40 + d, 17, 3])
        got, want = walk_commit_triton(tree, choice, state, drafting), walk_commit_ref(tree, choice, rstate, drafting)
        committed &= all(torch.equal(x, y) for x, y in zip(got, want)) and torch.equal(state, rstate)
    if not (torch.equal(ancestor_mask_triton(tree), tree.mask_ref()) and torch.equal(ok, rok) and committed
            and int(bonus) == int(rbonus) and torch.equal(packed, pack_round_ref(tree, choice, rok, rbonus))):
        bad.append([d, k, b, follow])
print(json.dumps(bad))
"""


DRAFT_ATTENTION_SCRIPT = r"""
import json, sys, torch
from unittest import mock
from ddtree_chat.engine.ops import triton_draft_attention as tda
from ddtree_chat.engine.ops.draft_attention import draft_attention_ref
bad = []
with mock.patch.object(tda, "sm_count", lambda dev: 4):  # NOTE: no GPU: a small SM count, several splits
    for b, nh, nkv, d, n, masking in json.loads(sys.argv[1]):
        g = torch.Generator().manual_seed(n + nh)
        r = lambda *s: torch.randn(*s, generator=g)
        q, kb, vb = r(b, nh, d), r(b, nkv, d), r(b, nkv, d)
        kc, vc = r(n + 5, nkv, d)[:n], r(n + 5, nkv, d)[:n]  # views of a longer buffer, as the cache hands them
        mask = None
        if masking == "held":  # the graphs' form: a device count of the visible entries
            mask = torch.tensor([max(n - 7, 0)])
        elif masking:  # the held entries, then the block (causal: to test its columns)
            block = torch.ones(b, b, dtype=torch.bool)
            block = block.tril() if masking == "causal" else block
            mask = torch.cat([(torch.arange(n) < max(n - 7, 0)).expand(b, n), block], -1)
        want = draft_attention_ref(q, kc, vc, kb, vb, mask, d ** -0.5)
        got = tda.draft_attention_triton(q, kc, vc, kb, vb, mask, d ** -0.5)
        if got is None or got.shape != want.shape or (got - want).abs().max() > 1e-4:
            bad.append([b, nh, nkv, d, n, masking])
print(json.dumps(bad))
"""

MM_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_linear import matmul_nt_triton
bad = []
cases, modes = json.loads(sys.argv[1])
for (shape_x, shape_w, glu, split, *normed), (prec, tile) in ((c, m) for m in modes for c in cases):
    tile = tuple(tile) if tile else None
    g = torch.Generator().manual_seed(len(shape_x) * 100 + shape_x[-2])
    x = torch.randn(*shape_x, generator=g)
    w, w2 = torch.randn(*shape_w, generator=g), torch.randn(*shape_w, generator=g)
    norm = (torch.rand(shape_x[-1], generator=g) + 0.5, 1e-5) if normed else None
    xn = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * norm[0].double() if norm else x
    ref = xn.double() @ w.double().transpose(-1, -2)
    if glu:
        ref = torch.nn.functional.silu(ref) * (x.double() @ w2.double().transpose(-1, -2))
    for _ in range(2):  # NOTE: twice: split-K counters must be back at zero after a launch
        got = matmul_nt_triton(x.transpose(-1, -2).contiguous().transpose(-1, -2), w, precision=prec,
                               w2=w2 if glu else None, split=split, norm=norm, tile=tile)
        if got.shape != ref.shape or (got.double() - ref).abs().max() > 1e-4 * max(1.0, ref.abs().max().item()):
            bad.append([shape_x, shape_w, glu, split, prec])
    if not glu and len(shape_x) == len(shape_w) == 2:  # a residual added in the store (row-strided)
        res = torch.randn(shape_x[0], shape_w[0] + 3, generator=g)[:, :shape_w[0]]
        got = matmul_nt_triton(x, w, precision=prec, split=split, norm=norm, residual=res, tile=tile)
        if (got.double() - ref - res.double()).abs().max() > 1e-4 * max(1.0, ref.abs().max().item()):
            bad.append([shape_x, shape_w, glu, split, prec, "residual"])
    if glu and len(shape_w) == 3 and len(shape_x) == 2:
        # the routed form: top-2 of the experts but the last (a shared one: weight 1), -1 = another rank's
        e, t = shape_w[0], shape_x[0]
        ids = torch.stack([torch.randperm(e - 1, generator=g)[:2] for _ in range(t)])
        ids[0, 1] = -1
        rw = torch.rand(t, 2, generator=g)
        want = torch.zeros(t, e, shape_w[1], dtype=torch.float64)
        want[:, e - 1] = ref[e - 1]
        for i in range(t):
            for j in range(2):
                if ids[i, j] >= 0:
                    want[i, ids[i, j]] += rw[i, j].double() * ref[ids[i, j], i]
        got = matmul_nt_triton(x, w, precision=prec, w2=w2, route=(ids, rw, e - 1), tile=tile)
        if got.shape != want.shape or (got.double() - want).abs().max() > 1e-4 * max(1.0, want.abs().max().item()):
            bad.append([shape_x, shape_w, glu, prec, "routed"])
print(json.dumps(bad))
"""

TOPK_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.topk import topk_logprobs_ref
from ddtree_chat.engine.ops.triton_topk import topk_logprobs_triton
bad = []
for r, v, k, dtype in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(v + k)
    x = (torch.randn(r, v, generator=g) * 4).to(getattr(torch, dtype))
    x[0, : min(v - k, 10)] = float("-inf")  # masked vocabulary entries
    x[-1, 1::2] = x[-1, 0::2][: v // 2]  # exact ties: the lower id first
    want, want_ids = topk_logprobs_ref(x, k)
    got = topk_logprobs_triton(x, k)
    ok = got is not None and torch.allclose(got[0], want, atol=1e-5)
    if ok:  # ids agree wherever the value does not tie with a neighbour; ties keep the lower id first
        lp = torch.log_softmax(x.float(), -1)
        ok = torch.allclose(lp.gather(1, got[1]), got[0], atol=1e-5)
        ties = torch.cat([(want[:, 1:] == want[:, :-1]), torch.zeros(r, 1, dtype=torch.bool)], 1)
        ties = ties | torch.cat([torch.zeros(r, 1, dtype=torch.bool), ties[:, :-1]], 1)
        ok = ok and bool((got[1] == want_ids)[~ties].all())
        same = got[0][:, 1:] == got[0][:, :-1]
        ok = ok and bool((got[1][:, 1:] > got[1][:, :-1])[same].all())
    if not ok:
        bad.append([r, v, k, dtype])
print(json.dumps(bad))
"""


MLA_SCRIPT = r"""
import json, sys, torch
from unittest import mock
from ddtree_chat.engine.ops import triton_mla as tm
from ddtree_chat.engine.ops.mla_attention import mla_attention_ref
bad = []
mock.patch.object(tm, "sm_count", lambda dev: 4).start()  # NOTE: no GPU: a small SM count, several splits
cases, merges = json.loads(sys.argv[1])
for t, nh, r, p, ctx, cap, ci in cases:
    g = torch.Generator().manual_seed(t * 100 + ctx)
    q_lat, q_pe = torch.randn(t, nh, r, generator=g), torch.randn(t, nh, p, generator=g)
    ckv, kpe = torch.randn(cap, r, generator=g), torch.randn(cap, p, generator=g)
    ckv[ctx + t:], kpe[ctx + t:] = float("nan"), float("nan")  # unused slots must never be read
    mask = (torch.rand(t, t, generator=g) < 0.5) | torch.eye(t, dtype=torch.bool)
    want = mla_attention_ref(q_lat, q_pe, ckv, kpe, ctx, mask, 0.1)
    got = tm.mla_attention_triton(q_lat, q_pe, ckv, kpe, torch.tensor([ctx]), mask, 0.1, max_prefix=cap - t,
                                  config=tm._CONFIGS[ci])
    if got.shape != want.shape or not (got - want).abs().max() <= 1e-4:
        bad.append([t, nh, r, p, ctx, cap, ci])
for ns, m, r in merges:  # more splits than one merge tile; empty splits (lse -inf) weigh nothing
    g = torch.Generator().manual_seed(ns)
    op, lp = torch.randn(ns, m, r, generator=g), torch.randn(ns, m, generator=g) * 4
    lp[1::3] = float("-inf")
    want = (op * torch.softmax(lp * 0.6931471805599453, 0)[..., None]).sum(0)
    op[1::3] = float("nan")  # an empty split's partial is never written: it must not be read
    got = torch.empty(m, r)
    tm.merge_splits(op, lp, got)
    if not (got - want).abs().max() <= 1e-5:
        bad.append([ns, m, r])
print(json.dumps(bad))
"""


EXACT_MLA_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops import triton_mla_exact as ex
from ddtree_chat.engine.ops.mla_attention import mla_attention_ref
r, p, nh = 64, 16, 16  # NOTE: 16 heads fill a 16-row block: numpy's products depend on a row's place in it
chunk = ex.chunk_keys(nh)
g = torch.Generator().manual_seed(1)
keys, qs = torch.randn(3 * chunk, r + p, generator=g), torch.randn(3 * chunk, nh, r + p, generator=g)
bad = []
for length, parents in json.loads(sys.argv[1]):
    t = len(parents)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    deep = int(mask.sum(-1).argmax())
    depth = int(mask[deep].sum()) - 1
    ckv = torch.full((length + t + 50, r + p), float("nan"))
    ckv[:length], ckv[length:length + t] = keys[:length], torch.randn(t, r + p, generator=g)
    node = deep
    for d in range(depth, -1, -1):  # the deepest node's chain holds the true keys of its positions
        ckv[length + node], node = keys[length + d], parents[node]
    q = torch.randn(t, nh, r + p, generator=g)
    q[deep] = qs[length + depth]
    args = (ckv[:, :r], ckv[:, r:], torch.tensor([length]), mask, 0.1)
    ex.FOLD = False  # NOTE: the tree with one program per chunk, the AR step with one per sub-chunk
    out = ex.mla_attention_exact(q[..., :r], q[..., r:], *args, max_prefix=length + 40)
    want = mla_attention_ref(q[..., :r], q[..., r:], ckv[:, :r], ckv[:, r:], length, mask, 0.1)
    pos = length + depth  # the AR step at the deepest node's position
    ex.FOLD = True
    ar = ex.mla_attention_exact(qs[pos:pos + 1, :, :r], qs[pos:pos + 1, :, r:], keys[:, :r], keys[:, r:], pos,
                                torch.ones(1, 1, dtype=torch.bool), 0.1)
    if not (out - want).abs().max() <= 1e-4 or not torch.equal(ar[0], out[deep]):
        bad.append([length, parents])
print(json.dumps(bad))
"""


EXACT_MLA_ROWS_SCRIPT = r"""
import json, sys, torch
from unittest import mock
from ddtree_chat.engine.ops import triton_mla_exact as ex
from ddtree_chat.engine.ops.mla_attention import mla_attention_ref
# NOTE: 128-key chunks of four 32-key sub-chunks: every program runs a tile or two, quick in the interpreter
mock.patch.object(ex, "chunk_keys", lambda heads: 128).start()
mock.patch.object(ex, "SUB_KEYS", 32).start()
# NOTE: 2 chunks a merge step: the 65-row launch's 3 chunks take the two-pass merge, the AR step's 2 one step
mock.patch.object(ex, "MERGE_FEW", (2, ex.MERGE_FEW[1])).start()
r, p, length = 64, 16, 150  # one head: a chain of T nodes is a launch of T rows
g = torch.Generator().manual_seed(2)
keys, qs = torch.randn(length + 80, r + p, generator=g), torch.randn(length + 80, 1, r + p, generator=g)
bad = []


def attend(pos, t, fold, spare=20, bound=length + 40):
    # T chain nodes after a prefix of pos keys (node i at position pos + i), NaN in the unused slots; bound None:
    # the launch planned for every slot of the cache (as the engine's recorded programs), mostly idle programs
    ex.FOLD = fold
    ckv = torch.full((pos + t + spare, r + p), float("nan"))
    ckv[:pos + t] = keys[:pos + t]
    q, mask = qs[pos:pos + t], torch.ones(t, t).tril().bool()
    args = (ckv[:, :r], ckv[:, r:], torch.tensor([pos]), mask, 0.1)
    out = ex.mla_attention_exact(q[..., :r], q[..., r:], *args, max_prefix=bound)
    want = mla_attention_ref(q[..., :r], q[..., r:], ckv[:, :r], ckv[:, r:], pos, mask, 0.1)
    if not (out - want).abs().max() <= 1e-4:
        bad.append(["reference", t, fold])
    return out


def check(t, fold, both, scan):
    out = attend(length, t, fold)
    if both and not torch.equal(out, attend(length, t, not fold)):  # every row: either fold, the same bits
        bad.append(["fold", t])
    if both and not torch.equal(out, attend(length, t, fold, spare=600, bound=None)):  # the plan sizes the launch only
        bad.append(["whole cache", t])
    if scan:  # the ancestor scan's width is integer work only: a narrower one gives the same bits
        with mock.patch.object(ex, "BLOCK_T", scan):
            if not torch.equal(out, attend(length, t, fold)):
                bad.append(["scan", t, scan])
    for i in range(0, t, 16):  # NOTE: rows at a block's first place (numpy's products depend on a row's place)
        if not torch.equal(attend(length + i, 1, not fold)[0], out[i]):  # the AR step, the other fold
            bad.append(["row", t, i])


for t, fold, both, scan, tile in json.loads(sys.argv[1]):
    # tile: every launch of the case with that key tile (16: sm_120's float32 one), 0: the launcher's pick
    with mock.patch.dict(ex.BLOCK_NS, {torch.float32: (tile,)} if tile else {}):
        check(t, fold, both, scan)
print(json.dumps(bad))
"""


EXACT_LINEAR_SCRIPT = r"""
import json, sys, torch
from unittest import mock
from ddtree_chat.engine.ops import triton_exact_linear as el
mock.patch.object(el, "sm_count", lambda dev: 4).start()  # NOTE: no GPU: a small SM count, several splits
tiles, cases = json.loads(sys.argv[1])
g = torch.Generator().manual_seed(0)
bad, heights, seen = [], set(), set()
for tile in tiles:
    # NOTE: the interpreter's bf16 dots are not numpy's float32 ones: each candidate runs as the float32 tile
    el.FP32_TILE, bm = tuple(tile), tile[0]
    for n, k, batch in cases if bm not in heights else cases[:1]:  # batched: once per block height
        eff = el.tile(n, k, batch, torch.float32, None)
        key = (n, k, batch, eff[:3], eff[5])
        if key in seen:  # NOTE: warps and stages mean nothing here; two split multipliers may give one split
            continue
        seen.add(key)
        w = torch.randn(*((batch,) if batch > 1 else ()), n, k, generator=g)
        mm = lambda x: el.matmul_nt_exact(x if batch == 1 else x.expand(batch, *x.shape), w)
        pick = lambda y, i: y[i] if batch == 1 else y[:, i]
        r = torch.randn(1, k, generator=g)
        alone = pick(mm(r), 0)
        # NOTE: numpy's products depend on a row's place in its block: each launch's middle row is checked in
        # block j of a launch of 3 blocks, at its own place
        y, mids = torch.randn(3 * bm, k, generator=g), []
        for j, m in enumerate((8, 17, 65)):
            x = torch.randn(m, k, generator=g)
            last, mid = bm * ((m - 1) // bm), m // 2  # the last block's first row (the lone row's place), a middle one
            x[last], y[j * bm + mid % bm] = r[0], x[mid]
            got = mm(x)
            mids.append(pick(got, mid))
            if not (got - x @ w.transpose(-1, -2)).abs().max() <= 1e-3 or not torch.equal(pick(got, last), alone):
                bad.append([tile, n, k, batch, m])
        at = [j * bm + m // 2 % bm for j, m in enumerate((8, 17, 65))]
        if not all(torch.equal(pick(mm(y), i), want) for i, want in zip(at, mids)):
            bad.append([tile, n, k, batch, "middle"])
        if batch == 1 and not heights:  # the residual's add: after the tile's sum, whatever the tile
            res, x = torch.randn(17, n, generator=g), torch.randn(17, k, generator=g)
            if not (el.matmul_nt_exact(x, w, res) - (res + x @ w.T)).abs().max() <= 1e-3:
                bad.append([tile, n, k, "residual"])
            # GLU: both products' partials summed in split order, the epilogue on the sums; a row alone equals it
            # at the same place of a 17-row launch's last block
            w2, last = torch.randn(n, k, generator=g), bm * (16 // bm)
            x[last] = r[0]
            got, want = el.matmul_nt_exact(x, w, w2=w2), torch.nn.functional.silu(x @ w.T) * (x @ w2.T)
            if not (got - want).abs().max() <= 1e-3 * max(1.0, want.abs().max().item()) \
                    or not torch.equal(got[last], el.matmul_nt_exact(r, w, w2=w2)[0]):
                bad.append([tile, n, k, "glu"])
    heights.add(bm)
print(json.dumps(bad))
"""


LOOP_PROBE = r"""
import torch, triton, triton.language as tl
@triton.jit
def k(X, N, B: tl.constexpr):
    for i in range(0, N, B):
        tl.store(X + i + tl.arange(0, B), tl.arange(0, B))
k[(1,)](torch.zeros(32, dtype=torch.int32), 32, B=16)
"""


SCAN_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_scan import row_cumsum_triton
bad = []
for rows, v in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(rows * 100000 + v)
    x = torch.softmax(torch.randn(rows, v, generator=g) * 3, -1).sort(-1, descending=True).values
    got = row_cumsum_triton(x)
    alone = [row_cumsum_triton(x[i:i + 1]) for i in range(rows)]
    if not (torch.allclose(got, x.double().cumsum(-1).float(), atol=2e-6) and all(torch.equal(a, got[i:i + 1]) for i, a in enumerate(alone))):
        bad.append([rows, v])
print(json.dumps(bad))
"""


def interpreter_runs_loops() -> bool:
    """Whether this Triton's interpreter runs loops over runtime bounds (3.9's, CI's, does; 3.6's does not)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-c", LOOP_PROBE], env=env, capture_output=True, timeout=120).returncode == 0


def interpret(script: str, cases) -> list:
    return interpret_apart(script, [cases])


def interpret_apart(script: str, parts: list) -> list:
    """The script once per part of its cases, the runs side by side (the suite runs tests one at a time: the
    interpreter's slowest checks spread over the machine's cores); every run's failures, in part order."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    runs = [subprocess.Popen([sys.executable, "-c", script, json.dumps(cases)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for cases in parts]
    bad = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
        bad += json.loads(out.strip().splitlines()[-1])
    return bad


def test_tree_kernel_in_the_interpreter_equals_the_reference():
    assert interpret(TREE_SCRIPT, [(7, 32, 32), (7, 1, 7), (3, 4, 5), (1, 8, 8), (7, 64, 64), (15, 2, 9), (2, 3, 9)]) == []


def test_mask_and_walk_kernels_in_the_interpreter_equal_the_references():
    """Random best-first trees (chains, bushy, a single root) against a target that agrees with the tree
    for 0..depth steps along a random path; and the round's packed result from the walk's outputs."""
    cases = [(7, 32, 32, 0), (7, 32, 32, 3), (7, 32, 32, 7), (7, 1, 7, 7), (3, 4, 5, 2), (1, 8, 8, 1),
             (15, 4, 64, 9), (7, 8, 0, 0), (5, 64, 200, 4)]
    assert interpret(WALK_SCRIPT, cases) == []


def test_draft_attention_kernel_in_the_interpreter_equals_the_reference():
    """The demo drafter's shapes (8 slots, 4 heads on 2 kv heads, d = 64) with no, one and 1000 context
    entries over several splits, with and without a mask (and a causal block) or the graphs' device count
    of held entries (0, 1, a few splits' worth), fewer slots than a tile, one kv head per query head."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    cases = [(8, 4, 2, 64, 300, "entries"), (8, 4, 2, 64, 0, None), (8, 4, 2, 64, 1, "causal"),
             (8, 4, 2, 64, 1000, None), (3, 16, 2, 32, 70, "causal"), (8, 8, 8, 16, 17, "entries"),
             (8, 4, 2, 64, 300, "held"), (8, 4, 2, 64, 7, "held"), (8, 4, 2, 64, 8, "held")]
    assert interpret(DRAFT_ATTENTION_SCRIPT, cases) == []


def test_mla_kernel_in_the_interpreter_equals_the_reference():
    """Fixed tiles (the autotuner is bypassed): no context, a context shorter than a split, trees of 3-33
    nodes under a random ancestor mask, K2.6's latent (512 + 64) at 64 heads, NaN in every unused slot;
    and the split merge over more splits than one of its tiles."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    cases = [(1, 4, 64, 16, 0, 40, 6), (3, 4, 64, 16, 37, 300, 5), (17, 2, 64, 16, 300, 2000, 4),
             (33, 4, 64, 16, 5, 100, 0), (2, 64, 512, 64, 700, 1500, 3), (1, 64, 512, 64, 1100, 1200, 1),
             (5, 8, 512, 64, 300, 400, 2)]
    merges = [(1, 3, 64), (5, 2, 128), (70, 2, 512)]
    assert interpret(MLA_SCRIPT, [cases, merges]) == []


def test_exact_mla_kernel_rows_equal_the_ar_step_in_the_interpreter():
    """The row-invariant MLA kernel (triton_mla_exact): a tree node's output equals the AR step's at its
    position, bit for bit, where the tree's keys straddle a chunk boundary or sit inside one, a context of
    0, a causal prefill chunk; and both equal the reference. (On the GPU: tests/test_exact_gpu.py.)"""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    cases = [(1019, [-1] + list(range(8)) + [0, 3, 5]), (512, [-1, 0, 1, 0]),
             (0, [-1, 0, 0, 1, 2]), (30, [-1] + list(range(19)))]
    assert interpret_apart(EXACT_MLA_SCRIPT, [cases[::2], cases[1::2]]) == []


def test_exact_mla_fold_keeps_rows_bitwise_across_row_counts_in_the_interpreter():
    """The sub-chunk fold (triton_mla_exact.layout): an 8-row launch gives every row the same bits with one
    program per sub-chunk as with one per chunk, and planned for a cache of 600 more slots (idle programs);
    rows of 8-, 17- and 65-row chain launches (either fold; the 65-row one through the merge's two passes, at 2
    chunks a step) equal the AR step run alone with the other fold, around sub-chunk and chunk boundaries, and
    the 17-row launch's with an 8-entry ancestor scan; the 8-row launch with the 16-key tile (sm_120's float32)
    as well; all equal the reference."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    assert interpret_apart(EXACT_MLA_ROWS_SCRIPT,
                           [[[65, False, False, 0, 0]], [[8, True, True, 0, 16], [17, True, False, 8, 0]]]) == []


def test_exact_products_are_row_invariant_in_the_interpreter():
    """The row-invariant product (triton_exact_linear) at every tile the sweep may put in its table (16-,
    32- and 64-row blocks, the router's float32 tile): a row alone equals it inside 8-, 17- and 65-row
    launches (split-K, batched, edges that are no tile multiple, a residual, the GLU epilogue), row blocks
    enumerated first; equal to x @ w^T."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    from exact_tiles import candidates

    tiles, cases = candidates(), [(24, 512, 1), (24, 128, 3)]
    assert interpret_apart(EXACT_LINEAR_SCRIPT, [[tiles[::2], cases], [tiles[1::2], cases]]) == []


def test_small_m_product_kernel_in_the_interpreter_equals_float64():
    """x @ w^T and the GLU epilogue: masked edges (no dimension a tile multiple), a column-major x, a
    shared 2-D x against stacked experts, batched both sides; split-K (the drafter's K = 1536, a K that
    is no multiple of a split, batched; with the GLU epilogue too); the RMSNorm prologue (a K over several k-steps, a strided x); the
    routed GLU (stacked experts scaled by each row's routing weight, an id of another rank's expert, a
    shared expert at weight 1); a residual added in the store (plain, split-K, after the norm). Each case in
    tl.dot's IEEE precision and in the FFMA broadcast form ("fma"), at the shape rule's tile and at a
    2-row tile (many row programs, masked rows)."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    cases = [([5, 70], [40, 70], False, 1), ([5, 70], [40, 70], True, 1), ([33, 64], [3, 24, 64], True, 1),
             ([2, 17, 32], [2, 9, 32], False, 1), ([1, 256], [130, 256], True, 1),
             ([8, 1536], [40, 1536], False, 6), ([17, 700], [3, 33, 700], False, 3),
             ([2, 9, 300], [2, 20, 300], False, 2), ([33, 200], [40, 200], False, 1, True), ([3, 70], [130, 70], False, 1, True),
             ([20, 64], [5, 40, 64], True, 1), ([8, 1536], [40, 1536], True, 6), ([2, 9, 300], [2, 20, 300], True, 2)]
    modes = [("ieee", None), ("fma", None), ("fma", (2, 16, 32, 4, 1))]
    assert interpret_apart(MM_SCRIPT, [[cases[::2], modes], [cases[1::2], modes]]) == []


LAYOUT_SCRIPT = r"""
import json, sys, torch
from ddtree_chat.engine.ops.triton_linear import matmul_nt_triton
bad = []
for prec in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(9, 4, 48, generator=g)[..., :32]  # [T, h, 48] slice: the absorption's head-transposed x
    w = torch.randn(4, 64, 32, generator=g)
    o = matmul_nt_triton(q.transpose(0, 1), w, prec)
    want = torch.matmul(q.transpose(0, 1).double(), w.double().transpose(-1, -2))
    if o.shape != want.shape or (o.double() - want).abs().max() > 1e-4 or not o.transpose(0, 1).is_contiguous():
        bad.append(prec)
print(json.dumps(bad))
"""


def test_head_transposed_product_keeps_its_layout_in_the_interpreter():
    """A batch-inner x (a [T, h, d] activation viewed [h, T, d]) gets its output in that layout: transposed
    back it is contiguous, so o_proj's flatten is a view, not one copy per layer."""
    assert interpret(LAYOUT_SCRIPT, ["ieee", "fma"]) == []


def test_rope_kernel_in_the_interpreter_equals_the_reference():
    """Both layouts, with and without a heads axis, a leading batch axis, a half width that is not a power
    of two, more rows than one program holds, bf16 (rounded once); with the per-head RMSNorm first (the
    drafter's q and k: slices of its fused q/k/v product), one weight for all heads or one per head."""
    cases = [((), 5, 4, 16, 48, True, "float32", False),  # q's rope slice [T, h, 32 + 16]
             ((), 7, None, 16, 80, True, "float32", False),  # the latent's rope slice [T, 64 + 16]
             ((), 3, 8, 64, 64, False, "float32", False), ((2,), 3, 2, 12, 20, False, "float32", False),
             ((), 1, 64, 64, 192, True, "bfloat16", False), ((), 300, None, 8, 8, False, "float32", False),
             ((), 8, 4, 64, 512, False, "float32", True), ((), 9, 2, 12, 60, False, "float32", True),
             ((2,), 3, 8, 128, 2048, False, "bfloat16", True),
             ((), 8, 6, 64, 512, False, "float32", 2), ((2,), 3, 5, 32, 256, False, "bfloat16", 2)]  # q + k heads
    assert interpret(ROPE_SCRIPT, cases) == []


def test_latent_write_kernel_in_the_interpreter_equals_the_reference():
    """The demo's latent (64 + 16) and K2.6's (512 + 64), consecutive slots and a graph's scattered slot
    indices, rank not a power of two, one token, bf16; every slot it should not write stays NaN."""
    cases = [(5, 128, 64, 16, 12, False, "float32"), (33, 128, 64, 16, 64, True, "float32"),
             (3, 1536, 512, 64, 9, True, "bfloat16"), (1, 0, 48, 8, 1, False, "float32"),
             (17, 16, 96, 64, 40, False, "bfloat16")]
    assert interpret(LATENT_SCRIPT, cases) == []


def test_move_rows_kernel_in_the_interpreter_equals_the_reference():
    """An accepted path's rows moved down to consecutive slots, one after another (a later node can sit
    in an earlier one's destination): the demo's latent (64 + 16) and K2.6's (512 + 64), bit for bit."""
    if not interpreter_runs_loops():
        pytest.skip("this Triton's interpreter cannot run loops over runtime bounds")
    cases = [(3, 40, 64, 16, 5, 33, 7, 4, "float32"), (2, 300, 512, 64, 100, 65, 7, 7, "bfloat16"),
             (1, 20, 96, 64, 0, 9, 3, 0, "float32"), (4, 80, 64, 16, 30, 17, 7, 2, "bfloat16")]
    assert interpret(MOVE_SCRIPT, cases) == []


def test_wide_norm_kernel_in_the_interpreter_equals_the_reference():
    """K2.6's hidden (7168, not a power of two) and q_a (1536) rows, with and without the residual add
    (the sum rounded to the activation dtype first: bit-equal to the reference's in float32), strided rows."""
    cases = [(3, 7168, 0, False, "float32"), (2, 7168, 64, True, "bfloat16"), (5, 1536, 576, False, "bfloat16"),
             (1, 1024, 0, True, "float32")]
    assert interpret(NORM_SCRIPT, cases) == []


def test_topk_logprobs_kernel_in_the_interpreter_equals_the_reference():
    """The demo drafter's vocabulary (8192) at dflash's k = 1 and a tree budget, vocabularies that are not a
    chunk multiple, nine chunks, k up to 300 (512 candidates per chunk), exact ties, -inf entries, bf16."""
    cases = [(2, 8192, 32, "float32"), (3, 8192, 1, "float32"), (3, 100, 7, "float32"), (1, 5000, 256, "float32"),
             (1, 9000, 8, "float32"), (1, 3000, 300, "float32"), (4, 2048, 16, "bfloat16")]
    assert interpret_apart(TOPK_SCRIPT, [cases[::2], cases[1::2]]) == []


def test_running_sum_kernel_in_the_interpreter_equals_float64_and_ignores_the_row_count():
    """One chunk, a chunk and a bit, nine chunks (the sums of the chunks before in one reduction): within float32
    rounding of a float64 running sum, and each row's sums the same alone as among the others."""
    assert interpret(SCAN_SCRIPT, [(3, 1000), (2, 2049), (2, 17000)]) == []
