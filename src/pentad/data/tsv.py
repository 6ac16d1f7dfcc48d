"""Classification TSV files: reading with checks, label maps, and encoding to instances.

Format (TencentPretrain's fine-tuning format, header required)::

    label<TAB>text_a[<TAB>text_b]        labelled (train, dev, labelled test)
    text_a[<TAB>text_b]                  unlabelled (inference input)

The header names the columns (in any order); every later line must have exactly as many
tab-separated fields. Labels are ids ``0..n-1`` when every label is an integer, otherwise the
sorted distinct strings; a :class:`LabelMap` records which, so dev/test files and predictions use
the training set's ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pentad.data.corpus import BadLine, decode_line
from pentad.data.shards import Instances
from pentad.errors import UserError

KNOWN_COLUMNS = ("label", "text_a", "text_b")
_INTEGER = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class TsvRow:
    """One data line of a classification TSV (``line`` is 1-based, header = line 1)."""

    line: int
    text_a: str
    text_b: str | None = None
    label: str | None = None
    qid: str | None = None


def parse_header(text: str, path: Path | str, with_labels: bool, known: Sequence[str] = KNOWN_COLUMNS,
                 required: Sequence[str] = ("text_a",), expected: str | None = None) -> tuple[str, ...]:
    """The column names of a header line; UserError unless they are a valid classification header.

    With ``with_labels`` the ``label`` column is required; without, it is optional (a labelled
    file can be used for inference and its labels are kept). ``known``: the column names allowed;
    ``required``: those that must be present besides ``label``; ``expected``: the header shown in the
    error (default: the classification header).
    """
    columns = tuple(c.strip() for c in text.split("\t"))
    if expected is None:
        expected = "label<TAB>text_a[<TAB>text_b]" if with_labels else "text_a[<TAB>text_b]"
    expected = f"'{expected}'"
    problems = []
    unknown = [c for c in columns if c not in known]
    if unknown:
        problems.append(f"unknown column name(s) {unknown}")
    if len(set(columns)) != len(columns):
        problems.append("a column name appears twice")
    problems += [f"no '{name}' column" for name in required if name not in columns]
    if with_labels and "label" not in columns:
        problems.append("no 'label' column")
    if problems:
        raise UserError(f"{path}, line 1: expected a header line {expected}, found "
                        f"{text[:80]!r} ({'; '.join(problems)}). Add the header as the first line.")
    return columns


def split_row(text: str, columns: Sequence[str], line: int, empty_label: bool = False) -> TsvRow:
    """One data line -> TsvRow; BadLine if its field count differs from the header's or a text
    (or the label, unless ``empty_label``, or the qid) is empty."""
    values = text.split("\t")
    if len(values) != len(columns):
        raise BadLine(f"has {len(values)} tab-separated field(s), the header has {len(columns)} "
                      f"({chr(9).join(columns)!r})")
    row = dict(zip(columns, values))
    empty = [name for name in ("text_a", "text_b") if name in row and not row[name].strip()]
    if empty:
        raise BadLine(f"has an empty {' and an empty '.join(empty)} field: every example needs its text (a "
                      "blank line, or a missing value between two tabs?); remove the line or fill in the text")
    if "label" in row and not row["label"].strip() and not empty_label:
        raise BadLine("has an empty label field; give every example its label (or drop the label column "
                      "for inference input)")
    if "qid" in row and not row["qid"].strip():
        raise BadLine("has an empty qid field; every line needs the id of its question")
    return TsvRow(line, row["text_a"], row.get("text_b"),
                  row["label"].strip() if "label" in row else None,
                  row["qid"].strip() if "qid" in row else None)


def read_classification_tsv(path: Path, with_labels: bool, known: Sequence[str] = KNOWN_COLUMNS,
                            required: Sequence[str] = ("text_a",), empty_label: bool = False,
                            expected: str | None = None) -> tuple[list[TsvRow], tuple[str, ...]]:
    """All rows of a classification TSV and its column names, checked line by line.

    UserError (naming file and line) for a missing file, a bad header, a line that is not UTF-8,
    a line with the wrong number of fields, and a file with no data lines. ``known``, ``required``
    and ``expected``: the header's columns (see :func:`parse_header`); ``empty_label``: an empty
    label field is allowed (a multi-label example with no label).
    """
    rows: list[TsvRow] = []
    columns: tuple[str, ...] = ()
    for window, found in iter_classification_tsv(path, with_labels, known, required, empty_label, expected):
        rows, columns = rows + window, found
    return rows, columns


def iter_classification_tsv(path: Path, with_labels: bool, known: Sequence[str] = KNOWN_COLUMNS,
                            required: Sequence[str] = ("text_a",), empty_label: bool = False,
                            expected: str | None = None, window: int | None = None
                            ) -> Iterator[tuple[list[TsvRow], tuple[str, ...]]]:
    """The rows of a classification TSV in consecutive windows of at most ``window`` rows (None: one
    window of all of them), each with the column names, read lazily: only one window is held at a
    time (streamed inference). The checks and errors of :func:`read_classification_tsv`; a file with
    no data lines fails when the end is reached."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"TSV file {path} does not exist." if not path.exists()
                        else f"TSV path {path} is not a file.")
    rows: list[TsvRow] = []
    columns: tuple[str, ...] = ()
    seen = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                text = decode_line(raw, line_no)
                if line_no == 1:
                    columns = parse_header(text, path, with_labels, known, required, expected)
                    continue
                rows.append(split_row(text, columns, line_no, empty_label))
            except BadLine as bad:
                raise UserError(f"{path}, line {line_no}: the line {bad}.") from None
            if window is not None and len(rows) >= window:
                seen += len(rows)
                yield rows, columns
                rows = []
    if not columns:
        raise UserError(f"TSV file {path} is empty; expected a header line and data lines.")
    if not rows and not seen:
        raise UserError(f"TSV file {path} has a header but no data lines.")
    if rows:
        yield rows, columns


