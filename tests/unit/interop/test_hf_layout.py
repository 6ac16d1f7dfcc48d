"""pentad -> Hugging Face files -> pentad without ``transformers``: key maps, config translation
both ways, tokenizer files, and the errors of each step. (Numerical parity with ``transformers``
is in tests/parity/test_conversion.py.)"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pentad.errors import UserError
from pentad.interop import convert
from pentad.interop.convert import read_interop
from pentad.interop.hf.families import guess_family
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, read_weights

from .helpers import BERT, GPT2, PENTAD_MODELS, ROBERTA, make_run, resolved, variant, write_bpe, write_wordpiece


@pytest.mark.parametrize("family, model", [(f, m) for _, f, m in PENTAD_MODELS], ids=[i for i, _, _ in PENTAD_MODELS])
def test_pentad_to_hf_to_pentad_is_bitwise_and_config_equivalent(tmp_path, family, model):
    cfg, _ = make_run(tmp_path / "run", model)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    before = read_weights(tmp_path / "run" / "model.safetensors")
    after = read_weights(find_weights(tmp_path / "back"))
    assert set(before) == set(after)
    for key in before:
        assert torch.equal(before[key], after[key]), key
    back_cfg, _ = load_run(tmp_path / "back")
    assert resolved(back_cfg.model) == resolved(cfg.model)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["model_type"] == family
    assert read_interop(tmp_path / "back")["source"]["model_type"] == family


def test_exported_bert_uses_hugging_face_names(tmp_path):
    make_run(tmp_path / "run", BERT)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    assert report.architecture == "BertForPreTraining"
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    ours = read_weights(tmp_path / "run" / "model.safetensors")
    qkv = ours["encoder.layers.1.attention.qkv.weight"]
    assert torch.equal(state["bert.encoder.layer.1.attention.self.key.weight"], qkv[32:64])
    assert torch.equal(state["bert.pooler.dense.weight"], ours["targets.sp.pooler.weight"])
    assert torch.equal(state["cls.seq_relationship.bias"], ours["targets.sp.classifier.bias"])
    # The tied decoder weight is not written (as transformers 5 saves it).
    assert "cls.predictions.decoder.weight" not in state and "cls.predictions.bias" in state


def test_roberta_positions_keep_their_offset(tmp_path):
    make_run(tmp_path / "run", ROBERTA)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="roberta")
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["max_position_embeddings"] == 24 + 2 and hf_config["pad_token_id"] == 1
    table = load_file(str(tmp_path / "hf" / "model.safetensors"))["roberta.embeddings.position_embeddings.weight"]
    ours = read_weights(tmp_path / "run" / "model.safetensors")["embedding.pos.weight"]
    assert torch.equal(table[2:], ours) and not table[:2].any()
    # HF -> pentad keeps rows 0..1 aside, so that the way back restores them bit for bit.
    hf_state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    hf_state["roberta.embeddings.position_embeddings.weight"][:2] = torch.randn(2, 32)
    save_file(hf_state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "imported")
    assert (tmp_path / "imported" / "interop_extra.safetensors").is_file()
    convert("pentad-to-hf", tmp_path / "imported", tmp_path / "hf2")
    again = load_file(str(tmp_path / "hf2" / "model.safetensors"))["roberta.embeddings.position_embeddings.weight"]
    assert torch.equal(again, hf_state["roberta.embeddings.position_embeddings.weight"])


def test_hf_config_survives_hf_to_pentad_to_hf(tmp_path):
    make_run(tmp_path / "run", variant(BERT, targets=[{"type": "cls", "num_labels": 3}]))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(hidden_act="gelu", id2label={"0": "neg", "1": "neu", "2": "pos"},
                  label2id={"neg": 0, "neu": 1, "pos": 2}, use_cache=False, custom_key=[1, 2])
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "hf2")
    assert json.loads((tmp_path / "hf2" / "config.json").read_text()) == config


@pytest.mark.parametrize("family, model, write", [("bert", BERT, write_wordpiece), ("gpt2", GPT2, write_bpe),
                                                  ("roberta", ROBERTA, lambda d: write_bpe(d, roberta=True))],
                         ids=["wordpiece", "gpt2-bpe", "roberta-bpe"])
def test_tokenizer_files_round_trip(tmp_path, family, model, write):
    cfg, _ = make_run(tmp_path / "run", variant(model, max_seq_length=20, embedding={
        **model["embedding"], "parts": [*model["embedding"]["parts"][:1], {"type": "pos", "max_positions": 24},
                                        *model["embedding"]["parts"][2:]]}), tokenizer=write(tmp_path / "tok"))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family)
    tok_config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert tok_config["model_max_length"] == 20
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    back_cfg, back_tok = load_run(tmp_path / "back")
    _, tok = load_run(tmp_path / "run")
    text = "The quick brown fox jumps over the lazy dog!"
    assert back_tok.encode(text) == tok.encode(text)
    assert back_tok.special_tokens == tok.special_tokens
    # model_max_length carries max_seq_length across; the position table keeps its size.
    assert resolved(back_cfg.model) == resolved(cfg.model)
    assert str(back_cfg.tokenizer.vocab).startswith(str(tmp_path / "back" / "tokenizer"))  # the run's own copy


def test_headless_bert_imports_with_a_recorded_zero_classifier(tmp_path):
    make_run(tmp_path / "run", variant(BERT, targets=[{"type": "sp"}]))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    # Make it a bare BertModel checkpoint: no NSP head, keys without the "bert." prefix.
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    bare = {k[len("bert."):]: v for k, v in state.items() if k.startswith("bert.")}
    save_file(bare, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    assert report.architecture == "BertModel"
    assert any("written as zeros" in n for n in report.notes)
    weights = read_weights(find_weights(tmp_path / "pentad"))
    assert not weights["targets.sp.classifier.weight"].any()
    assert read_interop(tmp_path / "pentad")["synthesized"] == ["targets.sp.classifier.weight",
                                                                "targets.sp.classifier.bias"]
    back = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "hf2")
    assert back.architecture == "BertModel"
    assert load_file(str(tmp_path / "hf2" / "model.safetensors")).keys() == bare.keys()


@pytest.mark.parametrize("family, model, prefix", [("bert", variant(BERT, targets=[BERT["targets"][0]]), "bert."),
                                                   ("roberta", ROBERTA, "roberta.")], ids=["bert", "roberta"])
def test_masked_lm_checkpoint_with_a_pooler_keeps_it(tmp_path, family, model, prefix):
    """Older MaskedLM checkpoints (roberta-base's among them) also hold a pooler."""
    make_run(tmp_path / "run", model)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family)
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    state[f"{prefix}pooler.dense.weight"] = torch.randn(32, 32)
    state[f"{prefix}pooler.dense.bias"] = torch.randn(32)
    save_file(state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    cfg, _ = load_run(tmp_path / "pentad")
    assert [t.type for t in cfg.model.targets] == ["mlm", "sp"]
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "hf2")
    assert report.architecture.endswith("ForMaskedLM")
    again = load_file(str(tmp_path / "hf2" / "model.safetensors"))
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


