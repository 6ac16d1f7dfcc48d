"""Cached decoding gives exactly the tokens of uncached decoding (the whole prefix re-run at every
step) for every model family; left-padded batches equal each prompt alone; seeds reproduce samples."""

from __future__ import annotations

import pytest
import torch

from pentad.generation import GenerationConfig, generate, stream
from pentad.generation.config import GenerationInputError

from .models import DECODER_ONLY, ENCODER_DECODER, PROMPTS, VOCAB, tiny_model

FAMILIES = DECODER_ONLY + ENCODER_DECODER
START, STOP = 0, 1
BASE = dict(max_new_tokens=10, decoder_start_token_id=START, stop_token_ids=[STOP], pad_token_id=2)


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param)


def test_cached_greedy_equals_uncached(family_model) -> None:
    family, model = family_model
    cached = generate(model, PROMPTS, **BASE)
    uncached = generate(model, PROMPTS, use_cache=False, **BASE)
    assert cached.sequences() == uncached.sequences()
    torch.testing.assert_close(cached.scores, uncached.scores, atol=1e-4, rtol=0)
    assert len({t for s in cached.sequences() for t in s}) > 3, "degenerate test model: too few distinct tokens"


def test_cached_beam_search_equals_uncached(family_model) -> None:
    family, model = family_model
    options = dict(BASE, num_beams=3, num_return_sequences=2, max_new_tokens=6)
    cached = generate(model, PROMPTS, **options)
    uncached = generate(model, PROMPTS, use_cache=False, **options)
    assert cached.sequences() == uncached.sequences()
    torch.testing.assert_close(cached.scores, uncached.scores, atol=1e-4, rtol=0)
    assert cached.tokens.shape[0] == len(PROMPTS) * 2
    # Beams come best first.
    assert bool((cached.scores.view(-1, 2)[:, 0] >= cached.scores.view(-1, 2)[:, 1]).all())


def test_padded_batch_equals_each_prompt_alone(family_model) -> None:
    family, model = family_model
    batch = generate(model, PROMPTS, **BASE).sequences()
    for prompt, expected in zip(PROMPTS, batch):
        assert generate(model, [prompt], **BASE).sequences()[0] == expected


def test_tensor_prompts_with_any_padding_side(family_model) -> None:
    """A [B, L] tensor right- or left-padded is re-padded as the model needs; same tokens as lists."""
    family, model = family_model
    expected = generate(model, PROMPTS, **BASE).sequences()
    width = max(map(len, PROMPTS))
    for side in ("left", "right"):
        tokens = torch.full((len(PROMPTS), width), 2)
        padding = torch.ones(len(PROMPTS), width, dtype=torch.bool)
        for i, p in enumerate(PROMPTS):
            span = slice(width - len(p), width) if side == "left" else slice(0, len(p))
            tokens[i, span], padding[i, span] = torch.tensor(p), False
        assert generate(model, tokens, padding_mask=padding, **BASE).sequences() == expected


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_sampling_is_reproducible_with_a_seed(family: str) -> None:
    model = tiny_model(family)
    options = dict(BASE, do_sample=True, top_k=20, top_p=0.95, temperature=1.3, num_return_sequences=2)
    first = generate(model, PROMPTS, seed=11, **options).sequences()
    assert generate(model, PROMPTS, seed=11, **options).sequences() == first
    assert generate(model, PROMPTS, generator=torch.Generator().manual_seed(11), **options).sequences() == first
    assert generate(model, PROMPTS, seed=12, **options).sequences() != first
    # Cached and uncached decoding draw the same samples.
    assert generate(model, PROMPTS, seed=11, use_cache=False, **options).sequences() == first


def test_stop_tokens_end_rows_and_fill_the_rest() -> None:
    model = tiny_model("llama")
    free = generate(model, PROMPTS, **dict(BASE, stop_token_ids=[])).sequences()
    stop = free[1][3]  # a token row 1 produces at step 4
    out = generate(model, PROMPTS, **dict(BASE, stop_token_ids=[stop]))
    for row, full in zip(out.sequences(), free):
        cut = full.index(stop) + 1 if stop in full else len(full)
        assert row == full[:cut]
    assert out.stopped.tolist() == [stop in full for full in free]
    for i, n in enumerate(out.lengths.tolist()):
        assert set(out.tokens[i, n:].tolist()) <= {2}
    # min_new_tokens forbids the stop token early.
    late = generate(model, PROMPTS, **dict(BASE, stop_token_ids=[stop], min_new_tokens=8)).sequences()
    assert all(stop not in row[:8] for row in late)


