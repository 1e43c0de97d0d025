"""The draft tree's best-first build (tree.build_tree_ref) as one Triton program: no host sync, one
launch instead of ~10 small kernels per depth (top-k, index maths, gathers) and a final sort. Also the
tree's ancestor mask and the verify walk, one launch each (the references loop over depth: 58 and 38
torch ops for a depth-7 tree, benchmarks/op_counts.py), and the round's packed result (ddtree.pack_round).

Per depth the kept prefixes and the drafter's top-K at that depth are both sorted (descending), so the
pair (i, j) of the i-th kept prefix and the j-th token has at least (i+1)(j+1) candidates scoring as
high: only pairs with (i+1)(j+1) <= budget can be among the best `budget` (~budget * ln(budget) pairs
instead of budget * K). Selections are bitonic sorts of (score, index) packed into one int64 key, ties
going to the lower index, so a parent (an earlier depth, never a lower score) precedes its children."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_PAIRS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


@triton.jit
def _key(score, index, size: tl.constexpr):
    """(score, index) -> int64 whose descending order is score descending, then index ascending."""
    bits = score.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed int order
    return (ordered.to(tl.int64) << 32) | (size - 1 - index).to(tl.int64)


@triton.jit
def _index(key, size: tl.constexpr):
    return size - 1 - (key & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _tree_kernel(LOGP, IDS, ROOT, PI, PJ, KSC, KPAR, KTOK, SBUF, NODE, OTOK, OPAR, ODEP, OLP, K, B,
                 D: tl.constexpr, C: tl.constexpr, BP: tl.constexpr, G: tl.constexpr):
    low = -9223372036854775807 - 1
    c = tl.arange(0, C)
    pi = tl.load(PI + c)  # [C] pair: kept-prefix rank, token rank (padding: rank B, never valid)
    pj = tl.load(PJ + c)
    r = tl.arange(0, BP)
    n_prev = B * 0 + 1  # the root (an int32 scalar: the loop carries it)
    # NOTE: a loop, not tl.static_range: unrolled, the D copies of the sort took ~7x longer to compile
    # (87 s for budget 256 on a CPU core, paid at the first start for every candidate budget)
    for d in range(D):
        n_cur = tl.minimum(B, n_prev * K)
        ok = (pi < n_prev) & (pj < K)
        sc = tl.load(LOGP + d * K + pj, mask=ok, other=0.0)
        sc += tl.load(KSC + (d - 1) * BP + pi, mask=ok & (d > 0), other=0.0)
        key = tl.where(ok, _key(sc, c, C), low)
        tl.store(SBUF + c, tl.sort(key, descending=True))
        tl.debug_barrier()
        keep = r < n_cur
        idx = _index(tl.load(SBUF + r, mask=keep & (r < C), other=low), C)
        ci = tl.load(PI + idx, mask=keep, other=0)
        cj = tl.load(PJ + idx, mask=keep, other=0)
        s = tl.load(LOGP + d * K + cj, mask=keep, other=0.0)
        s += tl.load(KSC + (d - 1) * BP + ci, mask=keep & (d > 0), other=0.0)
        tl.debug_barrier()  # NOTE: every lane has read SBUF and the previous depth before they change
        tl.store(KSC + d * BP + r, s)
        tl.store(KPAR + d * BP + r, tl.where(keep, ci, -1))
        tl.store(KTOK + d * BP + r, tl.load(IDS + d * K + cj, mask=keep, other=0))
        tl.debug_barrier()
        n_prev = n_cur
    # the best B prefixes over all depths; candidate g = depth * BP + rank
    g = tl.arange(0, G)
    have = g < D * BP
    live = have & (tl.load(KPAR + g, mask=have, other=-1) >= 0)
    key = tl.where(live, _key(tl.load(KSC + g, mask=have, other=0.0), g, G), low)
    tl.store(SBUF + g, tl.sort(key, descending=True))
    tl.debug_barrier()
    t = r
    take = t < B
    gi = tl.where(take, _index(tl.load(SBUF + t, mask=take, other=low), G), 0)
    tl.store(NODE + gi, t + 1, mask=take)
    tl.debug_barrier()
    dd = gi // BP
    deep = take & (dd > 0)
    pg = (dd - 1) * BP + tl.load(KPAR + gi, mask=deep, other=0)
    s = tl.load(KSC + gi, mask=take, other=0.0)
    ps = tl.load(KSC + pg, mask=deep, other=0.0)
    tl.store(OTOK + 1 + t, tl.load(KTOK + gi, mask=take, other=0), mask=take)
    tl.store(OPAR + 1 + t, tl.where(deep, tl.load(NODE + pg, mask=deep, other=0), 0).to(tl.int64), mask=take)
    tl.store(ODEP + 1 + t, (dd + 1).to(tl.int64), mask=take)
    tl.store(OLP + 1 + t, s - ps, mask=take)
    tl.store(OTOK, tl.load(ROOT))
    tl.store(OPAR, -1)
    tl.store(ODEP, 0)
    tl.store(OLP, 0.0)


def _pairs(budget: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (prefix rank, token rank) pairs that can make a depth's best `budget`, padded to a power of two."""
    key = (budget, k, str(device))
    if key not in _PAIRS:
        pairs = [(i, j) for i in range(budget) for j in range(min(k, budget)) if (i + 1) * (j + 1) <= budget]
        size = max(16, triton.next_power_of_2(len(pairs)))
        pad = [(budget, k)] * (size - len(pairs))
        t = torch.tensor(pairs + pad, dtype=torch.int32)
        _PAIRS[key] = (t[:, 0].contiguous().to(device), t[:, 1].contiguous().to(device))
    return _PAIRS[key]


