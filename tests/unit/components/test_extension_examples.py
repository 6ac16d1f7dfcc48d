"""The worked examples of docs/architecture.md (a new position scheme, a new attention variant, a new
norm) run as written: each is one file's code, registered in a fresh registry here so the real ones stay
as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pentad import registry
from pentad.builder import build_model, init_weights
from pentad.components import norms
from pentad.components.encoders.transformer import TransformerStackConfig
from pentad.components.model_config import model_config_class
from pentad.components.targets.mlm import MlmTargetConfig
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
    which = next(kind for folder, kind in (("positions", "POSITION_SCHEMES"), ("attention", "ATTENTION_BLOCKS"),
                                           ("norms", "NORMS")) if f"/{folder}/" in path)
    monkeypatch.setattr(registry, which, fresh)
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
    """The documented file is the real one (docs/architecture.md shows qk_norm.py without its docstring)."""
    path = "src/pentad/components/attention/qk_norm.py"
    real = (DOC.parents[1] / path).read_text()
    assert _example(path).split("\n", 1)[1].strip() == real[real.index('"""', 3) + 3:].strip()
    example = _run(path, monkeypatch, "attention blocks")
    block = example["registered"].get("qk_norm")
    cfg = type("Cfg", (), {"qk_norm": "before_rotary", "dropout": 0.0, "attention_dropout": None, "num_heads": 2,
                           "num_kv_heads": None, "head_size": None, "bias": True, "attention_scale": True,
                           "qkv_bias": None, "norm": "rmsnorm", "layer_norm_eps": 1e-6, "attention_scale_size": None})()
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


def test_every_norm_field_offers_the_registered_norms():
    names = tuple(registry.NORMS.names())
    embedding = model_config_class().model_fields["embedding"].annotation
    fields = [TransformerStackConfig.model_fields["norm"], MlmTargetConfig.model_fields["norm"],
              embedding.model_fields["norm_kind"]]
    for field in fields:
        assert field.annotation.__args__ == names
    final = TransformerStackConfig.model_fields["final_norm_kind"].annotation.__args__[0]
    assert final.__args__ == names


def test_a_new_norm_is_one_file(monkeypatch):
    example = _run("src/pentad/components/norms/scale.py", monkeypatch, "norms")
    kind = example["registered"].get("scalenorm")
    norm = kind.build(16, 1e-6)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((2, 3), 4.0))
    # In the real registry (what the file does when the package imports it), every place that builds a
    # norm builds it: the layers' and final norms, the embedding slot, the mlm head; the builder's
    # initialisation resets it.
    monkeypatch.setitem(norms.NORMS._entries, "scalenorm", kind)
    assert norms.make_norm("scalenorm", 8, 1e-6).weight.item() == pytest.approx(8 ** 0.5)
    cfg = model_config_class().model_validate(
        {"hidden_size": 16, "vocab_size": 40, "max_seq_length": 8, "embedding": {"parts": ["word"]},
         "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 2, "ffn_size": 32,
                     "norm_position": "pre"},
         "targets": [{"type": "mlm"}]})
    for section, key in ((cfg.encoder, "norm"), (cfg.embedding, "norm_kind"), (cfg.targets[0], "norm")):
        object.__setattr__(section, key, "scalenorm")  # past the choices fixed when the classes were built
    model = build_model(cfg)
    built = [name for name, module in model.named_modules() if norms.norm_kind_of(module) == "scalenorm"]
    assert built == ["embedding.norm", "encoder.layers.0.attention_norm", "encoder.layers.0.ffn_norm",
                     "encoder.layers.1.attention_norm", "encoder.layers.1.ffn_norm", "encoder.final_norm",
                     "targets.mlm.norm"]
    with torch.no_grad():
        model.encoder.final_norm.weight.fill_(0.5)
    init_weights(model, 0.02)
    assert model.encoder.final_norm.weight.item() == pytest.approx(16 ** 0.5)
