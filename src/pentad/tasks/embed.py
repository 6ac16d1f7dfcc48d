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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind, pool

POOLINGS: tuple[str, ...] = ("first", "mean", "max", "last")


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
    from pentad.data.corpus import BadLine, decode_line

    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file {path} does not exist." if not path.exists() else f"input {path} is not a file.")
    with open(path, "rb") as f:
        raw_lines = f.read().splitlines()
    texts: list[str] = []
    for n, raw in enumerate(raw_lines, start=1):
        try:
            texts.append(decode_line(raw, n))
        except BadLine as bad:
            raise UserError(f"{path}, line {n}: the line {bad}.") from None
    header = [c.strip() for c in texts[0].split("\t")] if texts else []
    if "text_a" not in header:
        if pairs:
            raise UserError(f"{path}, line 1: --similarity reads pairs from a TSV with a header naming text_a and "
                            f"text_b (and optionally label), found {texts[0][:80] if texts else ''!r}")
        if not any(t.strip() for t in texts):
            raise UserError(f"input file {path} has no text.")
        empty = next((n for n, t in enumerate(texts, start=1) if not t.strip()), None)
        if empty is not None:
            raise UserError(f"{path}, line {empty}: the line is empty; give one text per line (a vector per line "
                            "keeps the output aligned with the input), or a TSV with a text_a column")
        return TextFile(path, texts)
    if pairs and "text_b" not in header:
        raise UserError(f"{path}, line 1: --similarity needs a text_b column beside text_a; the header is {header}")
    columns = {name: i for i, name in enumerate(header)}
    rows = []
    for n, text in enumerate(texts[1:], start=2):
        values = text.split("\t")
        if len(values) != len(header):
            raise UserError(f"{path}, line {n}: the line has {len(values)} tab-separated field(s), the header has "
                            f"{len(header)} ({chr(9).join(header)!r}).")
        for name in ("text_a", "text_b") if pairs else ("text_a",):
            if not values[columns[name]].strip():
                raise UserError(f"{path}, line {n}: the {name} field is empty.")
        rows.append((n, values))
    if not rows:
        raise UserError(f"{path} has a header but no data lines.")
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
    def __call__(self, texts: Sequence[str], batch_size: int = 64, progress: str | None = None) -> np.ndarray:
        """Pooled vectors [N, H] of ``texts``, in order."""
        from pentad.components.base import Batch
        from pentad.data.shards import Instances
        from pentad.tasks.base import in_order

        if batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {batch_size}")
        instances = Instances.from_sequences(self.encode(texts))
        empty = np.flatnonzero(instances.lengths == 0)
        if len(empty):
            raise UserError(f"text {int(empty[0]) + 1} encodes to no tokens ({texts[int(empty[0])][:40]!r}); the "
                            "model needs at least one")
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
        from pentad.config.streams import stream_embedding, stream_names
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
        from pentad.data.images import load_images
        from pentad.data.tsv import read_path_tsv

        path = Path(path)
        rows = read_path_tsv(path, "label", False, "image")
        images = load_images([path.parent / p for _, p, _ in rows], [n for n, _, _ in rows], path, self.size,
                             self.channels, self.max_pixels)
        return [p for _, p, _ in rows], images


def run_pooling(cfg: Any) -> PoolingKind:
    """How a run pools its sentences: a two-stream run's first stream's pooling, else ``mean``."""
    streams = getattr(cfg.model, "streams", None)
    return next(iter(streams.values())).pooling if streams else "mean"