def test_all_rows_stopping_ends_early() -> None:
    model = tiny_model("gpt2")
    first = generate(model, [PROMPTS[0]], **dict(BASE, stop_token_ids=[])).sequences()[0][0]
    out = generate(model, [PROMPTS[0]], **dict(BASE, stop_token_ids=[first]))
    assert out.sequences() == [[first]] and out.tokens.shape == (1, 1)


def test_stream_and_on_step_see_the_generated_tokens() -> None:
    model = tiny_model("bloom")
    expected = generate(model, [PROMPTS[2]], **BASE).sequences()[0]
    assert list(stream(model, PROMPTS[2], **BASE)) == expected
    seen: list[list[int]] = []
    generate(model, PROMPTS, on_step=lambda t: seen.append(t.tolist()), **BASE)
    assert [step[2] for step in seen][:len(expected)] == expected
    # Sampling streams the same tokens as generate with the same seed.
    sampled = generate(model, [PROMPTS[0]], do_sample=True, seed=5, **BASE).sequences()[0]
    assert list(stream(model, PROMPTS[0], do_sample=True, seed=5, **BASE)) == sampled


def test_repetition_penalty_changes_greedy_output() -> None:
    model = tiny_model("bloom")
    plain = generate(model, PROMPTS, **BASE).sequences()
    penalised = generate(model, PROMPTS, repetition_penalty=3.0, **BASE).sequences()
    assert penalised != plain
    repeats = lambda rows: sum(len(r) - len(set(r)) for r in rows)  # noqa: E731
    assert repeats(penalised) < repeats(plain)
    assert generate(model, PROMPTS, repetition_penalty=3.0, use_cache=False, **BASE).sequences() == penalised


def test_training_mode_is_restored() -> None:
    model = tiny_model("gpt2").train()
    generate(model, PROMPTS, **BASE)
    assert model.training
    tokens = stream(model, PROMPTS[0], **BASE)
    next(tokens)
    assert not model.training  # eval while streaming
    tokens.close()
    assert model.training


def test_bad_inputs() -> None:
    model = tiny_model("gpt2")
    with pytest.raises(GenerationInputError, match="empty"):
        generate(model, [[5], []], **BASE)
    with pytest.raises(GenerationInputError, match="positions"):
        generate(model, [list(range(3, 60))], **dict(BASE, max_new_tokens=20))
    with pytest.raises(GenerationInputError, match="decoder_start_token_id"):
        generate(tiny_model("t5"), PROMPTS, max_new_tokens=3)
    with pytest.raises(ValueError, match="num_return_sequences"):
        GenerationConfig(num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="greedy"):
        GenerationConfig(num_return_sequences=2)
    with pytest.raises(ValueError, match="sampling"):
        GenerationConfig(num_beams=2, do_sample=True)
    with pytest.raises(ValueError):
        GenerationConfig(top_p=1.5)


def test_outputs_are_ordinary_tensors() -> None:
    out = generate(tiny_model("gpt2"), PROMPTS, **BASE)
    out.tokens[0, 0] = 7  # an inference-mode tensor would refuse this outside inference mode
    assert not out.tokens.is_inference()


@pytest.mark.parametrize("encoder", [{"type": "lstm", "num_layers": 1, "dropout": 0.0},
                                     {"type": "gatedcnn", "num_layers": 2, "kernel_size": 3, "block_size": 1,
                                      "dropout": 0.0}])
