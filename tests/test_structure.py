"""The package's joints: which layer may import which, and every runtime knob listed in one place."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_chat import knobs

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ddtree_chat"


def _imports(path: Path) -> set[str]:
    """Absolute names of the ddtree_chat modules a file imports (at any depth, relative ones resolved)."""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])  # a module's package, or an __init__'s own
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("ddtree_chat")}


def _files(sub: str):
    return sorted((PKG / sub).rglob("*.py"))


@pytest.mark.parametrize("layer,forbidden", [("engine", ("ddtree_chat.ui", "ddtree_chat.cli", "textual")),
                                             ("ui", ("ddtree_chat.cli",))])
def test_layers_import_only_downwards(layer, forbidden):
    bad = {(str(f.relative_to(ROOT)), m) for f in _files(layer) for m in _imports(f) | _textual(f)
           if m.startswith(forbidden)}
    assert not bad


def _textual(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return {m for m in names if m.split(".")[0] == "textual"}


def test_parallel_never_imports_the_engine_module():
    bad = {(f.name, m) for f in _files("engine/parallel") for m in _imports(f)
           if m in ("ddtree_chat.engine.engine", "ddtree_chat.engine.Engine", "ddtree_chat.engine.reply")}
    assert not bad


def test_the_runtime_never_imports_the_tooling():
    """ddtree_chat/dev/ (demo training, random models) is for tests, benchmarks and the training command."""
    runtime = [f for f in PKG.rglob("*.py") if "dev" not in f.relative_to(PKG).parts]
    bad = {(f.name, m) for f in runtime for m in _imports(f) if m.startswith("ddtree_chat.dev")}
    assert runtime and not bad
    code = ("import sys, ddtree_chat.cli, ddtree_chat.ui.app, ddtree_chat.engine; "
            "print(sorted(m for m in sys.modules if m.startswith('ddtree_chat.dev')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_loaded_modules_respect_the_layers():
    """At run time too: importing the engine loads no UI or CLI, and the UI (app, startup) loads no CLI."""
    code = ("import sys, ddtree_chat.engine, ddtree_chat.engine.parallel; "
            "print(sorted(m for m in sys.modules if m.startswith(('ddtree_chat.ui', 'ddtree_chat.cli', 'textual'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
    code = ("import sys, ddtree_chat.ui.app, ddtree_chat.ui.startup, ddtree_chat.ui.loading; "
            "print('ddtree_chat.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_every_ddtree_variable_is_a_listed_knob_and_in_the_readme():
    listed = {k.name for k in knobs.KNOBS}
    used = set()
    for path in list(PKG.rglob("*.py")) + list(PKG.rglob("*.cu")):
        used |= set(re.findall(r"\bDDTREE_[A-Z0-9_]+\b", path.read_text()))
    assert used <= listed, used - listed
    readme = (ROOT / "README.md").read_text()
    assert all(name in readme for name in listed)
