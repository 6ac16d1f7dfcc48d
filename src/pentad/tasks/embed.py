"""Sentence vectors from any run's encoder (``pentad embed``): pooling, BERT-whitening, pair similarity.

A text becomes ``[CLS] text [SEP]`` (just its tokens when the tokenizer has no [CLS]/[SEP], a GPT-2
say), cut to the run's sequence length; the encoder's token states are pooled over the real tokens
(``first``, ``mean``, ``max``, ``last``). Heads are not used, so a pre-training run, a fine-tuned
run of any task and a converted checkpoint all work. A two-stream run (SBERT, SimCSE) gives stream
0's vectors, pooled by default as the run pools them, so they equal its pooled output.

BERT-whitening (Su et al. 2021, "Whitening Sentence Representations for Better Semantics and Faster
Retrieval"): with the mean ``mu`` and covariance ``C = U diag(s) U^T`` of a set of vectors, ``x ->
(x - mu) U diag(1/sqrt(s))`` has zero mean and identity covariance on that set; keeping the first
``k`` columns (the largest variances) also reduces the dimension.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pentad.errors import UserError
from pentad.files import temporary_file
from pentad.layers.pooling import PoolingKind, pool

POOLINGS: tuple[str, ...] = ("first", "mean", "max", "last")
# texts (images) read, embedded and written at a time: the memory of `pentad embed` does not grow with the input
EMBED_WINDOW = 1024


@dataclass
class TextFile:
    """The texts of an input file: ``text_a`` (and ``text_b`` and float ``labels`` of a pair TSV)."""

    path: Path
    text_a: list[str]
    text_b: list[str] | None = None
    labels: np.ndarray | None = None


def read_texts(path: Path, pairs: bool = False) -> TextFile:
    """One text per line, or a TSV whose header names ``text_a`` (and ``text_b``, ``label``; other
    columns are ignored). ``pairs``: the file must be a TSV with ``text_a`` and ``text_b`` (a
    ``label`` column, when there, must hold numbers). UserError naming the file and line otherwise."""
    whole = TextFile(Path(path), [], [] if pairs else None)
    labels = []
    for window in iter_texts(path, pairs):
        whole.text_a += window.text_a
        if window.text_b is not None:
            whole.text_b = (whole.text_b or []) + window.text_b
        if window.labels is not None:
            labels.append(window.labels)
    whole.labels = np.concatenate(labels) if labels else None
    return whole


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of ``path``, read lazily; lines end at \\n, \\r\\n or \\r."""
    from pentad.data.corpus import BadLine, decode_line

    number = 0
    with open(path, "rb") as f:
        for chunk in f:
            for raw in chunk.splitlines():
                number += 1
                try:
                    yield number, decode_line(raw, number)
                except BadLine as bad:
                    raise UserError(f"{path}, line {number}: the line {bad}.") from None


