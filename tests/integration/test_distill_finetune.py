"""``pentad finetune --teacher RUN`` on real reviews (book_review): a teacher classifier is fine-tuned, then a
smaller student learns from its logits and its labels, logs both losses and writes results; a student whose
labels differ from the teacher's is refused before training, naming the difference."""

from __future__ import annotations

import json

from tests.integration.bench_rows import bench_row

from pentad.cli.main import main


def _model(tp, hidden: int) -> list[str]:
    return ["--config", "bert/tiny", "tokenizer.type=wordpiece",
            f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", f"model.hidden_size={hidden}",
            "model.max_seq_length=64", "model.encoder.num_layers=1",
            "model.encoder.num_heads=2", f"model.encoder.ffn_size={2 * hidden}", "train.progress=false",
            "train.batch_size=16", "train.lr=2e-3", "train.adam_bias_correction=true", "task.head_dropout=0"]


def test_a_student_distils_from_a_teacher_run(tp, tmp_path, capsys):
    common = bench_row("common")
    book = tp / "datasets" / "book_review"
    train = common.head_tsv(book / "train.tsv", tmp_path / "train.tsv", 320)
    dev = common.head_tsv(book / "dev.tsv", tmp_path / "dev.tsv", 80)
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    data = [f"data.train={train}", f"data.dev={dev}", f"data.test={dev}"]
    assert main(["finetune", "--task", "classification", *_model(tp, 64), *data, f"output={teacher}",
                 "train.epochs=3", "train.log_every=10"]) == 0
    assert main(["finetune", "--task", "classification", "--teacher", str(teacher), *_model(tp, 32), *data,
                 f"output={student}", "train.epochs=2", "train.log_every=5", "train.distill.temperature=3",
                 "train.distill.alpha=0.7"]) == 0
    results = json.loads((student / "results.json").read_text())
    assert 0.0 <= results["test"]["accuracy"] <= 1.0
    records = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "loss" in r]
    assert trained and all(r["cls_distill_loss"] >= 0 and r["cls_hard_loss"] > 0 for r in trained)
    # the logged loss is the mix of both
    for r in trained:
        assert abs(r["loss"] - (0.3 * r["cls_hard_loss"] + 0.7 * r["cls_distill_loss"])) < 1e-4 * max(1.0, r["loss"])
    saved = (student / "config.yaml").read_text()
    assert f"teacher: {teacher}" in saved

    # other labels: 0/1 renamed
    lines = train.read_text(encoding="utf-8").splitlines()
    renamed = tmp_path / "renamed.tsv"
    renamed.write_text("\n".join([lines[0]] + [("neg" if x.startswith("0") else "pos") + x[1:] for x in lines[1:]])
                       + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["finetune", "--task", "classification", "--teacher", str(teacher), *_model(tp, 32),
                 f"data.train={renamed}", f"output={tmp_path / 'refused'}"]) != 0
    err = capsys.readouterr().err
    assert "has other labels than this run" in err and '"neg"' in err, err
    assert not (tmp_path / "refused" / "config.yaml").exists()  # refused before the run directory is written
