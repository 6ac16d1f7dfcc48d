"""A static (pre-allocated) key/value cache gives exactly the tokens of the dynamic one for every
model family (greedy, seeded sampling, beam search, left-padded batches); its memory is allocated
once; options that cannot work are refused; a compiled step does not recompile as decoding goes."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from pentad.generation import GenerationConfig, generate
from pentad.generation.config import GenerationInputError
from pentad.generation.search import start_session
from pentad.layers.cache import StaticKVCache

from .models import DECODER_ONLY, ENCODER_DECODER, PROMPTS, tiny_model

START, STOP = 0, 1
BASE = dict(max_new_tokens=8, decoder_start_token_id=START, stop_token_ids=[STOP], pad_token_id=2)


@pytest.fixture(scope="module", params=DECODER_ONLY + ENCODER_DECODER)
def family_model(request):
    return request.param, tiny_model(request.param)


@pytest.mark.parametrize("options", [
    {},
    {"do_sample": True, "top_k": 20, "seed": 5, "num_return_sequences": 2},
    {"num_beams": 3, "num_return_sequences": 2},
], ids=["greedy", "sample", "beam"])
def test_static_equals_dynamic(family_model, options) -> None:
    family, model = family_model
    dynamic = generate(model, PROMPTS, **BASE, **options)
    static = generate(model, PROMPTS, cache="static", **BASE, **options)
    assert static.sequences() == dynamic.sequences()
    torch.testing.assert_close(static.scores, dynamic.scores, atol=1e-4, rtol=0)


def test_static_padded_batch_equals_each_prompt_alone(family_model) -> None:
    family, model = family_model
    batch = generate(model, PROMPTS, cache="static", **BASE).sequences()
    for prompt, expected in zip(PROMPTS, batch):
        assert generate(model, [prompt], cache="static", **BASE).sequences()[0] == expected


def test_static_with_decoder_prompt() -> None:
    model = tiny_model("t5")
    options = dict(BASE, decoder_prompt_ids=[7, 9])
    assert (generate(model, PROMPTS, cache="static", **options).sequences()
            == generate(model, PROMPTS, **options).sequences())


def test_static_cache_memory_is_preallocated() -> None:
    model = tiny_model("llama")  # 2 layers, 2 key/value heads of 8 dimensions
    config = GenerationConfig(cache="static", **BASE)
    session = start_session(model, PROMPTS, config)
    assert isinstance(session.cache, StaticKVCache)
    session.prefill()
    rows, capacity = len(PROMPTS), max(map(len, PROMPTS)) + BASE["max_new_tokens"]
    expected = 2 * 2 * rows * 2 * capacity * 8 * 4  # layers x (k, v) x rows x heads x positions x dims x fp32
    assert session.cache.memory_bytes() == expected
    addresses = [layer.keys.data_ptr() for layer in session.cache.layers]
    for _ in range(3):
        session.step(torch.full((rows,), 5))
    assert session.cache.memory_bytes() == expected
    session.reorder(torch.tensor([2, 0, 1]))
    assert [layer.keys.data_ptr() for layer in session.cache.layers] == addresses, "reorder must stay in place"
    assert session.cache.length == max(map(len, PROMPTS)) + 3


def test_config_validation_messages() -> None:
    with pytest.raises(ValidationError, match="compile=true needs cache='static'"):
        GenerationConfig(compile=True)
    with pytest.raises(ValidationError, match="cache='static' needs use_cache=true"):
        GenerationConfig(cache="static", use_cache=False)
    with pytest.raises(ValidationError):
        GenerationConfig(cache="pinned")
    assert GenerationConfig(cache="static", compile=True).compile


def test_static_refused_for_a_stack_without_a_cache() -> None:
    from pentad.builder import build_model
    from pentad.components.model_config import model_config_class

    config = model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 32,
        "embedding": {"parts": ["word"], "dropout": 0.0},
        "encoder": {"type": "lstm", "num_layers": 1, "dropout": 0.0},
        "targets": [{"type": "lm"}]})
    model = build_model(config, training=False).eval()
    with pytest.raises(GenerationInputError, match="cache='static'.*keeps none"):
        generate(model, [[3, 4]], cache="static", max_new_tokens=2)


def test_compiled_step_equals_eager_without_recompiling() -> None:
    counters = pytest.importorskip("torch._dynamo.utils").counters
    torch._dynamo.reset()
    model = tiny_model("gpt2")
    eager = generate(model, PROMPTS, cache="static", **BASE)
    counters.clear()
    compiled = generate(model, PROMPTS, cache="static", compile=True, **BASE)
    assert compiled.sequences() == eager.sequences()
    first = counters["stats"]["unique_graphs"]
    assert first >= 1
    # A second generation of the same shapes reuses the compiled step (unique_graphs counts every
    # (re)compiled frame); test_compiled_steps_after_the_first_compile_nothing checks the steps
    # within one generation.
    again = generate(model, PROMPTS, cache="static", compile=True, **BASE)
    assert again.sequences() == eager.sequences()
    assert counters["stats"]["unique_graphs"] == first
    assert counters["recompiles"] == {} or sum(counters["recompiles"].values()) == 0


def _static_address(tensor) -> bool:
    # torch._dynamo.mark_static_address records its mark as this attribute of the tensor
    return getattr(tensor, "_dynamo_static_input_type", None) is not None


def _encoder_decoder_step_inputs(session) -> list:
    layers = session.cache.layers
    assert layers and all(layer.cross_keys is not None for layer in layers)
    cross = [t for layer in layers for t in (layer.cross_keys, layer.cross_values)]
    assert session.source_padding is not None  # PROMPTS differ in length: the sources are padded
    return [session.memory, session.source_padding, *cross]


def test_encoder_decoder_step_inputs_are_static_addresses() -> None:
    """Cross-attention keys/values, the encoder memory and the source padding, read by every step,
    are marked as static addresses (CUDA graphs then do not copy them on each replay), also after
    ``expand`` makes new ones; a dynamic cache marks nothing."""
    model = tiny_model("t5")
    session = start_session(model, PROMPTS, GenerationConfig(cache="static", **BASE))
    session.prefill()
    inputs = _encoder_decoder_step_inputs(session)
    assert all(map(_static_address, inputs))
    session.step(torch.full((session.rows,), 5))
    session.expand(2)
    expanded = _encoder_decoder_step_inputs(session)
    assert expanded[0].shape[0] == 2 * len(PROMPTS)
    assert all(map(_static_address, expanded))
    assert not any(new is old for new, old in zip(expanded, inputs))
    dynamic = start_session(model, PROMPTS, GenerationConfig(**BASE))
    dynamic.prefill()
    assert not any(map(_static_address, _encoder_decoder_step_inputs(dynamic)))


def test_decoder_only_padding_is_a_static_address() -> None:
    session = start_session(tiny_model("gpt2"), PROMPTS, GenerationConfig(cache="static", **BASE))
    assert session.padding is not None and _static_address(session.padding)
    session.prefill()
    session.expand(2)
    assert session.padding.shape[0] == 2 * len(PROMPTS) and _static_address(session.padding)


@pytest.mark.parametrize("family,options", [
    ("t5", {}),
    ("bart", {}),
    ("bart", {"num_beams": 2}),
], ids=["t5-greedy", "bart-greedy", "bart-beam"])
def test_compiled_encoder_decoder_equals_eager(family, options) -> None:
    model = tiny_model(family)
    eager = generate(model, PROMPTS, cache="static", **BASE, **options)
    assert eager.sequences() == generate(model, PROMPTS, **BASE, **options).sequences()
    compiled = generate(model, PROMPTS, cache="static", compile=True, **BASE, **options)
    assert compiled.sequences() == eager.sequences()
    torch.testing.assert_close(compiled.scores, eager.scores, atol=1e-4, rtol=0)



def _compilations() -> tuple[int, int]:
    """(graphs compiled, frames compiled) since the counters were last cleared."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], counters["frames"]["total"]


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_compiled_steps_after_the_first_compile_nothing(family) -> None:
    """A generation of 12 tokens compiles exactly what one of 2 tokens (the prefill's and one
    compiled step) compiles: the steps after the first add no graph and no frame. (A step whose
    inputs changed kind after the first, say a position tensor that became an inference tensor,
    recompiled once at the second step: the count of one whole generation did not show it.)"""
    from torch._dynamo.utils import counters

    counts = {}
    model = tiny_model(family)
    for new in (2, 12):
        torch._dynamo.reset()
        counters.clear()
        with torch._dynamo.config.patch(error_on_recompile=True):
            result = generate(model, PROMPTS, cache="static", compile=True,
                              **dict(BASE, max_new_tokens=new, min_new_tokens=new))
        assert result.lengths.tolist() == [new] * len(PROMPTS)
        counts[new] = _compilations()
    assert counts[2][0] >= 1 and counts[2][1] >= 1
    assert counts[12] == counts[2]
