"""TencentPretrain checkpoints with exactly the keys and shapes TencentPretrain's own builder gives
each family (tests/data/tencentpretrain_state_keys.json, recorded from its model_builder with the
shipped configs shrunk): they convert to pentad, run, and convert back bit for bit, aliases
(tied tensors saved under several names) included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, read_weights

DATA = Path(__file__).parents[2] / "data" / "tencentpretrain_state_keys.json"
CONFIGS = Path(__file__).parents[4] / "shared" / "data" / "tencentpretrain" / "configs"
MAPPED = ("bert", "albert", "gpt2", "t5", "t5-v1_1", "bart", "pegasus", "llama", "llama2-70b", "bloom",
          "transformer", "xlm-roberta", "rnn/lstm", "rnn/bilstm", "cnn/gatedcnn_9")


def recorded() -> dict:
    if not DATA.is_file():
        pytest.skip(f"{DATA} is absent")
    return json.loads(DATA.read_text())


def fake_checkpoint(directory: Path, family: str) -> dict[str, torch.Tensor]:
    """A TencentPretrain directory whose state dict has the recorded keys, shapes and aliases
    (random values), beside the family's shipped config with the recorded overrides."""
    entry = recorded()[family]
    if not (CONFIGS / entry["config"]).is_file():
        pytest.skip(f"{CONFIGS / entry['config']} is absent")
    config = json.loads((CONFIGS / entry["config"]).read_text())
    config.update(entry["overrides"])
    g = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    for key, shape in entry["keys"]:
        alias = entry["aliases"].get(key)
        state[key] = state[alias] if alias is not None else 0.1 * torch.randn(shape, generator=g)
    directory.mkdir(parents=True)
    torch.save(state, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps(config))
    return state


