"""LoRA (pentad.training.lora, pentad.layers.lora): which rows are adapted in each attention layout,
that an adapted model starts equal to its base, trains only its adapters, saves only them, and that
merging the adapters gives the adapted model's outputs."""

from __future__ import annotations

import json

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.layers.lora import LoraLinear
from pentad.training import checkpoint as ckpt
from pentad.training import lora
from pentad.training.config import LoraConfig, TrainConfig
from pentad.training.optim import build_optimizer

LLAMA_GQA = ["model.hidden_size=32", "model.vocab_size=64", "model.max_seq_length=16", "model.encoder.num_layers=2",
             "model.encoder.num_heads=4", "model.encoder.num_kv_heads=2", "model.encoder.ffn_size=48"]
T5 = ["model.hidden_size=32", "model.vocab_size=64", "model.max_seq_length=16", "model.encoder.num_layers=1",
      "model.decoder.num_layers=1", "model.encoder.num_heads=4", "model.decoder.num_heads=4",
      "model.encoder.ffn_size=48", "model.decoder.ffn_size=48", "model.encoder.dropout=0",
      "model.decoder.dropout=0", "model.embedding.dropout=0"]


GPT2 = ["model.hidden_size=32", "model.vocab_size=64", "model.max_seq_length=16", "model.encoder.ffn_size=48",
        "model.encoder.dropout=0", "model.embedding.dropout=0"]


def gpt2():
    torch.manual_seed(0)
    return build_model(load_config("gpt2/tiny", GPT2).model)


def bert():
    torch.manual_seed(0)
    return build_model(model_config_class().model_validate(tiny_model_dict()))


def llama():
    torch.manual_seed(0)
    return build_model(load_config("llama2/7b", LLAMA_GQA).model)


def t5():
    torch.manual_seed(0)
    return build_model(load_config("t5/small", T5).model)


def batch(model, decoder: bool = False) -> Batch:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 50, (2, 8), generator=g)
    fields = {"tokens": tokens, "segments": torch.zeros_like(tokens)}
    if decoder:
        fields["decoder_tokens"] = torch.randint(1, 50, (2, 5), generator=g)
    return Batch(**fields)


@torch.no_grad()  # (attention may pick another kernel when no input needs gradients: frozen weights)
def hidden(model, b: Batch) -> torch.Tensor:
    h, mask = model.encode(b)
    return model.decode(b, h, mask) if model.decoder is not None else h


def adapt(model, **options):
    cfg = LoraConfig(**options)
    tensors = {k: v.clone() for k, v in ckpt.weights_to_save(model).items()}
    lora.apply_lora(model, cfg, "base.safetensors", lora.fingerprint(tensors))
    return tensors


