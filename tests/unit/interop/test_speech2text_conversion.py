"""Speech-to-text conversion parity: a Hugging Face ``Speech2TextForConditionalGeneration`` built
from a tiny ``Speech2TextConfig`` with random weights (no download) converts to a pentad
encoder-decoder with a ``speech`` part and back.

* HF -> pentad: encoder states and decoder logits equal HF's within 1e-5 relative in fp32 on
  filterbank-shaped features [B, T, 80] of two lengths (zero frames after the shorter one, an
  attention mask) and padded decoder rows; the ``--verify`` report (every layer) agrees.
* HF's subsampled encoder attention mask is pentad's speech padding mask.
* HF -> pentad -> HF: bitwise-identical state dicts and the same config; ``pentad convert`` on the
  command line does the same.
* pentad -> HF: the ``s2t`` recipe layout (family guessed) loads with ``AutoModelForSpeechSeq2Seq``;
  options either side cannot express are refused with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import assert_same_hf_checkpoint, make_run, perturb, variant
from tests.unit.interop.test_cli import exit_status

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.interop.verify import speech_padding_mask
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5
VOCAB, HIDDEN, FEATURES = 40, 32, 80
FRAMES, DECODER = (37, 22), (6, 4)  # two utterances of different lengths, two transcripts


def s2t_config(**over):
    return transformers.Speech2TextConfig(**{
        "vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": 2, "decoder_layers": 1,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
        "conv_channels": 24, "conv_kernel_sizes": [5, 3], "num_conv_layers": 2, "input_feat_per_channel": FEATURES,
        "max_source_positions": 40, "max_target_positions": 16, **over})


def save_hf(directory, config, class_name="Speech2TextForConditionalGeneration"):
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config)
    perturb(model, 1)
    model.save_pretrained(directory)
    return model.eval()


def pentad_model(run_dir):
    cfg, _ = load_run(run_dir)
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(run_dir)), str(run_dir))
    return cfg, model.eval()


def relative(ours, theirs):
    return float((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max())


def inputs(pad):
    """Features [2, T, 80] zero after each row's length, as HF's feature extractor pads, and right-padded
    decoder tokens that never hold the padding id at a real position."""
    g = torch.Generator().manual_seed(3)
    frames = torch.randn(len(FRAMES), max(FRAMES), FEATURES, generator=g)
    frame_padding = torch.arange(max(FRAMES))[None, :] >= torch.tensor(FRAMES)[:, None]
    frames[frame_padding] = 0.0
    tokens = torch.randint(0, VOCAB, (len(DECODER), max(DECODER)), generator=g)
    tokens = torch.where(tokens == pad, (tokens + 1) % VOCAB, tokens)
    token_padding = torch.arange(max(DECODER))[None, :] >= torch.tensor(DECODER)[:, None]
    tokens[token_padding] = pad
    batch = Batch(audio=frames, audio_padding_mask=frame_padding, decoder_tokens=tokens,
                  decoder_padding_mask=token_padding)
    hf_inputs = {"input_features": frames, "attention_mask": (~frame_padding).long(), "decoder_input_ids": tokens,
                 "decoder_attention_mask": (~token_padding).long()}
    return batch, hf_inputs


def test_hf_to_pentad_outputs_match(tmp_path):
    hf = save_hf(tmp_path / "hf", s2t_config())
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.family == "speech_to_text" and report.architecture == "Speech2TextForConditionalGeneration"
    assert len(report.verification) == (1 + 2) + (1 + 1) + 1  # embeddings + layers per stack, logits
    cfg, net = pentad_model(tmp_path / "pentad")
    speech, positions = cfg.model.embedding.parts
    assert (speech.conv_channels, speech.kernel_sizes, speech.feature_size) == ([24, 2 * HIDDEN], [5, 3], FEATURES)
    assert (positions.offset, positions.max_positions, positions.spacing) == (2, 40, "tensor2tensor")
    assert cfg.task.type == "asr" and cfg.task.decoder_start == hf.config.decoder_start_token_id == 2
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in hf.parameters())
    batch, hf_inputs = inputs(pad=1)
    with torch.no_grad():
        ref = hf(**hf_inputs, output_hidden_states=True)
        hidden, padding = net.encode(batch)
        # HF's encoder attention mask, subsampled from the frame mask, is pentad's speech padding mask
        hf_mask = hf.model._get_feature_vector_attention_mask(hidden.shape[1], hf_inputs["attention_mask"])
        assert torch.equal(hf_mask.bool(), ~padding) and torch.equal(padding, speech_padding_mask(cfg.model, batch))
        assert padding.any() and not padding[0].any()
        logits = net.targets["lm"](net.decode(batch, hidden, padding), batch).logits
    keep = ~padding
    assert relative(hidden[keep], ref.encoder_last_hidden_state[keep]) <= TOL
    real = ~batch.decoder_padding_mask
    assert relative(logits[real], ref.logits[real]) <= TOL


def test_hf_to_pentad_to_hf_is_bitwise(tmp_path):
    save_hf(tmp_path / "hf", s2t_config(scale_embedding=False, tie_word_embeddings=False, pad_token_id=3,
                                        activation_function="gelu"))
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "Speech2TextFeatureExtractor", "num_mel_bins": FEATURES, "sampling_rate": 16000,
         "do_ceptral_normalize": True, "normalize_means": True, "normalize_vars": True}))
    assert exit_status(["convert", "hf-to-pentad", str(tmp_path / "hf"), str(tmp_path / "pentad"), "--verify"]) == 0
    cfg, _ = load_run(tmp_path / "pentad")
    assert cfg.model.embedding.parts[1].offset == 4 and not cfg.model.tie_word_embeddings
    assert (cfg.task.audio.sample_rate, cfg.task.audio.feature_size, cfg.task.audio.cmvn) == (16000, FEATURES, True)
    assert exit_status(["convert", "pentad-to-hf", str(tmp_path / "pentad"), str(tmp_path / "back"), "--verify"]) == 0
    assert "lm_head.weight" in assert_same_hf_checkpoint(tmp_path / "hf", tmp_path / "back")


def test_bare_model_and_stored_position_tables(tmp_path):
    """A Speech2TextModel checkpoint (no lm_head) converts; a position table older checkpoints stored
    (``embed_positions.weights``) is read and left out, as transformers ignores it."""
    save_hf(tmp_path / "hf", s2t_config(), "Speech2TextModel")
    path = tmp_path / "hf" / "model.safetensors"
    state = safetensors_torch.load_file(str(path))
    assert not any("embed_positions" in k for k in state)  # a non-persistent buffer in transformers
    state["encoder.embed_positions.weights"] = torch.zeros(42, HIDDEN)
    safetensors_torch.save_file(state, str(path), metadata={"format": "pt"})
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == "Speech2TextModel"


def test_s2t_recipe_exports_and_loads(tmp_path):
    """The s2t recipe's layout, shrunk: the family is guessed from the speech part and the model loads
    with transformers' auto class; the pentad -> HF -> pentad weights are bitwise the same."""
    from importlib.resources import files

    import yaml

    recipe = yaml.safe_load(files("pentad.zoo").joinpath("s2t/small.yaml").read_text())["model"]
    recipe["embedding"]["parts"][0]["conv_channels"] = [24, 2 * HIDDEN]
    model = variant(recipe, hidden_size=HIDDEN, vocab_size=VOCAB,
                    encoder={**recipe["encoder"], "num_layers": 1, "ffn_size": 48},
                    decoder={**recipe["decoder"], "num_layers": 1, "ffn_size": 48})
    make_run(tmp_path / "run", model)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)
    assert report.ok, report.render()
    assert report.family == "speech_to_text" and any("guessed" in note for note in report.notes)
    loaded = transformers.AutoModelForSpeechSeq2Seq.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(loaded).__name__ == "Speech2TextForConditionalGeneration"
    assert (loaded.config.pad_token_id, loaded.config.conv_channels) == (1, 24)
    # the recipe's tables are facebook/s2t-*-librispeech-asr's
    assert (loaded.config.max_source_positions, loaded.config.max_target_positions) == (6000, 1024)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "again")
    before, after = (read_weights(find_weights(tmp_path / d)) for d in ("run", "again"))
    assert sorted(before) == sorted(after)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("change, message", [
    ({"conv_kernel_sizes": [4, 5]}, "even sizes"),
    ({"activation_function": "mish"}, "activation_function 'mish'"),
    ({"pad_token_id": 0}, "real frames get no position"),
], ids=["even-kernel", "activation", "pad-0"])
def test_hf_options_pentad_cannot_hold(tmp_path, change, message):
    save_hf(tmp_path / "hf", s2t_config())
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(change)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=f"cannot convert .*speech_to_text.*{message}"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


