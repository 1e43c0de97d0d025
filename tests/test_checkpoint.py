"""Loading: both layouts give the same model; every bad input ends in a clear CheckpointError/ConfigError."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from ddtree_chat.engine.config import load_target_config
from ddtree_chat.engine.errors import CheckpointError, ConfigError
from ddtree_chat.engine.loader import load_target
from ddtree_chat.engine.model import causal_mask
from ddtree_chat.engine.synthetic import make_target

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def k25(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("k25"), "tiny", seed=3, layout="k25")


@pytest.fixture
def broken(k25, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(k25, d)
    return d


def _logits(model, ids):
    t = len(ids)
    h, _ = model(torch.tensor(ids), torch.arange(t), causal_mask(t))
    return model.logits(h)


def test_both_layouts_load_to_identical_logits(k25, tmp_path):
    k2 = make_target(tmp_path / "k2", "tiny", seed=3, layout="k2")
    c25, m25 = load_target(k25, CPU, torch.float32)
    c2, m2 = load_target(k2, CPU, torch.float32)
    assert c25.layout == "k25" and c2.layout == "k2"
    ids = [5, 17, 300, 2, 99]
    assert torch.equal(_logits(m25, ids), _logits(m2, ids))


def test_packed_experts_on_request_compute_as_the_dense_ones(k25):
    from ddtree_chat.engine.ops.int4 import Int4Weight

    _, dense = load_target(k25, CPU, torch.float32)
    _, packed = load_target(k25, CPU, torch.float32, packed_experts=True)
    kinds = {type(layer.mlp.experts.down) for m in (dense, packed) for layer in m.layers
             if getattr(layer.mlp, "experts", None) is not None}
    assert kinds == {torch.Tensor, Int4Weight}  # NOTE: dense by default on the CPU, packed when asked
    ids = [5, 17, 300, 2, 99]
    torch.testing.assert_close(_logits(packed, ids), _logits(dense, ids), rtol=1e-4, atol=1e-4)


def test_config_fields_and_fp32_bias(k25):
    cfg, model = load_target(k25, CPU, torch.float32)
    assert cfg.quant is not None and cfg.quant.group_size == 32
    assert cfg.rope_scaling.type == "yarn" and cfg.rope_scaling.factor == 64
    assert model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    raw = json.loads((k25 / "config.json").read_text())
    assert "vision_tower.patch_embed.proj.weight" in json.loads(
        (k25 / "model.safetensors.index.json").read_text())["weight_map"]  # present on disk, skipped by the loader
    assert raw["model_type"] == "kimi_k25"


def test_experts_load_one_slice_at_a_time_into_their_place(k25, monkeypatch):
    """The host holds one expert's tensors at a time, not a projection's tensors of every expert (hundreds of
    MB per rank at K2.6 shapes), and each expert lands in its own place, as its checkpoint tensors say."""
    import weakref

    from ddtree_chat.engine import checkpoint
    from ddtree_chat.engine.ops.int4 import dequant_int4

    alive, peak, real = [0], [0], checkpoint.CheckpointReader.get

    def get(self, name, *a, **kw):
        t = real(self, name, *a, **kw)
        if ".experts." in name:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            weakref.finalize(t, lambda: alive.__setitem__(0, alive[0] - 1))
        return t

    monkeypatch.setattr(checkpoint.CheckpointReader, "get", get)
    cfg, model = load_target(k25, CPU, torch.float32)
    assert cfg.n_routed_experts == 8 and peak[0] <= 3, peak
    reader, g = checkpoint.CheckpointReader(k25), cfg.quant.group_size
    base = "language_model.model.layers.2.mlp.experts"
    for proj, got in (("gate_proj", model.layers[2].mlp.experts.gate), ("down_proj", model.layers[2].mlp.experts.down)):
        for e in (0, 5):
            want = dequant_int4(real(reader, f"{base}.{e}.{proj}.weight_packed")[None],
                                real(reader, f"{base}.{e}.{proj}.weight_scale")[None], g, torch.float32)[0]
            assert torch.equal(got[e], want), (proj, e)


def test_progress_reports_every_tensor(k25):
    seen = []
    load_target(k25, CPU, torch.float32, progress=lambda d, t, what: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, len(seen) + 1))


def test_missing_index_and_shard(broken):
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (broken / shard).unlink()
    with pytest.raises(CheckpointError, match=shard):
        load_target(broken, CPU, torch.float32)
    (broken / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="index"):
        load_target(broken, CPU, torch.float32)


def test_missing_tensor(broken):
    index_path = broken / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"]["language_model.model.layers.1.self_attn.o_proj.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="layers.1.self_attn.o_proj.weight is missing"):
        load_target(broken, CPU, torch.float32)


def _rewrite_tensor(d, name, value):
    index = json.loads((d / "model.safetensors.index.json").read_text())
    fname = index["weight_map"][name]
    from safetensors import safe_open

    with safe_open(str(d / fname), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors[name] = value
    save_file(tensors, str(d / fname))


def test_wrong_shape_and_dtype(broken):
    _rewrite_tensor(broken, "language_model.model.norm.weight", torch.ones(65, dtype=torch.bfloat16))
    with pytest.raises(CheckpointError, match=r"norm.weight .*shape \[65\], expected \[64\]"):
        load_target(broken, CPU, torch.float32)
    _rewrite_tensor(broken, "language_model.model.norm.weight", torch.ones(64, dtype=torch.bfloat16))
    name = "language_model.model.layers.1.mlp.experts.0.up_proj.weight_packed"
    _rewrite_tensor(broken, name, torch.zeros(64, 8, dtype=torch.int64))
    with pytest.raises(CheckpointError, match="dtype"):
        load_target(broken, CPU, torch.float32)


def test_truncated_shard(broken):
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shard = broken / sorted(set(index["weight_map"].values()))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_target(broken, CPU, torch.float32)


def test_pickled_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="pickled"):
        from ddtree_chat.engine.checkpoint import CheckpointReader

        CheckpointReader(tmp_path)


@pytest.mark.parametrize("patch, match", [
    ({"quant_method": "gptq"}, "quant_method"),
    ({"format": "float-quantized"}, "format"),
    ({"weights": {"num_bits": 8}}, "num_bits"),
    ({"weights": {"symmetric": False}}, "symmetric"),
    ({"weights": {"strategy": "channel"}}, "strategy"),
])
def test_unsupported_quantization(broken, patch, match):
    raw = json.loads((broken / "config.json").read_text())
    q = raw["text_config"]["quantization_config"]
    for k, v in patch.items():
        if k == "weights":
            q["config_groups"]["group_0"]["weights"].update(v)
        else:
            q[k] = v
    (broken / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=match):
        load_target_config(broken)


def test_corrupt_config(broken):
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_target_config(broken)
    (broken / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 4}}))
    with pytest.raises(ConfigError, match="missing the field"):
        load_target_config(broken)


def test_reads_equal_safetensors_and_fetch_only_the_rows_asked(tmp_path, monkeypatch):
    """Whole tensors of every dtype the loader meets, row and column slices: the reader's values are
    safetensors' own; a row slice is one read request of exactly its rows' bytes."""
    from safetensors import safe_open

    from ddtree_chat.engine import checkpoint
    from ddtree_chat.engine.checkpoint import CheckpointReader

    g = torch.Generator().manual_seed(0)
    tensors = {"w.bf16": torch.randn(37, 40, generator=g).to(torch.bfloat16), "w.f32": torch.randn(9, 3, 5, generator=g),
               "w.i32": torch.randint(-2**31, 2**31 - 1, (64, 16), dtype=torch.int32, generator=g),
               "v.f32": torch.randn(33, generator=g), "s.i64": torch.tensor(7), "empty": torch.zeros(0, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    reader = CheckpointReader(tmp_path)
    asked = []
    read_at = checkpoint._read_at
    monkeypatch.setattr(checkpoint, "_read_at", lambda f, view, at: asked.append(view.nbytes) or read_at(f, view, at))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        for name in tensors:
            assert torch.equal(reader.get(name), f.get_tensor(name)), name
        for name, rows, cols in (("w.bf16", slice(5, 17), None), ("w.i32", slice(16, 32), slice(4, 8)),
                                 ("w.i32", None, slice(12, 16)), ("v.f32", slice(30, 33), None),
                                 ("w.f32", slice(8, 9), None)):
            sl = f.get_slice(name)
            want = sl[rows or slice(None), cols or slice(None)] if cols is not None else sl[rows or slice(None)]
            asked.clear()
            got = reader.get(name, rows=rows, cols=cols)
            assert torch.equal(got, want) and got.is_contiguous(), (name, rows, cols)
            rows_read = (rows or slice(None)).indices(tensors[name].shape[0])
            row_bytes = tensors[name][0].numel() * tensors[name].element_size()
            assert asked == [(rows_read[1] - rows_read[0]) * row_bytes], (name, asked)
    reader.close()