def test_encoders_without_a_cache_re_run_the_sequence(encoder) -> None:
    """Recurrent and convolutional LMs have no key/value cache: generation falls back to re-running."""
    from pentad.builder import build_model
    from pentad.components.model_config import model_config_class

    cfg = model_config_class().model_validate({
        "hidden_size": 32, "vocab_size": 61, "tie_word_embeddings": False, "init_std": 0.3,
        "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0}, "encoder": encoder,
        "targets": [{"type": "lm"}]})
    torch.manual_seed(0)
    model = build_model(cfg, training=False).eval()
    batch = generate(model, PROMPTS, **BASE).sequences()
    assert batch == [generate(model, [p], **BASE).sequences()[0] for p in PROMPTS]


@pytest.mark.parametrize("beams", [1, 3])
def test_decoder_prompt_and_suppressed_tokens(beams: int) -> None:
    """An encoder-decoder's decoder prompt is read after the start token (as if forced), never
    returned; suppressed tokens never appear, begin-suppressed ones not first; cached = uncached."""
    model = tiny_model("bart")
    options = dict(BASE, stop_token_ids=[], num_beams=beams)
    prompt = [7, 9]
    out = generate(model, PROMPTS, decoder_prompt_ids=prompt, **options)
    assert out.tokens.shape[1] == BASE["max_new_tokens"]
    assert generate(model, PROMPTS, decoder_prompt_ids=prompt, use_cache=False, **options).sequences() == \
        out.sequences()
    if beams == 1:  # the same as stepping the prompt's tokens in after the start token
        from pentad.generation.search import start_session

        session = start_session(model, PROMPTS, GenerationConfig(**dict(options, max_new_tokens=12)))
        session.prefill()
        rows = len(PROMPTS)
        session.step(torch.full((rows,), prompt[0]))
        logits = session.step(torch.full((rows,), prompt[1]))
        assert logits.argmax(-1).tolist() == out.tokens[:, 0].tolist()
        assert out.sequences() != generate(model, PROMPTS, **options).sequences()
    common = [t for row in out.sequences() for t in row]
    banned = sorted(set(common))[:3]
    first = sorted({row[0] for row in out.sequences()})
    clean = generate(model, PROMPTS, decoder_prompt_ids=prompt, suppress_tokens=banned,
                     begin_suppress_tokens=first, **options).sequences()
    assert not {t for row in clean for t in row} & set(banned)
    assert not {row[0] for row in clean} & set(first)
    with pytest.raises(GenerationInputError, match="decoder's 64 positions"):
        generate(model, PROMPTS, decoder_prompt_ids=[7] * 60, **options)
    with pytest.raises(GenerationInputError, match="decoder_prompt_ids"):
        generate(tiny_model("gpt2"), PROMPTS, decoder_prompt_ids=prompt, **options)


def test_decodings_that_cannot_fit_are_refused_before_allocation(monkeypatch) -> None:
    """The key/value cache and next-token scores of every row are estimated first: a billion beams
    (terabytes for this tiny model) are refused at once with the estimate, nothing allocated."""
    import time

    from pentad import memory
    from pentad.errors import UserError
    from pentad.generation.search import decoding_memory

    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    model = tiny_model("gpt2")
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"not enough memory for generating: it needs at least [\d.]+ TiB "
                                        r"\(1,000,000,000 rows \(1 prompts x 1,000,000,000\): key/value cache"):
        generate(model, [[5, 6, 7]], num_beams=10 ** 9, max_new_tokens=8)
    assert time.perf_counter() - start < 2.0
    # the estimate: 2 layers x (keys + values) x 32 wide x 4 bytes x (3 + 8) positions per row, and the
    # fp32 scores of 61 tokens twice
    config = GenerationConfig(num_beams=100_000, max_new_tokens=8)
    need, _ = decoding_memory(model, 1, 3, config)
    assert need == 100_000 * (2 * 2 * 32 * 4 * 11 + VOCAB * 4 * 2)
    # --num-beams 100000 (612 MB here) on a machine with 256 MiB free is refused; 2 beams pass
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (256 * 1024 ** 2, "this machine"))
    with pytest.raises(UserError, match="this machine has 256.0 MiB available"):
        generate(model, [[5, 6, 7]], num_beams=100_000, max_new_tokens=8)
    assert generate(model, [[5, 6, 7]], num_beams=2, max_new_tokens=8).tokens.shape[0] == 1
