"""A built wheel carries what an installed ddtree-chat needs: the demo pair, the TUI's CSS, the CUDA sources."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "ddtree_chat" / "assets" / "demo"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    made_here = not (ROOT / "build").exists()  # NOTE: setuptools builds in ./build; a stale one could leak old files
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    if made_here:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = out.glob("ddtree_chat-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_contains_the_demo_pair(wheel):
    names = set(wheel.namelist())
    shards = json.loads((DEMO / "target" / "model.safetensors.index.json").read_text())["weight_map"].values()
    needed = {f"target/{f}" for f in (*shards, "config.json", "model.safetensors.index.json", "tokenizer.json",
                                      "chat_template.jinja")}
    needed |= {"draft/config.json", "draft/model.safetensors", "heldout_prompts.json"}
    assert {f"ddtree_chat/assets/demo/{f}" for f in needed} <= names
    assert {"ddtree_chat/ui/app.tcss", "ddtree_chat/csrc/moe_int4.cu"} <= names


def test_wheel_declares_the_dependencies_it_needs(wheel):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in wheel.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    for req in ("textual>=6", "rich>=14", "tokenizers>=0.19.1", "torch<3,>=2.11"):
        assert req in requires, requires
    assert not any(r.startswith(("pybind11", "ninja")) for r in requires)
