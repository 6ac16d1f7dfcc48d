"""TencentPretrain checkpoints -> pentad: the key map, tied and padding rows, fine-tuned classifiers,
vocabulary files, and errors. The checkpoints are built from pentad models through the inverse map
(and, in tests/parity/test_conversion.py, by hand from a Hugging Face BERT with TencentPretrain's
own converter layout)."""

import json

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.tencentpretrain.checkpoint import to_tencentpretrain
from pentad.tencentpretrain.config import import_config
from pentad.training.checkpoint import find_weights, load_weights, read_weights, weights_to_save

from .helpers import perturb, write_bpe, write_wordpiece

BERT = {"emb_size": 32, "feedforward_size": 48, "hidden_size": 32, "hidden_act": "gelu", "heads_num": 4,
        "layers_num": 2, "max_seq_length": 24, "dropout": 0.1, "data_processor": "bert",
        "embedding": ["word", "pos", "seg"], "encoder": "transformer", "mask": "fully_visible",
        "target": ["mlm", "sp"], "tie_weights": True}
GPT2 = {"emb_size": 32, "feedforward_size": 48, "hidden_size": 32, "hidden_act": "gelu_fast", "heads_num": 4,
        "layers_num": 2, "max_seq_length": 24, "dropout": 0.1, "data_processor": "lm",
        "embedding": ["word", "pos"], "remove_embedding_layernorm": True, "encoder": "transformer",
        "mask": "causal", "layernorm_positioning": "pre", "target": ["lm"], "tie_weights": True}


def tp_checkpoint(directory, tp_config, vocab_size=60, finetuned=False, **over):
    """A TencentPretrain directory (model.bin + config.json) of a perturbed pentad model."""
    out, _ = import_config({**tp_config, **over}, [f"vocab_size={vocab_size}"], "test")
    if finetuned:
        out["model"]["targets"] = [{"type": "cls", "num_labels": 3}]
    model_cfg = model_config_class().model_validate(out["model"])
    torch.manual_seed(0)
    model = build_model(model_cfg)
    perturb(model)
    ours = weights_to_save(model)
    state = to_tencentpretrain(model_cfg, ours, finetuned=finetuned)
    directory.mkdir(parents=True)
    torch.save(state, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps({**tp_config, **over}))
    return model.eval(), ours, state


def test_bert_key_names_follow_tencentpretrain(tmp_path):
    _, ours, state = tp_checkpoint(tmp_path / "tp", BERT)
    qkv = ours["encoder.layers.0.attention.qkv.weight"]
    assert torch.equal(state["encoder.transformer.0.self_attn.linear_layers.2.weight"], qkv[64:])
    assert torch.equal(state["encoder.transformer.1.layer_norm_2.gamma"], ours["encoder.layers.1.ffn_norm.weight"])
    assert torch.equal(state["target.mlm.layer_norm.beta"], ours["targets.mlm.norm.bias"])
    assert torch.equal(state["target.sp.linear_2.weight"], ours["targets.sp.classifier.weight"])
    # tie_weights: TencentPretrain saves the output layer under both names.
    assert torch.equal(state["target.mlm.linear_2.weight"], state["embedding.word.embedding.weight"])
    # Segment table: TencentPretrain's rows are (padding, A, B), pentad's imported ones (A, B, padding).
    seg = state["embedding.seg.embedding.weight"]
    assert seg.shape == (3, 32) and torch.equal(seg[1:], ours["embedding.seg.weight"][:2])
    assert torch.equal(seg[0], ours["embedding.seg.weight"][2])


@pytest.mark.parametrize("tp_config", [BERT, GPT2], ids=["bert", "gpt2"])
def test_converts_bitwise_and_runs_the_same(tmp_path, tp_config):
    model, ours, _ = tp_checkpoint(tmp_path / "tp", tp_config)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok and report.max_difference() == 0.0
    weights = read_weights(find_weights(tmp_path / "out"))
    assert set(weights) == set(ours) and all(torch.equal(weights[k], ours[k]) for k in ours)
    cfg, _ = load_run(tmp_path / "out")
    other = build_model(cfg.model)
    load_weights(other, weights, "converted")
    other.eval()
    tokens = torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(3))
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 6:] = True
    batch = Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=padding)
    with torch.no_grad():
        assert torch.equal(other.encode(batch)[0], model.encode(batch)[0])