@dataclass
class Whitening:
    """BERT-whitening fitted on a set of vectors: ``apply(x) = (x - mean) @ transform`` ([N,H] -> [N,K])."""

    mean: np.ndarray        # [H]
    transform: np.ndarray   # [H, K]

    @classmethod
    def fit(cls, vectors: np.ndarray, dim: int | None = None) -> Whitening:
        """Mean and the SVD of the covariance of ``vectors`` [N, H], keeping ``dim`` directions of largest
        variance. Directions with (numerically) no variance cannot be scaled to unit variance: by default
        they are dropped (the mean-pooled states of a post-LayerNorm encoder lie in a hyperplane, so H - 1
        directions are left; N vectors span at most N - 1), and asking for them is an error."""
        x = np.asarray(vectors, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise UserError(f"whitening needs at least 2 vectors to fit on, got {len(x)}")
        width = x.shape[1]
        if dim is not None and not 1 <= dim <= width:
            raise UserError(f"--whitening-dim {dim} is out of range: the vectors have {width} dimensions")
        mean = x.mean(axis=0)
        covariance = np.cov(x - mean, rowvar=False)
        u, s, _ = np.linalg.svd(covariance)
        usable = int((s > s[0] * 1e-8).sum()) if s[0] > 0 else 0
        if usable == 0:
            raise UserError(f"the {len(x)} vectors to fit the whitening on are all the same; fit on other texts")
        if dim is not None and dim > usable:
            raise UserError(f"whitening to {dim} dimensions needs {dim} directions of non-zero variance, but the "
                            f"{len(x)} vectors fitted on have {usable}; keep fewer dimensions (--whitening-dim "
                            f"{usable} or less) or fit on more texts (--whitening-fit FILE)")
        keep = usable if dim is None else dim
        return cls(mean, u[:, :keep] / np.sqrt(s[:keep]))

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


def embed_file(run_dir: Path, input_path: Path, output: Path, pooling: PoolingKind | None = None,
               whitening: bool = False, whitening_dim: int | None = None, whitening_fit: Path | None = None,
               batch_size: int = 64, similarity: bool = False, device: str = "auto",
               progress: bool = False, images: bool = False, projected: bool = False) -> dict[str, Any]:
    """Write the vectors of ``input_path``'s texts to ``output`` (.npy, [N, H] or [N, K] float32), or with
    ``similarity`` the cosine similarity of each text_a/text_b pair (a TSV with header ``similarity``),
    plus a JSON sidecar (:func:`sidecar_path`) describing them; returns that description.

    ``whitening``: fitted on the input's texts (both sides of the pairs) or on ``whitening_fit``'s,
    keeping ``whitening_dim`` dimensions. With pairs that have a ``label`` column the description holds
    Spearman's and Pearson's correlation of similarity and label. ``images``: ``input_path`` (and
    ``whitening_fit``) are TSVs of image files (:class:`ImageEmbedder`); ``projected``: a two-stream
    run's clr features instead of pooled states."""
    from pentad.tasks.correlation import pearson, spearman
    from pentad.training.checkpoint import atomic_write_text, write_json
    from pentad.training.distributed import pick_device

    check_options(whitening, whitening_dim, whitening_fit, batch_size)
    if images and similarity:
        raise UserError("--similarity scores text pairs; it does not go with --images")
    label = "embed" if progress else None
    if images:
        image_embedder = ImageEmbedder.from_run(run_dir, pooling, pick_device(device), projected)
        names, pixels = image_embedder.read(input_path)
        texts = TextFile(Path(input_path), names)
        first, second = image_embedder(pixels, batch_size, label), None
        embedder: Any = image_embedder
    else:
        texts = read_texts(input_path, pairs=similarity)
        embedder = Embedder.from_run(run_dir, pooling, pick_device(device), projected)
        first = embedder(texts.text_a, batch_size, label)
        second = embedder(texts.text_b, batch_size, label) if texts.text_b is not None else None
    hidden_size = int(first.shape[1])
    transform = None
    if whitening:
        if whitening_fit is None:
            fit_on = first if second is None else np.concatenate([first, second])
        elif images:
            fit_on = embedder(embedder.read(whitening_fit)[1], batch_size, label)
        else:
            fit_texts = read_texts(whitening_fit)
            fit_on = embedder(fit_texts.text_a + (fit_texts.text_b or []), batch_size, label)
        transform = Whitening.fit(fit_on, whitening_dim)
        first = transform.apply(first)
        second = transform.apply(second) if second is not None else None
    description: dict[str, Any] = {
        "run": str(Path(run_dir).resolve()), "input": str(Path(input_path).resolve()), "output": str(output),
        "pooling": embedder.pooling, "count": len(texts.text_a), "hidden_size": hidden_size,
        "dim": int(first.shape[1]), "projected": embedder.head is not None,
        **({"images": {"stream": embedder.stream, "size": list(embedder.size), "channels": embedder.channels,
                       "normalise": embedder.normalise}} if images else {"seq_length": embedder.seq_length}),
        "whitening": None if transform is None else {
            "fit_on": str(Path(whitening_fit).resolve()) if whitening_fit is not None else "input",
            "dim": int(transform.transform.shape[1])},
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    if second is None:
        tmp = output.with_name(output.name + ".tmp.npy")
        np.save(tmp, first.astype(np.float32))
        tmp.replace(output)
        description["what"] = "vectors"
    else:
        cosines = cosine_rows(first, second)
        atomic_write_text(output, "similarity\n" + "".join(f"{x:.6f}\n" for x in cosines))
        description["what"] = "similarity"
        if texts.labels is not None:
            description["spearman"] = spearman(cosines, texts.labels)
            description["pearson"] = pearson(cosines, texts.labels)
    write_json(sidecar_path(output), description)
    return description
