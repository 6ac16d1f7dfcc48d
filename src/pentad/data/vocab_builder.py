"""Train a vocabulary on a corpus with the Rust ``tokenizers`` trainers.

``build_vocab`` writes the files that the ``wordpiece`` and ``bpe`` tokenizers of
:mod:`pentad.data.tokenizers` load, and returns the tokenizer config for them:

- ``wordpiece``: ``vocab.txt`` (one token per line) starting with ``[PAD] [UNK] [CLS] [SEP] [MASK]``
  at ids 0-4, trained after BERT's normalisation and pre-tokenisation.
- ``bpe``: GPT-2 style byte-level ``vocab.json`` + ``merges.txt``; ``<|endoftext|>`` is id 0 and
  all 256 byte symbols are in the vocabulary, so no text is ever unknown.

The trainers read the corpus files line by line in Rust: the corpus is streamed, never loaded
whole, and memory grows with the number of distinct words, not with the corpus size.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import tokenizers as hf_tokenizers
from tokenizers import models, normalizers, pre_tokenizers, trainers

from pentad.data.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer, load_tokenizer
from pentad.errors import UserError
from pentad.files import temporary_dir

WORDPIECE_SPECIALS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BPE_SPECIALS: tuple[str, ...] = ("<|endoftext|>",)
_BYTE_SYMBOLS = 256


def _check_corpus(corpus_paths: Sequence[Path | str]) -> list[Path]:
    """Every corpus file exists and holds some non-whitespace text (read until the first)."""
    paths = [Path(p) for p in corpus_paths]
    if not paths:
        raise UserError("build_vocab: no corpus files given; pass at least one text file.")
    for path in paths:
        if not path.is_file():
            raise UserError(f"corpus file {path} does not exist (or is not a file).")
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 16):
                if chunk.strip():
                    break
            else:
                raise UserError(f"corpus file {path} is empty; a vocabulary needs text to learn from.")
    return paths


def _check_output(output_dir: Path) -> None:
    """Checked before training: a vocabulary is never written over another one (or anything else)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"vocabulary output {output_dir} exists and is not a directory; --output must name a new "
                        "or empty directory.")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        held = sorted(p.name for p in output_dir.iterdir())
        shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
        raise UserError(f"vocabulary output directory {output_dir} already exists and is not empty ({shown}); "
                        "choose a new --output or remove it first (a vocabulary is never overwritten: the "
                        "datasets and runs built on it depend on its token ids).")


def _wordpiece_setup(
    vocab_size: int, lowercase: bool, min_frequency: int, show_progress: bool
) -> tuple[hf_tokenizers.Tokenizer, trainers.Trainer]:
    # The same normaliser and pre-tokeniser as the `wordpiece` tokenizer, so that training sees
    # the words it will later cut into pieces.
    backend = hf_tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(WORDPIECE_SPECIALS),
        continuing_subword_prefix="##",
    )
    return backend, trainer


def _bpe_setup(
    vocab_size: int, lowercase: bool, min_frequency: int, show_progress: bool
) -> tuple[hf_tokenizers.Tokenizer, trainers.Trainer]:
    backend = hf_tokenizers.Tokenizer(models.BPE())
    if lowercase:
        backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(BPE_SPECIALS),
        # Every byte symbol, seen in the corpus or not: byte-level BPE then covers any text.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    return backend, trainer


def _write_vocab_txt(backend: hf_tokenizers.Tokenizer, path: Path) -> None:
    """Tokens in id order, one per line (the line number is the id)."""
    by_id = sorted((index, token) for token, index in backend.get_vocab(with_added_tokens=True).items())
    if [index for index, _ in by_id] != list(range(len(by_id))):
        raise RuntimeError("the trained WordPiece vocabulary has gaps in its ids")
    if [token for _, token in by_id[: len(WORDPIECE_SPECIALS)]] != list(WORDPIECE_SPECIALS):
        raise RuntimeError("the trained WordPiece vocabulary does not start with the special tokens")
    bad = [token for _, token in by_id if not token or "\n" in token or "\r" in token]
    if bad:  # the BERT pre-tokeniser splits on whitespace, so this cannot happen
        raise RuntimeError(f"trained tokens cannot be written one per line: {bad[:3]!r}")
    path.write_text("".join(token + "\n" for _, token in by_id), encoding="utf-8")