def test_verify_says_what_it_checked_and_compares_the_round_trip_bitwise(tmp_path):
    _, _, state = tp_checkpoint(tmp_path / "tp", BERT)
    half = {k: v.half() for k, v in state.items()}  # dtypes must survive the round trip too
    half["target.mlm.linear_2.weight"] = half["embedding.word.embedding.weight"]
    torch.save(half, tmp_path / "tp" / "model.bin")
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok, report.render()
    checks = report.checks()
    assert list(checks) == ["same tensor names", "same shapes", "same dtypes", "bitwise-identical values",
                            "pentad forward pass is finite"]
    assert all(c.exact and not c.problem for c in checks.values())
    assert f"{len(state)} names of the input checkpoint" in checks["same tensor names"].detail
    assert "1 tied copy" in checks["bitwise-identical values"].detail  # target.mlm.linear_2.weight
    text = report.render()
    assert "outputs are not compared" in text and "compared bitwise with the input checkpoint" in text
    assert "verified: yes, 5 exact check(s) passed" in text
    assert read_weights(find_weights(tmp_path / "out"))["embedding.word.weight"].dtype == torch.float16


def test_verify_reports_each_failed_exact_check(tmp_path, monkeypatch):
    """A round trip that changes one value, one dtype and drops one name fails three checks, named."""
    from pentad.tencentpretrain import checkpoint as tencentpretrain

    tp_checkpoint(tmp_path / "tp", BERT)
    original = tencentpretrain.to_tencentpretrain

    def lossy(*args, **kwargs):
        state = dict(original(*args, **kwargs))
        state["encoder.transformer.0.layer_norm_1.gamma"] = state["encoder.transformer.0.layer_norm_1.gamma"] * 1.0001
        state["target.sp.linear_2.bias"] = state["target.sp.linear_2.bias"].double()
        del state["embedding.pos.embedding.weight"]
        return state

    monkeypatch.setattr(tencentpretrain, "to_tencentpretrain", lossy)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert not report.ok
    checks = report.checks()
    assert "1 missing (embedding.pos.embedding.weight)" in checks["same tensor names"].problem
    assert "target.sp.linear_2.bias torch.float64 instead of torch.float32" in checks["same dtypes"].problem
    assert "encoder.transformer.0.layer_norm_1.gamma (max |Δ|" in checks["bitwise-identical values"].problem
    assert not checks["same shapes"].problem and not checks["pentad forward pass is finite"].problem
    assert "verified: NO, 3 check(s) failed: same tensor names, same dtypes, bitwise-identical values" in \
        report.render()


def test_bitwise_checks_see_the_sign_of_zero():
    from pentad.interop.verify import bitwise_checks

    a = {"x": torch.tensor([0.0, 1.0])}
    assert not bitwise_checks(a, {"x": torch.tensor([0.0, 1.0])}, "a")[3].problem
    assert bitwise_checks(a, {"x": torch.tensor([-0.0, 1.0])}, "a")[3].problem  # torch.equal says equal


def test_padding_segment_row_is_kept(tmp_path):
    _, _, state = tp_checkpoint(tmp_path / "tp", BERT)
    state["embedding.seg.embedding.weight"][0] = torch.randn(32)
    torch.save(state, tmp_path / "tp" / "model.bin")
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    weights = read_weights(find_weights(tmp_path / "out"))
    assert torch.equal(weights["embedding.seg.weight"][2], state["embedding.seg.embedding.weight"][0])
    convert("pentad-to-tencentpretrain", tmp_path / "out", tmp_path / "back")
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert torch.equal(back["embedding.seg.embedding.weight"], state["embedding.seg.embedding.weight"])


def test_finetuned_classifier_layout(tmp_path):
    _, ours, state = tp_checkpoint(tmp_path / "tp", BERT, finetuned=True, pooling="mean")
    assert "output_layer_2.weight" in state and "target.mlm.linear_1.weight" not in state
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok and any("run_classifier.py" in n for n in report.notes)
    cfg, _ = load_run(tmp_path / "out")
    (target,) = cfg.model.targets
    assert (target.type, target.num_labels, target.pooling) == ("cls", 3, "mean")


def test_untied_lm_with_bias_and_no_transformer_bias(tmp_path):
    _, ours, state = tp_checkpoint(tmp_path / "tp", GPT2, tie_weights=False, has_lmtarget_bias=True,
                                   remove_transformer_bias=True)
    assert "target.lm.output_layer.bias" in state and "encoder.transformer.0.feed_forward.linear_1.bias" not in state
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    weights = read_weights(find_weights(tmp_path / "out"))
    assert torch.equal(weights["targets.lm.output.weight"], state["target.lm.output_layer.weight"])


