"""Hot-start (pentad.training.grow): width growth preserves the small model's function (losses equal on
the same batch), depth growth by copying layers starts far below a random model's loss, identity depth
growth is exact, and incompatible configs are refused with the key named."""

from __future__ import annotations

import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.errors import UserError
from pentad.model import total_loss
from pentad.training.grow import check_configs, grow_model

VOCAB = 97
SMALL = ["model.hidden_size=32", f"model.vocab_size={VOCAB}", "model.max_seq_length=64", "model.encoder.num_layers=2",
         "model.encoder.num_heads=2", "model.encoder.ffn_size=48"]
WIDE = ["model.hidden_size=64", "model.encoder.num_heads=4", "model.encoder.ffn_size=80"]
LLAMA = ["model.encoder.num_heads=4", "model.encoder.num_kv_heads=2"]  # head size 8, grouped-query


pytestmark = pytest.mark.usefixtures("one_thread")


def config(recipe: str, *overrides: str):
    return load_config(recipe, [*SMALL, *overrides]).model


def perturbed(cfg, seed: int = 0):
    """A model whose every weight (norms and biases too) is random, so that no part of it is trivial."""
    torch.manual_seed(seed)
    model = build_model(cfg, training=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    return model.eval()


def lm_batch(seed: int = 1, length: int = 12) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (3, length + 1), generator=g)
    padding = torch.zeros(3, length, dtype=torch.bool)
    padding[2, -4:] = True
    labels = tokens[:, 1:].masked_fill(padding, IGNORE_INDEX)
    return Batch(tokens=tokens[:, :-1], padding_mask=padding, labels={"lm": labels})