def fits(top_logp: torch.Tensor, budget: int) -> bool:
    """Whether the depths hold at least `budget` candidates (else the tree is smaller: the reference)."""
    depth, k = top_logp.shape
    total, kept = 0, 1
    for _ in range(depth):
        kept = min(budget, kept * k)
        total += kept
    return total >= budget and budget >= 1


def build_tree_triton(root, top_logp: torch.Tensor, top_ids: torch.Tensor, budget: int,
                      out: tuple[torch.Tensor, ...] | None = None):
    """root [1] or [] int64 (device), top_logp [D, K] float32 (rows sorted descending), top_ids [D, K]
    -> (tokens, parents, depth, logprobs) [budget + 1] as build_tree_ref builds them (into `out`'s
    contiguous buffers when given); None when the depths hold fewer than `budget` candidates (the
    reference then builds a smaller tree)."""
    if not fits(top_logp, budget):
        return None
    dev = top_logp.device
    d, k = top_logp.shape
    pi, pj = _pairs(budget, k, dev)
    bp = max(16, triton.next_power_of_2(budget))
    g = triton.next_power_of_2(d * bp)
    n = budget + 1
    long = dict(dtype=torch.long, device=dev)
    want = (torch.long, torch.long, torch.long, torch.float32)
    if out is None or any(t.shape != (n,) or t.dtype != w or t.stride(0) != 1 for t, w in zip(out, want)):
        out = tuple(torch.empty(n, dtype=w, device=dev) for w in want)
    ksc = torch.empty(d * bp, dtype=torch.float32, device=dev)
    kpar = torch.empty(d * bp, dtype=torch.int32, device=dev)
    ktok = torch.empty(d * bp, **long)
    sbuf = torch.empty(max(g, pi.numel(), bp), **long)
    node = torch.empty(g, dtype=torch.int32, device=dev)
    root = torch.as_tensor(root, device=dev, dtype=torch.long).reshape(1)
    _tree_kernel[(1,)](top_logp.float().contiguous(), top_ids.contiguous(), root, pi, pj, ksc, kpar, ktok, sbuf,
                       node, *out, k, budget, D=d, C=pi.numel(), BP=bp, G=g, num_warps=4 if g <= 1024 else 8)
    return out


