"""Label smoothing spread over every class (torch's) or over the wrong ones only (fairseq's and
TencentPretrain's ``lm_target.py``), and TencentPretrain configs importing the latter; the cls
head's smoothing of its training loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.model_config import model_config_class
from pentad.components.targets.bilm import BilmTarget, BilmTargetConfig
from pentad.components.targets.lm import LmTarget, LmTargetConfig
from pentad.tencentpretrain.checkpoint import export_config
from pentad.tencentpretrain.config import import_config

VOCAB, HIDDEN = 7, 8


class Sizes:
    hidden_size, vocab_size = HIDDEN, VOCAB


def fairseq_smoothed(logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """The smoothed loss as TencentPretrain's lm target writes it: eps_i = eps / (V - 1),
    (1 - eps - eps_i) * nll + eps_i * sum of -log p over the vocabulary, averaged over the rows."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    nll = -logp.gather(-1, labels[:, None]).squeeze(-1)
    smooth = -logp.sum(dim=-1)
    eps_i = eps / (logits.shape[-1] - 1)
    return ((1 - eps - eps_i) * nll + eps_i * smooth).mean()


@pytest.mark.parametrize("spread", ["all", "others"])
@torch.no_grad()
def test_lm_target_spreads_the_smoothing_as_configured(spread):
    torch.manual_seed(0)
    target = LmTarget.from_config(LmTargetConfig(label_smoothing=0.1, label_smoothing_spread=spread), Sizes)
    hidden = torch.randn(2, 3, HIDDEN)
    labels = torch.tensor([[1, 2, 3], [4, 5, IGNORE_INDEX]])
    batch = Batch(tokens=torch.zeros(2, 3, dtype=torch.long), labels={"lm": labels})
    loss = target(hidden, batch).loss
    scored = labels != IGNORE_INDEX
    logits = target.output(hidden)[scored]
    if spread == "others":
        expected = fairseq_smoothed(logits, labels[scored], 0.1)
    else:
        expected = torch.nn.functional.cross_entropy(logits.double(), labels[scored], label_smoothing=0.1)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    # the two conventions differ: the test would notice a spread that is ignored
    other = fairseq_smoothed(logits, labels[scored], 0.1) if spread == "all" else \
        torch.nn.functional.cross_entropy(logits.double(), labels[scored], label_smoothing=0.1)
    assert abs(float(loss) - float(other)) > 1e-5


@torch.no_grad()
def test_bilm_target_spreads_over_the_others():
    torch.manual_seed(1)
    target = BilmTarget.from_config(BilmTargetConfig(label_smoothing=0.2, label_smoothing_spread="others"), Sizes)
    hidden = torch.randn(1, 4, HIDDEN)
    labels = torch.randint(0, VOCAB, (1, 4, 2))
    loss = target(hidden, Batch(tokens=torch.zeros(1, 4, dtype=torch.long), labels={"bilm": labels})).loss
    halves = (hidden[0, :, : HIDDEN // 2], hidden[0, :, HIDDEN // 2:])
    expected = sum(fairseq_smoothed(target.output(h), labels[0, :, i], 0.2) for i, h in enumerate(halves)) / 2
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


GPT2 = {"emb_size": 32, "feedforward_size": 64, "hidden_size": 32, "hidden_act": "gelu_fast", "heads_num": 2,
            "layers_num": 1, "max_seq_length": 16, "embedding": ["word", "pos"], "remove_embedding_layernorm": True,
            "encoder": "transformer", "mask": "causal", "layernorm_positioning": "pre", "target": ["lm"],
            "tie_weights": True, "label_smoothing": 0.1}


def test_tencentpretrain_smoothing_imports_spread_over_the_others():
    shipped = Path(__file__).resolve().parents[3] / "src" / "pentad" / "zoo" / "s2t" / "small.yaml"
    assert "label_smoothing_spread: others" in shipped.read_text(encoding="utf-8")
    out, _ = import_config(json.loads(json.dumps(GPT2)), ["vocab_size=60"], "test", [])
    (lm,) = out["model"]["targets"]
    assert (lm["label_smoothing"], lm["label_smoothing_spread"]) == (0.1, "others")


@pytest.mark.parametrize(("smoothing", "spread", "written"), [(0.1, "others", 0.1), (0.1, "all", 0.1 * 59 / 60),
                                                              (0.0, "others", None)])
def test_export_writes_tencentpretrains_smoothing(smoothing, spread, written):
    """The exported label_smoothing gives TencentPretrain's loss the pentad head computes: torch's
    spread over all 60 tokens becomes eps * 59 / 60 over the wrong ones; none is written without any."""
    out, _ = import_config(json.loads(json.dumps(GPT2)), ["vocab_size=60"], "test", [])
    out["model"]["targets"][0].update(label_smoothing=smoothing, label_smoothing_spread=spread)
    model = model_config_class().model_validate(out["model"])
    config, notes = export_config(model, label="test", base=dict(GPT2))
    assert config.get("label_smoothing") == (pytest.approx(written) if written else None)
    assert any("label_smoothing" in n for n in notes) == (spread == "all")


def test_cls_target_smooths_its_training_loss_only():
    from pentad.components.targets.cls import ClsTarget, ClsTargetConfig
    from pentad.tasks.image_classification import ImageClassificationTaskConfig

    torch.manual_seed(0)
    target = ClsTarget.from_config(ClsTargetConfig(num_labels=5, pooler=False, dropout=0.0, label_smoothing=0.2),
                                   Sizes)
    hidden, labels = torch.randn(4, 3, HIDDEN), torch.tensor([0, 4, 2, 2])
    batch = Batch(labels={"cls": labels})
    logits = target.scores(hidden, batch)
    trained = target(hidden, batch).loss
    assert torch.allclose(trained, torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.2))
    assert not torch.allclose(trained, torch.nn.functional.cross_entropy(logits, labels))
    target.eval()
    assert torch.allclose(target(hidden, batch).loss, torch.nn.functional.cross_entropy(logits, labels))
    # the image task hands its setting to the head it asks for
    from pentad.tasks.image_classification import ImageClassificationTask

    task = ImageClassificationTask(ImageClassificationTaskConfig(label_smoothing=0.1), None, 17)
    task.load_state({"kind": "string", "labels": ["a", "b"]})
    assert task.head_configs()[0]["label_smoothing"] == 0.1


def test_a_smoothed_cls_head_exports_to_tencentpretrain_with_a_note():
    from pentad.assembly import load_config

    for smoothing in (0.0, 0.1):
        cfg = load_config("vit/tiny-16", [f"model.targets.0.label_smoothing={smoothing}"])
        config, notes = export_config(cfg.model, label="test")
        assert config["labels_num"] == 1000
        assert any("label_smoothing 0.1" in n for n in notes) == bool(smoothing), notes