def iter_texts(path: Path, pairs: bool = False, window: int | None = None) -> Iterator[TextFile]:
    """The texts of :func:`read_texts` in consecutive windows of at most ``window`` texts (None: one
    window), read lazily so that only one window is held; the same checks, an error being raised when
    the reading reaches it (so a caller that must not start on a bad file reads it through once first:
    :func:`count_texts`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file {path} does not exist." if not path.exists() else f"input {path} is not a file.")
    lines = _decoded_lines(path)
    first = next(lines, None)
    header = [c.strip() for c in first[1].split("\t")] if first is not None else []
    if "text_a" not in header:
        if pairs:
            raise UserError(f"{path}, line 1: --similarity reads pairs from a TSV with a header naming text_a and "
                            f"text_b (and optionally label), found {first[1][:80] if first else ''!r}")
        chunk: list[str] = []
        empty, seen = None, False
        for n, text in itertools.chain([first] if first is not None else [], lines):
            if not text.strip():
                empty = empty or n
                continue
            seen = True
            if empty is not None:  # a text after an empty line
                break
            chunk.append(text)
            if window is not None and len(chunk) >= window:
                yield TextFile(path, chunk)
                chunk = []
        if not seen:
            raise UserError(f"input file {path} has no text.")
        if empty is not None:
            raise UserError(f"{path}, line {empty}: the line is empty; give one text per line (a vector per line "
                            "keeps the output aligned with the input), or a TSV with a text_a column")
        if chunk:
            yield TextFile(path, chunk)
        return
    if pairs and "text_b" not in header:
        raise UserError(f"{path}, line 1: --similarity needs a text_b column beside text_a; the header is {header}")
    columns = {name: i for i, name in enumerate(header)}
    rows: list[tuple[int, list[str]]] = []
    seen = False
    for n, text in lines:
        values = text.split("\t")
        if len(values) != len(header):
            raise UserError(f"{path}, line {n}: the line has {len(values)} tab-separated field(s), the header has "
                            f"{len(header)} ({chr(9).join(header)!r}).")
        for name in ("text_a", "text_b") if pairs else ("text_a",):
            if not values[columns[name]].strip():
                raise UserError(f"{path}, line {n}: the {name} field is empty.")
        rows.append((n, values))
        seen = True
        if window is not None and len(rows) >= window:
            yield _text_rows(path, rows, columns, pairs)
            rows = []
    if not seen:
        raise UserError(f"{path} has a header but no data lines.")
    if rows:
        yield _text_rows(path, rows, columns, pairs)


def _text_rows(path: Path, rows: list[tuple[int, list[str]]], columns: dict[str, int], pairs: bool) -> TextFile:
    out = TextFile(path, [v[columns["text_a"]] for _, v in rows])
    if pairs:
        out.text_b = [v[columns["text_b"]] for _, v in rows]
        if "label" in columns:
            labels = np.zeros(len(rows))
            for i, (n, values) in enumerate(rows):
                try:
                    labels[i] = float(values[columns["label"]])
                except ValueError:
                    labels[i] = math.nan
                if not math.isfinite(labels[i]):
                    raise UserError(f"{path}, line {n}: label {values[columns['label']]!r} is not a number (the "
                                    "similarity of the pair, a graded score or 0/1).")
            out.labels = labels
    return out


def count_texts(path: Path, pairs: bool = False) -> int:
    """How many texts (pairs) :func:`read_texts` finds in ``path``, reading it through once with every
    check and holding one window at a time (embedding then starts only on a good file)."""
    return sum(len(window.text_a) for window in iter_texts(path, pairs, EMBED_WINDOW))


def projection_head(model: Any, stream: str, run_dir: Path) -> tuple[Any, int]:
    """(clr head, index of ``stream`` among the streams it compares) of a two-stream run, for
    ``--projected``; UserError when the run has none."""
    plan = getattr(model, "stream_plan", None)
    for name, target in getattr(model, "targets", {}).items():
        if plan is not None and target.registry_name == "clr" and stream in plan.reads.get(name, ()):
            return target, plan.reads[name].index(stream)
    raise UserError(f"--projected: {run_dir} has no clr head over stream '{stream}' (only a two-stream run with a "
                    "clr head, CLIP-style, has projected features); drop --projected for the pooled states")


class Embedder:
    """A run's embedding and encoder, turning texts into pooled vectors [N, H] (float32, numpy); with
    ``projected`` (a two-stream run with a clr head) the head's projected, L2-normalised features."""

    def __init__(self, model: Any, tokenizer: Any, seq_length: int, pooling: PoolingKind, device: torch.device,
                 projected: bool = False, run_dir: Path | None = None):
        if pooling not in POOLINGS:
            raise UserError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
        self.model, self.tokenizer, self.seq_length = model, tokenizer, seq_length
        self.pooling = pooling
        self.device = device
        self.pad_id = int(tokenizer.pad_id) if tokenizer.pad_id is not None else 0
        self.head = None
        if projected:
            plan = getattr(model, "stream_plan", None)
            if plan is None:
                raise UserError(f"--projected: {run_dir} has one stream; projected features belong to a two-stream "
                                "run's clr head")
            self.head = projection_head(model, plan.first, run_dir or Path("RUN"))

    @classmethod
    def from_run(cls, run_dir: Path, pooling: PoolingKind | None = None, device: str | torch.device = "cpu",
                 projected: bool = False) -> Embedder:
        """The encoder of ``run_dir`` with its weights; ``pooling`` default: the run's own (a two-stream
        run's first stream's pooling), else ``mean``."""
        from pentad.generation.text import load_model

        run_dir = Path(run_dir)
        model, cfg, tokenizer = load_model(run_dir, device)
        if tokenizer is None:
            raise UserError(f"{run_dir} has no tokenizer, so it cannot read text; a run made by pentad has one")
        seq_length = cfg.model.max_seq_length
        if cfg.data.objective is not None:
            seq_length = min(seq_length, cfg.data.objective.seq_length)
        return cls(model, tokenizer, seq_length, pooling or run_pooling(cfg), torch.device(device), projected,
                   run_dir)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text: ``[CLS] text [SEP]`` cut to ``seq_length`` (the ids alone when the
        tokenizer has no [CLS]/[SEP])."""
        ids = self.tokenizer.encode_batch(list(texts))
        cls_id, sep_id = self.tokenizer.cls_id, self.tokenizer.sep_id
        if cls_id is None or sep_id is None:
            return [np.asarray(x[:self.seq_length], dtype=np.int64) for x in ids]
        from pentad.data.tsv import assemble_pairs

        sequences, _ = assemble_pairs(ids, None, int(cls_id), int(sep_id), self.seq_length)
        return sequences

    @torch.no_grad()
    def __call__(self, texts: Sequence[str], batch_size: int = 64, progress: str | None = None,
                 start: int = 0) -> np.ndarray:
        """Pooled vectors [N, H] of ``texts``, in order (``start``: the number of texts before them in the
        input, for errors)."""
        from pentad.components.base import Batch
        from pentad.data.shards import Instances
        from pentad.tasks.base import in_order

        if batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {batch_size}")
        instances = Instances.from_sequences(self.encode(texts))
        empty = np.flatnonzero(instances.lengths == 0)
        if len(empty):
            first = int(empty[0])
            raise UserError(f"text {start + first + 1} encodes to no tokens ({texts[first][:40]!r}); the model "
                            "needs at least one")
        self.model.eval()
        out = []
        for idx in in_order(len(instances), batch_size, progress):
            ids, valid = instances[idx].padded(self.pad_id)
            batch = Batch(tokens=torch.from_numpy(ids), segments=torch.zeros(ids.shape, dtype=torch.long),
                          padding_mask=torch.from_numpy(~valid)).to(self.device)
            hidden, mask = self.model.encode(batch)
            vectors = pool(hidden, mask, self.pooling)
            if self.head is not None:
                vectors = self.head[0].stream_features(vectors, self.head[1])
            out.append(vectors.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


class ImageEmbedder:
    """A run's image tower, turning image files into pooled vectors [N, H] (float32, numpy): a model whose
    embedding slot has a ``patch`` (or ``masked_patch``) part (ViT, BEiT) pools its encoder's states
    (default: as its cls head pools, else the CLS position); a two-stream model whose second stream
    embeds images (CLIP) pools that stream as it is configured to; with ``projected`` its clr head's
    projected, L2-normalised features (what retrieval compares). Images are decoded, resized to the
    patch part's size and channels and normalised as the run's task does (``half`` when it says
    nothing)."""

    def __init__(self, model: Any, cfg: Any, pooling: PoolingKind | None, device: torch.device,
                 projected: bool = False, run_dir: Path | None = None):
        from pentad.components.stream import stream_embedding, stream_names
        from pentad.data.images import NORMALISE

        where = run_dir or Path("RUN")
        self.model, self.device = model, device
        own = {p.type: p for p in cfg.model.embedding.parts}
        names = stream_names(cfg.model)
        second = {p.type: p for p in stream_embedding(cfg.model, names[1]).parts} if names else {}
        self.stream: str | None = None
        if "patch" in own or "masked_patch" in own:
            patch = own.get("patch") or own.get("masked_patch")
            heads = [t for t in cfg.model.targets if t.type == "cls"]
            default = getattr(heads[0], "pooling", "first") if heads else "first"
        elif "patch" in second:
            self.stream, patch = names[1], second["patch"]
            default = cfg.model.streams[names[1]].pooling
        elif "word_patch" in own:
            raise UserError(f"{where} reads a caption and an image as one sequence (word_patch, ViLT-style): an image "
                            "alone has no vector there; embed with a ViT or a two-tower (CLIP-style) run")
        else:
            raise UserError(f"{where} reads no images: its embedding slot has no patch part, nor has a second stream "
                            "(docs/vision.md)")
        self.pooling = pooling or default
        if self.pooling not in POOLINGS:
            raise UserError(f"unknown pooling {self.pooling!r}; expected one of {', '.join(POOLINGS)}")
        self.size, self.channels = (patch.image_size[0], patch.image_size[1]), patch.channels
        self.max_pixels = cfg.data.max_image_pixels
        objective = cfg.data.objective
        self.normalise = (getattr(cfg.task, "normalise", None) if cfg.task is not None else None) or \
            getattr(objective, "normalise", None) or "half"
        self.mean, self.std = NORMALISE[self.normalise]
        self.head = None
        if projected:
            if self.stream is None:
                raise UserError(f"--projected: {where} has one stream; projected features belong to a two-stream "
                                "run's clr head")
            self.head = projection_head(model, self.stream, where)

    @classmethod
    def from_run(cls, run_dir: Path, pooling: PoolingKind | None = None, device: str | torch.device = "cpu",
                 projected: bool = False) -> ImageEmbedder:
        from pentad.generation.text import load_model

        model, cfg, _ = load_model(Path(run_dir), device)
        return cls(model, cfg, pooling, torch.device(device), projected, Path(run_dir))

    @torch.no_grad()
    def __call__(self, images: np.ndarray, batch_size: int = 64, progress: str | None = None) -> np.ndarray:
        """Pooled vectors [N, H] of uint8 ``images`` [N, H, W, C] (as :func:`read_images` gives them)."""
        from pentad.components.base import Batch
        from pentad.components.stream import run_stream
        from pentad.data.images import to_pixels
        from pentad.tasks.base import in_order

        if batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {batch_size}")
        self.model.eval()
        out = []
        for idx in in_order(len(images), batch_size, progress):
            batch = Batch(pixels=to_pixels(images[np.asarray(idx)], self.mean, self.std)).to(self.device)
            if self.stream is None:
                hidden, mask = self.model.encode(batch)
            else:
                hidden, mask = run_stream(*self.model.stream_slots(self.stream), batch)
            vectors = pool(hidden, mask, self.pooling)
            if self.head is not None:
                vectors = self.head[0].stream_features(vectors, self.head[1])
            out.append(vectors.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    def read(self, path: Path) -> tuple[list[str], np.ndarray]:
        """(paths as written, uint8 images [N, H, W, C]) of a TSV of images: a header naming ``path`` (other
        columns are ignored), one image per line, paths relative to the file's folder."""
        rows = self.rows(path)
        return [p for _, p, _ in rows], next(self.windows(path, rows, len(rows)))

    @staticmethod
    def rows(path: Path) -> list[tuple[int, str, str | None]]:
        """The checked rows (line, path, label) of a TSV of images (a line and a path each: small beside
        the images, which :meth:`windows` decodes a window at a time)."""
        from pentad.data.tsv import read_path_tsv

        return read_path_tsv(Path(path), "label", False, "image")

    def windows(self, path: Path, rows: list[tuple[int, str, str | None]], window: int) -> Iterator[np.ndarray]:
        """uint8 images [<= window, H, W, C] of ``rows`` of ``path``, decoded a window at a time."""
        from pentad.data.images import load_images

        path = Path(path)
        for begin in range(0, len(rows), window):
            part = rows[begin:begin + window]
            yield load_images([path.parent / p for _, p, _ in part], [n for n, _, _ in part], path, self.size,
                              self.channels, self.max_pixels)


