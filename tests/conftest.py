"""Shared fixtures: paths to the shared data, tiny configs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TP = SHARED / "tencentpretrain"
SLOW_LIST = REPO / "tests" / "slow_unit_tests.txt"


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` the unit tests that tests/slow_unit_tests.txt lists (``make check`` leaves them out)."""
    lines = SLOW_LIST.read_text(encoding="utf-8").splitlines()
    listed = {line for line in lines if line and not line.startswith("#")}
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (modules using it: ``pytestmark = pytest.mark.usefixtures("one_thread")``):
    their models are tiny, and a second thread only adds spinning, slow on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not TP.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    return TP


def tiny_model_dict(**over) -> dict:
    """A tiny BERT-like model section (dict) for unit tests."""
    model = {
        "hidden_size": 32, "vocab_size": 50, "max_seq_length": 16,
        "embedding": {"parts": ["word", "pos", "seg"], "dropout": 0.0},
        "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 64, "dropout": 0.0},
        "targets": ["mlm", "sp"],
    }
    model.update(over)
    return model
