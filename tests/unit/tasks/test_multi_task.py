"""The multi_task task: config checks, its inputs (task.datasets, not data.train), batches each from one
dataset (proportional and rotating sampling, resumable), heads without labels in a batch (no loss, no
gradient), per-dataset metrics and their mean, and the prediction file."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.model import total_loss
from pentad.tasks.multi_task import MultiTaskBatches, MultiTaskConfig, MultiTaskTask


@pytest.fixture()
def tok(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "book", "mary", "paris", "lives", "in"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture()
def files(tmp_path):
    sentiment = "label\ttext_a\n1\tgood book\n0\tbad book\n1\tgood\n0\tbad\n1\tbook\n"
    return {"s_train": write(tmp_path / "s.tsv", sentiment),
            "s_dev": write(tmp_path / "sd.tsv", "label\ttext_a\n1\tgood\n0\tbad book\n"),
            "p_train": write(tmp_path / "p.tsv", "label\ttext_a\nyes\tmary lives in paris\nno\tlives in paris\n"
                             "yes\tmary\n"),
            "nolabel": write(tmp_path / "n.tsv", "text_a\ngood book\nmary lives\nparis\n")}


def config(files, **over):
    datasets = [{"name": "sent", "train": files["s_train"], "dev": files["s_dev"]},
                {"name": "per", "train": files["p_train"]}]
    return MultiTaskConfig(datasets=datasets, **over)


def data(train=None, dev=None, test=None):
    return SimpleNamespace(train=train, dev=dev, test=test)


def fitted(tok, files, **over):
    cfg = config(files, **over)
    task = MultiTaskTask(cfg, tok, 16)
    task.fit(MultiTaskTask.sources(cfg, data())["train"])
    return task


def test_sources_come_from_task_datasets(files):
    cfg = config(files)
    sources = MultiTaskTask.sources(cfg, data())
    assert sources == {"train": {"sent": files["s_train"], "per": files["p_train"]},
                       "dev": {"sent": files["s_dev"]}, "test": None}
    with pytest.raises(UserError, match=r"data\.train is set .*task\.datasets"):
        MultiTaskTask.sources(cfg, data(train=files["s_train"]))
    with pytest.raises(UserError, match="task.datasets is empty"):
        MultiTaskTask.sources(MultiTaskConfig(), data())


def test_default_sources_still_need_data_train():
    from pentad.tasks.classification import ClassificationTask, ClassificationTaskConfig

    with pytest.raises(UserError, match="data.train is not set"):
        ClassificationTask.sources(ClassificationTaskConfig(), data())
    assert ClassificationTask.sources(ClassificationTaskConfig(), data(train="t.tsv")) == {
        "train": "t.tsv", "dev": None, "test": None}


def test_config_refuses_repeated_or_bad_names(files):
    with pytest.raises(ValueError, match=r"repeated: \['a'\]"):
        MultiTaskConfig(datasets=[{"name": "a", "train": files["s_train"]}, {"name": "a", "train": files["p_train"]}])
    with pytest.raises(ValueError, match="name"):
        MultiTaskConfig(datasets=[{"name": "a/b", "train": files["s_train"]}])


def test_fit_state_heads_and_describe(tok, files):
    task = fitted(tok, files)
    assert [c["name"] for c in task.head_configs()] == ["cls_sent", "cls_per"]
    assert [c["num_labels"] for c in task.head_configs()] == [2, 2]
    assert task.head_names() == ("cls_sent", "cls_per")
    assert {"labels.cls_sent", "labels.cls_per"} <= task.provides
    again = MultiTaskTask(config(files), tok, 16, task.state())
    assert again.tasks["per"].label_map.names == ["no", "yes"] and "per: 2 labels" in again.describe()
    with pytest.raises(UserError, match="names the datasets"):
        MultiTaskTask(MultiTaskConfig(datasets=[{"name": "x", "train": files["s_train"]}]), tok, 16, task.state())


def test_batches_come_from_one_dataset_with_its_labels_only(tok, files):
    task = fitted(tok, files)
    train = task.read(MultiTaskTask.sources(task.cfg, data())["train"])
    assert len(train) == 8
    batches = task.train_batches(train, 2, seed=3)
    assert batches.batches_per_epoch == 3 + 2  # proportional: ceil(5/2) + ceil(3/2)
    seen = {"cls_sent": 0, "cls_per": 0}
    for batch in list(_take(batches.iterate(), 5)):
        (head,) = batch.labels  # exactly one head's labels
        seen[head] += batch.batch_size
    assert seen == {"cls_sent": 5, "cls_per": 3}  # every example once per epoch
    with pytest.raises(ValueError, match="mixes datasets"):
        task.collate(train, [0, 6], np.random.default_rng(0))


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_batch_plans_and_resuming():
    proportional = MultiTaskBatches([5, 3], 2, 7, "proportional", lambda idx, rng: idx)
    epoch = _take(proportional.iterate(), 5)
    assert sorted(np.concatenate(epoch).tolist()) == list(range(8))
    assert all((b < 5).all() or (b >= 5).all() for b in epoch)
    again = _take(proportional.iterate(), 12)
    assert [b.tolist() for b in _take(proportional.iterate(7), 5)] == [b.tolist() for b in again[7:12]]

    rotating = MultiTaskBatches([5, 3], 2, 7, "rotating", lambda idx, rng: idx)
    assert rotating.batches_per_epoch == 6  # 3 rounds of both datasets
    first = _take(rotating.iterate(), 12)
    assert [bool((b >= 5).all()) for b in first] == [False, True] * 6  # the datasets take turns
    small = np.concatenate([b for b in first if (b >= 5).all()])
    assert sorted(small[:3].tolist()) == [5, 6, 7]  # the smaller dataset is used up, then reshuffled
    assert [b.tolist() for b in _take(rotating.iterate(5), 4)] == [b.tolist() for b in first[5:9]]
    rotating.num_workers = 1  # a loader worker builds the same batches
    assert [b.tolist() for b in _take(rotating.iterate(5), 4)] == [b.tolist() for b in first[5:9]]


def test_a_head_without_labels_gives_no_loss_and_no_gradient():
    heads = [{"type": "cls", "name": "cls_a", "num_labels": 2}, {"type": "cls", "name": "cls_b", "num_labels": 3}]
    model = build_model(model_config_class().model_validate(tiny_model_dict(targets=heads)))
    batch = Batch(tokens=torch.randint(5, 50, (4, 6)), segments=torch.zeros(4, 6, dtype=torch.long),
                  padding_mask=torch.zeros(4, 6, dtype=torch.bool), labels={"cls_a": torch.tensor([0, 1, 1, 0])})
    out = model(batch)
    assert out["cls_b"].loss is None and out["cls_b"].logits.shape == (4, 3)
    assert out["cls_a"].loss is not None
    total_loss(out).backward()
    assert all(p.grad is None for p in model.targets["cls_b"].parameters())
    assert all(p.grad is not None for p in model.targets["cls_a"].parameters())
    before = [p.detach().clone() for p in model.targets["cls_b"].parameters()]
    torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1).step()  # the unused head is left alone
    assert all(torch.equal(a, p) for a, p in zip(before, model.targets["cls_b"].parameters()))


def test_scores_per_dataset_and_mean(tok, files):
    task = fitted(tok, files)
    predictions = {"sent": torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),
                   "per": torch.tensor([[1.0, 0.0], [1.0, 0.0]])}
    gold = {"sent": np.array([1, 0, 0, 0]), "per": np.array([0, 1])}
    m = task.score(predictions, None, gold)
    assert m["sent/accuracy"] == 0.75 and m["per/accuracy"] == 0.5
    assert m["sent/macro_f1"] == pytest.approx((2 / 3 + 0.8) / 2)  # class 1: 2/(2+1); class 0: 4/(4+1)
    assert m["per/macro_f1"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["mean_accuracy"] == 0.625
    assert m["mean_macro_f1"] == pytest.approx((m["sent/macro_f1"] + m["per/macro_f1"]) / 2)
    assert task.selection_score(m) == 0.625


def test_inference_predicts_every_head(tok, files, tmp_path):
    task = fitted(tok, files)
    model = build_model(model_config_class().model_validate(tiny_model_dict(targets=task.head_configs())))
    instances = task.read(files["nolabel"], with_labels=False)
    predictions = task.predict(model, instances, 2, torch.device("cpu"))
    assert {k: tuple(v.shape) for k, v in predictions.items()} == {"sent": (3, 2), "per": (3, 2)}
    task.write_predictions(tmp_path / "p.tsv", predictions, instances, probabilities=True)
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert lines[0] == "sent\tper\tprob_sent_0\tprob_sent_1\tprob_per_no\tprob_per_yes" and len(lines) == 4
    per = ["no", "yes"]
    for line, p in zip(lines[1:], predictions["per"]):
        assert line.split("\t")[1] == per[int(p.argmax())]


def test_ddp_is_refused(tok, files):
    task = fitted(tok, files)
    with pytest.raises(UserError, match="train.strategy=ddp"):
        task.bind(SimpleNamespace(train=SimpleNamespace(strategy="ddp")))