def run_pooling(cfg: Any) -> PoolingKind:
    """How a run pools its sentences: a two-stream run's first stream's pooling, else ``mean``."""
    streams = getattr(cfg.model, "streams", None)
    return next(iter(streams.values())).pooling if streams else "mean"


class Moments:
    """Count, mean and covariance of vectors added a window at a time (float64), so that whitening is
    fitted on any number of vectors without holding them. The sums are taken about the first window's
    mean, so they do not cancel when the mean is large beside the spread (the covariance then equals
    ``np.cov``'s to rounding)."""

    def __init__(self) -> None:
        self.count = 0
        self.shift: np.ndarray | None = None
        self.sum = np.zeros(0)
        self.products = np.zeros((0, 0))

    @property
    def width(self) -> int:
        return 0 if self.shift is None else len(self.shift)

    def add(self, vectors: np.ndarray) -> Moments:
        x = np.asarray(vectors, dtype=np.float64)
        if len(x) == 0:
            return self
        if self.shift is None:
            self.shift = x.mean(axis=0)
            self.sum, self.products = np.zeros(x.shape[1]), np.zeros((x.shape[1], x.shape[1]))
        d = x - self.shift
        self.sum += d.sum(axis=0)
        self.products += d.T @ d
        self.count += len(x)
        return self

    def mean(self) -> np.ndarray:
        assert self.shift is not None
        return self.shift + self.sum / self.count

    def covariance(self) -> np.ndarray:
        """The unbiased covariance [H, H] (``np.cov(x, rowvar=False)``)."""
        return (self.products - np.outer(self.sum, self.sum) / self.count) / (self.count - 1)