class LabelMap:
    """Label strings <-> ids ``0..num_labels-1``.

    ``integer`` maps: labels are the ids themselves (``"2"`` -> 2). String maps: ids follow the
    sorted distinct labels of the training data.
    """

    def __init__(self, names: Sequence[str], integer: bool):
        self.names = list(names)
        self.integer = integer
        self._ids = {name: i for i, name in enumerate(self.names)}

    @property
    def num_labels(self) -> int:
        return len(self.names)

    @classmethod
    def from_labels(cls, labels: Iterable[str], num_labels: int | None = None,
                    where: str = "the data") -> LabelMap:
        """A map for the distinct ``labels``; errors name ``where`` (``from_rows`` names lines)."""
        distinct = sorted({label.strip() for label in labels})
        return cls._build(distinct, num_labels, where=where)

    @classmethod
    def from_rows(cls, rows: Sequence[TsvRow], path: Path | str,
                  num_labels: int | None = None) -> LabelMap:
        """A map for the labels of training ``rows`` read from ``path``.

        Args:
            num_labels: the number of classes when known in advance; integer labels must then be
                below it. Without it, integer labels give ``max + 1`` classes.
        """
        unlabelled = next((r for r in rows if r.label is None), None)
        if unlabelled is not None:
            raise UserError(f"{path}, line {unlabelled.line}: no label; training data needs a "
                            f"'label' column.")
        for row in rows:
            label = row.label or ""
            if _INTEGER.fullmatch(label) and int(label) < 0:
                raise UserError(f"{path}, line {row.line}: label {label} is negative; integer "
                                f"labels must be 0..n-1.")
            if num_labels is not None and _INTEGER.fullmatch(label) and int(label) >= num_labels:
                raise UserError(f"{path}, line {row.line}: label {label} is out of range for "
                                f"num_labels={num_labels} (labels 0..{num_labels - 1}).")
        distinct = sorted({row.label or "" for row in rows})
        lines: dict[str, list[int]] = {}
        for row in rows:
            lines.setdefault((row.label or "").strip(), []).append(row.line)
        return cls._build(distinct, num_labels, where=str(path), lines=lines)

    @classmethod
    def _build(cls, distinct: list[str], num_labels: int | None, where: str,
               lines: dict[str, list[int]] | None = None) -> LabelMap:
        if distinct and all(_INTEGER.fullmatch(x) for x in distinct):
            values = sorted({int(x) for x in distinct})
            if values[0] < 0:
                raise UserError(f"{where}: label {values[0]} is negative; integer labels must be "
                                f"0..n-1.")
            if num_labels is None and lines is not None:  # fine-tuning's training file (from_rows)
                _check_contiguous(values, where, lines)
            count = values[-1] + 1 if num_labels is None else num_labels
            if values[-1] >= count:
                raise UserError(f"{where}: label {values[-1]} is out of range for "
                                f"num_labels={count} (labels 0..{count - 1}).")
            return cls([str(i) for i in range(count)], integer=True)
        if num_labels is not None and len(distinct) > num_labels:
            raise UserError(f"{where} has {len(distinct)} distinct labels "
                            f"({_show(distinct)}), more than num_labels={num_labels}.")
        return cls(distinct, integer=False)

    def encode(self, label: str, path: Path | str, line: int) -> int:
        """The id of ``label`` found at ``path``:``line``; UserError if the map does not know it."""
        label = label.strip()
        if self.integer and _INTEGER.fullmatch(label) and 0 <= int(label) < self.num_labels:
            return int(label)
        if not self.integer and label in self._ids:
            return self._ids[label]
        known = (f"integer labels 0..{self.num_labels - 1}" if self.integer
                 else f"the labels {_show(self.names)}")
        raise UserError(f"{path}, line {line}: label {label!r} is unknown; the model knows "
                        f"{known} (from its training data).")

    def decode(self, index: int) -> str:
        """The label string of id ``index``."""
        return self.names[index]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description; ``LabelMap.from_dict`` reverses it."""
        if self.integer:
            return {"kind": "integer", "num_labels": self.num_labels}
        return {"kind": "string", "labels": list(self.names)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabelMap:
        if data.get("kind") == "integer":
            return cls([str(i) for i in range(int(data["num_labels"]))], integer=True)
        if data.get("kind") == "string":
            return cls([str(x) for x in data["labels"]], integer=False)
        raise UserError(f"not a label map: {data!r} (expected kind 'integer' or 'string').")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelMap) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"LabelMap({self.to_dict()})"


def _check_contiguous(values: list[int], where: str, lines: dict[str, list[int]]) -> None:
    """Integer labels without a declared ``num_labels`` must be 0..n-1, each present: a gap means a
    stray label (a ``7`` in a 0/1 file) that would silently add classes the data never trains."""
    missing = sorted(set(range(values[-1] + 1)) - set(values))
    if not missing:
        return
    beyond = [v for v in values if v > missing[0]]

    def at(value: int) -> str:
        found = next((n for label, n in lines.items() if _INTEGER.fullmatch(label) and int(label) == value), [])
        if not found:
            return str(value)
        shown = ", ".join(str(n) for n in found[:3]) + (f", ... ({len(found)} lines)" if len(found) > 3 else "")
        return f"{value} (line{'s' if len(found) > 1 else ''} {shown})"

    absent = ", ".join(str(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
    present = ", ".join(at(v) for v in beyond[:3]) + (", ..." if len(beyond) > 3 else "")
    n = values[-1] + 1
    one = len(beyond) == 1
    declare = (f"the model really has {n} classes, some of them absent from the training data, declare "
               f"task.num_labels={n}.")
    plural = "s" if len(lines.get(str(beyond[0]), [])) > 1 else ""
    advice = f"If {beyond[0]} is a typo, fix it on its line{plural}; if {declare}" if one else f"If {declare}"
    if missing[0] == 0:
        advice += " Labels numbered from 1 (ratings 1-5, say) should be shifted to start at 0."
    raise UserError(
        f"{where}: integer labels are class ids and must be 0..n-1, each present in the training data, but "
        f"{'id' if len(missing) == 1 else 'ids'} {absent} never {'occurs' if len(missing) == 1 else 'occur'} "
        f"while {'label' if one else 'labels'} {present} {'does' if one else 'do'} (labels found: "
        f"{', '.join(str(v) for v in values[:20])}{', ...' if len(values) > 20 else ''}). {advice}")


def _show(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def assemble_pairs(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]] | None,
                   cls_id: int, sep_id: int, seq_length: int, truncation: str = "longest_first"
                   ) -> tuple[list[np.ndarray], np.ndarray]:
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` per row, truncated to ``seq_length``.

    ``truncation``: ``longest_first``, each text shortened so that the sequence with its ``[SEP]``s fits,
    a pair's longer text first (as BERT's fine-tuning does); ``end``, the assembled sequence cut at
    ``seq_length`` (TencentPretrain's ``run_classifier.py``: a long text loses its final ``[SEP]``, and a
    long text_a leaves little or nothing of text_b). Returns the sequences and ``split`` [N], the position
    where segment B starts (the sequence length when there is no segment B).
    """
    sequences: list[np.ndarray] = []
    splits = np.zeros(len(first), dtype=np.int64)
    for i, a in enumerate(first):
        a = np.asarray(a, dtype=np.int64)
        if truncation == "end":
            seq = np.concatenate([[cls_id], a, [sep_id]])
            splits[i] = min(len(seq), seq_length)
            if second is not None:
                seq = np.concatenate([seq, np.asarray(second[i], dtype=np.int64), [sep_id]])
            sequences.append(seq[:seq_length].astype(np.int64))
            continue
        if second is None:
            seq = np.concatenate([[cls_id], a[:seq_length - 2], [sep_id]])
            splits[i] = len(seq)
        else:
            b = np.asarray(second[i], dtype=np.int64)
            keep_a, keep_b = fit_pair(len(a), len(b), seq_length - 3)
            seq = np.concatenate([[cls_id], a[:keep_a], [sep_id], b[:keep_b], [sep_id]])
            splits[i] = keep_a + 2
        sequences.append(seq.astype(np.int64))
    return sequences, splits