def test_old_style_pytorch_bin_checkpoint(tmp_path):
    """pytorch_model.bin with TensorFlow-era LayerNorm names, a position_ids buffer and the tied
    decoder saved twice, as released BERT checkpoints have."""
    make_run(tmp_path / "run", BERT)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    old["bert.embeddings.position_ids"] = torch.arange(24)[None]
    old["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    old["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(old, tmp_path / "hf" / "pytorch_model.bin")
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    before = read_weights(tmp_path / "run" / "model.safetensors")
    after = read_weights(find_weights(tmp_path / "pentad"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    # A decoder that is not the word embedding while the config ties them is refused.
    old["cls.predictions.decoder.weight"] += 1
    torch.save(old, tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(UserError, match="cls.predictions.decoder.weight must be the same tensor"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad2")


def test_guess_family():
    from pentad.components.model_config import model_config_class

    def cfg(d):
        return model_config_class().model_validate(d)

    assert guess_family(cfg(BERT)) == "bert"
    assert guess_family(cfg(GPT2)) == "gpt2"
    roberta = variant(ROBERTA, embedding={**ROBERTA["embedding"], "parts": [
        "word", {"type": "pos", "max_positions": 26}, {"type": "seg", "num_segments": 1}]})
    assert guess_family(cfg(roberta)) == "roberta"


# ------------------------------------------------------------------------------------------ errors
@pytest.fixture
def bert_hf(tmp_path):
    make_run(tmp_path / "run", BERT)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    return tmp_path / "hf"


def _edit_config(hf_dir, **changes):
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(changes)
    (hf_dir / "config.json").write_text(json.dumps(config))


def test_unknown_model_type(bert_hf, tmp_path):
    _edit_config(bert_hf, model_type="electra")
    with pytest.raises(UserError, match="model_type 'electra' is not a model family pentad converts; supported: "
                                        "albert"):
        convert("hf-to-pentad", bert_hf, tmp_path / "out")


def test_family_that_disagrees_with_config(bert_hf, tmp_path):
    with pytest.raises(UserError, match="holds a 'bert' model, not 'gpt2'"):
        convert("hf-to-pentad", bert_hf, tmp_path / "out", family="gpt2")
    with pytest.raises(UserError, match="--family 'mbart'.*did you mean 'bart'"):
        convert("hf-to-pentad", bert_hf, tmp_path / "out", family="mbart")


def test_checkpoint_of_another_family(bert_hf, tmp_path):
    make_run(tmp_path / "gpt", GPT2)
    convert("pentad-to-hf", tmp_path / "gpt", tmp_path / "gpt_hf")
    (bert_hf / "model.safetensors").write_bytes((tmp_path / "gpt_hf" / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match="does not look like a Hugging Face bert checkpoint") as info:
        convert("hf-to-pentad", bert_hf, tmp_path / "out")
    assert "transformer.h.0.attn.c_attn.weight" in str(info.value)
    assert "look like a gpt2 checkpoint" in str(info.value)


def test_missing_tensor_and_wrong_shape(bert_hf, tmp_path):
    state = load_file(str(bert_hf / "model.safetensors"))
    del state["bert.encoder.layer.1.output.dense.weight"]
    state["bert.pooler.dense.bias"] = torch.zeros(7)
    save_file(state, str(bert_hf / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError) as info:
        convert("hf-to-pentad", bert_hf, tmp_path / "out")
    text = str(info.value)
    assert "1 tensor(s) missing: bert.encoder.layer.1.output.dense.weight" in text
    assert "bert.pooler.dense.bias (7,) -> pentad targets.sp.pooler.bias needs (32,)" in text
    assert not (tmp_path / "out").exists()


def test_unsupported_hf_options(bert_hf, tmp_path):
    _edit_config(bert_hf, position_embedding_type="relative_key", hidden_act="mish")
    with pytest.raises(UserError, match="relative_key.*hidden_act 'mish'"):
        convert("hf-to-pentad", bert_hf, tmp_path / "out")


def test_unsupported_pentad_model_for_export(tmp_path):
    make_run(tmp_path / "run", variant(BERT, encoder={**BERT["encoder"], "norm_position": "pre"}))
    with pytest.raises(UserError, match="cannot export .* as bert: model.encoder must be a post-norm"):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="bert")
    make_run(tmp_path / "run2", variant(BERT, targets=[{"type": "mlm"}, {"type": "cls", "num_labels": 2}]))
    with pytest.raises(UserError, match="have no bert architecture"):
        convert("pentad-to-hf", tmp_path / "run2", tmp_path / "hf2")
    make_run(tmp_path / "run3", variant(BERT, targets=[{"type": "tagger", "num_labels": 3, "crf": True}]))
    with pytest.raises(UserError, match="the tagger target has a CRF"):
        convert("pentad-to-hf", tmp_path / "run3", tmp_path / "hf3")


def test_output_directory_must_be_new(bert_hf, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "something").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        convert("hf-to-pentad", bert_hf, tmp_path / "out")
    with pytest.raises(UserError, match="unknown conversion"):
        convert("hf-to-tf", bert_hf, tmp_path / "new")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        convert("hf-to-pentad", tmp_path / "empty", tmp_path / "new")
    with pytest.raises(UserError, match="lies inside the input"):  # (never written into the input)
        convert("hf-to-pentad", bert_hf, bert_hf / "new")
    assert not (bert_hf / "new").exists()


def test_label_names_of_a_finetuned_run_become_id2label(tmp_path):
    make_run(tmp_path / "run", variant(BERT, targets=[{"type": "cls", "num_labels": 2}]))
    (tmp_path / "run" / "labels.json").write_text(json.dumps({"kind": "string", "labels": ["neg", "pos"]}))
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert report.architecture == "BertForSequenceClassification"
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}


def test_sharded_safetensors(tmp_path):
    make_run(tmp_path / "run", GPT2)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(tmp_path / "hf" / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    before = read_weights(tmp_path / "run" / "model.safetensors")
    after = read_weights(find_weights(tmp_path / "pentad"))
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bert_token_classifier_is_told_from_a_sequence_classifier_by_its_pooler(tmp_path):
    """BERT's sequence and token heads are both 'classifier'; without an architectures hint the
    pooler (only the sequence classifier has one) decides, and a hint that disagrees with the
    tensors is an error naming the missing pooler."""
    make_run(tmp_path / "run", variant(BERT, targets=[{"type": "tagger", "num_labels": 3}]))
    (tmp_path / "run" / "labels.json").write_text(json.dumps({"kind": "string", "labels": ["O", "B-X", "I-X"]}))
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert report.architecture == "BertForTokenClassification"
    assert config["id2label"] == {"0": "O", "1": "B-X", "2": "I-X"}
    assert not any("pooler" in k for k in load_file(str(tmp_path / "hf" / "model.safetensors")))
    _edit_config(tmp_path / "hf", architectures=None)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    assert report.architecture == "BertForTokenClassification"
    _edit_config(tmp_path / "hf", architectures=["BertForSequenceClassification"])
    with pytest.raises(UserError, match="BertForSequenceClassification needs the pooler 'bert.pooler.dense.weight'"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "bad")


def test_imported_classifiers_are_runs_that_infer(tmp_path):
    """A converted HF token classifier is a ner run (labels from id2label) that `pentad infer` uses."""
    from pentad.cli.main import main

    make_run(tmp_path / "run", variant(BERT, targets=[{"type": "tagger", "num_labels": 3}]),
             tokenizer=write_wordpiece(tmp_path / "tok"))
    (tmp_path / "run" / "labels.json").write_text(json.dumps({"kind": "string", "labels": ["O", "B-X", "I-X"]}))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    assert any("a ner run" in n for n in report.notes)
    assert json.loads((tmp_path / "back" / "labels.json").read_text())["labels"] == ["O", "B-X", "I-X"]
    (tmp_path / "in.tsv").write_text("text_a\nthe cat sat\nhello world\n", encoding="utf-8")
    assert main(["infer", "--model", str(tmp_path / "back"), f"data.test={tmp_path / 'in.tsv'}",
                 "--output", str(tmp_path / "pred.tsv")]) == 0
    rows = [line.split(" ") for line in (tmp_path / "pred.tsv").read_text().splitlines()[1:]]
    assert [len(r) for r in rows] == [3, 2] and {t for r in rows for t in r} <= {"O", "B-X", "I-X"}