@dataclass
class Whitening:
    """BERT-whitening fitted on a set of vectors: ``apply(x) = (x - mean) @ transform`` ([N,H] -> [N,K])."""

    mean: np.ndarray        # [H]
    transform: np.ndarray   # [H, K]

    @classmethod
    def fit(cls, vectors: np.ndarray, dim: int | None = None) -> Whitening:
        """Mean and the SVD of the covariance of ``vectors`` [N, H], keeping ``dim`` directions of largest
        variance (:meth:`from_moments` of their :class:`Moments`)."""
        x = np.asarray(vectors, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise UserError(f"whitening needs at least 2 vectors to fit on, got {len(x)}")
        return cls.from_moments(Moments().add(x), dim)

    @classmethod
    def from_moments(cls, moments: Moments, dim: int | None = None) -> Whitening:
        """The whitening of the vectors whose :class:`Moments` are given, keeping ``dim`` directions of
        largest variance. Directions with (numerically) no variance cannot be scaled to unit variance: by
        default they are dropped (the mean-pooled states of a post-LayerNorm encoder lie in a hyperplane, so
        H - 1 directions are left; N vectors span at most N - 1), and asking for them is an error."""
        n = moments.count
        if n < 2:
            raise UserError(f"whitening needs at least 2 vectors to fit on, got {n}")
        width = moments.width
        if dim is not None and not 1 <= dim <= width:
            raise UserError(f"--whitening-dim {dim} is out of range: the vectors have {width} dimensions")
        u, s, _ = np.linalg.svd(moments.covariance())
        usable = int((s > s[0] * 1e-8).sum()) if s[0] > 0 else 0
        if usable == 0:
            raise UserError(f"the {n} vectors to fit the whitening on are all the same; fit on other texts")
        if dim is not None and dim > usable:
            raise UserError(f"whitening to {dim} dimensions needs {dim} directions of non-zero variance, but the "
                            f"{n} vectors fitted on have {usable}; keep fewer dimensions (--whitening-dim "
                            f"{usable} or less) or fit on more texts (--whitening-fit FILE)")
        keep = usable if dim is None else dim
        return cls(moments.mean(), u[:, :keep] / np.sqrt(s[:keep]))

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        return ((np.asarray(vectors, dtype=np.float64) - self.mean) @ self.transform).astype(np.float32)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row pair of ``a`` and ``b`` [N, D] -> [N] (0 for a zero vector)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0), 0.0)


