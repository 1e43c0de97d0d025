import os
import tempfile

import pytest
from hypothesis import settings

# NOTE: the same examples on every run, so a CI result is reproducible (explore locally with
# HYPOTHESIS_PROFILE=explore).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# NOTE: set before anything imports ddtree_chat.paths, so no test touches the real home directory.
os.environ.setdefault("DDTREE_CHAT_HOME", tempfile.mkdtemp(prefix="ddtree-chat-test-"))

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def synthetic_pair(tmp_path_factory):
    from ddtree_chat.engine.synthetic import make_synthetic_pair

    return make_synthetic_pair(tmp_path_factory.mktemp("synthetic"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def engine(synthetic_pair):
    from ddtree_chat.engine import Engine

    target, draft = synthetic_pair
    return Engine.load(target, draft, device="cpu")