def fit_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths to keep of a pair so that ``keep_a + keep_b <= budget``, trimming the longer first.

    Equivalent to removing one token at a time from the longer side (from B on ties).
    """
    excess = len_a + len_b - budget
    if excess <= 0:
        return len_a, len_b
    longer_a = len_a > len_b
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (len_a - excess, len_b) if longer_a else (len_a, len_b - excess)
    rest = excess - gap
    # Once equal, removals alternate starting with B (ties trim B).
    short = min(len_a, len_b)
    return short - rest // 2, short - (rest - rest // 2)


def encode_classification(rows: Sequence[TsvRow], tokenizer: Any, seq_length: int,
                          label_map: LabelMap | None, path: Path | str = "<rows>",
                          truncation: str = "longest_first") -> Instances:
    """Rows -> Instances for the ``cls`` objective's collate (``truncation``: see :func:`assemble_pairs`).

    Fields: ``split`` (where segment B starts) and, when ``label_map`` is given and the rows have
    labels, ``label`` (ids; an unknown label is a UserError naming ``path`` and the line).
    """
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        from pentad.data.masking import describe_tokenizer

        raise UserError(f"classification needs [CLS] and [SEP] tokens, which the "
                        f"{describe_tokenizer(tokenizer)} lacks.")
    first = tokenizer.encode_batch([r.text_a for r in rows])
    pairs = bool(rows) and rows[0].text_b is not None
    second = tokenizer.encode_batch([r.text_b or "" for r in rows]) if pairs else None
    sequences, splits = assemble_pairs(first, second, int(tokenizer.cls_id), int(tokenizer.sep_id),
                                       seq_length, truncation)
    fields: dict[str, Any] = {"split": splits}
    if label_map is not None and rows and all(r.label is not None for r in rows):
        fields["label"] = [label_map.encode(r.label or "", path, r.line) for r in rows]
    return Instances.from_sequences(sequences, **fields)


def read_path_tsv(path: Path | str, column: str, required: bool, item: str) -> list[tuple[int, str, str | None]]:
    """(line, media path as written, ``column``'s value or None) of each row of a file of media paths: a
    header line naming ``column`` (``label``, ``text``) and ``path``, then one ``item`` (image, utterance)
    per line. ``required``: the column must be there and never empty (training data); otherwise it is
    optional (inference input). UserError naming the file and line for a missing file, a bad header, a
    line that is not UTF-8, a wrong field count, an empty field, or no rows."""
    return [row for window in iter_path_tsv(path, column, required, item) for row in window]


def iter_path_tsv(path: Path | str, column: str, required: bool, item: str, window: int | None = None
                  ) -> Iterator[list[tuple[int, str, str | None]]]:
    """The rows of :func:`read_path_tsv` in consecutive windows of at most ``window`` rows (None: one
    window), read lazily (streamed inference decodes one window of media at a time); the same checks,
    a file without rows failing when the end is reached."""
    path = Path(path)
    expected = f"'{column}<TAB>path'" if required else f"'path' (and optionally '{column}')"
    if not path.is_file():
        raise UserError(f"TSV file {path} does not exist (a header line {expected}, then one {item} per line; "
                        "paths relative to the file's folder)")
    rows: list[tuple[int, str, str | None]] = []
    columns: list[str] = []
    seen = False
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = decode_line(raw, number)
            except BadLine as bad:
                raise UserError(f"{path}, line {number}: the line {bad}.") from None
            if not text.strip():
                continue
            if not columns:
                columns = [c.strip() for c in text.split("\t")]
                if set(columns) - {column, "path"} or "path" not in columns or (required and column not in columns) \
                        or len(set(columns)) != len(columns):
                    raise UserError(f"{path}, line 1: expected a header line {expected}, found {text[:80]!r}. "
                                    "Add the header as the first line.")
                continue
            values = text.split("\t")
            if len(values) != len(columns):
                raise UserError(f"{path}, line {number}: {len(values)} tab-separated field(s), the header has "
                                f"{len(columns)} ({', '.join(columns)})")
            row = dict(zip(columns, values))
            if not row["path"].strip():
                raise UserError(f"{path}, line {number}: the path field is empty")
            value = row.get(column)
            if value is not None:
                value = value.strip()
                if required and not value:
                    raise UserError(f"{path}, line {number}: the {column} field is empty; give every {item} its "
                                    f"{column}")
            rows.append((number, row["path"].strip(), value))
            seen = True
            if window is not None and len(rows) >= window:
                yield rows
                rows = []
    if not seen:
        raise UserError(f"TSV file {path} has no examples; expected a header line {expected} and one {item} per line")
    if rows:
        yield rows


def text_problem(tokenizer: Any, text: str, ids: Sequence[int], budget: int, what: str,
                 length_key: str) -> str | None:
    """Why ``text`` (encoded to ``ids``), a sequence of its own between [CLS] and [SEP], is refused;
    None when it can be used as it is. Refused, as the asr task and the s2t objective refuse
    transcripts: text outside the vocabulary (what encodes to the unknown token without being it
    literally), which would silently become the unknown token, and more than ``budget`` tokens, which
    would silently be cut. ``what`` names the text (a caption); ``length_key`` the setting that sets
    ``budget``. The phrase continues "the line ..." (or "the caption ...")."""
    unk = tokenizer.unk_id
    if unk is not None and unk in ids:
        pieces = tokenizer.unknown_text(text)
        if pieces:
            shown = ", ".join(repr(p) for p in pieces[:10]) + (" ..." if len(pieces) > 10 else "")
            return f"has a {what} with text outside the vocabulary ({shown}), which would become the unknown token"
    if len(ids) > budget:
        return f"has a {what} of {len(ids)} tokens; {length_key} allows {budget} (besides [CLS] and [SEP])"
    return None