VocabKind = Literal["wordpiece", "bpe"]
KINDS: tuple[str, ...] = get_args(VocabKind)  # the kinds `pentad vocab build --kind` offers


def build_vocab(
    corpus_paths: Sequence[Path | str],
    kind: VocabKind,
    vocab_size: int,
    output_dir: Path,
    lowercase: bool = True,
    min_frequency: int = 2,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Train a ``kind`` vocabulary of ``vocab_size`` tokens on the corpus and write its files.

    Args:
        corpus_paths: UTF-8 text files, read line by line.
        kind: ``wordpiece`` (writes ``vocab.txt``) or ``bpe`` (writes ``vocab.json`` + ``merges.txt``).
        vocab_size: the size to aim for, special tokens included. WordPiece keeps every character
            of the corpus, so a very small size can be exceeded.
        output_dir: a new or empty directory (created if needed). A non-empty one is refused, as
            ``preprocess`` refuses one: datasets and runs built on a vocabulary depend on its ids.
        lowercase: lower-case the text before learning (and when tokenizing later).
        min_frequency: pairs seen fewer times are not merged.
        show_progress: show the trainer's progress bars.

    Returns:
        the tokenizer config dict, paths relative to ``output_dir``:
        ``load_tokenizer(result, base_dir=output_dir)`` loads the trained tokenizer.
    """
    if kind not in KINDS:
        raise UserError(f"build_vocab: unknown vocabulary kind {kind!r}; expected 'wordpiece' or 'bpe'.")
    smallest = len(WORDPIECE_SPECIALS) + 1 if kind == "wordpiece" else _BYTE_SYMBOLS + len(BPE_SPECIALS)
    if vocab_size < smallest:
        raise UserError(
            f"build_vocab: vocab_size {vocab_size} is too small for a {kind} vocabulary; it needs at "
            f"least {smallest} tokens"
            + (" (the 256 byte symbols and <|endoftext|>)." if kind == "bpe" else " (5 special tokens and one more).")
        )
    if min_frequency < 0:
        raise UserError(f"build_vocab: min_frequency must be >= 0, found {min_frequency}.")
    paths = _check_corpus(corpus_paths)
    output_dir = Path(output_dir)
    _check_output(output_dir)
    setup = _wordpiece_setup if kind == "wordpiece" else _bpe_setup
    backend, trainer = setup(vocab_size, lowercase, min_frequency, show_progress)
    try:
        backend.train([str(p) for p in paths], trainer)
    except Exception as exc:  # the Rust reader reports e.g. invalid UTF-8 as a plain Exception
        names = ", ".join(str(p) for p in paths)
        raise UserError(f"training a {kind} vocabulary on {names} failed: {exc}") from None

    # Written into a temporary directory beside the output, checked, then renamed into place: a
    # failure (a full disk, Ctrl-C) leaves no half-written vocabulary that a new attempt would refuse.
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = temporary_dir(output_dir.parent, f".{output_dir.name}.partial.")
    try:
        if kind == "wordpiece":
            _write_vocab_txt(backend, staging / "vocab.txt")
            cfg = WordPieceTokenizer.Config(vocab=Path("vocab.txt"), lowercase=lowercase)
        else:
            backend.model.save(str(staging))  # writes vocab.json and merges.txt
            cfg = ByteLevelBPETokenizer.Config(vocab=Path("vocab.json"), merges=Path("merges.txt"),
                                               lowercase=lowercase)
        result = cfg.model_dump(mode="json")
        load_tokenizer(result, base_dir=staging)  # what was written loads: fail here, not later
        os.replace(staging, output_dir)  # onto a missing or empty directory
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result