@triton.jit(do_not_specialize=["N"])
def _ancestor_kernel(PAR, M, N, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
    """Row i of the ancestor mask: i itself and every node on its way up (DEPTH steps bound the climb)."""
    i = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    row = cols == i
    a = tl.load(PAR + i)
    for _ in tl.static_range(DEPTH):
        row = row | ((cols == a) & (a >= 0))
        a = tl.where(a >= 0, tl.load(PAR + tl.maximum(a, 0)), a)
    tl.store(M + i * N + cols, row.to(tl.int8), mask=cols < N)


@triton.jit(do_not_specialize=["N"])
def _walk_kernel(PAR, TOK, CHOICE, OK, BONUS, DEP, STATE, PATH, SLOTS, N, DEPTH: tl.constexpr, BLOCK: tl.constexpr,
                 COMMIT: tl.constexpr, LB: tl.constexpr, DRAFTING: tl.constexpr):
    """A node is accepted iff the target chose its token at its parent and every ancestor is accepted:
    each node climbs its own chain (no cross-thread gathers), then the deepest accepted node's choice
    is the bonus token. COMMIT: also tree.walk_commit_ref's path, slots and state update (LB: levels
    DEPTH + 1 padded to a power of two)."""
    nodes = tl.arange(0, BLOCK)
    live = nodes < N
    a = nodes
    ok = live
    depth = tl.zeros([BLOCK], tl.int32)
    for _ in tl.static_range(DEPTH + 1):
        p = tl.load(PAR + a, mask=live, other=-1)
        up = p >= 0
        hit = tl.load(CHOICE + tl.maximum(p, 0), mask=live & up, other=0) == tl.load(TOK + a, mask=live & up, other=0)
        ok = ok & (hit | ~up)
        depth += up.to(tl.int32)
        a = tl.where(up, p, a)
    tl.store(OK + nodes, ok.to(tl.int8), mask=live)
    deepest = tl.argmax(tl.where(ok, depth, -1), 0)
    bonus = tl.load(CHOICE + deepest)
    tl.store(BONUS, bonus)
    if COMMIT:
        lv = tl.arange(0, LB)
        dep = tl.load(DEP + nodes, mask=live, other=-1)
        # at most one accepted node per depth: the max picks it (0 where none)
        hit2 = ok[None, :] & (dep[None, :] == lv[:, None])
        path = tl.max(tl.where(hit2, nodes[None, :], 0), 1).to(tl.int64)  # [LB]
        start = tl.load(STATE)
        entries = tl.load(STATE + 1)
        lv_ok = lv < DEPTH + 1
        tl.store(PATH + lv, path, mask=lv_ok)
        tl.store(SLOTS + lv, start + path, mask=lv_ok)
        tl.store(SLOTS + (DEPTH + 1) + lv, start + lv, mask=lv_ok)
        tl.store(SLOTS + 2 * (DEPTH + 1) + lv, entries + lv, mask=lv_ok)
        count = tl.sum(ok.to(tl.int64), 0)
        tl.debug_barrier()  # every lane has read STATE before it moves
        tl.store(STATE, start + count)
        if DRAFTING:
            tl.store(STATE + 1, entries + count)
        tl.store(STATE + 2, bonus)


def _block(n: int) -> int:
    """One block width for every tree the graphs serve (<= 257 nodes): one compile per kernel, not per size."""
    return 512 if n <= 512 else triton.next_power_of_2(n)


def ancestor_mask_triton(tree) -> torch.Tensor:
    """A DraftTree on the device -> its [N, N] bool ancestor mask (DraftTree.mask_ref), in one launch."""
    parents, depth_bound = tree.parents, tree.depth_bound
    n = parents.numel()
    out = torch.empty(n, n, dtype=torch.uint8, device=parents.device)
    _ancestor_kernel[(n,)](parents.contiguous(), out, n, DEPTH=depth_bound, BLOCK=_block(n))
    return out.view(torch.bool)


def walk_triton(tree, choice: torch.Tensor):
    """(accepted mask [N] bool, bonus token [] int64) as tree.walk_topk_ref computes them, in one launch."""
    return _walk(tree, choice)


def commit_state_ok(tree, choice: torch.Tensor, state: torch.Tensor, drafting: bool) -> bool:
    """The state walk_commit_triton advances: int64 [3], unit stride."""
    return state.dtype == torch.long and state.numel() == 3 and state.stride(0) == 1


def walk_commit_triton(tree, choice: torch.Tensor, state: torch.Tensor, drafting: bool):
    """tree.walk_commit_ref in one launch: (ok, bonus, path, slots), state advanced in place."""
    if not commit_state_ok(tree, choice, state, drafting):
        return None
    return _walk(tree, choice, (state, drafting))


def _walk(tree, choice, commit=None):
    parents, tokens, depth_bound = tree.parents, tree.tokens, tree.depth_bound
    n = parents.numel()
    dev = parents.device
    ok = torch.empty(n, dtype=torch.uint8, device=dev)
    bonus = torch.empty((), dtype=torch.long, device=dev)
    state, drafting = commit if commit is not None else (ok, False)
    path = torch.empty(depth_bound + 1, dtype=torch.long, device=dev) if commit is not None else ok
    slots = torch.empty(3, depth_bound + 1, dtype=torch.long, device=dev) if commit is not None else ok
    _walk_kernel[(1,)](parents.contiguous(), tokens.contiguous(), choice.contiguous(), ok, bonus,
                       tree.depth.contiguous(), state, path, slots, n, DEPTH=depth_bound, BLOCK=_block(n),
                       COMMIT=commit is not None, LB=triton.next_power_of_2(depth_bound + 1), DRAFTING=drafting,
                       num_warps=4 if n <= 1024 else 8)
    return (ok.view(torch.bool), bonus) if commit is None else (ok.view(torch.bool), bonus, path, slots)


@triton.jit(do_not_specialize=["n"])
def _pack_kernel(TOK, PAR, DEP, LP, CH, OK, BONUS, OUT, n, BLOCK: tl.constexpr):
    j = tl.arange(0, BLOCK)
    m = j < n
    tl.store(OUT + j, tl.load(TOK + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + n + j, tl.load(PAR + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + 2 * n + j, tl.load(DEP + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + 3 * n + j, tl.load(LP + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + 4 * n + j, tl.load(CH + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + 5 * n + j, tl.load(OK + j, mask=m).to(tl.float64), mask=m)
    tl.store(OUT + 6 * n, tl.load(BONUS).to(tl.float64))


def pack_parts_ok(tree, choice: torch.Tensor, ok: torch.Tensor, bonus: torch.Tensor) -> bool:
    """The parts pack_round_triton packs: 1-D, N long, unit stride; bonus one element."""
    n = tree.tokens.numel()
    parts = (tree.tokens, tree.parents, tree.depth, tree.logprobs, choice, ok)
    return all(p.dim() == 1 and p.numel() == n and p.stride(0) == 1 for p in parts) and bonus.numel() == 1


def pack_round_triton(tree, choice: torch.Tensor, ok: torch.Tensor, bonus: torch.Tensor):
    """ddtree.pack_round_ref's [6N + 1] float64 in one launch; None for parts it does not serve."""
    if not pack_parts_ok(tree, choice, ok, bonus):
        return None
    parts = (tree.tokens, tree.parents, tree.depth, tree.logprobs, choice, ok)
    n = tree.tokens.numel()
    out = torch.empty(6 * n + 1, dtype=torch.float64, device=tree.tokens.device)
    _pack_kernel[(1,)](*parts[:5], ok.view(torch.uint8) if ok.dtype == torch.bool else ok, bonus, out, n,
                       BLOCK=_block(n))
    return out
