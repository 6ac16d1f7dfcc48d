"""Soft-label distillation: the KL and MSE formulas against hand computation, each head's soft loss, the
mixing (alpha=0 is exactly the plain loss, to the last bit, through whole training steps), and the checks
that a teacher run fits the student."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch, TargetOutput
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.layers.soft_labels import binary_soft_label_loss, soft_label_loss
from pentad.registry import TARGETS
from pentad.training.config import TrainConfig
from pentad.training.distill import Distiller, LogitsTransfer, Teacher, check_teacher
from pentad.training.trainer import Trainer


def _softmax(row: list[float], temperature: float) -> list[float]:
    exps = [math.exp(x / temperature) for x in row]
    return [e / sum(exps) for e in exps]


def _kl(s: list[float], t: list[float], temperature: float) -> float:
    p, q = _softmax(t, temperature), _softmax(s, temperature)
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q)) * temperature ** 2


def test_kl_and_mse_against_hand_computation():
    s = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    t = [[3.0, 1.0, 0.0], [0.0, 0.0, 4.0]]
    got = soft_label_loss(torch.tensor(s), torch.tensor(t), 2.0, "kl").item()
    assert got == pytest.approx((_kl(s[0], t[0], 2.0) + _kl(s[1], t[1], 2.0)) / 2, rel=1e-6)
    assert soft_label_loss(torch.tensor(s), torch.tensor(s), 2.0, "kl").item() == pytest.approx(0.0, abs=1e-7)
    mse = sum((a - b) ** 2 for x, y in zip(s, t) for a, b in zip(x, y)) / 6
    assert soft_label_loss(torch.tensor(s), torch.tensor(t), 2.0, "mse").item() == pytest.approx(mse, rel=1e-6)


def test_rows_and_entries_leave_positions_out():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    rows = torch.tensor([[True, True, False, True, False], [False, True, True, False, False]])
    got = soft_label_loss(s, t, 1.5, "kl", rows=rows)
    picked = [_kl(s[b, i].tolist(), t[b, i].tolist(), 1.5) for b in range(2) for i in range(5) if rows[b, i]]
    assert got.item() == pytest.approx(sum(picked) / len(picked), rel=1e-5)
    # a dummy class (a padding choice) is out of both distributions, and of the MSE's mean
    entries = torch.tensor([[True, True, False, True]]).expand(2, 4)
    got = soft_label_loss(s[:, 0], t[:, 0], 1.0, "kl", entries=entries)
    real = [0, 1, 3]
    want = sum(_kl(s[b, 0, real].tolist(), t[b, 0, real].tolist(), 1.0) for b in range(2)) / 2
    assert got.item() == pytest.approx(want, rel=1e-5)
    got = soft_label_loss(s[:, 0], t[:, 0], 1.0, "mse", entries=entries)
    assert got.item() == pytest.approx(((s[:, 0, real] - t[:, 0, real]) ** 2).mean().item(), rel=1e-6)


def test_binary_kl_is_bernoulli_kl():
    s, t = torch.tensor([[0.3, -2.0]]), torch.tensor([[1.0, 0.5]])

    def bern(x, y, temperature):
        p, q = 1 / (1 + math.exp(-y / temperature)), 1 / (1 + math.exp(-x / temperature))
        return (p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))) * temperature ** 2

    want = (bern(0.3, 1.0, 3.0) + bern(-2.0, 0.5, 3.0)) / 2
    assert binary_soft_label_loss(s, t, 3.0, "kl").item() == pytest.approx(want, rel=1e-5)
    assert binary_soft_label_loss(s, t, 3.0, "mse").item() == pytest.approx((0.7 ** 2 + 2.5 ** 2) / 2, rel=1e-6)


def _head(kind: str, **options):
    return TARGETS.get(kind)(kind, **options)


def test_each_head_takes_the_soft_labels_its_loss_calls_for():
    g = torch.Generator().manual_seed(1)
    logits = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    # tagger: only the scored positions (with a label) count
    s, t = logits(2, 4, 3), logits(2, 4, 3)
    labels = torch.tensor([[1, IGNORE_INDEX, 0, IGNORE_INDEX], [2, 2, IGNORE_INDEX, IGNORE_INDEX]])
    tagger = _head("tagger", hidden_size=8, num_labels=3)
    got = tagger.distill_loss(TargetOutput(None, logits=s), TargetOutput(None, logits=t),
                              Batch(labels={"tagger": labels}), 2.0, "kl")
    assert got.item() == pytest.approx(soft_label_loss(s, t, 2.0, "kl", rows=labels != IGNORE_INDEX).item())
    # span: start and end distributions over the positions, padding out
    s, t = logits(2, 6, 2), logits(2, 6, 2)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    s, t = (x.masked_fill(padding[..., None], torch.finfo(torch.float32).min) for x in (s, t))
    span = _head("span", hidden_size=8)
    got = span.distill_loss(TargetOutput(None, logits=s), TargetOutput(None, logits=t),
                            Batch(padding_mask=padding), 2.0, "kl")
    want = sum(_kl(s[b, :n, k].tolist(), t[b, :n, k].tolist(), 2.0) for b, n in ((0, 6), (1, 4)) for k in (0, 1)) / 4
    assert got.item() == pytest.approx(want, rel=1e-5)
    # regression: the teacher's value, whatever the kind
    values_s, values_t = logits(5, 1), logits(5, 1)
    regression = _head("regression", hidden_size=8)
    got = regression.distill_loss(TargetOutput(None, logits=values_s), TargetOutput(None, logits=values_t),
                                  Batch(), 2.0, "kl")
    assert got.item() == pytest.approx(((values_s - values_t) ** 2).mean().item(), rel=1e-6)
    # multi_label: sigmoids
    s, t = logits(3, 4), logits(3, 4)
    multi = _head("multi_label", hidden_size=8, num_labels=4)
    got = multi.distill_loss(TargetOutput(None, logits=s), TargetOutput(None, logits=t), Batch(), 2.0, "kl")
    assert got.item() == pytest.approx(binary_soft_label_loss(s, t, 2.0, "kl").item())
    # choice: dummy choices out
    s, t = logits(2, 3), logits(2, 3)
    groups = torch.tensor([[False, False, True], [False, False, False]])
    choice = _head("choice", hidden_size=8)
    got = choice.distill_loss(TargetOutput(None, logits=s), TargetOutput(None, logits=t),
                              Batch(group_padding_mask=groups), 1.0, "kl")
    want = (_kl(s[0, :2].tolist(), t[0, :2].tolist(), 1.0) + _kl(s[1].tolist(), t[1].tolist(), 1.0)) / 2
    assert got.item() == pytest.approx(want, rel=1e-5)
    # in-batch contrastive logits and heads without logits while training take none
    clr = _head("clr", widths=(8, 8))
    pair = TargetOutput(None, logits=logits(2, 2))
    assert clr.distill_loss(pair, pair, Batch(pair=Batch()), 2.0, "kl") is None
    lm = _head("lm", hidden_size=8, vocab_size=10)
    assert lm.distill_loss(TargetOutput(torch.tensor(1.0)), TargetOutput(None, logits=logits(1, 2, 10)),
                           Batch(), 2.0, "kl") is None


def _model(seed: int, hidden: int = 32, layers: int = 2):
    torch.manual_seed(seed)
    encoder = {"type": "transformer", "num_layers": layers, "num_heads": 4, "ffn_size": 64, "dropout": 0.0}
    cfg = tiny_model_dict(hidden_size=hidden, encoder=encoder,
                          targets=[{"type": "cls", "num_labels": 3, "dropout": 0.0}])
    return build_model(model_config_class().model_validate(cfg))


def _batches(start: int):
    step = start
    while True:
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, 50, (4, 10), generator=g)
        yield Batch(tokens=tokens, segments=torch.zeros_like(tokens),
                    padding_mask=torch.zeros_like(tokens, dtype=torch.bool),
                    labels={"cls": torch.randint(0, 3, (4,), generator=g)})
        step += 1


def _distiller(alpha: float, kind: str = "kl") -> Distiller:
    teacher = _model(5, hidden=48, layers=1).eval().requires_grad_(False)
    return Distiller(Teacher(teacher, Path("teacher"), None, None), alpha, [LogitsTransfer(2.0, kind)])


def test_mixing_alpha_weights_the_soft_loss():
    model = _model(0)
    batch = next(_batches(0))
    outputs = model(batch)
    for alpha in (0.0, 0.3, 1.0):
        distiller = _distiller(alpha)
        teacher = distiller.teach(batch, torch.no_grad)
        soft = soft_label_loss(outputs["cls"].logits, teacher["cls"].logits, 2.0, "kl")
        mixed = distiller.combine(model, outputs, teacher, batch)["cls"]
        assert mixed.loss.item() == pytest.approx((1 - alpha) * outputs["cls"].loss.item() + alpha * soft.item())
        assert torch.equal(mixed.metrics["distill_loss"], soft.detach())
        if alpha == 0.0:
            assert torch.equal(mixed.loss, outputs["cls"].loss)


def _train(tmp_path: Path, distiller: Distiller | None) -> tuple[list[dict], dict[str, torch.Tensor]]:
    model = _model(0)
    cfg = TrainConfig(batch_size=4, lr=1e-2, progress=False, log_every=1, tensorboard=False, warmup=0,
                      save_minutes=None)
    trainer = Trainer(model, cfg, tmp_path, 3)
    trainer.train(_batches, hooks=[distiller] if distiller is not None else [])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return records, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_alpha_zero_trains_exactly_like_no_teacher(tmp_path):
    plain, weights = _train(tmp_path / "plain", None)
    distilled, weights_0 = _train(tmp_path / "alpha0", _distiller(0.0))
    assert [r["loss"] for r in distilled] == [r["loss"] for r in plain]
    assert all(torch.equal(weights[k], weights_0[k]) for k in weights)
    assert all("cls_distill_loss" in r and "cls_hard_loss" in r for r in distilled)
    moved, _ = _train(tmp_path / "alpha1", _distiller(1.0, "mse"))
    assert [r["loss"] for r in moved] != [r["loss"] for r in plain]
    assert moved[0]["loss"] == pytest.approx(moved[0]["cls_distill_loss"])


def test_a_task_whose_heads_give_no_logits_is_refused():
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(tiny_model_dict(targets=["mlm"])))
    batch = next(_batches(0))
    batch.labels = {"mlm": torch.where(torch.rand(4, 10) < 0.3, batch.tokens, IGNORE_INDEX)}
    distiller = Distiller(Teacher(model, Path("teacher"), None, None), 0.5, [LogitsTransfer(2.0, "kl")], task="lm")
    with pytest.raises(UserError, match=r"no head of this model takes soft labels.*mlm \(mlm\)"):
        distiller.combine(model, model(batch), distiller.teach(batch, torch.no_grad), batch)


class _Vocab:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.vocab_size = len(tokens)

    def id_to_token(self, i: int) -> str:
        return self.tokens[i]


def test_a_teacher_that_does_not_fit_is_refused_naming_what_differs(tmp_path):
    run = tmp_path / "teacher"
    run.mkdir()
    (run / "labels.json").write_text(json.dumps({"kind": "int", "labels": [0, 1]}))
    cfg = SimpleNamespace(task=SimpleNamespace(type="classification"), model=SimpleNamespace(max_seq_length=64))
    vocab = _Vocab(["[PAD]", "a", "b"])
    ok = {"task_type": "classification", "task_state": {"kind": "int", "labels": [0, 1]}, "tokenizer": vocab,
          "seq_length": 64, "state_file": "labels.json"}
    check_teacher(run, cfg, vocab, **ok)
    with pytest.raises(UserError, match="fine-tuned for task classification, this run is ner"):
        check_teacher(run, cfg, vocab, **{**ok, "task_type": "ner"})
    with pytest.raises(UserError, match=r"other labels than this run.*\[0, 1\].*\[0, 1, 2\]"):
        check_teacher(run, cfg, vocab, **{**ok, "task_state": {"kind": "int", "labels": [0, 1, 2]}})
    with pytest.raises(UserError, match="token id 2 is 'b' for the teacher and 'c' here"):
        check_teacher(run, cfg, vocab, **{**ok, "tokenizer": _Vocab(["[PAD]", "a", "c"])})
    with pytest.raises(UserError, match="another vocabulary: 3 tokens, this run's tokenizer has 2"):
        check_teacher(run, cfg, vocab, **{**ok, "tokenizer": _Vocab(["[PAD]", "a"])})
    with pytest.raises(UserError, match="takes at most 64 tokens"):
        check_teacher(run, cfg, vocab, **{**ok, "seq_length": 128})
    with pytest.raises(UserError, match="not a fine-tuned run"):
        check_teacher(run, SimpleNamespace(task=None), vocab, **ok)


def test_no_teacher_no_distiller():
    from pentad.training.distill import make_distiller

    assert make_distiller(TrainConfig(), task_type="classification", task_state={}, tokenizer=None, provided=(),
                          seq_length=8, device=torch.device("cpu"), state_file="labels.json") is None
    with pytest.raises(UserError, match="does not train"):
        make_distiller(TrainConfig(distill={"teacher": "runs/teacher"}), task_type="prompt", task_state={},
                       tokenizer=None, provided=(), seq_length=8, device=torch.device("cpu"),
                       state_file="labels.json", trains=False)


def test_every_kind_of_head_distils_end_to_end():
    heads = [{"type": "tagger", "num_labels": 3, "dropout": 0.0}, {"type": "span"},
             {"type": "multi_label", "num_labels": 4, "dropout": 0.0}, {"type": "regression", "dropout": 0.0}]

    def model(seed: int):
        torch.manual_seed(seed)
        return build_model(model_config_class().model_validate(tiny_model_dict(targets=heads)))

    student = model(0)
    teacher = model(1).eval().requires_grad_(False)
    batch = next(_batches(0))
    batch.padding_mask[1, -3:] = True
    tags = torch.randint(0, 3, (4, 10)).masked_fill(batch.padding_mask, IGNORE_INDEX)
    tags[:, 0] = IGNORE_INDEX  # [CLS]
    batch.labels = {"tagger": tags, "span": torch.tensor([[1, 2], [3, 3], [0, 0], [2, 5]]),
                    "multi_label": torch.randint(0, 2, (4, 4)).float(), "regression": torch.randn(4)}
    for kind in ("kl", "mse"):
        distiller = Distiller(Teacher(teacher, Path("teacher"), None, None), 0.5, [LogitsTransfer(2.0, kind)])
        outputs = distiller.combine(student, student(batch), distiller.teach(batch, torch.no_grad), batch)
        for name in batch.labels:
            soft = outputs[name].metrics["distill_loss"]
            assert torch.isfinite(soft) and soft > 0, (kind, name)
        student.zero_grad()
        sum(out.loss for out in outputs.values()).backward()
        assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)
