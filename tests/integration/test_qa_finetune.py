"""Span-extraction QA through ``pentad finetune --task qa`` and ``pentad infer`` on CMRC 2018 (TencentPretrain's
copy): a tiny BERT from random initialisation over the Chinese BERT vocabulary, contexts longer than
its windows, the official-rule EM/F1 and the JSON predictions file.

A model this small and this briefly trained does not answer unseen questions (its held-out score is
only checked to be computed); what it can do in seconds is learn the answers of the questions it is
trained on, and that is what the test measures: fitting them through windows, labels, n-best
prediction and the character offsets back to the context scores far above the heuristic baseline
(the first characters of the context, as many as the mean answer), and the answers written by
``pentad infer`` score exactly what fine-tuning reported.
"""

from __future__ import annotations

import json

import pytest

from pentad.cli.main import main
from pentad.tasks.qa import qa_metrics, read_squad


def _slice(source, target, questions: int, skip_articles: int = 0) -> int:
    data = json.loads(source.read_text(encoding="utf-8"))
    articles, count = [], 0
    for article in data["data"][skip_articles:]:
        if count >= questions:
            break
        articles.append(article)
        count += sum(len(p["qas"]) for p in article["paragraphs"])
    target.write_text(json.dumps({"version": data.get("version"), "data": articles}, ensure_ascii=False),
                      encoding="utf-8")
    return count


@pytest.fixture(scope="module")
def cmrc(tp, tmp_path_factory):
    root = tmp_path_factory.mktemp("cmrc")
    dev = tp / "datasets" / "cmrc2018" / "dev.json"
    _slice(dev, root / "train.json", 24)  # the first articles of the dev set: 24 questions
    _slice(dev, root / "heldout.json", 12, skip_articles=20)
    _slice(tp / "datasets" / "cmrc2018" / "test.json", root / "test.json", 4)  # unlabelled (FAKE_ANSWER at -1)
    return root


def test_qa_finetunes_scores_and_writes_answers(tp, cmrc, tmp_path):
    out = tmp_path / "run"
    assert main(["finetune", "--task", "qa", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=64",
                 "model.max_seq_length=256", "data.objective.seq_length=256", "model.encoder.num_layers=2",
                 "model.encoder.num_heads=2", "model.encoder.ffn_size=128", f"data.train={cmrc / 'train.json'}",
                 f"data.dev={cmrc / 'train.json'}", f"data.test={cmrc / 'heldout.json'}", f"output={out}",
                 "train.epochs=16", "train.eval_every=1000", "train.batch_size=16", "train.lr=2e-3",
                 "train.adam_bias_correction=true", "train.progress=false", "train.log_every=10", "train.threads=1",
                 "task.doc_stride=96"]) == 0
    results = json.loads((out / "results.json").read_text())
    questions, _ = read_squad(cmrc / "train.json", with_labels=True)
    contexts = {q.id: q.context for q in questions}
    assert len(questions) == 24 and max(len(q.context) for q in questions) > 256  # several windows a question
    gold = [q.answers for q in questions]
    width = round(sum(len(q.context[q.start:q.end]) for q in questions) / len(questions))
    baseline = qa_metrics(gold, [q.context[:width] for q in questions])
    assert baseline["f1"] < 0.3, baseline
    assert results["dev"]["f1"] >= max(0.6, baseline["f1"] + 0.3), (results, baseline)  # 0.89 measured
    assert results["dev"]["em"] >= 0.4, results
    assert set(results["test"]) == {"f1", "em"} and 0.0 <= results["test"]["f1"] <= 1.0

    # inference on the training questions scores what fine-tuning reported, from the written file
    answers = tmp_path / "answers.json"
    assert main(["infer", "--model", str(out), f"data.test={cmrc / 'train.json'}", "--output", str(answers)]) == 0
    written = json.loads(answers.read_text(encoding="utf-8"))
    assert list(written) == [q.id for q in questions]
    assert all(isinstance(a, str) and a in contexts[qid] for qid, a in written.items())
    assert qa_metrics(gold, [written[q.id] for q in questions]) == pytest.approx(results["dev"])

    # an unlabelled file (CMRC's test set), with probabilities
    scored = tmp_path / "scored.json"
    assert main(["infer", "--model", str(out), f"data.test={cmrc / 'test.json'}", "--output", str(scored),
                 "--probabilities"]) == 0
    test_questions, _ = read_squad(cmrc / "test.json", with_labels=False)
    written = json.loads(scored.read_text(encoding="utf-8"))
    assert list(written) == [q.id for q in test_questions]
    for q in test_questions:
        assert written[q.id]["answer"] in q.context and 0.0 < written[q.id]["probability"] <= 1.0