def perturb(model, seed: int = 3):
    """Non-zero B (as after training), so that the adapters change the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


# ----------------------------------------------------------------------------- layouts
def test_gqa_fused_qkv_adapts_only_the_named_rows():
    model = llama()
    attention = model.encoder.layers[0].attention
    assert (attention.q_dim, attention.kv_dim) == (32, 16)  # 4 query heads, 2 key/value heads of 8
    adapt(model, targets=["q", "v"], rank=2)
    qkv = model.encoder.layers[0].attention.qkv
    assert isinstance(qkv, LoraLinear) and qkv.parts == {"q": (0, 32), "v": (48, 64)}
    assert tuple(qkv.lora_B["q"].shape) == (32, 2) and tuple(qkv.lora_B["v"].shape) == (16, 2)
    assert not isinstance(model.encoder.layers[0].attention.out, LoraLinear)
    # a change of B changes exactly the q and v rows of the projection's output
    x = torch.randn(2, 3, 32)
    before = qkv(x)
    with torch.no_grad():
        qkv.lora_B["v"].fill_(0.5)
    after = qkv(x)
    changed = (after - before).abs().amax(dim=(0, 1)) > 0
    assert not changed[:48].any() and changed[48:].all()
    assert model.lora.record["modules"]["encoder.layers.1.attention.qkv"] == {"q": [0, 32], "v": [48, 64]}


def test_every_target_of_a_gated_gqa_model():
    model = llama()
    adapt(model, targets=["all"])
    layer = model.encoder.layers[1]
    assert layer.attention.qkv.parts == {"q": (0, 32), "k": (32, 48), "v": (48, 64)}
    assert layer.attention.out.parts == {"o": (0, 32)}
    assert {r: getattr(layer.ffn, r).parts for r in ("gate", "up", "down")} == {
        "gate": {"gate": (0, 48)}, "up": {"up": (0, 48)}, "down": {"down": (0, 32)}}


def test_cross_attention_q_and_fused_kv():
    model = t5()
    adapt(model, targets=["k", "v", "q"])
    cross = model.decoder.layers[0].cross_attention
    assert cross.q.parts == {"q": (0, 32)} and cross.kv.parts == {"k": (0, 32), "v": (32, 64)}
    assert model.decoder.layers[0].attention.qkv.parts == {"q": (0, 32), "k": (32, 64), "v": (64, 96)}


def test_gpt2_layout_with_tied_output():
    model = gpt2()
    adapt(model, targets=["k", "o", "up"], heads="all")
    attention = model.encoder.layers[0].attention
    assert attention.qkv.parts == {"k": (32, 64)} and attention.out.parts == {"o": (0, 32)}
    assert model.encoder.layers[0].ffn.up.parts == {"up": (0, 48)}
    # the LM head's output is the word embedding: frozen, not saved, even with heads: all
    assert not model.embedding.word.weight.requires_grad
    assert "embedding.word.weight" not in model.lora.saved and "targets.lm.output.weight" not in model.lora.saved


def test_bert_layout_and_module_pattern():
    model = bert()
    adapt(model, targets=["attention"], modules=r"layers\.1\.")
    assert isinstance(model.encoder.layers[1].attention.qkv, LoraLinear)
    assert not isinstance(model.encoder.layers[0].attention.qkv, LoraLinear)
    assert set(model.lora.record["modules"]) == {"encoder.layers.1.attention.qkv", "encoder.layers.1.attention.out"}


def test_a_target_or_pattern_that_matches_nothing_lists_what_there_is():
    with pytest.raises(UserError, match=r"gate match no projection.*it has q, k, v, o, up, down"):
        adapt(bert(), targets=["q", "gate"])
    with pytest.raises(UserError, match=r"modules='decoder' matches none.*encoder\.layers\.N\.attention\.qkv "
                                        r"\(N = 0-1\)"):
        adapt(bert(), modules="decoder")
    with pytest.raises(UserError, match="not a valid regular expression"):
        adapt(bert(), modules="(")
    with pytest.raises(ValueError, match="targets"):
        TrainConfig.model_validate({"lora": {"targets": ["query"]}})


# ----------------------------------------------------------------------------- behaviour
@pytest.mark.parametrize("make,decoder", [(bert, False), (gpt2, False), (llama, False), (t5, True)])
def test_starts_equal_to_the_base_and_merges_to_the_same_outputs(make, decoder):
    base = make().eval()
    b = batch(base, decoder)
    expected = hidden(base, b)
    model = make().eval()
    tensors = adapt(model, targets=["all"], rank=4, alpha=8)
    assert torch.equal(hidden(model, b), expected)  # B = 0: exactly the base
    perturb(model)
    adapted = hidden(model, b)
    assert (adapted - expected).abs().max() > 1e-3
    merged_tensors = lora.merge(tensors, ckpt.weights_to_save(model), model.lora.record, "test")
    merged = make().eval()
    ckpt.load_weights(merged, merged_tensors, "merged")
    torch.testing.assert_close(hidden(merged, b), adapted, rtol=1e-5, atol=1e-5)


def test_only_adapters_get_gradients_and_change():
    model = llama()
    adapt(model, targets=["q", "v", "down"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, TrainConfig(lr=1e-2))
    b = batch(model)
    b.labels["lm"] = b.tokens
    out = model(b)
    out["lm"].loss.backward()
    assert all((p.grad is not None) == (n in trainable) for n, p in model.named_parameters())
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable


def test_task_heads_train_and_are_saved_tied_weights_stay_frozen(tmp_path):
    model = bert()
    lora.apply_lora(model, LoraConfig(heads="all"), "base", "", task_heads=())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "targets.sp.classifier.weight" in trainable and "embedding.word.weight" not in trainable
    assert "targets.mlm.output.weight" not in {n for n, p in model.named_parameters(remove_duplicate=False)
                                                if p.requires_grad}
    other = bert()
    lora.apply_lora(other, LoraConfig(), "base", "", task_heads=("sp",))
    assert {n for n, p in other.named_parameters() if p.requires_grad and n.startswith("targets.")} == {
        n for n, _ in other.named_parameters() if n.startswith("targets.sp.")}


def test_adapter_file_is_small_self_describing_and_merges_on_read(tmp_path):
    base_model = llama()
    base_path = tmp_path / "base" / "model.safetensors"
    ckpt.save_weights(base_model, base_path)
    model = llama()
    tensors = ckpt.read_weights(base_path)
    lora.apply_lora(model, LoraConfig(rank=2), str(base_path), lora.fingerprint(tensors))
    perturb(model)
    adapters = tmp_path / "run" / "model.safetensors"
    ckpt.save_weights(model, adapters)
    assert adapters.stat().st_size * 10 < base_path.stat().st_size
    assert json.loads(ckpt.read_metadata(adapters)[lora.METADATA_KEY])["base"] == str(base_path)
    raw = ckpt.read_weights(adapters, merge_adapters=False)
    assert set(raw) == model.lora.saved and all(lora.is_adapter_key(k) for k in raw)
    # read as a whole model: merged into the base; equal outputs
    plain = llama().eval()
    ckpt.load_weights(plain, ckpt.read_weights(adapters), str(adapters))
    b = batch(plain)
    torch.testing.assert_close(hidden(plain, b), hidden(model.eval(), b), rtol=1e-5, atol=1e-5)
    # the raw adapters load back into an adapted model (resume): the frozen base may be left out
    again = llama()
    lora.apply_lora(again, LoraConfig(rank=2), str(base_path), "")
    ckpt.load_weights(again, raw, str(adapters))
    assert torch.equal(again.encoder.layers[0].attention.qkv.lora_B["q"],
                       model.encoder.layers[0].attention.qkv.lora_B["q"])


def test_a_changed_or_missing_base_is_refused(tmp_path):
    base_path = tmp_path / "base.safetensors"
    ckpt.save_weights(llama(), base_path)
    model = llama()
    lora.apply_lora(model, LoraConfig(), str(base_path), lora.fingerprint(ckpt.read_weights(base_path)))
    adapters = tmp_path / "adapters.safetensors"
    ckpt.save_weights(model, adapters)
    torch.manual_seed(5)
    other = build_model(load_config("llama2/7b", LLAMA_GQA).model)
    ckpt.save_weights(other, base_path)  # the base was replaced
    with pytest.raises(UserError, match="not the ones the LoRA adapters"):
        ckpt.read_weights(adapters)
    base_path.unlink()
    with pytest.raises(UserError, match="do not exist any more.*--base"):
        ckpt.read_weights(adapters)


def test_lora_needs_a_base_a_supported_strategy_and_trained_embeddings_for_adversarial_training(monkeypatch):
    with pytest.raises(UserError, match="needs base weights"):
        lora.check_usable(TrainConfig(), None)
    monkeypatch.setitem(lora.UNSUPPORTED_STRATEGIES, "deepspeed", "a reason")
    with pytest.raises(UserError, match="not offered with train.strategy=deepspeed: a reason"):
        lora.check_usable(TrainConfig(strategy="deepspeed"), "runs/base")
    with pytest.raises(UserError, match="adversarial.method=fgm cannot be combined with train.lora"):
        lora.check_usable(TrainConfig.model_validate({"adversarial": {"method": "fgm"}}), "runs/base")
    lora.check_usable(TrainConfig(strategy="ddp"), "runs/base")


def test_resuming_on_another_base_is_refused(tmp_path):
    from pentad.training.distributed import Dist
    from pentad.training.strategies.single import SingleStrategy

    model = llama()
    lora.apply_lora(model, LoraConfig(), "base", "fingerprint-1")
    directory = tmp_path / "step"
    ckpt.write_checkpoint_files(directory, model, {"optimizer": build_optimizer(model, TrainConfig()).state_dict()})
    again = llama()
    lora.apply_lora(again, LoraConfig(), "base", "fingerprint-2")
    strategy = SingleStrategy(TrainConfig(), Dist(device=torch.device("cpu")))
    strategy.setup(again, lambda m: build_optimizer(m, TrainConfig()))
    with pytest.raises(UserError, match="trained on other base weights"):
        strategy.load(directory)
    same = llama()
    lora.apply_lora(same, LoraConfig(), "base", "fingerprint-1")
    strategy.setup(same, lambda m: build_optimizer(m, TrainConfig()))
    assert strategy.load(directory) == {}


def test_generation_loads_a_lora_run_as_its_merged_model(tmp_path):
    from pentad.generation.text import load_model
    from pentad.runs import prepare_run_dir

    base_path = tmp_path / "base.safetensors"
    ckpt.save_weights(llama(), base_path)
    model = llama()
    lora.apply_lora(model, LoraConfig(targets=["attention", "ffn"]), str(base_path),
                    lora.fingerprint(ckpt.read_weights(base_path)))
    perturb(model)
    run_dir = tmp_path / "run"
    cfg = load_config("llama2/7b", [*LLAMA_GQA, "train.lora.rank=8", f"init={base_path}"])
    prepare_run_dir(run_dir, cfg, None)
    ckpt.save_weights(model, run_dir / "model.safetensors")
    loaded, loaded_cfg, _ = load_model(run_dir)
    assert loaded_cfg.train.lora.rank == 8 and not any(isinstance(m, LoraLinear) for m in loaded.modules())
    b = batch(loaded)
    torch.testing.assert_close(hidden(loaded, b), hidden(model.eval(), b), rtol=1e-5, atol=1e-5)


def test_merge_lora_with_a_moved_base_and_adapters_on_adapters(tmp_path):
    from pentad.runs import prepare_run_dir
    from pentad.training.merge import merge_run

    base_path = tmp_path / "base.safetensors"
    ckpt.save_weights(llama(), base_path)
    # first adapters on the base, second adapters on the first (their base: the first run's file)
    first = llama()
    lora.apply_lora(first, LoraConfig(rank=2), str(base_path), lora.fingerprint(ckpt.read_weights(base_path)))
    perturb(first, seed=4)
    first_path = tmp_path / "first.safetensors"
    ckpt.save_weights(first, first_path)
    second = llama()
    ckpt.load_weights(second, ckpt.read_weights(first_path), "first")
    lora.apply_lora(second, LoraConfig(targets=["o", "down"]), str(first_path),
                    lora.fingerprint(ckpt.read_weights(first_path)))
    perturb(second, seed=5)
    run_dir = tmp_path / "run"
    prepare_run_dir(run_dir, load_config("llama2/7b", [*LLAMA_GQA, "train.lora.rank=8", f"init={first_path}"]), None)
    ckpt.save_weights(second, run_dir / "model.safetensors")
    b = batch(second)
    expected = hidden(second.eval(), b)

    moved = tmp_path / "moved.safetensors"
    first_path.rename(moved)
    with pytest.raises(UserError, match="do not exist any more"):
        merge_run(run_dir, tmp_path / "out")
    with pytest.raises(UserError, match="not the ones the LoRA adapters"):
        merge_run(run_dir, tmp_path / "out", base=base_path)  # the first run's own base is not its merged model
    result = merge_run(run_dir, tmp_path / "out", base=moved)
    assert "merged the LoRA adapters" in result.render()
    merged_cfg = load_config(tmp_path / "out" / "config.yaml")
    assert merged_cfg.train.lora is None
    plain = build_model(merged_cfg.model)
    ckpt.load_weights(plain, ckpt.read_weights(tmp_path / "out" / "model.safetensors"), "merged")
    torch.testing.assert_close(hidden(plain.eval(), b), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="already exists"):
        merge_run(run_dir, tmp_path / "out", base=moved)


def test_model_flops_count_the_frozen_base_forward_and_input_gradients():
    from pentad.training.precision import model_flops_per_token

    model = llama()
    full, _ = model_flops_per_token(model)
    adapt(model)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert model_flops_per_token(model)[0] == 6 * adapters + 4 * frozen and frozen * 6 == full


def test_a_rank_above_what_the_projections_allow_is_refused():
    """B [rows, r] A [r, in] of a rank r above min(rows, in) expresses nothing more and only takes memory:
    train.lora.rank=100000 on 32-wide projections is refused before any adapter is made."""
    model = bert()
    with pytest.raises(UserError, match=r"train.lora.rank=100000 is larger than the projections it adapts allow: "
                                        r"encoder\.layers\.0\.attention\.qkv \(q: 32 rows x 32 inputs\) has rank at "
                                        r"most 32.*train.lora.rank <= 32"):
        lora.apply_lora(model, LoraConfig(rank=100_000), "base.safetensors", "fingerprint")
    assert not any(lora.is_adapter_key(name) for name, _ in model.named_parameters())
    lora.apply_lora(model, LoraConfig(rank=32), "base.safetensors", "fingerprint")  # the bound itself is allowed