SPEECH = {"type": "speech", "feature_size": FEATURES, "conv_channels": [24, 2 * HIDDEN], "kernel_sizes": [5, 5]}
TABLE = {"type": "sinusoidal", "interleave": False, "spacing": "tensor2tensor", "offset": 2, "max_positions": 40}
_STACK = {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 48, "activation": "relu",
          "norm_position": "pre", "final_norm": True, "layer_norm_eps": 1e-5}
TINY_S2T = {
    "hidden_size": HIDDEN, "vocab_size": VOCAB, "max_seq_length": 16, "tie_word_embeddings": True,
    "embedding": {"parts": [SPEECH, TABLE], "norm": False},
    "target_embedding": {"parts": [{"type": "word", "scale": True}, {**TABLE, "max_positions": 16}], "norm": False},
    "encoder": {**_STACK, "mask": "bidirectional"}, "decoder": _STACK,
    "targets": [{"type": "lm", "bias": False}],
}


@pytest.mark.parametrize("change, message", [
    ({"embedding": {"parts": [{**SPEECH, "activation": "gelu", "conv_channels": [24, HIDDEN]}, TABLE], "norm": False}},
     "has a GLU"),
    ({"embedding": {"parts": [{**SPEECH, "conv_channels": [24, 16, 64], "kernel_sizes": [5, 5, 5]}, TABLE],
                    "norm": False}}, "one channel count"),
    ({"embedding": {"parts": [SPEECH, {**TABLE, "offset": 0}], "norm": False}}, "one offset"),
    ({"embedding": {"parts": [{**SPEECH, "scale": False}, TABLE], "norm": False}}, "one scale_embedding"),
    ({"targets": [{"type": "lm", "bias": True}]}, "without a bias"),
], ids=["gelu", "channels", "offsets", "scales", "lm-bias"])
def test_models_speech2text_cannot_express_are_refused(tmp_path, change, message):
    make_run(tmp_path / "run", variant(TINY_S2T, **change))
    with pytest.raises(UserError, match=f"cannot export .* as speech_to_text: .*{message}"):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def write_tokenizer(directory, swap: bool = False):
    """fairseq S2T's tokenizer files: a SentencePiece model trained with the dictionary's special ids
    and the vocab.json that numbers its pieces (two pieces swapped with ``swap``)."""
    from tests.unit.interop.test_families import tiny_model

    data = tiny_model(bos_id=0, pad_id=1, eos_id=2, unk_id=3)
    (directory / "sentencepiece.bpe.model").write_bytes(data)
    import sentencepiece

    model = sentencepiece.SentencePieceProcessor(model_proto=data)
    vocab = {model.id_to_piece(i): i for i in range(model.get_piece_size())}
    if swap:
        a, b = model.id_to_piece(10), model.id_to_piece(11)
        vocab[a], vocab[b] = vocab[b], vocab[a]
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Speech2TextTokenizer", "do_upper_case": True, "model_max_length": 16}))