def test_vocabulary_files_become_the_run_tokenizer(tmp_path):
    tp_checkpoint(tmp_path / "tp", BERT, vocab_size=19)
    write_wordpiece(tmp_path / "tmpvocab")
    (tmp_path / "tp" / "google_uncased_en_vocab.txt").write_bytes((tmp_path / "tmpvocab" / "vocab.txt").read_bytes())
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    cfg, tok = load_run(tmp_path / "out")
    assert tok.registry_name == "wordpiece" and tok.vocab_size == cfg.model.vocab_size == 19
    assert cfg.data.objective.type == "bert"
    # TencentPretrain's tokenizers split a literal "[CLS]" in the text; the converted run does too.
    assert cfg.tokenizer.special_tokens_in_text == "split" and tok.cls_id not in tok.encode("[CLS]")
    tp_checkpoint(tmp_path / "gpt", GPT2, vocab_size=266)
    files = write_bpe(tmp_path / "bpe")
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / "gpt" / f"gpt2_{name}").write_bytes((tmp_path / "bpe" / name).read_bytes())
    convert("tencentpretrain-to-pentad", tmp_path / "gpt", tmp_path / "gpt_out")
    gpt_cfg, gpt_tok = load_run(tmp_path / "gpt_out")
    assert gpt_tok.registry_name == "bpe" and files and gpt_cfg.tokenizer.special_tokens_in_text == "split"


@pytest.mark.parametrize("in_text", ["parse", "split"])
def test_export_notes_a_tokenizer_that_parses_literal_special_tokens(tmp_path, in_text):
    from .helpers import BERT as BERT_RUN
    from .helpers import make_run

    make_run(tmp_path / "run", BERT_RUN, tokenizer={**write_wordpiece(tmp_path / "tok"),
                                                    "special_tokens_in_text": in_text})
    report = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    noted = any("TencentPretrain's tokenizer splits it" in n for n in report.notes)
    assert noted == (in_text == "parse")
    again = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "back")
    assert again.ok and load_run(tmp_path / "back")[0].tokenizer.special_tokens_in_text == "split"


