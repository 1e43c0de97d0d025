"""The kernel registry (ops/registry.py) on CPU with fake kernels: which implementation serves a call, in
which order, and strict mode (the GPU tests' guard against silent fallbacks)."""

from types import SimpleNamespace

import pytest
import torch

from ddtree_chat.engine.ops import registry
from ddtree_chat.engine.ops.registry import KernelDeclined, Op

F32 = SimpleNamespace(is_cuda=True, dtype=torch.float32)  # a CUDA tensor, as far as dispatch looks
BF16 = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def own_ops(monkeypatch):
    """Fake ops never leak into the real table."""
    monkeypatch.setattr(registry, "OPS", dict(registry.OPS))


def probe(name="probe"):
    return Op(name, lambda x, a: ("ref", a))


def test_the_first_kernel_that_accepts_serves_else_the_reference():
    op = probe()
    assert op(F32, 1) == ("ref", 1)  # nothing registered
    op.register(lambda x, a: ("small", a), dtypes=[torch.float32], supports=lambda x, a: 0 <= a < 10)
    op.register(lambda x, a: ("any", a), supports=lambda x, a: a >= 0)
    assert op(F32, 2) == ("small", 2)
    assert op(F32, 12) == ("any", 12)  # the first one's supports says no
    assert op(BF16, 2) == ("any", 2)  # not its dtype
    assert op(F32, -1) == ("ref", -1)  # none accepts
    assert op(torch.zeros(1), 3) == ("ref", 3)  # a CPU tensor: the reference, no kernel asked
    op.register(lambda x, a: ("first", a), ahead=True, supports=lambda x, a: a == 5)
    assert op(F32, 5) == ("first", 5) and op(F32, 4) == ("small", 4)
    assert op.kernel_for(F32, 12).name == "<lambda>" and op.kernel_for(torch.zeros(1), 1) is None


def test_recorded_calls_take_the_reference():
    op = probe()
    op.register(lambda x, a: ("kernel", a))
    grad = torch.ones(1, requires_grad=True)  # autograd records the call: the kernels have no backward
    assert op.on(F32, F32, grad) == ("ref", grad)
    assert op.on(F32, F32, grad.detach())[0] == "kernel"
    with torch.no_grad():
        assert op.on(F32, F32, grad)[0] == "kernel"


def test_a_declined_call_moves_on_and_strict_mode_raises_unless_the_kernel_may_decline():
    op = probe()
    op.register(lambda x, a: None if a < 0 else ("checked", a), declines=True)
    op.register(lambda x, a: None, supports=lambda x, a: a > 100, name="liar")
    assert op(F32, -1) == ("ref", -1) and op(F32, 101) == ("checked", 101)
    with registry.strict():
        assert op(F32, -1) == ("ref", -1)  # declines=True: its own shape checks may say no
        op.kernels.reverse()
        with pytest.raises(KernelDeclined, match="liar"):
            op(F32, 101)  # accepted by supports, then None: the rule and the kernel disagree
        assert op(F32, 5) == ("checked", 5)  # the liar's supports said no: a decision, not a fallback
    assert op(F32, 101) == ("checked", 101)  # outside strict mode the next serves


def test_strict_mode_from_the_knob(monkeypatch):
    assert not registry.strict_mode()
    monkeypatch.setenv("DDTREE_STRICT", "1")
    assert registry.strict_mode()
    with registry.strict(False):
        assert not registry.strict_mode()


class NoFit(Exception):
    pass


def test_a_kernel_that_fails_for_good_is_skipped_and_logged_once(caplog):
    op = probe()
    calls = []

    def kernel(x, a):
        calls.append(a)
        if a > 0:
            raise NoFit("out of resources: shared memory")
        return ("kernel", a)

    op.register(kernel, errors=(NoFit,))
    assert op(F32, 0) == ("kernel", 0)
    with caplog.at_level("WARNING"):
        assert [op(F32, 1), op(F32, 0), op(F32, 2)] == [("ref", 1), ("ref", 0), ("ref", 2)]
    assert calls == [0, 1] and sum("probe: fast kernel unavailable" in r.message for r in caplog.records) == 1
    assert op.fast(F32) is None  # broken: no longer reported as serving
    other = probe("probe2")
    other.register(lambda x, a: (_ for _ in ()).throw(ValueError("bad shape")), errors=(NoFit,))
    with pytest.raises(ValueError):  # other errors (a bug, a bad shape) are not swallowed
        other(F32, 1)
    strict_op = probe("probe3")
    strict_op.register(lambda x, a: (_ for _ in ()).throw(NoFit("no nvcc")), errors=(NoFit,))
    with registry.strict(), pytest.raises(NoFit):
        strict_op(F32, 1)
    assert strict_op.kernels[0].broken is None


def test_builtin_forms_stay_behind_the_kernels_and_survive_a_swap():
    op = probe()
    op.register(lambda x, a: ("dense", a), builtin=True)
    assert op(F32, 1) == ("dense", 1) and op.fast(F32) is None  # a builtin form is no kernel
    op.register(lambda x, a: ("kernel", a), supports=lambda x, a: a > 0)
    assert op(F32, 1) == ("kernel", 1) and op(F32, 0) == ("dense", 0)
    registry.register("probe", lambda x, a: ("swapped", a))  # without ahead: replaces the kernels
    assert op(F32, 0) == ("swapped", 0) and [k.builtin for k in op.kernels] == [False, True]
    op.clear()
    assert op(F32, 0) == ("dense", 0)