def sidecar_path(output: Path) -> Path:
    """The JSON description written beside an output file (``vectors.npy`` -> ``vectors.json``)."""
    return output.with_suffix(".json")


def check_options(whitening: bool, whitening_dim: int | None, whitening_fit: Path | None, batch_size: int) -> None:
    """UserError for options that do not go together (checked before any work)."""
    if whitening_dim is not None and not whitening:
        raise UserError("--whitening-dim is set without --whitening; add --whitening (or drop --whitening-dim)")
    if whitening_fit is not None and not whitening:
        raise UserError("--whitening-fit is set without --whitening; add --whitening (or drop --whitening-fit)")
    if whitening_dim is not None and whitening_dim < 1:
        raise UserError(f"--whitening-dim must be at least 1, got {whitening_dim}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")


# a window of embedded input: vectors of text_a (or images) [n, H], of text_b [n, H] or None, labels [n] or None
Window = tuple[np.ndarray, "np.ndarray | None", "np.ndarray | None"]


def embed_file(run_dir: Path, input_path: Path, output: Path, pooling: PoolingKind | None = None,
               whitening: bool = False, whitening_dim: int | None = None, whitening_fit: Path | None = None,
               batch_size: int = 64, similarity: bool = False, device: str = "auto",
               progress: bool = False, images: bool = False, projected: bool = False,
               window: int | None = None) -> dict[str, Any]:
    """Write the vectors of ``input_path``'s texts to ``output`` (.npy, [N, H] or [N, K] float32), or with
    ``similarity`` the cosine similarity of each text_a/text_b pair (a TSV with header ``similarity``),
    plus a JSON sidecar (:func:`sidecar_path`) describing them; returns that description.

    ``whitening``: fitted on the input's texts (both sides of the pairs) or on ``whitening_fit``'s,
    keeping ``whitening_dim`` dimensions. With pairs that have a ``label`` column the description holds
    Spearman's and Pearson's correlation of similarity and label. ``images``: ``input_path`` (and
    ``whitening_fit``) are TSVs of image files (:class:`ImageEmbedder`); ``projected``: a two-stream
    run's clr features instead of pooled states.

    Streamed: the input is checked through first, then read, embedded and written ``window`` (default
    ``EMBED_WINDOW``) texts or images at a time, so memory does not grow with the input; whitening is
    fitted from running sums (:class:`Moments`), and when it is fitted on the input itself the raw
    vectors wait in a scratch file beside the output (removed after) until it is. The output appears
    under its name only once complete."""
    from pentad.training.distributed import pick_device

    check_options(whitening, whitening_dim, whitening_fit, batch_size)
    if images and similarity:
        raise UserError("--similarity scores text pairs; it does not go with --images")
    label = "embed" if progress else None
    from pentad.tasks.base import window_size

    window = window_size(batch_size, window or EMBED_WINDOW)
    embedder: Any
    if images:
        embedder = ImageEmbedder.from_run(run_dir, pooling, pick_device(device), projected)
        rows = embedder.rows(input_path)
        count = len(rows)

        def embedded(path: Path, pairs: bool) -> Iterator[Window]:
            found = rows if path == input_path else embedder.rows(path)
            for pixels in embedder.windows(path, found, window):
                yield embedder(pixels, batch_size, label), None, None
    else:
        count = count_texts(input_path, pairs=similarity)
        embedder = Embedder.from_run(run_dir, pooling, pick_device(device), projected)

        def embedded(path: Path, pairs: bool) -> Iterator[Window]:
            done = 0
            for texts in iter_texts(path, pairs, window):
                first = embedder(texts.text_a, batch_size, label, done)
                second = embedder(texts.text_b, batch_size, label, done) if texts.text_b is not None else None
                done += len(texts.text_a)
                yield first, second, texts.labels

    output.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        windows = embedded(input_path, similarity)
        transform = None
        if whitening:
            moments = Moments()
            if whitening_fit is None:
                # every vector is needed before the first whitened one can be written: the raw ones wait on disk
                scratch = stack.enter_context(Scratch(output))
                for first, second, labels in windows:
                    moments.add(first)
                    if second is not None:
                        moments.add(second)
                    scratch.append(first, second, labels)
                windows = scratch.windows(window)
            else:
                for first, _, _ in embedded(Path(whitening_fit), False):
                    moments.add(first)
            transform = Whitening.from_moments(moments, whitening_dim)
        write = _write_similarity if similarity else _write_vectors
        written = write(output, windows, count, transform)
    description: dict[str, Any] = {
        "run": str(Path(run_dir).resolve()), "input": str(Path(input_path).resolve()), "output": str(output),
        "pooling": embedder.pooling, "count": count, "hidden_size": written["hidden_size"],
        "dim": written["dim"], "projected": embedder.head is not None,
        **({"images": {"stream": embedder.stream, "size": list(embedder.size), "channels": embedder.channels,
                       "normalise": embedder.normalise}} if images else {"seq_length": embedder.seq_length}),
        "whitening": None if transform is None else {
            "fit_on": str(Path(whitening_fit).resolve()) if whitening_fit is not None else "input",
            "dim": int(transform.transform.shape[1])},
        "what": "similarity" if similarity else "vectors",
    }
    if "spearman" in written:
        description["spearman"], description["pearson"] = written["spearman"], written["pearson"]
    from pentad.files import write_json

    write_json(sidecar_path(output), description)
    return description


