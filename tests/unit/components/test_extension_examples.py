"""The worked examples of docs/architecture.md (a new position scheme, a new attention variant) run as
written: each is one file's code, registered in a fresh registry here so the real ones stay as they are."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from pentad import registry
from pentad.layers.attention import AttentionInputs, SelfAttention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.transformer import TransformerLayer, TransformerStack

DOC = Path(__file__).parents[3] / "docs" / "architecture.md"


def _example(path: str) -> str:
    """The code block of docs/architecture.md that starts with ``# <path>``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.lstrip(" ").startswith(f"# {path}")]
    assert len(found) == 1, f"no example for {path}"
    return "\n".join(line[2:] if line.startswith("  ") else line for line in found[0].splitlines())


def _run(path: str, monkeypatch, name: str) -> dict:
    fresh = registry.Registry(name)
    monkeypatch.setattr(registry, "POSITION_SCHEMES" if "positions" in path else "ATTENTION_BLOCKS", fresh)
    namespace: dict = {"__name__": "example"}
    exec(compile(_example(path), path, "exec"), namespace)  # noqa: S102 - the documentation's own code
    namespace["registered"] = fresh
    return namespace


def _stack(attention, positions=None) -> TransformerStack:
    layer = TransformerLayer(attention, FeedForward(16, 32), lambda: torch.nn.LayerNorm(16), dropout=0.0)
    return TransformerStack([layer], 1, mask="causal", positions=positions).eval()


def test_a_new_position_scheme_is_one_file(monkeypatch):
    example = _run("src/pentad/components/positions/window.py", monkeypatch, "position schemes")
    scheme = example["registered"].get("window").build(None, None, "causal")
    assert scheme.window == 64
    small = example["WindowBias"](2)
    bias = small.bias(5, 5, 0, torch.device("cpu"))
    assert bias.shape == (1, 1, 5, 5) and torch.isinf(bias[0, 0, 4, 1]) and bias[0, 0, 4, 2] == 0
    stack = _stack(SelfAttention(16, 2), small)
    assert stack.positions is small and stack.position_kind == "window" and stack.window_bias is small
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        out = stack.run(x, None)
        cut = stack.run(x[:, 2:], None)  # the last query sees keys 2..4 only: the first two do not matter
    torch.testing.assert_close(out[:, -1], cut[:, -1])


def test_a_new_attention_variant_is_one_file(monkeypatch):
    example = _run("src/pentad/components/attention/qk_norm.py", monkeypatch, "attention blocks")
    block = example["registered"].get("qk_norm")
    cfg = type("Cfg", (), {"qk_norm": True, "dropout": 0.0, "attention_dropout": None, "num_heads": 2,
                           "num_kv_heads": None, "head_size": None, "bias": True, "attention_scale": True,
                           "qkv_bias": None})()
    assert block.applies(cfg)
    attention = block.factory(cfg, type("Sizes", (), {"hidden_size": 16})())(0)
    assert {name for name, _ in attention.named_parameters()} >= {"q_norm.weight", "k_norm.weight", "qkv.weight"}
    plain = SelfAttention(16, 2)
    plain.load_state_dict({k: v for k, v in attention.state_dict().items() if "norm" not in k})
    x = torch.randn(2, 5, 16)
    out, _ = attention(x, AttentionInputs(None, True))
    assert out.shape == (2, 5, 16) and not torch.allclose(out, plain(x, AttentionInputs(None, True))[0])
    with torch.no_grad():
        assert _stack(attention).run(x, None).shape == (2, 5, 16)
