"""Every zoo recipe keeps its parameter names, initial weights and outputs bit for bit across
refactors of the transformer stack (the block seam): a shrunken copy of each recipe is built on a
fixed seed, and its state-dict layout, weights, eval losses, train-mode (dropout) losses and
gradients are compared with checksums recorded before the refactor in
``data/zoo_outputs.json``. Regenerate only for an intended change:
``python -m tests.unit.components.test_zoo_outputs_unchanged``.

Bitwise equality holds only on the platform the fixture was recorded on (the same torch and CPU
kernel set: vectorised normal draws and matmul reductions round differently under other
instruction sets). Elsewhere the layout is still compared exactly and the values through sums that
must agree to 1e-4 relative. An entry recorded on another platform than the file's ``_platform``
(a recipe added later, elsewhere) names its own ``platform``, and is bitwise only there."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tests.unit.test_zoo import batch_for, shrunk_model_config

from pentad.builder import build_model
from pentad.config.loader import zoo_names
from pentad.model import total_loss

FIXTURE = Path(__file__).parent / "data" / "zoo_outputs.json"
# Options no recipe uses, on a recipe's shrunken config: recipe, encoder/decoder overrides.
VARIANTS = {
    "bert/tiny+residual_attention": ("bert/tiny", {"residual_attention": True}),
    "bert/tiny+prefix_nobias": ("bert/tiny", {"mask": "prefix", "bias": False}),
    "gpt2/tiny+residual_attention_share": ("gpt2/tiny", {"residual_attention": True, "share_layers": True}),
    "llama/7b+gqa_head": ("llama/7b", {"num_heads": 4, "num_kv_heads": 2, "head_size": 8}),
    "t5/small+gated": ("t5/small", {"ffn": "gated", "activation": "gelu_tanh", "attention_scale": True}),
}


def _config(name: str):
    if name not in VARIANTS:
        return shrunk_model_config(name)
    recipe, overrides = VARIANTS[name]
    raw = shrunk_model_config(recipe).model_dump(mode="json")
    for slot in ("encoder", "decoder"):
        if raw.get(slot) is not None:
            raw[slot].update({k: v for k, v in overrides.items() if slot == "encoder" or k != "mask"})
    return type(shrunk_model_config(recipe)).model_validate(raw)


def _platform() -> dict[str, str]:
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


def _abs_sum(tensors) -> float:
    return float(sum(t.detach().double().abs().sum() for t in tensors))


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:32]


def fingerprint(name: str) -> dict:
    """Layout, weight, output and gradient checksums of recipe ``name`` shrunk, on seed 0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions are bitwise reproducible for one thread count
    try:
        torch.manual_seed(0)
        model = build_model(_config(name))
        state = model.state_dict()
        layout = [f"{k}:{tuple(v.shape)}" for k, v in state.items()]
        batch = batch_for(model, 97)
        model.eval()
        with torch.no_grad():
            outputs = model(batch)
            hidden, _ = model.encode(batch) if model.stream_plan is None else (model.encode_pair(batch).first, None)
        eval_losses = {k: repr(float(o.loss)) for k, o in outputs.items() if o.loss is not None}
        cached, cached_sum = _cached_hidden(model, batch)
        model.train()
        torch.manual_seed(1)
        loss = total_loss(model(batch))
        loss.backward()
        loss = loss.detach()
        grads = [p.grad for _, p in model.named_parameters() if p.grad is not None]
        sums = {"weights": _abs_sum(state.values()), "hidden": _abs_sum([hidden]), "grads": _abs_sum(grads),
                "train_loss": float(loss), **{f"eval_{k}": float(v) for k, v in eval_losses.items()},
                **({"cached": cached_sum} if cached is not None else {})}
        return {"layout": hashlib.sha256("\n".join(layout).encode()).hexdigest()[:32],
                "num_tensors": len(layout), "weights": _digest(state.values()), "eval_losses": eval_losses,
                "hidden": _digest([hidden]), "train_loss": repr(float(loss)), "grads": _digest(grads),
                **({"cached": cached} if cached is not None else {}), "sums": sums}
    finally:
        torch.set_num_threads(threads)


def _cached_hidden(model, batch) -> tuple[str | None, float | None]:
    """Checksum and |sum| of a causal encoder's states computed in two cached chunks (8 + rest), else
    (None, None)."""
    from pentad.components.base import Batch
    from pentad.layers.cache import KVCache

    if model.stream_plan is not None or getattr(model.encoder, "mask_kind", None) != "causal":
        return None, None
    cache = KVCache()
    first = Batch(tokens=batch.tokens[:, :8], padding_mask=batch.padding_mask[:, :8],
                  positions=torch.arange(8)[None].expand(2, 8))
    rest = Batch(tokens=batch.tokens[:, 8:], padding_mask=batch.padding_mask,
                 positions=torch.arange(8, batch.tokens.shape[1])[None].expand(2, -1))
    with torch.no_grad():
        a, _ = model.encode(first, cache)
        b, _ = model.encode(rest, cache)
    return _digest([a, b]), _abs_sum([a, b])


def _recorded() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", [*zoo_names(), *VARIANTS])
def test_recipe_is_bitwise_unchanged(name):
    recorded = _recorded()
    if name not in recorded:
        pytest.fail(f"{name}: not in {FIXTURE.name}; a new recipe adds its entry with "
                    "`python -m tests.unit.components.test_zoo_outputs_unchanged` (existing entries are kept)")
    expected, found = dict(recorded[name]), fingerprint(name)
    if expected.pop("platform", recorded["_platform"]) == _platform():
        assert found == expected
        return
    assert (found["layout"], found["num_tensors"]) == (expected["layout"], expected["num_tensors"])
    assert found["sums"] == pytest.approx(expected["sums"], rel=1e-4, abs=1e-6)


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    old = _recorded() if FIXTURE.exists() else {"_platform": _platform()}
    # New entries only; recorded on another platform than the file's, they say which.
    here = {} if old["_platform"] == _platform() else {"platform": _platform()}
    old.update({name: {**fingerprint(name), **here} for name in (*zoo_names(), *VARIANTS) if name not in old})
    FIXTURE.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def test_another_platform_compares_layout_and_sums(monkeypatch):
    monkeypatch.setattr(f"{__name__}._platform", lambda: {"torch": "other", "cpu": "other"})
    test_recipe_is_bitwise_unchanged("gpt2/tiny")
    recorded = _recorded()["gpt2/tiny"]
    changed = {**recorded, "sums": {**recorded["sums"], "grads": recorded["sums"]["grads"] * 1.001}}
    monkeypatch.setattr(f"{__name__}._recorded", lambda: {"_platform": {}, "gpt2/tiny": changed})
    with pytest.raises(AssertionError):
        test_recipe_is_bitwise_unchanged("gpt2/tiny")