def test_errors(tmp_path):
    _, _, state = tp_checkpoint(tmp_path / "tp", BERT)
    with pytest.raises(UserError, match="--family applies to Hugging Face"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", family="bert")
    # A tied output layer that differs from the embedding.
    bad = dict(state)
    bad["target.mlm.linear_2.weight"] = bad["target.mlm.linear_2.weight"] + 1
    torch.save(bad, tmp_path / "tp" / "model.bin")
    with pytest.raises(UserError, match="target.mlm.linear_2.weight must be the same tensor"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    # A missing tensor and a mis-shaped one.
    bad = dict(state)
    del bad["encoder.transformer.1.self_attn.final_linear.bias"]
    bad["embedding.pos.embedding.weight"] = torch.zeros(30, 32)
    torch.save(bad, tmp_path / "tp" / "model.bin")
    with pytest.raises(UserError, match="final_linear.bias.*embedding.pos.embedding.weight \\(30, 32\\)"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    # Not a state dict of tensors (weights_only refuses arbitrary objects).
    torch.save({"model": "not a tensor"}, tmp_path / "tp" / "model.bin")
    with pytest.raises(UserError, match="does not hold a state dict"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    (tmp_path / "tp" / "other.bin").write_bytes(b"")
    with pytest.raises(UserError, match="exactly one checkpoint file"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    (tmp_path / "tp" / "other.bin").unlink()
    (tmp_path / "tp" / "config.json").unlink()
    with pytest.raises(UserError, match="exactly one TencentPretrain JSON config"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")


def test_unsupported_module_is_named(tmp_path):
    """A config that says gatedcnn beside a transformer's tensors: the mismatch is listed; and pentad's
    own cnn encoder (TencentPretrain has none) is named on export."""
    from .helpers import make_run

    tp_checkpoint(tmp_path / "tp", BERT)
    config = json.loads((tmp_path / "tp" / "config.json").read_text())
    config.update(encoder="gatedcnn", kernel_size=4, block_size=2)
    (tmp_path / "tp" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"missing: encoder.conv.0.bias.*no place in the pentad model"):
        convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    make_run(tmp_path / "run", {"hidden_size": 16, "vocab_size": 30, "max_seq_length": 8, "embedding": {
        "parts": ["word"]}, "encoder": {"type": "cnn", "num_layers": 1}, "targets": [{"type": "lm"}]})
    with pytest.raises(UserError, match="encoder 'cnn'"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back")


@pytest.mark.parametrize("crf", [False, True], ids=["softmax", "crf"])
def test_run_ner_checkpoint_becomes_a_ner_run(tmp_path, crf):
    """A checkpoint as TencentPretrain's run_ner.py saves it (embedding, encoder, output_layer and,
    with --crf_target, pytorch-crf's crf.*) with its label2id.json: a pentad ner run and back, bitwise."""
    _, _, pretrained = tp_checkpoint(tmp_path / "pre", BERT)
    g = torch.Generator().manual_seed(5)
    state = {k: v for k, v in pretrained.items() if not k.startswith("target.")}
    state["output_layer.weight"] = torch.randn(5, 32, generator=g)
    state["output_layer.bias"] = torch.randn(5, generator=g)
    if crf:
        state.update({"crf.start_transitions": torch.randn(5, generator=g),
                      "crf.end_transitions": torch.randn(5, generator=g),
                      "crf.transitions": torch.randn(5, 5, generator=g)})
    (tmp_path / "tp").mkdir()
    torch.save(state, tmp_path / "tp" / "model.bin")
    (tmp_path / "tp" / "config.json").write_text(json.dumps(BERT))
    tags = {"O": 0, "B-LOC": 1, "I-LOC": 2, "B-PER": 3, "I-PER": 4}
    (tmp_path / "tp" / "label2id.json").write_text(json.dumps(tags))
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok and any("run_ner.py" in n for n in report.notes)
    cfg, _ = load_run(tmp_path / "out")
    (target,) = cfg.model.targets
    assert (target.type, target.num_labels, target.crf) == ("tagger", 5, crf)
    assert cfg.task.type == "ner" and cfg.task.metric == "f1"
    assert json.loads((tmp_path / "out" / "labels.json").read_text())["labels"] == list(tags)
    weights = read_weights(find_weights(tmp_path / "out"))
    assert torch.equal(weights["targets.tagger.classifier.weight"], state["output_layer.weight"])
    if crf:
        assert torch.equal(weights["targets.tagger.crf.transitions"], state["crf.transitions"])
    convert("pentad-to-tencentpretrain", tmp_path / "out", tmp_path / "back")
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert json.loads((tmp_path / "back" / "label2id.json").read_text()) == tags
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    assert exported["labels_num"] == 5 and exported.get("crf_target", False) == crf


def test_run_cmrc_checkpoint_becomes_a_qa_run(tmp_path):
    """A checkpoint as TencentPretrain's run_cmrc.py saves it (embedding, encoder, a 2-output output_layer):
    a pentad qa run whose span head holds that layer, which predicts answers and converts back bitwise;
    with a label2id.json beside it, the same layer is a 2-tag run_ner.py tagger."""
    from pentad.cli.main import main

    _, _, pretrained = tp_checkpoint(tmp_path / "pre", BERT, vocab_size=19)
    g = torch.Generator().manual_seed(6)
    state = {k: v for k, v in pretrained.items() if not k.startswith("target.")}
    state["output_layer.weight"] = torch.randn(2, 32, generator=g)
    state["output_layer.bias"] = torch.randn(2, generator=g)
    (tmp_path / "tp").mkdir()
    torch.save(state, tmp_path / "tp" / "model.bin")
    (tmp_path / "tp" / "config.json").write_text(json.dumps(BERT))
    write_wordpiece(tmp_path / "words")
    (tmp_path / "tp" / "google_uncased_en_vocab.txt").write_bytes((tmp_path / "words" / "vocab.txt").read_bytes())
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok and any("run_cmrc.py" in n for n in report.notes)
    cfg, _ = load_run(tmp_path / "out")
    assert [t.type for t in cfg.model.targets] == ["span"] and cfg.task.type == "qa"
    weights = read_weights(find_weights(tmp_path / "out"))
    assert torch.equal(weights["targets.span.qa_outputs.weight"], state["output_layer.weight"])
    context = "the quick brown fox jumps over the lazy dog ."
    squad = {"data": [{"paragraphs": [{"context": context, "qas": [{"id": "q1", "question": "the fox ?"}]}]}]}
    (tmp_path / "q.json").write_text(json.dumps(squad))
    assert main(["infer", "--model", str(tmp_path / "out"), f"data.test={tmp_path / 'q.json'}",
                 "--output", str(tmp_path / "answers.json")]) == 0
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert list(answers) == ["q1"] and answers["q1"] and answers["q1"] in context
    convert("pentad-to-tencentpretrain", tmp_path / "out", tmp_path / "back")
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert not (tmp_path / "back" / "label2id.json").exists()

    (tmp_path / "tp" / "label2id.json").write_text(json.dumps({"O": 0, "S-PER": 1}))
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "tagger")
    cfg, _ = load_run(tmp_path / "tagger")
    assert [(t.type, t.num_labels) for t in cfg.model.targets] == [("tagger", 2)] and cfg.task.type == "ner"
    convert("pentad-to-tencentpretrain", tmp_path / "tagger", tmp_path / "tagger_back")  # verified as a tagger