def _write_vectors(output: Path, windows: Iterator[Window], count: int, transform: Whitening | None
                   ) -> dict[str, Any]:
    """Write the vectors of ``windows`` (whitened by ``transform``) to ``output`` as a .npy of ``count``
    rows, byte for byte what ``np.save`` writes, a window at a time. Returns the widths written."""
    from pentad.files import atomic_open

    rows, dim, hidden = 0, 0, 0
    with atomic_open(output, binary=True) as f:
        for first, _, _ in windows:
            hidden = int(first.shape[1])
            vectors = (transform.apply(first) if transform is not None else first).astype(np.float32)
            if rows == 0:
                dim = int(vectors.shape[1])
                np.lib.format.write_array_header_1_0(
                    f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
                        "shape": (count, dim)})
            f.write(np.ascontiguousarray(vectors).tobytes())
            rows += len(vectors)
        _check_count(count, rows, output)  # a .npy whose header is wrong is never renamed into place
    return {"hidden_size": hidden, "dim": dim}


def _check_count(expected: int, found: int, output: Path) -> None:
    if found != expected:
        raise UserError(f"the input changed while it was read ({expected} examples when it was checked, {found} "
                        f"when they were embedded); {output} was not written. Embed a file nothing is writing to")


def _write_similarity(output: Path, windows: Iterator[Window], count: int, transform: Whitening | None
                      ) -> dict[str, Any]:
    """Write the cosine similarity of each pair of ``windows`` (whitened by ``transform``) to ``output``
    (a TSV with header ``similarity``) a window at a time. Returns the widths, and Spearman's and
    Pearson's correlation with the labels when the pairs have them: those need every pair's similarity
    and label at once, two floats a pair (the texts and vectors are not kept)."""
    from pentad.files import atomic_open
    from pentad.tasks.correlation import pearson, spearman

    cosines: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    dim = hidden = 0
    with atomic_open(output) as f:
        f.write("similarity\n")
        for first, second, gold in windows:
            assert second is not None
            hidden = int(first.shape[1])
            if transform is not None:
                first, second = transform.apply(first), transform.apply(second)
            dim = int(first.shape[1])
            cosines.append(cosine_rows(first, second))
            f.write("".join(f"{x:.6f}\n" for x in cosines[-1]))
            if gold is not None:
                labels.append(gold)
        _check_count(count, sum(len(c) for c in cosines), output)
    similarity = np.concatenate(cosines)
    out: dict[str, Any] = {"hidden_size": hidden, "dim": dim}
    if labels:
        gold_all = np.concatenate(labels)
        out["spearman"], out["pearson"] = spearman(similarity, gold_all), pearson(similarity, gold_all)
    return out