def bert_batch(seed: int = 1, length: int = 12) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (3, length), generator=g)
    segments = (torch.arange(length) >= length // 2).long().expand(3, length).clone()
    mlm = torch.full_like(tokens, IGNORE_INDEX)
    mlm[:, ::3] = torch.randint(0, VOCAB, mlm[:, ::3].shape, generator=g)
    return Batch(tokens=tokens, segments=segments, padding_mask=torch.zeros_like(tokens, dtype=torch.bool),
                 labels={"mlm": mlm, "sp": torch.tensor([0, 1, 0])})


def loss_of(model, batch) -> float:
    with torch.no_grad():
        return float(total_loss(model(batch)))


def grown(small_cfg, big_cfg, depth="stack", seed=0):
    small = perturbed(small_cfg, seed)
    check_configs(small_cfg, big_cfg)
    torch.manual_seed(123)
    big = build_model(big_cfg, training=False).eval()
    grow_model(small, big, small_cfg, big_cfg, depth)
    return small, big


@pytest.mark.parametrize("recipe,extra,batch", [
    ("gpt2/tiny", [], lm_batch),                                       # pre-norm, tied head, no embedding norm
    ("bert/tiny", [], bert_batch),                                     # post-norm, tied MLM head, pooler + NSP
    ("llama/7b", LLAMA, lm_batch),                                     # RMSNorm, SwiGLU, rotary, GQA, untied
    ("bert/tiny", ["model.encoder.norm=layernorm_unbiased", "model.embedding.norm_kind=layernorm_unbiased"],
     bert_batch),                                                      # TencentPretrain's LayerNorm
    ("gpt2/tiny", ["model.encoder.positions=relative", "model.embedding.parts=[word]"], lm_batch),  # T5-style bias
    ("gpt2/tiny", ["model.encoder.attention_reuse.keep_qk=false"], lm_batch),  # layer 1 reuses layer 0's weights
], ids=["gpt2", "bert", "llama-gqa", "bert-unbiased-ln", "relative-positions", "attention-reuse"])
def test_width_growth_preserves_the_loss(recipe, extra, batch):
    small_cfg = config(recipe, *extra)
    wide = [w for w in WIDE if not (extra == LLAMA and "num_heads" in w)] + (
        ["model.encoder.num_heads=8", "model.encoder.num_kv_heads=4"] if extra == LLAMA else [])
    big_cfg = config(recipe, *extra, *wide)
    small, big = grown(small_cfg, big_cfg)
    b = batch()
    assert abs(loss_of(small, b) - loss_of(big, b)) < 1e-4
    # every target's outputs, not only the summed loss
    with torch.no_grad():
        for name, out in small(b).items():
            assert abs(float(out.loss) - float(big(b)[name].loss)) < 1e-4


def test_heads_and_ffn_grow_by_any_count_and_hidden_by_three():
    small_cfg = config("gpt2/tiny")
    big_cfg = config("gpt2/tiny", "model.hidden_size=96", "model.encoder.num_heads=6", "model.encoder.ffn_size=50")
    small, big = grown(small_cfg, big_cfg)
    assert abs(loss_of(small, lm_batch()) - loss_of(big, lm_batch())) < 1e-4
    # ffn 48 -> 50: units 0 and 1 have two copies each, whose read-out columns are halved
    down = big.encoder.layers[0].ffn.down.weight
    assert torch.allclose(down[:, 0], down[:, 48]) and torch.allclose(down[:32, 2] * 1, down[32:64, 2])


def test_noise_lets_copies_differ_and_changes_the_loss_a_little():
    small_cfg = config("gpt2/tiny", "model.encoder.dropout=0", "model.embedding.dropout=0")
    big_cfg = config("gpt2/tiny", "model.encoder.dropout=0", "model.embedding.dropout=0", *WIDE)
    small = perturbed(small_cfg)
    torch.manual_seed(3)
    exact, noisy = build_model(big_cfg, training=False).eval(), build_model(big_cfg, training=False).eval()
    grow_model(small, exact, small_cfg, big_cfg)
    grow_model(small, noisy, small_cfg, big_cfg, noise=0.01, seed=4)
    up_exact, up_noisy = exact.encoder.layers[0].ffn.up.weight, noisy.encoder.layers[0].ffn.up.weight
    assert torch.equal(up_exact[:48, :32], up_noisy[:48, :32])  # the originals' first copy of the hidden features
    assert not torch.equal(up_noisy[:48, 32:], up_noisy[:48, :32])  # the repeated hidden columns differ
    assert not torch.equal(up_noisy[48:80], up_noisy[:32])  # copied units differ from their sources
    assert torch.equal(up_exact[48:80], up_exact[:32])
    b = lm_batch()
    assert 0 < abs(loss_of(noisy, b) - loss_of(small, b)) < 0.02
    assert loss_of(exact, b) == pytest.approx(loss_of(small, b), abs=1e-5)


def test_depth_growth_starts_near_the_small_loss_far_below_random():
    """Copying layers is not function-preserving; on a trained-like (perturbed) small model the grown
    model's loss stays within a few tenths of the small one's, far below a random model's (~ln V)."""
    small_cfg = config("gpt2/tiny")
    big_cfg = config("gpt2/tiny", "model.encoder.num_layers=4")
    b = lm_batch()
    torch.manual_seed(5)
    random = loss_of(build_model(big_cfg, training=False).eval(), b)
    for depth in ("stack", "interleave"):
        small, big = grown(small_cfg, big_cfg, depth)
        # the layers are the small ones' (stack: 0 1 0 1, interleave: 0 0 1 1)
        order = [0, 1, 0, 1] if depth == "stack" else [0, 0, 1, 1]
        for i, j in enumerate(order):
            assert torch.equal(big.encoder.layers[i].ffn.up.weight, small.encoder.layers[j].ffn.up.weight)
        assert loss_of(big, b) != loss_of(small, b)
    # exact with identity copies (pre-norm): each copy's output projections are zero
    small, big = grown(small_cfg, big_cfg, "identity")
    assert abs(loss_of(small, b) - loss_of(big, b)) < 1e-5
    assert not big.encoder.layers[1].attention.out.weight.any() and big.encoder.layers[1].ffn.up.weight.any()
    assert abs(random - torch.log(torch.tensor(float(VOCAB))).item()) < 0.5


def test_depth_growth_of_a_trained_small_model_is_close_to_its_loss():
    """A small model trained to a low loss on a repetitive batch: the stacked model keeps most of it."""
    small_cfg = config("gpt2/tiny", "model.embedding.dropout=0", "model.encoder.dropout=0")
    big_cfg = config("gpt2/tiny", "model.embedding.dropout=0", "model.encoder.dropout=0", "model.encoder.num_layers=4")
    torch.manual_seed(0)
    small = build_model(small_cfg)
    b = lm_batch()
    optimizer = torch.optim.AdamW(small.parameters(), lr=3e-3)
    for _ in range(60):
        optimizer.zero_grad()
        total_loss(small(b)).backward()
        optimizer.step()
    small.eval()
    torch.manual_seed(1)
    random = loss_of(build_model(big_cfg, training=False).eval(), b)
    results = {}
    for depth in ("stack", "interleave", "identity"):
        torch.manual_seed(2)
        big = build_model(big_cfg, training=False).eval()
        grow_model(small, big, small_cfg, big_cfg, depth)
        results[depth] = loss_of(big, b)
    trained = loss_of(small, b)
    assert trained < 0.5 * random
    assert abs(results["identity"] - trained) < 1e-5
    for depth in ("stack", "interleave"):  # far closer to the small model's loss than to a random one's
        assert results[depth] - trained < 0.5 * (random - trained), (depth, results, trained, random)


def test_incompatible_configs_are_refused():
    small = config("gpt2/tiny")
    with pytest.raises(UserError, match=r"model\.vocab_size: the small run has 97 tokens, the big config 98"):
        check_configs(small, config("gpt2/tiny", "model.vocab_size=98"))
    with pytest.raises(UserError, match=r"model\.encoder\.num_layers: the big config has 1, fewer"):
        check_configs(small, config("gpt2/tiny", "model.encoder.num_layers=1"))
    with pytest.raises(UserError, match=r"model\.hidden_size: 48 is not a multiple of the small run's 32"):
        check_configs(small, config("gpt2/tiny", "model.hidden_size=48", "model.encoder.num_heads=3"))
    with pytest.raises(UserError, match=r"head size .* is 16 in the small run and 32"):
        check_configs(small, config("gpt2/tiny", "model.hidden_size=64"))
    with pytest.raises(UserError, match=r"model\.encoder\.activation: small 'gelu_tanh', big 'gelu'"):
        check_configs(small, config("gpt2/tiny", "model.encoder.activation=gelu"))
    alibi = ["model.encoder.positions=alibi", "model.embedding.parts=[word]"]
    with pytest.raises(UserError, match=r"ALiBi positions \(model\.encoder\.positions=alibi\)"):
        grown(config("gpt2/tiny", *alibi), config("gpt2/tiny", *alibi, *WIDE))
    with pytest.raises(UserError, match="--depth identity needs pre-norm"):
        grown(config("bert/tiny"), config("bert/tiny", "model.encoder.num_layers=3"), "identity")


def test_growing_into_a_model_that_cannot_fit_is_refused_before_allocation(tmp_path, monkeypatch):
    """~1.6 trillion parameters (6 TiB of weights) are refused at once, with the estimate, and nothing
    is built or written."""
    import time

    from tests.unit.interop.helpers import GPT2, make_run

    from pentad import memory
    from pentad.training.grow import grow_run

    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    make_run(tmp_path / "small", GPT2)
    k = 8192  # hidden 32 -> 262,144, heads 4 -> 32,768 (head size 8 kept)
    big = load_config(str(tmp_path / "small" / "config.yaml"),
                      [f"model.hidden_size={32 * k}", f"model.encoder.num_heads={4 * k}"])
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"not enough memory for growing into this model: it needs at least "
                                        r"[\d.]+ TiB \(the big model's weights [\d.]+ TiB twice"):
        grow_run(tmp_path / "small", big, tmp_path / "big")
    assert time.perf_counter() - start < 2.0
    assert not (tmp_path / "big").exists()
