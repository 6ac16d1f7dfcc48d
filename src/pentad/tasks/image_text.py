"""Image–text tasks for two-tower (CLIP-style) models: a text stream (stream 0: ``Batch.tokens``) and
an image stream (stream 1: ``Batch.pair.pixels``) compared by the ``clr`` head.

* ``image_text``: contrastive training on captioned images (TSV ``text<TAB>path``), evaluated by
  retrieval over the whole evaluation file: recall@1 and @5 from each text to the images and from
  each image to the texts (an image is right for a text when it is the text's own file, or when
  its caption is the same text). Predictions: the best image for each text.
* ``zero_shot``: classification without training (``pentad finetune`` only scores the model):
  each class becomes a text from ``task.template`` (``"a photo of the number {}"``), and an image
  takes the class whose text is most similar. Files are ``label<TAB>path``, as image classification.

Texts are ``[CLS] text [SEP]`` with the run's tokenizer (a CLIP tokenizer's start and end of text),
pooled as the model's stream 0 says (CLIP: the last token). Images are read, resized and augmented
as in image classification (``pentad.data.images``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from pentad.components.base import Batch
from pentad.components.stream import shares, stream_embedding, stream_names
from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.data.images import NORMALISE, AugmentConfig, augment, load_images, to_pixels
from pentad.data.shards import Instances
from pentad.data.tsv import LabelMap, assemble_pairs, read_path_tsv, text_problem
from pentad.errors import UserError, shown
from pentad.registry import TASKS
from pentad.tasks.base import EpochBatches, Task, TaskConfig, classification_metrics, in_order
from pentad.tasks.image_classification import read_image_tsv
from pentad.tasks.simcse import encode_sentences, sentence_batch


class ImageTextTaskConfig(TaskConfig):
    type: Literal["image_text"] = "image_text"
    metric: Literal["mean_r1", "t2i_r1", "i2t_r1", "t2i_r5", "i2t_r5"] = Field(
        "mean_r1", description="dev metric that picks the best model (mean_r1: the mean of both directions' "
        "recall@1)")
    normalise: Literal["half", "imagenet", "clip"] = Field("clip", description="pixel mean and std")
    augment: AugmentConfig | None = Field(default_factory=lambda: AugmentConfig(crop_scale=[0.9, 1.0], flip=False),
                                          description="training augmentation (no flip by default: a caption may "
                                          "say left or right); null: none")


class ZeroShotTaskConfig(TaskConfig):
    type: Literal["zero_shot"] = "zero_shot"
    template: str = Field("a photo of {}", description="the text of a class: {} is replaced by its name")
    names: dict[str, str] = Field(default_factory=dict, description="label -> the name put in the template "
                                  "(default: the label itself), e.g. {'7': 'seven'}")
    labels: list[str] | None = Field(None, description="the classes (labels as in the files); default: the labels "
                                     "of data.train if given, else of data.dev")
    metric: Literal["accuracy", "macro_f1", "top5"] = "accuracy"
    normalise: Literal["half", "imagenet", "clip"] = Field("clip", description="pixel mean and std")

    @field_validator("template")
    @classmethod
    def _one_slot(cls, template: str) -> str:
        """One ``{}`` (or ``{0}``, any number of times) for the class name, literal braces doubled (``{{``);
        anything else would fail when the texts are made or, with no slot, give every class the same text."""
        import string

        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
            if fields == [""] or (fields and set(fields) == {"0"}):
                template.format("name")
                return template
        except (ValueError, IndexError, KeyError, AttributeError, TypeError):
            pass
        raise ValueError("expected a text with one {} where the class name goes (write a literal brace as {{ or }}), "
                         f"e.g. 'a photo of {{}}'; found {shown(template)}")


def _streams(run_cfg: Any, task: str) -> tuple[tuple[int, int], int]:
    """(image size, channels) of the image stream of a two-tower model; UserError for any other model."""
    model = run_cfg.model
    names = stream_names(model)
    if not names or shares(model):
        raise UserError(f"task {task} compares a text stream with an image stream, but the model has "
                        + ("one stream" if not names else f"two streams ({', '.join(names)}) through one tower")
                        + ": use a two-tower model (model.streams, the second with an embedding of its own; e.g. "
                        "--config clip/base-32; docs/streams.md)")
    parts = stream_embedding(model, names[1]).parts
    patch = next((p for p in parts if p.type == "patch"), None)
    if patch is None or not any(p.type == "word" for p in model.embedding.parts):
        raise UserError(f"task {task} reads texts in the first stream ('{names[0]}': model.embedding needs a 'word' "
                        f"part) and images in the second ('{names[1]}': model.streams.{names[1]}.embedding needs a "
                        "'patch' part)")
    return (patch.image_size[0], patch.image_size[1]), patch.channels


def _clr_head(run_cfg: Any) -> dict[str, Any] | None:
    return next((t.model_dump() for t in run_cfg.model.targets if t.type == "clr"), None)


class _Features:
    """Normalised features of texts and images through a two-tower model's streams and ``clr`` head."""

    def __init__(self, model, device, head: str):
        self.model, self.device, self.head = model, device, head

    def texts(self, batches) -> torch.Tensor:
        return self._run(batches, 0)

    def images(self, batches) -> torch.Tensor:
        return self._run(batches, 1)

    def _run(self, batches, stream: int) -> torch.Tensor:
        from pentad.tasks.base import input_dtype

        model = self.model
        target = model.targets[self.head]
        dtype = input_dtype(model)
        was_training = model.training
        model.eval()
        out = []
        try:
            with torch.no_grad():
                for batch in batches:
                    pooled = model.encode_stream(batch.to(self.device, dtype=dtype), stream)
                    out.append(target.stream_features(pooled, stream).cpu())
        finally:
            model.train(was_training)
        return torch.cat(out) if out else torch.empty(0)


class ImageTextInstances:
    def __init__(self, texts, images: np.ndarray, paths: list[str], lines: list[int], captions: list[str]):
        self.texts, self.images, self.paths, self.lines = texts, images, paths, lines
        self.captions = captions
        self.fields: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.images)


def _recall(similarity: torch.Tensor, right: np.ndarray, k: int) -> float:
    """Share of rows whose top-k columns include a right one (``right`` [rows, cols] bool)."""
    if similarity.shape[0] == 0:
        return 0.0
    top = similarity.topk(min(k, similarity.shape[1]), dim=1).indices.numpy()
    return float(np.take_along_axis(right, top, axis=1).any(axis=1).mean())


@TASKS.register("image_text")
class ImageTextTask(Task):
    """Contrastive image–text training (CLIP) with retrieval recall@1/5 in both directions."""

    Config = ImageTextTaskConfig
    head = "clr"
    input_format = "text<TAB>path (paths relative to the TSV)"
    metric_names = ("mean_r1", "t2i_r1", "t2i_r5", "i2t_r1", "i2t_r5")
    provides = frozenset({"tokens", "segments", "padding_mask", "pair.pixels"})
    predictions_file = "retrieval.tsv"

    def __init__(self, cfg: ImageTextTaskConfig, tokenizer, seq_length: int, state=None):
        self.image_size: tuple[int, int] | None = None
        self.max_pixels = DEFAULT_MAX_IMAGE_PIXELS
        self.channels = 3
        self.clr: dict[str, Any] | None = None
        super().__init__(cfg, tokenizer, seq_length, state)
        self.mean, self.std = NORMALISE[cfg.normalise]
        self.pad_id = int(tokenizer.pad_id or 0) if tokenizer is not None else 0

    def bind(self, run_cfg: Any) -> None:
        self.image_size, self.channels = _streams(run_cfg, self.cfg.type)
        self.max_pixels = run_cfg.data.max_image_pixels
        self.clr = _clr_head(run_cfg)

    def head_configs(self) -> list[dict[str, Any]]:
        """The model's own ``clr`` head (projections and temperature), or a CLIP-style one."""
        if self.clr is not None:
            return [{**self.clr, "name": self.head}]
        return [{"type": "clr", "name": self.head, "projection": True}]

    def head_names(self) -> tuple[str, ...]:
        return () if self.clr is not None else (self.head,)

    # inference reads its input whole (no read_windows): retrieval ranks every caption against every image
    def read(self, path: Path, with_labels: bool = True) -> ImageTextInstances:
        path = Path(path)
        rows = _read_pairs(path)
        texts = encode_captions(rows, path, self.tokenizer, self.seq_length)  # before decoding any image
        images = load_images([path.parent / p for _, p, _ in rows], [n for _, _, n in rows], path,
                             self.image_size, self.channels, self.max_pixels)
        return ImageTextInstances(texts, images, [p for _, p, _ in rows], [n for _, _, n in rows],
                                  [t for t, _, _ in rows])

    def _batch(self, instances: ImageTextInstances, indices, rng: np.random.Generator | None) -> Batch:
        idx = np.asarray(indices)
        batch = sentence_batch(instances.texts[idx], self.pad_id)
        images = instances.images[idx]
        if rng is not None:
            images = augment(images, self.cfg.augment, rng)
        batch.pair = Batch(pixels=to_pixels(images, self.mean, self.std))
        return batch

    def collate(self, instances: ImageTextInstances, indices, rng: np.random.Generator) -> Batch:
        return self._batch(instances, indices, None)

    def train_batches(self, instances: ImageTextInstances, batch_size: int, seed: int) -> EpochBatches:
        return EpochBatches(len(instances), batch_size, seed, lambda idx, rng: self._batch(instances, idx, rng))

    def gold(self, instances: ImageTextInstances) -> np.ndarray:
        """[texts, images] bool: which images are right for which text: its own image (the same file),
        and any image whose caption is the same text (identical texts cannot be told apart)."""
        paths, captions = np.asarray(instances.paths), np.asarray(instances.captions)
        return (paths[:, None] == paths[None, :]) | (captions[:, None] == captions[None, :])

    def predict(self, model, instances: ImageTextInstances, batch_size: int, device, progress: str | None = None):
        """Cosine similarities [texts, images] of the whole file."""
        features = _Features(model, device, self.head)
        n = len(instances)
        texts = features.texts(sentence_batch(instances.texts[idx], self.pad_id) for idx in in_order(n, batch_size))
        images = features.images(Batch(pixels=to_pixels(instances.images[idx], self.mean, self.std))
                                 for idx in in_order(n, batch_size, progress))
        return texts @ images.T

    def score(self, similarity: torch.Tensor, instances, gold: np.ndarray) -> dict[str, float]:
        metrics = {"t2i_r1": _recall(similarity, gold, 1), "t2i_r5": _recall(similarity, gold, 5),
                   "i2t_r1": _recall(similarity.T, gold.T, 1), "i2t_r5": _recall(similarity.T, gold.T, 5)}
        metrics["mean_r1"] = (metrics["t2i_r1"] + metrics["i2t_r1"]) / 2
        return metrics

    def write_predictions(self, path: Path, similarity: torch.Tensor, instances, probabilities: bool) -> None:
        """TSV with header ``path<TAB>similarity``: the most similar image of each text, in input order."""
        from pentad.files import atomic_write_text

        best = similarity.argmax(dim=1)
        lines = ["path\tsimilarity"] + [f"{instances.paths[int(j)]}\t{float(similarity[i, j]):.6f}"
                                        for i, j in enumerate(best)]
        atomic_write_text(path, "\n".join(lines) + "\n")


def _read_pairs(path: Path) -> list[tuple[str, str, int]]:
    """(text, image path, line) of a ``text<TAB>path`` file with a header."""
    return [(text, image, line) for line, image, text in read_path_tsv(path, "text", True, "captioned image")]


def encode_captions(rows: list[tuple[str, str, int]], path: Path, tokenizer: Any, seq_length: int) -> Instances:
    """``[CLS] caption [SEP]`` per row of :func:`_read_pairs`; a caption with text outside the vocabulary
    or longer than ``seq_length`` is refused naming ``path`` and its line (as the asr task refuses
    transcripts, and the clip and vilt objectives such captions), never cut or turned into [UNK]."""
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        return encode_sentences([t for t, _, _ in rows], tokenizer, seq_length)  # its error names what is missing
    encoded = tokenizer.encode_batch([t for t, _, _ in rows])
    for ids, (text, _, line) in zip(encoded, rows):
        problem = text_problem(tokenizer, text, ids, seq_length - 2, "caption",
                               "the sequence length (data.objective.seq_length, at most model.max_seq_length)")
        if problem is not None:
            raise UserError(f"{path}, line {line}: the line {problem}. Fix the caption, or use a longer sequence "
                            "length or a tokenizer whose vocabulary covers it")
    sequences, _ = assemble_pairs(encoded, None, int(tokenizer.cls_id), int(tokenizer.sep_id), seq_length)
    return Instances.from_sequences(sequences)


@TASKS.register("zero_shot")
class ZeroShotTask(Task):
    """Zero-shot image classification with a two-tower model: each class is a text prompt (no training)."""

    Config = ZeroShotTaskConfig
    head = "clr"
    input_format = "label<TAB>path (paths relative to the TSV); classes as texts from task.template"
    metric_names = ("accuracy", "macro_f1", "top5")
    provides = frozenset({"tokens", "segments", "padding_mask", "pair.pixels"})

    def __init__(self, cfg: ZeroShotTaskConfig, tokenizer, seq_length: int, state=None):
        self.image_size: tuple[int, int] | None = None
        self.max_pixels = DEFAULT_MAX_IMAGE_PIXELS
        self.channels = 3
        self.clr: dict[str, Any] | None = None
        self.label_map: LabelMap | None = None
        super().__init__(cfg, tokenizer, seq_length, state)
        self.mean, self.std = NORMALISE[cfg.normalise]
        self.pad_id = int(tokenizer.pad_id or 0) if tokenizer is not None else 0

    @classmethod
    def sources(cls, cfg: Any, data: Any) -> dict[str, Any]:
        if data.dev is None and data.test is None:
            raise UserError("zero_shot scores a model without training: give data.dev and/or data.test "
                            "('label<TAB>path' files)")
        return {"train": data.train or data.dev or data.test, "dev": data.dev, "test": data.test}

    @property
    def trains(self) -> bool:
        return False

    def bind(self, run_cfg: Any) -> None:
        self.image_size, self.channels = _streams(run_cfg, self.cfg.type)
        self.max_pixels = run_cfg.data.max_image_pixels
        self.clr = _clr_head(run_cfg)
        if self.clr is None:
            raise UserError("zero_shot compares images with class texts through the model's clr head, which "
                            "model.targets lacks (initialise from a trained two-tower run: init=RUN)")

    def fit(self, train_path: Path) -> None:
        if self.cfg.labels is not None:
            self.label_map = LabelMap(list(self.cfg.labels), integer=False)
            return
        rows = read_image_tsv(Path(train_path), with_labels=True)
        self.label_map = LabelMap.from_rows(rows, train_path)

    def state(self) -> dict[str, Any]:
        return self.label_map.to_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        self.label_map = LabelMap.from_dict(state)

    def describe(self) -> str:
        return f"{self.label_map.num_labels} classes as texts: " + "; ".join(self.prompts()[:3]) + (
            " ..." if self.label_map.num_labels > 3 else "")

    def prompts(self) -> list[str]:
        return [self.cfg.template.format(self.cfg.names.get(name, name)) for name in self.label_map.names]

    def encoded_prompts(self) -> Instances:
        """``[CLS] prompt [SEP]`` per class; a class text outside the vocabulary or longer than the sequence
        is refused, naming the class (as captions are: :func:`encode_captions`)."""
        prompts = self.prompts()
        for name, prompt, ids in zip(self.label_map.names, prompts, self.tokenizer.encode_batch(prompts)):
            problem = text_problem(self.tokenizer, prompt, ids, self.seq_length - 2, "class text",
                                   "the sequence length")
            if problem is not None:
                raise UserError(f"zero_shot: the class {name!r}, whose text is {prompt!r} (task.template and "
                                f"task.names), {problem}; name the class with words of the vocabulary in task.names")
        return encode_sentences(prompts, self.tokenizer, self.seq_length)

    def head_configs(self) -> list[dict[str, Any]]:
        return [{**self.clr, "name": self.head}]

    def head_names(self) -> tuple[str, ...]:
        return ()

    def read(self, path: Path, with_labels: bool = True):
        return self._load(Path(path), read_image_tsv(path, with_labels), with_labels)

    def read_windows(self, path: Path, window: int):
        """Windows of images; the class prompts' features are computed again for each (a few texts)."""
        from pentad.data.tsv import TsvRow, iter_path_tsv

        return (self._load(Path(path), [TsvRow(line, image, None, label) for line, image, label in rows], False)
                for rows in iter_path_tsv(path, "label", False, "image", window))

    def _load(self, path: Path, rows, with_labels: bool):
        from pentad.tasks.image_classification import ImageInstances

        images = load_images([path.parent / r.text_a for r in rows], [r.line for r in rows], path, self.image_size,
                             self.channels, self.max_pixels)
        labels = None
        if with_labels and all(r.label is not None for r in rows):
            labels = np.asarray([self.label_map.encode(r.label, path, r.line) for r in rows], dtype=np.int64)
        return ImageInstances(images, labels, [r.line for r in rows])

    def collate(self, instances, indices, rng: np.random.Generator) -> Batch:
        return Batch(pixels=to_pixels(instances.images[np.asarray(indices)], self.mean, self.std))

    def predict(self, model, instances, batch_size: int, device, progress: str | None = None) -> torch.Tensor:
        """Similarities [images, classes] (scaled as the head scales them)."""
        features = _Features(model, device, self.head)
        prompts = self.encoded_prompts()
        texts = features.texts(sentence_batch(prompts[idx], self.pad_id)
                               for idx in in_order(len(prompts), batch_size))
        images = features.images(self.collate(instances, idx, None)
                                 for idx in in_order(len(instances), batch_size, progress))
        scale = float(model.targets[self.head].scale().detach())
        return scale * images @ texts.T

    def score(self, logits: torch.Tensor, instances, gold: np.ndarray) -> dict[str, float]:
        metrics = classification_metrics(logits.argmax(-1).numpy(), gold, self.label_map.num_labels)
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices.numpy()
        metrics["top5"] = float((top == gold[:, None]).any(axis=1).mean()) if len(gold) else 0.0
        return metrics

    def prediction_header(self, probabilities: bool) -> str:
        from pentad.tasks.image_classification import ImageClassificationTask

        return ImageClassificationTask.prediction_header(self, probabilities)  # type: ignore[arg-type]

    def prediction_lines(self, logits: torch.Tensor, instances, probabilities: bool) -> list[str]:
        from pentad.tasks.image_classification import ImageClassificationTask

        return ImageClassificationTask.prediction_lines(self, logits, instances, probabilities)  # type: ignore[arg-type]