def test_the_legacy_names_reach_the_same_op():
    assert registry.dispatch("fresh", F32, lambda a: ("ref", a), 1) == ("ref", 1)  # defined on first use
    registry.register("fresh", lambda a: ("kernel", a), dtypes=[torch.float32])
    assert registry.dispatch("fresh", F32, lambda a: ("ref", a), 1) == ("kernel", 1)
    assert registry.fast("fresh", F32)(2) == ("kernel", 2) and registry.fast("fresh", BF16) is None
    assert registry.fast("nothing", F32) is None
    early = registry.define("later")  # ops/gpu.py may register before the op's module defines it
    early.register(lambda x: "kernel")
    assert registry.define("later", lambda x: "ref") is early and early.ref(F32) == "ref" and early(F32) == "kernel"


def test_every_hot_path_op_is_defined_once_with_its_reference():
    import ddtree_chat.engine.tree  # noqa: F401  (defines the tree's ops)

    names = {"matmul_nt", "matmul_nt_glu", "linear_add", "rms_norm_linear", "routed_glu", "rms_norm", "add_rms_norm",
             "rope", "norm_rope", "latent_write", "move_rows", "mla_attention", "draft_attention", "topk_logprobs",
             "router_logits", "route", "moe_experts", "prepare_experts", "ancestor_mask", "build_tree", "walk",
             "walk_commit", "pack_round"}
    assert names <= set(registry.OPS) and all(registry.OPS[n].ref is not None for n in names)
    moe = registry.OPS["moe_experts"]
    assert [k.builtin for k in moe.kernels][-1:] == [True]  # the dense form, kept with the kernels off


def test_gpu_rules_for_the_exact_mla_and_products():
    from ddtree_chat.engine.ops import gpu

    q = torch.zeros(3, 4, 512)
    assert gpu._mla_exact_shape(q, torch.zeros(3, 4, 64)) and not gpu._mla_exact_shape(q, torch.zeros(3, 4, 48))
    assert not gpu._mla_exact_shape(torch.zeros(3, 4, 96), torch.zeros(3, 4, 64))
    assert gpu._int_prefix_fp32(q, None, None, None, 5, None, 1.0)
    assert not gpu._int_prefix_fp32(q, None, None, None, torch.tensor([5]), None, 1.0)
    assert not gpu._int_prefix_fp32(q.bfloat16(), None, None, None, 5, None, 1.0)
    x, w = torch.zeros(5, 8), torch.zeros(6, 8)
    assert gpu._exact_product_shape(x, w) and gpu._exact_product_shape(x, w, torch.zeros(5, 6))
    assert not gpu._exact_product_shape(x, w.bfloat16()) and gpu._exact_product_shape(x.bfloat16(), w, any_dtype=True)
    assert not gpu._exact_product_shape(x, w, torch.zeros(5, 6).t().contiguous().t())


def test_the_fingerprint_follows_the_exact_knob(monkeypatch):
    from ddtree_chat.engine.ops import gpu

    exact = gpu.fingerprint()
    monkeypatch.setenv("DDTREE_EXACT", "0")
    assert gpu.fingerprint() != exact


def test_the_router_keeps_one_float32_copy_of_a_half_weight():
    from ddtree_chat.engine.ops import router_logits, router_logits_ref
    from ddtree_chat.engine.ops.router import _F32, float32_weight, router_through_products

    w32 = torch.randn(8, 16)
    assert float32_weight(w32) is w32
    w = w32.bfloat16()
    first = float32_weight(w)
    assert first.dtype == torch.float32 and float32_weight(w) is first and torch.equal(first, w.float())
    with torch.no_grad():
        w.mul_(2)  # changed in place: a fresh copy
    assert float32_weight(w) is not first and torch.equal(float32_weight(w), w.float())
    x = torch.randn(3, 16).bfloat16()
    assert torch.equal(router_logits(x, w), router_logits_ref(x, w))
    assert torch.equal(router_through_products(x, w), router_logits_ref(x, w))  # the kernel form
    key = id(w)
    del w, first
    assert key not in _F32  # freed with its weight


@pytest.mark.parametrize("exact", ["1", "0"])
def test_the_gpu_table_orders_the_kernels_as_documented(monkeypatch, exact):
    """ops/gpu.register_all with CUDA faked (nothing runs): each op's kernels in dispatch order, with the
    row-invariant kernels (default) and without (DDTREE_EXACT=0)."""
    pytest.importorskip("triton")
    import ddtree_chat.engine.tree  # noqa: F401
    from ddtree_chat.engine.ops import gpu

    saved = {n: list(o.kernels) for n, o in registry.OPS.items()}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "enabled_ops", [])
    monkeypatch.delenv("DDTREE_KERNELS", raising=False)
    monkeypatch.setenv("DDTREE_EXACT", exact)
    try:
        gpu.register_all()
        order = {n: [k.name for k in o.kernels] for n, o in registry.OPS.items()}
    finally:
        for n, ks in saved.items():
            registry.OPS[n].kernels = ks
    row_invariant = ["matmul_nt_exact"] if exact == "1" else []
    assert order["mla_attention"] == ["mla_attention_exact"] * (exact == "1") + ["mla_attention_triton"]
    assert order["matmul_nt"] == row_invariant + ["matmul_nt_fast"]
    assert order["linear_add"] == row_invariant + ["linear_add_fast", "linear_add_addmm"]
    # NOTE: without the row-invariant product the router goes through the products' dispatch, never straight
    # to the reference's cuBLAS call
    assert order["router_logits"] == ["router_logits_exact"] * (exact == "1") + ["router_through_products"]
    assert order["rms_norm"] == ["rms_norm_wide", "rms_norm_fast"]
    assert order["moe_experts"] == ["moe_experts_fast", "moe_experts_grouped", "_dense_experts"]
    assert order["route"] == ["route_kernel"] and order["build_tree"] == ["build_tree_triton"]
    assert set(gpu.enabled_ops) == {n for n, ks in order.items() if any(k != "_dense_experts" for k in ks)}
