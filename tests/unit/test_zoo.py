"""Driven by the zoo: every recipe builds on the meta device with its published parameter count,
and a shrunken copy of it (same modules, tiny sizes) runs forward and backward, round-trips
through save/load bitwise, and learns from its own objective on real text. A new recipe is tested
without new test code (a new *target kind* needs example labels in ``example_labels``)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.model_config import model_config_class
from pentad.config.loader import zoo_names
from pentad.model import count_active_parameters, count_parameters, total_loss
from pentad.training import checkpoint as ckpt

# Size fields shrunk wherever they appear in a model config (nested stream configs included);
# fields left unset (None) stay unset so the recipe keeps its modules.
SHRINK = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "head_size": 8,
          "ffn_size": 48, "max_positions": 160, "relative_buckets": 8, "relative_max_distance": 16,
          "embedding_size": 16, "max_seq_length": 160, "image_size": 32, "patch_size": 8,
          "expert_ffn_size": 16, "first": 1, "kv_lora_rank": 16, "q_lora_rank": 12, "qk_nope_head_dim": 8,
          "qk_rope_head_dim": 4, "v_head_dim": 8,
          "sliding_window": 4}
MAX_EXPERTS = 16  # more experts (DeepSeek-V3's 256) shrink to this many, their groups kept
# a mixture of experts keeps at most this many experts and choices per token (Qwen3-MoE's 128 top-8 would
# make the shrunken model wide again)
MOE_SHRINK = {"num_experts": 8, "top_k": 2}


@cache
def published() -> dict:
    return yaml.safe_load((resources.files("pentad") / "zoo" / "published.yaml").read_text(encoding="utf-8"))


def _shrink(value, vocab: int):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "conv_channels" and value.get("type") == "speech":  # the last one's output is the width
                out[key] = [2 * SHRINK["hidden_size"] if value.get("activation", "glu") == "glu"
                            else SHRINK["hidden_size"]] * len(item)
            elif key == "feature_size" and value.get("type") == "speech":
                out[key] = 16
            elif key == "num_experts" and item > MAX_EXPERTS:
                out[key] = MAX_EXPERTS
            elif key in SHRINK and item is not None:
                out[key] = SHRINK[key]
            elif key in MOE_SHRINK and "num_experts" in value:
                out[key] = min(item, MOE_SHRINK[key])
            elif key in ("vocab_size", "target_vocab_size") and item is not None:
                out[key] = vocab
            else:
                out[key] = _shrink(item, vocab)
        return out
    if isinstance(value, list):
        return [_shrink(v, vocab) for v in value]
    return value


def shrunk_model_config(name: str, vocab: int = 97):
    cfg = load_config(name)
    return model_config_class().model_validate(_shrink(cfg.model.model_dump(mode="json"), vocab))


def example_labels(model, kind: str, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Labels of the right shape for a target kind (content does not matter here)."""
    b = tokens.shape[0]
    if kind in ("mlm", "lm"):
        return tokens.masked_fill(padding, IGNORE_INDEX)
    if kind == "bilm":
        return torch.stack([tokens, tokens.flip(1)], dim=-1).masked_fill(padding[..., None], IGNORE_INDEX)
    if kind in ("sp", "sop", "cls", "pair_cls"):
        return torch.arange(b) % 2
    if kind == "cosine":
        return torch.linspace(-1, 1, b)
    pytest.fail(f"no example labels for target kind '{kind}': add them to tests/unit/test_zoo.py")


def _patch(model):
    return getattr(model.embedding, "patch", None)