def test_tokenizer_converts_both_ways(tmp_path):
    save_hf(tmp_path / "hf", s2t_config())
    write_tokenizer(tmp_path / "hf")
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(reference).__name__ == "Speech2TextTokenizer"
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    assert any(note.startswith("do_upper_case") for note in report.notes)
    _, tokenizer = load_run(tmp_path / "pentad")
    text = "the quick brown fox jumps over a lazy dog, zebra"  # "z" is no piece: unk
    expected = reference(text)["input_ids"]
    assert reference.unk_token_id in expected and expected[-1] == reference.eos_token_id
    assert tokenizer.encode(text) == expected[:-1]  # HF appends the end token; the asr task does too
    assert (tokenizer.bos_id, tokenizer.pad_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert type(again).__name__ == "Speech2TextTokenizer" and again(text)["input_ids"] == expected
    assert json.loads((tmp_path / "back" / "vocab.json").read_text()) == \
        json.loads((tmp_path / "hf" / "vocab.json").read_text())


def test_tokenizer_whose_vocab_renumbers_pieces_is_refused(tmp_path):
    save_hf(tmp_path / "hf", s2t_config())
    write_tokenizer(tmp_path / "hf", swap=True)
    with pytest.raises(UserError, match=r"vocab.json numbers the pieces of sentencepiece.bpe.model differently .*2 "
                                        r"differ"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