class Scratch:
    """Raw vectors (and labels) of the input waiting for the whitening to be fitted: float32 rows in
    files beside ``output`` (disk, not memory; removed on leaving the ``with`` block)."""

    def __init__(self, output: Path):
        self.output = output
        self.files: list[Any] = []
        self.paths: list[Path] = []
        self.width = 0
        self.count = 0
        self.labels: list[np.ndarray] = []  # a float a pair

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: Any) -> None:
        for f in self.files:
            f.close()
        for path in self.paths:
            path.unlink(missing_ok=True)

    def _file(self, side: int) -> Any:
        while len(self.files) <= side:
            fd, name = temporary_file(self.output.parent, f".{self.output.name}.", ".raw")
            self.paths.append(Path(name))
            self.files.append(os.fdopen(fd, "w+b"))
        return self.files[side]

    def append(self, first: np.ndarray, second: np.ndarray | None, labels: np.ndarray | None) -> None:
        self.width = int(first.shape[1])
        for side, vectors in enumerate((first, second)):
            if vectors is not None:
                self._file(side).write(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
        if labels is not None:
            self.labels.append(labels)
        self.count += len(first)

    def windows(self, window: int) -> Iterator[Window]:
        """The vectors appended, ``window`` rows at a time, as they were appended."""
        for f in self.files:
            f.flush()
            f.seek(0)
        done = 0
        labels = np.concatenate(self.labels) if self.labels else None
        while done < self.count:
            n = min(window, self.count - done)
            sides = [np.frombuffer(f.read(n * self.width * 4), dtype=np.float32).reshape(n, self.width)
                     for f in self.files]
            yield sides[0], sides[1] if len(sides) > 1 else None, None if labels is None else labels[done:done + n]
            done += n
