"""ChID-format idiom cloze from the small pre-trained BERT, on a set made from real Chinese text.

There is no ChID data beside the repository: ``make_cloze_set`` blanks out 4-character spans of
passages of TencentPretrain's sampled CLUECorpusSmall and offers spans of other documents as the
other candidates, in ChID's layout (JSON lines + ``<name>_answer.json``); the chid integration test
uses it too. The candidates are not idioms, so the scores are not ChID scores.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from bench.downstream_tasks.common import finetune, pretrained_bert, small_bert

CORPUS = "corpora/CLUECorpusSmall_sampled.txt"
CANDIDATES = 7
SPAN = 4
_HAN = re.compile("[\u4e00-\u9fff]{" + str(SPAN) + "}")


def _spans(text: str) -> list[int]:
    """Starts of the 4-character all-Han spans of ``text``."""
    return [i for i in range(len(text) - SPAN + 1) if _HAN.fullmatch(text, i, i + SPAN)]


def make_cloze_set(corpus: Path, out: Path, lines: int, offset: int = 0, passage: int = 120, blanks: int = 2,
                   candidates: int = 7, seed: int = 0) -> tuple[Path, Path]:
    """Write ``out`` (ChID JSON lines) and ``<stem>_answer.json`` beside it from ``lines`` documents of
    ``corpus`` (one document per line) from document ``offset`` on.

    Each line is one passage of ``passage`` characters with ``blanks`` non-overlapping 4-character
    spans replaced by ``#idiomNNNNNN#`` tags; its candidates are those spans plus spans drawn from
    other documents, ``candidates`` in all, shuffled. Returns (data file, answer file).
    """
    rng = random.Random(seed)
    docs = [d.strip() for d in Path(corpus).read_text(encoding="utf-8").splitlines() if len(d.strip()) > passage]
    pool = [d[i:i + SPAN] for d in docs[:offset] + docs[offset + lines:] for i in _spans(d)[::37]]
    records, answers = [], {}
    tag_number = offset * blanks
    for doc in docs[offset:offset + lines]:
        begin = rng.randrange(0, len(doc) - passage + 1)
        text = doc[begin:begin + passage]
        starts = _spans(text)
        picked: list[int] = []
        for start in rng.sample(starts, len(starts)):
            if all(abs(start - p) >= 2 * SPAN for p in picked):
                picked.append(start)
            if len(picked) == blanks:
                break
        if not picked:
            continue
        picked.sort()
        truths = [text[p:p + SPAN] for p in picked]
        distractors: list[str] = []
        while len(distractors) < candidates - len(truths):
            span = rng.choice(pool)
            if span not in truths and span not in distractors:
                distractors.append(span)
        options = truths + distractors
        rng.shuffle(options)
        pieces, last = [], 0
        for p, truth in zip(picked, truths):
            tag = f"#idiom{tag_number:06d}#"
            tag_number += 1
            pieces += [text[last:p], tag]
            last = p + SPAN
            answers[tag] = options.index(truth)
        pieces.append(text[last:])
        records.append({"content": ["".join(pieces)], "candidates": options})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    answer = out.with_name(f"{out.stem}_answer.json")
    answer.write_text(json.dumps(answers, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return out, answer


def overlap_baseline(data: Path, answers: Path) -> float:
    """Accuracy of picking, for each blank, the candidate with the most characters found in its
    passage (ties: the first candidate)."""
    gold = json.loads(answers.read_text(encoding="utf-8"))
    right = total = 0
    for line in data.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for passage in record["content"]:
            plain = re.sub(r"#idiom\d+#", "", passage)
            for tag in re.findall(r"#idiom\d+#", passage):
                scores = [sum(ch in plain for ch in c) for c in record["candidates"]]
                right += scores.index(max(scores)) == gold[tag]
                total += 1
    return right / max(1, total)


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    corpus = shared / CORPUS
    train_lines, dev_lines = (200, 100) if quick else (1000, 400)
    data = out_dir / "chid"
    train, _ = make_cloze_set(corpus, data / "train.json", train_lines, candidates=CANDIDATES)
    dev, dev_answers = make_cloze_set(corpus, data / "dev.json", dev_lines, offset=train_lines,
                                      candidates=CANDIDATES, seed=1)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("chid", out_dir / "chid-run", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        "data.objective.seq_length=64", f"task.max_choices={CANDIDATES}",
        "train.epochs=1" if quick else "train.epochs=2", "train.batch_size=16", "train.lr=1e-4"])
    blanks = len(json.loads((data / "train_answer.json").read_text(encoding="utf-8")))
    return {"task": "chid", "dataset": "ChID-format cloze from CLUECorpusSmall (dev)", "metric": "accuracy",
            "score": results["dev"]["accuracy"], "baseline_name": "most characters in the passage",
            "baseline": overlap_baseline(dev, dev_answers), "seconds": seconds, "train_examples": blanks}