def batch_for(model, vocab: int, b: int = 2, s: int = 12, t: int = 9) -> Batch:
    g = torch.Generator().manual_seed(0)
    patch = _patch(model)
    if patch is not None:  # an image model: pixels instead of tokens
        batch = Batch(pixels=torch.randn(b, patch.channels, *patch.image_size, generator=g))
        batch.labels = {name: torch.arange(b) % 2 for name in model.targets}
        return batch
    speech = getattr(model.embedding, "speech", None)
    if speech is not None:  # a speech model: feature frames into the encoder, the transcript into the decoder
        audio_padding = torch.zeros(b, 4 * s, dtype=torch.bool)
        audio_padding[1, -9:] = True
        batch = Batch(audio=torch.randn(b, 4 * s, speech.convs[0].in_channels, generator=g),
                      audio_padding_mask=audio_padding)
        batch.decoder_tokens = torch.randint(0, vocab, (b, t), generator=g)
        batch.decoder_padding_mask = torch.zeros(b, t, dtype=torch.bool)
        batch.decoder_padding_mask[1, -2:] = True
        for name, target in model.targets.items():
            batch.labels[name] = example_labels(model, target.registry_name, batch.decoder_tokens,
                                                batch.decoder_padding_mask)
        return batch
    tokens = torch.randint(0, vocab, (b, s), generator=g)
    padding = torch.zeros(b, s, dtype=torch.bool)
    padding[1, -3:] = True
    seg = getattr(model.embedding, "seg", None)
    two_segments = (seg is not None and seg.weight.shape[0] > 1) or getattr(model.encoder, "mask_kind", "") == "prefix"
    segments = (torch.arange(s)[None, :] >= s // 2).long().expand(b, s).masked_fill(padding, 0) * int(two_segments)
    batch = Batch(tokens=tokens, segments=segments, padding_mask=padding)
    label_tokens, label_padding = tokens, padding
    fused = getattr(model.embedding, "word_patch", None)
    if fused is not None:  # caption then image in one sequence (ViLT): segment 1 and no padding over the image
        n = fused.patch.image_size[0] // fused.patch.patch_size * (fused.patch.image_size[1] // fused.patch.patch_size)
        image = n + int(fused.patch.cls is not None)
        batch.pixels = torch.randn(b, fused.patch.channels, *fused.patch.image_size, generator=g)
        batch.segments = torch.cat([segments, torch.ones(b, image, dtype=torch.long)], dim=1)
        label_tokens = torch.cat([tokens, torch.zeros(b, image, dtype=torch.long)], dim=1)
        label_padding = torch.cat([padding, torch.ones(b, image, dtype=torch.bool)], dim=1)
    if model.decoder is not None:
        batch.decoder_tokens = torch.randint(0, vocab, (b, t), generator=g)
        batch.decoder_padding_mask = torch.zeros(b, t, dtype=torch.bool)
        batch.decoder_padding_mask[1, -2:] = True
        label_tokens, label_padding = batch.decoder_tokens, batch.decoder_padding_mask
    second = model.stream_slots(1)[0] if model.stream_plan is not None else None
    if second is not None and getattr(second, "patch", None) is not None:  # text + image (CLIP)
        patch = second.patch
        batch.pair = Batch(pixels=torch.randn(b, patch.channels, *patch.image_size, generator=g))
    elif second is not None:  # two-stream model: text B goes to batch.pair
        pair_padding = torch.zeros(b, t, dtype=torch.bool)
        pair_padding[0, -4:] = True
        batch.pair = Batch(tokens=torch.randint(0, vocab, (b, t), generator=g),
                           segments=torch.zeros(b, t, dtype=torch.long), padding_mask=pair_padding)
    for name, target in model.targets.items():
        if target.registry_name != "clr":  # in-batch contrastive: the pairing is the label
            batch.labels[name] = example_labels(model, target.registry_name, label_tokens, label_padding)
    return batch


@pytest.mark.parametrize("name", zoo_names())
def test_recipe_builds_with_published_parameter_count(name):
    cfg = load_config(name)
    assert cfg.description
    model = build_model(cfg.model, device="meta")
    params = count_parameters(model)
    entry = published().get(name)
    assert entry is not None, f"{name}: add its published parameter count (or params: null) to zoo/published.yaml"
    assert entry.get("source")
    if entry.get("params") is not None:
        expected = float(entry["params"])
        assert abs(params - expected) <= entry["tolerance"] * expected + 0.5, \
            f"{name}: {params:,} parameters, published {expected:,.0f} ({entry['source']})"
    active = count_active_parameters(model)
    if entry.get("active") is not None:  # mixtures of experts: parameters a token passes through
        expected = float(entry["active"])
        assert abs(active - expected) <= entry["active_tolerance"] * expected + 0.5, \
            f"{name}: {active:,} active parameters, published {expected:,.0f} ({entry['source']})"
    else:
        assert active == params, f"{name} has experts: add its published active parameter count"


def test_published_table_names_only_recipes():
    assert set(published()) <= set(zoo_names())


@pytest.mark.parametrize("name", zoo_names())
def test_shrunken_recipe_trains_and_round_trips(name, tmp_path):
    model_cfg = shrunk_model_config(name)
    torch.manual_seed(0)
    model = build_model(model_cfg)
    batch = batch_for(model, 97)
    loss = total_loss(model(batch))
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"
    path = tmp_path / "m.safetensors"
    ckpt.save_weights(model, path)
    again = build_model(model_cfg)
    ckpt.load_weights(again, ckpt.read_weights(path), str(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    model.eval(), again.eval()
    with torch.no_grad():
        first, second = model(batch), again(batch)
    for key in first:
        assert torch.equal(first[key].loss, second[key].loss), key


# ---- the loss falls on real text, through each recipe's own objective ---------------------------

TP = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tencentpretrain"
DOCUMENTS = "corpora/CLUECorpusSmall_bert_sampled.txt"  # sentence per line, blank line between documents
LINES = "corpora/CLUECorpusSmall_sampled.txt"  # one document per line
PAIRS = "corpora/news-commentary-v13-en-zh_sampled.txt"  # source \t target
LABELLED = "corpora/book_review_cls.txt"  # label \t text (with a header)
CORPUS = {"bert": DOCUMENTS, "albert": DOCUMENTS, "bart": DOCUMENTS, "gsg": DOCUMENTS, "mlm": LINES, "lm": LINES,
          "t5": LINES, "bilm": LINES, "llm_pretrain": "jsonl:text", "mt": PAIRS, "prefixlm": PAIRS,
          "llm_sft": "jsonl:sft", "cls": LABELLED, "cls_mlm": LABELLED}


def _corpus(kind: str, directory: Path) -> Path:
    spec = CORPUS[kind]
    if not spec.startswith("jsonl:"):
        source, out = TP / spec, directory / Path(spec).name
        with open(source, encoding="utf-8") as f:
            lines = [next(f) for _ in range(600 if spec == DOCUMENTS else 300)]
        out.write_text("".join(lines), encoding="utf-8")
        return out
    out = directory / f"{spec[6:]}.jsonl"
    records = []
    with open(TP / (LINES if spec == "jsonl:text" else PAIRS), encoding="utf-8") as f:
        for _ in range(300):
            line = next(f).rstrip("\n")
            if spec == "jsonl:text":
                records.append({"text": line})
            elif "\t" in line:
                source, target = line.split("\t", 1)
                records.append({"instruction": "Translate into Chinese.", "input": source, "output": target})
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return out


@cache
def _tokenizer():
    from pentad.data.tokenizers import load_tokenizer

    return load_tokenizer({"type": "wordpiece", "vocab": str(TP / "models/google_zh_with_sentinel_vocab.txt")})


_DATASETS: dict[str, Path] = {}


def _batches(objective_cfg, tmp_path_factory, count: int = 4, batch_size: int = 8) -> list[Batch]:
    from pentad.data.loader import PretrainBatches, open_dataset
    from pentad.data.preprocess import preprocess
    from pentad.registry import OBJECTIVES

    tokenizer = _tokenizer()
    objective = OBJECTIVES.get(objective_cfg.type)(objective_cfg, tokenizer)
    key = objective_cfg.model_dump_json()
    if key not in _DATASETS:
        directory = tmp_path_factory.mktemp(objective_cfg.type)
        preprocess(objective, tokenizer, {"type": "wordpiece"}, _corpus(objective_cfg.type, directory),
                   directory / "dataset", progress=False)
        _DATASETS[key] = directory / "dataset"
    stream = PretrainBatches(open_dataset(_DATASETS[key], tokenizer, objective), objective, batch_size, seed=0)
    return [stream.batch(i) for i in range(count)]


_DROPS: dict[str, tuple[float, float]] = {}


def _pair_batches(cfg, count: int = 4, batch_size: int = 8) -> list[Batch]:
    """Sentence pairs (two book reviews; label: same sentiment) for two-stream recipes, through the
    classification task's own encoding."""
    from pentad.data.tsv import TsvRow
    from pentad.tasks.classification import collate_separate_pairs, encode_separate_pairs

    with open(TP / LABELLED, encoding="utf-8") as f:
        reviews = [line.rstrip("\n").split("\t", 1) for line in (next(f) for _ in range(2 * count * batch_size + 1))]
    reviews = [r for r in reviews if len(r) == 2 and r[0] in ("0", "1")]
    rows = [TsvRow(line=i, label=str(int(a[0] == b[0])), text_a=a[1], text_b=b[1])
            for i, (a, b) in enumerate(zip(reviews[0::2], reviews[1::2]))]
    from pentad.data.tsv import LabelMap

    tokenizer = _tokenizer()
    instances = encode_separate_pairs(rows, tokenizer, 32, LabelMap.from_labels(["0", "1"]))
    name = cfg.model.targets[0].target_name
    batches = []
    for i in range(count):
        batch = collate_separate_pairs(instances[i * batch_size:(i + 1) * batch_size], tokenizer.pad_id or 0)
        batch.labels = {name: batch.labels["cls"]} if "cls" in batch.labels else {}
        batches.append(batch)
    return batches


def _image_batches(model_cfg, count: int = 4, batch_size: int = 8, jitter: bool = True) -> list[Batch]:
    """Digits drawn with Pillow's built-in font at random places (label: the digit), through the image
    classification task's own batching, for image recipes."""
    from PIL import Image, ImageDraw

    from pentad.data.images import to_pixels

    patch = next(p for p in model_cfg.embedding.parts if p.type == "patch")
    height, width = patch.image_size
    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(count * batch_size):
        digit = i % 10
        image = Image.new("RGB" if patch.channels == 3 else "L", (width, height), "black")
        place = (int(rng.integers(0, width - 8)), int(rng.integers(0, height - 12))) if jitter else (4, 4)
        ImageDraw.Draw(image).text(place, str(digit), fill="white")
        images.append(np.asarray(image).reshape(height, width, patch.channels))
        labels.append(digit)
    images, labels = np.stack(images), torch.tensor(labels)
    name = model_cfg.targets[0].target_name
    return [Batch(pixels=to_pixels(images[i * batch_size:(i + 1) * batch_size], (0.5,) * 3, (0.5,) * 3),
                  labels={name: labels[i * batch_size:(i + 1) * batch_size]}) for i in range(count)]


def _captioned_image_batches(model_cfg, count: int = 4, batch_size: int = 8) -> list[Batch]:
    """Two-tower recipes (CLIP): the drawn digits of ``_image_batches`` in stream 1, and in stream 0 a
    caption naming the digit (the token of the digit's character between [CLS] and [SEP])."""
    stream = list(model_cfg.streams.values())[1]
    patch = next(p for p in stream.embedding.parts if p.type == "patch")
    images = _image_batches(model_cfg.model_copy(update={"embedding": stream.embedding}), count, batch_size,
                            jitter=False)
    tokenizer = _tokenizer()
    digit_ids = [tokenizer.encode_batch([str(d)])[0][0] for d in range(10)]
    batches = []
    for batch in images:
        digits = next(iter(batch.labels.values()))
        tokens = torch.tensor([[tokenizer.cls_id, digit_ids[int(d)], tokenizer.sep_id] for d in digits])
        batches.append(Batch(tokens=tokens, segments=torch.zeros_like(tokens),
                             padding_mask=torch.zeros(tokens.shape, dtype=torch.bool),
                             pair=Batch(pixels=batch.pixels[:, :patch.channels])))
    return batches


def _matching_batches(model_cfg, count: int = 4, batch_size: int = 8) -> list[Batch]:
    """Fused caption+image recipes (ViLT): the drawn digits with a caption naming the digit shown or
    another one (labels.sp: 0 when it is the one shown), the caption's digit token masked for mlm."""
    part = next(p for p in model_cfg.embedding.parts if p.type == "word_patch")
    images = _image_batches(model_cfg.model_copy(update={"embedding": model_cfg.embedding.model_copy(
        update={"parts": [part.patch]})}), count, batch_size, jitter=False)
    tokenizer = _tokenizer()
    digit_ids = [tokenizer.encode_batch([str(d)])[0][0] for d in range(10)]
    image = part.patch.length
    batches = []
    for i, batch in enumerate(images):
        digits = next(iter(batch.labels.values()))
        shown = torch.where(torch.arange(batch_size) % 2 == 0, digits, (digits + 1 + i) % 10)
        tokens = torch.tensor([[tokenizer.cls_id, digit_ids[int(d)], tokenizer.sep_id] for d in shown])
        mlm = torch.full((batch_size, 3 + image), IGNORE_INDEX)
        mlm[:, 1] = tokens[:, 1]
        batches.append(Batch(tokens=tokens, segments=torch.cat([torch.zeros(batch_size, 3, dtype=torch.long),
                                                                 torch.ones(batch_size, image, dtype=torch.long)], 1),
                             padding_mask=torch.zeros(tokens.shape, dtype=torch.bool), pixels=batch.pixels,
                             labels={"sp": (shown != digits).long(), "mlm": mlm}))
    return batches


def _speech_batches(model_cfg, count: int = 4, batch_size: int = 8) -> list[Batch]:
    """Speech recipes: tone sequences (one 0.12 s tone per digit, its pitch naming the digit) through
    pentad's Kaldi filterbank and CMVN, transcribed as the digits (one token each) of the
    tokenizer's vocabulary."""
    from pentad.data.audio import collate, fbank, utterance_cmvn

    pytest.importorskip("kaldi_native_fbank")
    part = next(p for p in model_cfg.embedding.parts if p.type == "speech")
    tokenizer = _tokenizer()
    ids = [tokenizer.token_to_id(str(d)) for d in range(10)]
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        features, targets = [], []
        for _ in range(batch_size):
            digits = rng.integers(0, 10, size=int(rng.integers(2, 5)))
            t = np.arange(int(0.12 * 16000)) / 16000
            wave = np.concatenate([0.3 * np.sin(2 * np.pi * (300 + 150 * d) * t) for d in digits]).astype(np.float32)
            features.append(utterance_cmvn(fbank(wave, 16000, part.feature_size)))
            targets.append([ids[d] for d in digits])
        audio, mask = collate(features)
        length = max(len(x) for x in targets) + 1
        decoder = torch.zeros(batch_size, length, dtype=torch.long)
        labels = torch.full((batch_size, length), IGNORE_INDEX)
        for row, body in enumerate(targets):
            decoder[row, 0] = tokenizer.cls_id
            decoder[row, 1:len(body) + 1] = torch.tensor(body)
            labels[row, :len(body)] = torch.tensor(body)
            labels[row, len(body)] = tokenizer.sep_id
        batches.append(Batch(audio=audio, audio_padding_mask=mask, decoder_tokens=decoder,
                             decoder_padding_mask=labels == IGNORE_INDEX, labels={"lm": labels}))
    return batches


def loss_drop(name: str, tmp_path_factory, steps: int = 40) -> tuple[float, float]:
    """Mean loss of the first and of the last four of ``steps`` AdamW steps over four real batches.

    Sizes of one family shrink to the same model, so results are shared between them."""
    cfg = load_config(name)
    objective_cfg = cfg.data.objective.model_copy(update={"seq_length": 64}) if cfg.data.objective else None
    model_cfg = shrunk_model_config(name, vocab=_tokenizer().vocab_size)
    images = getattr(cfg.task, "type", None) in ("image_classification", "image_text", "image_text_match")
    speech = getattr(cfg.task, "type", None) == "asr"
    key = model_cfg.model_dump_json() + ("images" if images else "speech" if speech
                                         else objective_cfg.model_dump_json())
    if key not in _DROPS:
        pairs = getattr(cfg.task, "pair_input", None) == "separate"
        if speech:
            batches = _speech_batches(model_cfg)
        elif cfg.task is not None and cfg.task.type == "image_text_match":
            batches = _matching_batches(model_cfg)
        elif images and cfg.task.type == "image_text":
            batches = _captioned_image_batches(model_cfg)
            # 32 wide, N(0, 0.02) weights give every text and image nearly the same feature (uniform
            # in-batch logits, a vanishing gradient); CLIP initialises with width^-0.5 (docs/vision.md)
            model_cfg = model_cfg.model_copy(update={"init_std": 0.15})
        elif images:
            batches = _image_batches(model_cfg)
        elif pairs:
            batches = _pair_batches(cfg)
        else:
            batches = _batches(objective_cfg, tmp_path_factory)
        _DROPS[key] = _train(model_cfg, batches, steps)
    return _DROPS[key]


def _train(model_cfg, batches: list[Batch], steps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = build_model(model_cfg, provided=batches[0].provided())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        loss = total_loss(model(batches[step % len(batches)]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses[:4])), float(np.mean(losses[-4:]))


@pytest.mark.parametrize("name", zoo_names())
def test_shrunken_recipe_learns_from_its_objective(name, tmp_path_factory):
    if not TP.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    torch.set_num_threads(1)
    first, last = loss_drop(name, tmp_path_factory)
    print(f"loss-drop {name}: {first:.3f} -> {last:.3f}")
    # one nat for token-level objectives; classification losses start near ln(labels), so 30 % of it
    fall = min(1.0, 0.3 * first)
    assert last < first - fall, f"{name}: loss {first:.3f} -> {last:.3f} (expected a fall of at least {fall:.2f})"


def test_docs_zoo_table_is_current():
    from pentad.zoo_table import END, START, markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "zoo.md").read_text(encoding="utf-8")
    documented = text[text.index(START):text.index(END) + len(END)]
    assert documented == markdown(), "docs/zoo.md is stale: regenerate it with `pentad list zoo --table`"
