"""Shapes and masks of each module, built from tiny configs."""

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model, check_requirements
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError, UserError
from pentad.layers.masks import attention_mask
from pentad.layers.pooling import pool
from pentad.model import count_parameters, total_loss


def make(**over):
    return build_model(model_config_class().model_validate(tiny_model_dict(**over)))


def bert_batch(b=3, s=10, vocab=50, pad_last=3):
    torch.manual_seed(0)
    tokens = torch.randint(5, vocab, (b, s))
    padding = torch.zeros(b, s, dtype=torch.bool)
    if pad_last:
        padding[-1, -pad_last:] = True
    segments = torch.zeros(b, s, dtype=torch.long)
    segments[:, s // 2:] = 1
    mlm = torch.full((b, s), IGNORE_INDEX)
    mlm[:, 2] = tokens[:, 2]
    return Batch(tokens=tokens, segments=segments, padding_mask=padding,
                 labels={"mlm": mlm, "sp": torch.tensor([0, 1, 0])[:b]})


def test_bert_like_forward_backward_shapes():
    model = make()
    batch = bert_batch()
    out = model(batch)
    assert set(out) == {"mlm", "sp"}
    assert out["mlm"].metrics["count"] == 3
    hidden, mask = model.encode(batch)
    assert hidden.shape == (3, 10, 32) and mask is batch.padding_mask
    total_loss(out).backward()
    assert model.embedding.word.weight.grad is not None


def test_inference_logits_without_labels():
    model = make().eval()
    batch = bert_batch()
    batch.labels = {}
    out = model(batch)
    assert out["mlm"].loss is None and out["mlm"].logits.shape == (3, 10, 50)
    assert out["sp"].logits.shape == (3, 2)


def test_tied_output_weight_is_counted_once():
    tied, untied = make(), make(tie_word_embeddings=False)
    assert tied.targets["mlm"].output.weight is tied.embedding.word.weight
    assert count_parameters(untied) - count_parameters(tied) == 50 * 32


def test_padding_does_not_change_the_real_positions():
    model = make().eval()
    batch = bert_batch(b=1, s=8, pad_last=0)
    hidden, _ = model.encode(batch)
    longer = Batch(tokens=torch.cat([batch.tokens, torch.ones(1, 4, dtype=torch.long)], 1),
                   segments=torch.cat([batch.segments, torch.ones(1, 4, dtype=torch.long)], 1),
                   padding_mask=torch.cat([torch.zeros(1, 8, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)], 1))
    hidden2, _ = model.encode(longer)
    torch.testing.assert_close(hidden2[:, :8], hidden, atol=1e-5, rtol=1e-5)


def test_causal_output_does_not_depend_on_future_tokens():
    model = make(embedding={"parts": ["word", "pos"], "norm": False, "dropout": 0.0},
                 encoder={"type": "transformer", "num_layers": 2, "num_heads": 4, "mask": "causal",
                          "norm_position": "pre", "dropout": 0.0}, targets=["lm"]).eval()
    tokens = torch.randint(0, 50, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 50
    a, _ = model.encode(Batch(tokens=tokens))
    b, _ = model.encode(Batch(tokens=changed))
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_prefix_mask_matrix():
    mask, causal = attention_mask("prefix", 5, None, torch.tensor([2]))
    assert not causal
    expected = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
                            dtype=torch.bool)
    assert torch.equal(mask[0, 0], expected)


def test_bidirectional_mask_hides_padding_keys_only():
    padding = torch.tensor([[False, False, True]])
    mask, causal = attention_mask("bidirectional", 3, padding)
    assert mask.shape == (1, 1, 1, 3) and mask.tolist() == [[[[True, True, False]]]] and not causal
    assert attention_mask("bidirectional", 3, torch.zeros(1, 3, dtype=torch.bool)) == (None, False)
    assert attention_mask("causal", 3, None) == (None, True)


@pytest.mark.parametrize("kind,expected", [("first", [1.0]), ("mean", [2.0]), ("max", [3.0]), ("last", [3.0])])
def test_pooling_ignores_padding(kind, expected):
    hidden = torch.tensor([[[1.0], [2.0], [3.0], [100.0]]])
    padding = torch.tensor([[False, False, False, True]])
    assert pool(hidden, padding, kind).tolist() == [expected]


def test_sinusoidal_embedding_has_no_parameters_and_builds_on_meta():
    cfg = model_config_class().model_validate(tiny_model_dict(embedding={"parts": ["word", "sinusoidal"]}))
    meta = build_model(cfg, device="meta")
    assert count_parameters(meta) == count_parameters(build_model(cfg))
    model = build_model(cfg).eval()
    table = model.embedding.sinusoidal.table
    assert table[0, 0] == 0.0 and table[0, 1] == 1.0  # sin(0), cos(0), interleaved


def test_heads_must_divide_hidden_size():
    with pytest.raises(ConfigError, match="not divisible by num_heads 5"):
        make(encoder={"type": "transformer", "num_heads": 5})


def test_missing_vocab_size_and_num_labels_are_reported_together():
    cfg = model_config_class().model_validate(tiny_model_dict(vocab_size=None, targets=["cls"]))
    with pytest.raises(ConfigError) as info:
        build_model(cfg)
    assert {p.path for p in info.value.problems} == {"model.vocab_size", "model.targets.0.num_labels"}


def test_required_batch_fields_are_checked_at_build_time():
    cfg = model_config_class().model_validate(tiny_model_dict())
    expected = r"embedding part 'seg' needs Batch.segments.*target 'sp' needs Batch.labels.sp"
    with pytest.raises(UserError, match=expected):
        build_model(cfg, provided={"tokens", "padding_mask", "labels.mlm"})
    check_requirements(build_model(cfg), {"tokens", "segments", "padding_mask", "labels.mlm", "labels.sp"})


def test_meta_build_counts_published_sizes():
    from pentad.assembly import load_config

    counts = {name: count_parameters(build_model(load_config(name).model, device="meta"))
              for name in ("bert/base", "gpt2/base", "roberta/base")}
    # BertForPreTraining, GPT2LMHeadModel and RobertaForMaskedLM in Hugging Face Transformers
    assert counts == {"bert/base": 110_106_428, "gpt2/base": 124_439_808, "roberta/base": 124_697_433}