def shared_names(state: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """The groups of names whose tensors share storage (two or more names)."""
    groups: dict[int, set[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(tensor.untyped_storage().data_ptr(), set()).add(key)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def alias_groups(aliases: dict[str, str]) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for key, target in aliases.items():
        groups.setdefault(target, {target}).add(key)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("family", MAPPED)
def test_recorded_layout_converts_both_ways_bitwise(tmp_path, family):
    state = fake_checkpoint(tmp_path / "tp", family)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.max_difference() == 0.0  # the key map reproduces the checkpoint; the forward pass is finite
    back = convert("pentad-to-tencentpretrain", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert set(written) == set(state)
    for key in state:
        assert written[key].shape == state[key].shape and torch.equal(written[key], state[key]), key
    # The names TencentPretrain ties share one storage in the file, as in TencentPretrain's own, and no others.
    assert shared_names(written) == shared_names(state) == alias_groups(recorded()[family]["aliases"])
    # The written config imports to the same architecture.
    again = convert("tencentpretrain-to-pentad", tmp_path / "back", tmp_path / "again")
    assert again.architecture == report.architecture
    first, second = read_weights(find_weights(tmp_path / "pentad")), read_weights(find_weights(tmp_path / "again"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_segment_rows_and_aliases(tmp_path):
    state = fake_checkpoint(tmp_path / "tp", "bert")
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")
    weights = read_weights(find_weights(tmp_path / "pentad"))
    seg = state["embedding.seg.embedding.weight"]
    # pentad segment ids 0 / 1 read TencentPretrain's rows 1 / 2 (A, B); its padding row comes last.
    assert torch.equal(weights["embedding.seg.weight"], seg[[1, 2, 0]])
    # tie_weights: the mlm output layer is the word table, saved once in pentad.
    assert "targets.mlm.output.weight" not in weights
    cfg, _ = load_run(tmp_path / "pentad")
    assert cfg.model.tie_word_embeddings


def test_export_stores_tied_tensors_once_and_import_takes_both_forms(tmp_path):
    """pentad-to-tencentpretrain keeps TencentPretrain's aliasing (a BERT's word table and tied MLM
    output layer are stored once); the import accepts an aliased file and one with separate copies."""
    state = fake_checkpoint(tmp_path / "tp", "bert")
    separate = {k: v.clone() for k, v in state.items()}
    assert not shared_names(separate)
    (tmp_path / "copies").mkdir()
    torch.save(separate, tmp_path / "copies" / "model.bin")
    (tmp_path / "copies" / "config.json").write_bytes((tmp_path / "tp" / "config.json").read_bytes())
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "aliased_run", verify=True)
    convert("tencentpretrain-to-pentad", tmp_path / "copies", tmp_path / "copies_run", verify=True)
    a, b = (read_weights(find_weights(tmp_path / d)) for d in ("aliased_run", "copies_run"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    back = convert("pentad-to-tencentpretrain", tmp_path / "copies_run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    assert back.checks()["tied tensors stored once"].detail == "1 tied name(s) share their tensor's storage"
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    word, output = written["embedding.word.embedding.weight"], written["target.mlm.linear_2.weight"]
    assert word.data_ptr() == output.data_ptr()
    size = (tmp_path / "back" / "model.bin").stat().st_size
    unique = sum(t.numel() * t.element_size() for k, t in written.items() if k != "target.mlm.linear_2.weight")
    assert unique < size < unique + 20_000  # the table once, plus torch.save's small per-key overhead
    assert (tmp_path / "copies" / "model.bin").stat().st_size - size > 0.9 * word.numel() * word.element_size()


def test_verify_fails_when_tied_tensors_are_written_apart(tmp_path, monkeypatch):
    from pentad.tencentpretrain import checkpoint as tencentpretrain

    fake_checkpoint(tmp_path / "tp", "t5")
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    monkeypatch.setattr(tencentpretrain, "alias_tied", lambda state, key_map: state)  # the old, copying export
    report = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    check = report.checks()["tied tensors stored once"]
    assert not report.ok and check.problem.startswith("2 written as separate copies")
    assert "encoder.transformer.1.relative_pos_emb.relative_attention_bias.weight" in check.problem
    assert "tgt_embedding.word.embedding.weight (of embedding.word.embedding.weight)" in check.problem


def test_t5_relative_bias_and_its_unused_copy(tmp_path):
    state = fake_checkpoint(tmp_path / "tp", "t5")
    unused = "encoder.relative_pos_emb.relative_attention_bias.weight"
    used = "encoder.transformer.0.relative_pos_emb.relative_attention_bias.weight"
    assert not torch.equal(state[unused], state[used])
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")
    weights = read_weights(find_weights(tmp_path / "pentad"))
    assert torch.equal(weights["encoder.relative_bias.weight"], state[used])
    from safetensors.torch import load_file

    extra = load_file(str(tmp_path / "pentad" / "interop_extra.safetensors"))
    assert torch.equal(extra["encoder.relative_bias.weight"], state[unused])  # kept for the way back
    # With share_embedding the lm head is TencentPretrain's own matrix, not the word table.
    assert "targets.lm.output.weight" in weights


def test_llama_rotary_rows_are_permuted(tmp_path):
    state = fake_checkpoint(tmp_path / "tp", "llama2-70b")
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")
    qkv = read_weights(find_weights(tmp_path / "pentad"))["encoder.layers.0.attention.qkv.weight"]
    q = state["encoder.transformer.0.self_attn.linear_layers.0.weight"]  # [heads * 16, 64], 4 heads
    k = state["encoder.transformer.0.self_attn.linear_layers.1.weight"]  # [kv_heads * 16, 64], 2 heads
    head = 16
    # Within each head pentad keeps the even rows of Meta's interleaved pairs, then the odd ones.
    assert torch.equal(qkv[:head // 2], q[0:head:2]) and torch.equal(qkv[head // 2:head], q[1:head:2])
    assert torch.equal(qkv[4 * head:4 * head + head // 2], k[0:head:2])
    assert torch.equal(qkv[-2 * head:], state["encoder.transformer.0.self_attn.linear_layers.2.weight"])


@pytest.mark.parametrize("family", ["sbert"])
def test_unmapped_families_are_refused(tmp_path, family):
    fake_checkpoint(tmp_path / "tp", family)
    with pytest.raises(UserError, match="dual-stream .* normalises each stream twice"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")
    assert not (tmp_path / "pentad").exists()


def test_checkpoint_of_another_family(tmp_path):
    fake_checkpoint(tmp_path / "tp", "gpt2")
    entry = recorded()["bart"]
    config = json.loads((CONFIGS / entry["config"]).read_text())
    config.update(entry["overrides"])
    (tmp_path / "tp" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="does not look like a TencentPretrain checkpoint.*missing"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")


def test_export_refuses_what_tencentpretrain_cannot_express(tmp_path):
    from .helpers import T5, make_run

    make_run(tmp_path / "run", T5)  # T5 v1.0 rescales the decoder output before its tied output layer
    with pytest.raises(UserError, match="rescales its input"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "out")
    with pytest.raises(UserError, match="--family applies to Hugging Face"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "out", family="t5")


def tencentpretrain_gatedcnn(state: dict[str, torch.Tensor], emb: torch.Tensor, layers: int, k: int,
                             block: int) -> torch.Tensor:
    """TencentPretrain's GatedcnnEncoder.forward (tencentpretrain/encoders/cnn_encoder.py), written out
    with torch.nn.functional on its own tensors: Conv2d over [B, 1, S+k-1, E], then [B, H, S+k-1, 1]."""
    import torch.nn.functional as F

    B, S, E = emb.shape
    x = torch.cat([emb.new_zeros(B, k - 1, E), emb], dim=1)[:, None]
    hidden = F.conv2d(x, state["encoder.conv_1.weight"], state["encoder.conv_1.bias"]) + state["encoder.conv_b1"]
    gate = F.conv2d(x, state["encoder.gate_1.weight"], state["encoder.gate_1.bias"]) + state["encoder.gate_b1"]
    hidden = hidden * torch.sigmoid(gate)
    residual = hidden
    pad = hidden.new_zeros(B, hidden.shape[1], k - 1, 1)
    hidden = torch.cat([pad, hidden], dim=2)
    for i in range(layers - 1):
        value = F.conv2d(hidden, state[f"encoder.conv.{i}.weight"], state[f"encoder.conv.{i}.bias"])
        gate = F.conv2d(hidden, state[f"encoder.gate.{i}.weight"], state[f"encoder.gate.{i}.bias"])
        hidden = (value + state[f"encoder.conv_b.{i}"]) * torch.sigmoid(gate + state[f"encoder.gate_b.{i}"])
        if (i + 1) % block == 0:
            hidden = hidden + residual
            residual = hidden
        hidden = torch.cat([pad, hidden], dim=2)
    return hidden[:, :, k - 1:, 0].transpose(1, 2)


def test_gated_cnn_computes_what_tencentpretrain_computes(tmp_path):
    from pentad.builder import build_model
    from pentad.components.base import Batch
    from pentad.training.checkpoint import load_weights

    state = fake_checkpoint(tmp_path / "tp", "cnn/gatedcnn_9")
    for i in range(1, 3):  # more layers than the recorded two, so that a residual block is crossed
        for name in ("conv", "gate"):
            state[f"encoder.{name}.{i}.weight"] = 0.1 * torch.randn(64, 64, 4, 1)
            state[f"encoder.{name}.{i}.bias"] = 0.1 * torch.randn(64)
            state[f"encoder.{name}_b.{i}"] = 0.1 * torch.randn(1, 64, 1, 1)
    torch.save(state, tmp_path / "tp" / "model.bin")
    config = json.loads((tmp_path / "tp" / "config.json").read_text())
    (tmp_path / "tp" / "config.json").write_text(json.dumps({**config, "layers_num": 4}))
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad")
    cfg, _ = load_run(tmp_path / "pentad")
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(tmp_path / "pentad")), "converted")
    model.eval()
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model.encode(Batch(tokens=tokens, padding_mask=torch.zeros(2, 9, dtype=torch.bool)))
        emb = state["embedding.word.embedding.weight"][tokens]
        theirs = tencentpretrain_gatedcnn(state, emb, layers=4, k=4, block=2)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_a_mixture_of_experts_is_refused_with_the_way_out(tmp_path):
    from tests.unit.interop.helpers import MIXTRAL, make_run

    make_run(tmp_path / "run", MIXTRAL)
    with pytest.raises(UserError, match="model.encoder.ffn is 'moe'.*no mixture of experts.*Hugging Face"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")


def test_biases_on_query_key_value_alone_are_refused(tmp_path):
    from tests.unit.interop.helpers import LLAMA, make_run, variant

    make_run(tmp_path / "run", variant(LLAMA, encoder={**LLAMA["encoder"], "qkv_bias": True}))
    with pytest.raises(UserError, match="model.encoder.qkv_bias is True with bias False.*one bias switch"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
