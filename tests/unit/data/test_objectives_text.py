"""The text pre-training objectives beyond bert/mlm/lm/cls, each run through ``preprocess`` on a
slice of a real corpus, then collated; the checks are invariants of the objective (what the
source and target must reconstruct, where labels may be), not just shapes."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from pentad.components.base import IGNORE_INDEX
from pentad.data.objectives import (
    AlbertObjective,
    BartObjective,
    BilmObjective,
    ClsMlmObjective,
    GsgObjective,
    LlmPretrainObjective,
    LlmSftObjective,
    MtObjective,
    PrefixLmObjective,
    T5Objective,
)
from pentad.data.objectives.gsg import rouge1, rouge1_against_rest
from pentad.data.objectives.t5 import noise_mask
from pentad.data.preprocess import preprocess
from pentad.data.shards import ShardDataset
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

NEW = ("albert", "t5", "bart", "gsg", "mt", "prefixlm", "bilm", "cls_mlm", "llm_pretrain", "llm_sft")


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok_config(shared_data):
    return {"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_with_sentinel_vocab.txt")}


@pytest.fixture(scope="module")
def tok(tok_config):
    return load_tokenizer(tok_config)


@pytest.fixture(scope="module")
def en_config(shared_data):
    return {"type": "wordpiece", "vocab": str(shared_data / "models/google_uncased_en_vocab.txt")}


def slice_of(src, dst, lines):
    with open(src, "rb") as f:
        dst.write_bytes(b"".join(next(f) for _ in range(lines)))
    return dst


@pytest.fixture
def bert_corpus(shared_data, tmp_path):
    return slice_of(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", tmp_path / "bert.txt", 300)


@pytest.fixture
def doc_corpus(shared_data, tmp_path):
    return slice_of(shared_data / "corpora/CLUECorpusSmall_sampled.txt", tmp_path / "docs.txt", 30)


@pytest.fixture
def pair_corpus(shared_data, tmp_path):
    return slice_of(shared_data / "corpora/news-commentary-v13-en-zh_sampled.txt", tmp_path / "mt.txt", 120)


def prep(objective, tok_config, corpus, output, **kw):
    """Preprocess as the CLI does; returns (manifest, dataset)."""
    kw.setdefault("progress", False)
    manifest = preprocess(objective, objective.tokenizer, tok_config, corpus, output, **kw)
    return manifest, ShardDataset(output)


def everything(dataset):
    return dataset.take(np.arange(len(dataset)))


def rows(instances):
    return [instances.sequence(i) for i in range(len(instances))]


def real(batch_field, padding):
    """Row b of a [B,T] tensor without its padding, as a list."""
    return [row[~pad].tolist() for row, pad in zip(batch_field.numpy(), padding.numpy())]


def check_seq2seq_decoder(batch, start_id):
    """Decoder input = start + labels shifted right; labels IGNORE exactly at padding."""
    decoder, labels, pad = (batch.decoder_tokens.numpy(), batch.labels["lm"].numpy(),
                            batch.decoder_padding_mask.numpy())
    assert decoder.shape == labels.shape == pad.shape
    assert (decoder[:, 0] == start_id).all()
    assert ((labels == IGNORE_INDEX) == pad).all()
    inner = ~pad[:, 1:]
    assert (decoder[:, 1:][inner] == labels[:, :-1][inner]).all()


def contains(stream, part):
    """Whether ``part`` occurs contiguously in ``stream`` (1-D int arrays)."""
    hay, needle = stream.astype("<i4").tobytes(), np.asarray(part).astype("<i4").tobytes()
    at = hay.find(needle)
    while at >= 0 and at % 4:
        at = hay.find(needle, at + 1)
    return at >= 0


def corpus_stream(tok, path):
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return np.concatenate([np.asarray(ids, dtype=np.int64) for ids in tok.encode_batch(lines) if ids])


# ---------------------------------------------------------------------------------- registry
def test_registered_with_matching_config_type():
    for name in NEW:
        cls = OBJECTIVES.get(name)
        cfg = cls.Config()
        assert cfg.type == name
        assert cls.corpus_format and cls.provides
        assert all(f.startswith("labels.") or f in {"tokens", "segments", "padding_mask", "decoder_tokens",
                                                     "decoder_padding_mask"} for f in cls.provides)


# ---------------------------------------------------------------------------------- albert
def test_albert_sentence_order(tok, tok_config, shared_data, tmp_path):
    corpus = slice_of(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", tmp_path / "bert.txt", 1500)
    obj = AlbertObjective(AlbertObjective.Config(seq_length=256), tok)
    manifest, ds = prep(obj, tok_config, corpus, tmp_path / "ds")
    assert set(manifest["fields"]) == {"split", "sop"}
    inst = everything(ds)
    sop = inst.fields["sop"]
    assert len(inst) > 200 and 0.4 < sop.mean() < 0.6
    stream = corpus_stream(tok, corpus)
    checked = 0
    for seq, split, swapped in zip(rows(inst), inst.fields["split"], sop):
        assert seq[0] == tok.cls_id and seq[split - 1] == tok.sep_id and seq[-1] == tok.sep_id
        a, b = seq[1:split - 1], seq[split:-1]
        assert len(a) and len(b)
        # Untruncated pairs are consecutive text: A then B in order, B then A when swapped.
        if len(seq) < 256:
            first, second = (b, a) if swapped else (a, b)
            assert contains(stream, np.concatenate([first, second]))
            if min(len(a), len(b)) >= 5:  # short pieces such as "。" occur in either order
                assert not contains(stream, np.concatenate([second, first]))
                checked += 1
    assert checked > 100
    batch = obj.collate(inst[:16], np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    assert batch.labels["sop"].tolist() == sop[:16].tolist()
    assert ((batch.labels["mlm"] != IGNORE_INDEX).sum(1) >= 1).all()


# ---------------------------------------------------------------------------------- t5
def test_t5_source_and_target_reconstruct_the_text(tok, tok_config, doc_corpus, tmp_path):
    obj = T5Objective(T5Objective.Config(seq_length=64), tok)
    assert len(obj.sentinel_ids) == 100
    _, ds = prep(obj, tok_config, doc_corpus, tmp_path / "ds")
    inst = everything(ds)
    texts = rows(inst)
    # The stored pieces are the documents' tokens, in order, nothing added or lost.
    assert np.concatenate(texts).tolist() == corpus_stream(tok, doc_corpus).tolist()
    batch = obj.collate(inst, np.random.default_rng(1))
    assert batch.provided() == set(obj.provides)
    check_seq2seq_decoder(batch, tok.cls_id)
    sentinels = {s: k for k, s in enumerate(obj.sentinel_ids)}
    noise = 0
    for text, source, target in zip(texts, real(batch.tokens, batch.padding_mask),
                                    real(batch.labels["lm"], batch.decoder_padding_mask)):
        assert source[0] == tok.cls_id and source[-1] == tok.sep_id and target[-1] == tok.sep_id
        # Cut the target at its sentinels: span k follows sentinel k.
        spans, order = {}, []
        for token in target[:-1]:
            if token in sentinels:
                order.append(sentinels[token])
                spans[order[-1]] = []
            else:
                spans[order[-1]].append(token)
        assert order == list(range(len(order))) and target[0] == obj.sentinel_ids[0]
        rebuilt = []
        for token in source[1:-1]:
            rebuilt.extend(spans[sentinels[token]] if token in sentinels else [token])
        assert rebuilt == text.tolist()
        assert all(spans.values())  # no empty span
        noise += sum(len(s) for s in spans.values())
    assert abs(noise / sum(len(t) for t in texts) - 0.15) < 0.02


def test_t5_noise_mask_shape():
    rng = np.random.default_rng(0)
    for length in (1, 2, 3, 10, 100, 511):
        mask = noise_mask(length, 0.15, 3.0, 100, rng)
        assert len(mask) == length and mask.sum() >= 1
        if length >= 2:
            assert not mask[0] and mask.sum() < length  # starts with kept text, keeps some
    mask = noise_mask(1000, 0.5, 1.0, 7, rng)  # spans capped by the sentinels available
    assert (np.diff(mask.astype(int)) == 1).sum() <= 7


def test_t5_needs_sentinels(shared_data):
    plain = load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")})
    with pytest.raises(UserError, match=r"(?s)<extra_id_0>.*google_zh_vocab\.txt"):
        T5Objective(T5Objective.Config(), plain)


def test_t5_pack_and_decoder_start(tok, doc_corpus):
    lines = doc_corpus.read_text(encoding="utf-8").splitlines()[:5]
    obj = T5Objective(T5Objective.Config(seq_length=32, pack=True, decoder_start="pad"), tok)
    stream = obj.build(lines, np.random.default_rng(0))
    assert obj.packs and obj.window == (30, 30)
    assert (stream == tok.sep_id).sum() == 5  # an EOS after every document
    from pentad.data.objectives.base import windows

    inst, _ = windows(stream, 30, 30, final=True)
    batch = obj.collate(inst[:4], np.random.default_rng(0))
    check_seq2seq_decoder(batch, tok.pad_id)


# ---------------------------------------------------------------------------------- bart
def test_bart_target_is_the_original(tok, tok_config, bert_corpus, tmp_path):
    obj = BartObjective(BartObjective.Config(seq_length=128), tok)
    _, ds = prep(obj, tok_config, bert_corpus, tmp_path / "ds")
    inst = everything(ds)
    originals, permuted = obj.texts(inst)
    stream = corpus_stream(tok, bert_corpus)
    assert np.concatenate(originals).tolist() == stream.tolist()  # chunks are the corpus, in order
    assert all(sorted(o.tolist()) == sorted(p.tolist()) for o, p in zip(originals, permuted))
    assert sum(o.tolist() != p.tolist() for o, p in zip(originals, permuted)) > len(inst) // 4
    batch = obj.collate(inst[:32], np.random.default_rng(3))
    assert batch.provided() == set(obj.provides)
    check_seq2seq_decoder(batch, tok.cls_id)
    targets = real(batch.labels["lm"], batch.decoder_padding_mask)
    sources = real(batch.tokens, batch.padding_mask)
    for original, text, target, source in zip(originals, permuted, targets, sources):
        assert target == original.tolist() + [tok.sep_id]
        assert source[0] == tok.cls_id and source[-1] == tok.sep_id
        body = np.asarray(source[1:-1])
        masks = body == tok.mask_id
        assert masks.any() and not (masks[1:] & masks[:-1]).any()  # one [MASK] per span
        kept = body[~masks]
        # What is left is the permuted text minus exactly ceil(0.3 n) tokens, order kept.
        assert len(text) - len(kept) == int(np.ceil(0.3 * len(text)))
        it = iter(text.tolist())
        assert all(token in it for token in kept.tolist())


# ---------------------------------------------------------------------------------- gsg
def test_rouge1():
    assert rouge1(np.array([1, 2, 3]), np.array([1, 2, 4])) == pytest.approx(2 / 3)
    assert rouge1(np.array([1, 1, 1]), np.array([1, 5])) == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert rouge1(np.array([7]), np.array([8])) == 0.0
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 12, size=rng.integers(1, 9)) for _ in range(7)]
    together = rouge1_against_rest(sentences)
    for k, sentence in enumerate(sentences):
        rest = np.concatenate(sentences[:k] + sentences[k + 1:])
        assert together[k] == pytest.approx(rouge1(sentence, rest))


@pytest.mark.parametrize("strategy", ["lead", "random", "principal"])
def test_gsg_selection(tok, strategy):
    sentences = ["今天北京天气很好。", "北京今天天气很好，适合出门。", "猫在睡觉。", "北京的天气今天很好。",
                 "我们去公园散步。", "明天可能下雨。", "数学考试很难。", "他喜欢踢足球。", "天气预报说北京今天很好。",
                 "晚饭吃面条。"]
    obj = GsgObjective(GsgObjective.Config(seq_length=256, sentence_selection=strategy), tok)
    inst = obj.build(sentences + [None], np.random.default_rng(0))
    assert len(inst) == 1
    seq, split = inst.sequence(0), int(inst.fields["split"][0])
    source, target = seq[:split], seq[split:]
    ids = [np.asarray(x) for x in tok.encode_batch(sentences)]
    masks = np.flatnonzero(source == tok.mask_id)
    assert len(masks) == 3  # 30 % of 10 sentences
    # Rebuild: walking the source, each [MASK] stands for a whole selected sentence.
    chosen, at = [], 1
    for s, sentence in enumerate(ids):
        if source[at] == tok.mask_id:
            chosen.append(s)
            at += 1
        else:
            assert source[at:at + len(sentence)].tolist() == sentence.tolist()
            at += len(sentence)
    assert source[at] == tok.sep_id and at == len(source) - 1
    assert target.tolist() == np.concatenate([ids[s] for s in chosen]).tolist()
    if strategy == "lead":
        assert chosen == [0, 1, 2]
    if strategy == "principal":
        scores = rouge1_against_rest(ids)
        assert chosen == sorted(np.argsort(-scores, kind="stable")[:3].tolist())
        assert 2 not in chosen and 6 not in chosen  # unrelated sentences are never principal


def test_gsg_on_corpus(tok, tok_config, bert_corpus, tmp_path):
    obj = GsgObjective(GsgObjective.Config(seq_length=128), tok)
    _, ds = prep(obj, tok_config, bert_corpus, tmp_path / "ds")
    inst = everything(ds)
    assert (inst.lengths - inst.fields["split"] >= 1).all()  # every instance has a target
    batch = obj.collate(inst[:32], np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    check_seq2seq_decoder(batch, tok.cls_id)
    assert batch.tokens.shape[1] <= 128 and batch.decoder_tokens.shape[1] <= 128
    masked = (batch.tokens == tok.mask_id) & ~batch.padding_mask
    assert (masked.sum(1) >= 1).all()


# ---------------------------------------------------------------------------------- mt
def test_mt_with_a_target_tokenizer(en_config, tok_config, pair_corpus, tmp_path):
    en = load_tokenizer(en_config)
    zh = load_tokenizer(tok_config)
    cfg = MtObjective.Config(seq_length=48, target_seq_length=40, target_tokenizer=tok_config,
                             decoder_start="[unused1]")
    obj = MtObjective(cfg, en)
    assert obj.target_tokenizer.fingerprint() == zh.fingerprint()
    manifest, ds = prep(obj, en_config, pair_corpus, tmp_path / "ds")
    assert manifest["target_tokenizer"]["fingerprint"] == zh.fingerprint()
    assert manifest["target_tokenizer"]["vocab_size"] == zh.vocab_size
    assert manifest["objective"]["instance_options"]["target_tokenizer"] == zh.fingerprint()
    pairs = [line.split("\t") for line in pair_corpus.read_text(encoding="utf-8").splitlines()]
    assert len(ds) == len(pairs)
    batch = obj.collate(everything(ds), np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    check_seq2seq_decoder(batch, zh.token_to_id("[unused1]"))
    sources = real(batch.tokens, batch.padding_mask)
    targets = real(batch.labels["lm"], batch.decoder_padding_mask)
    for (source, target), got_source, got_target in zip(pairs, sources, targets):
        assert got_source == [en.cls_id] + en.encode(source)[:46] + [en.sep_id]
        assert got_target == zh.encode(target)[:39] + [zh.sep_id]
    assert max(len(t) for t in targets) == 40


def test_mt_decoder_start_choices(tok):
    for choice, expected in ((None, tok.cls_id), ("pad", tok.pad_id), ("eos", tok.sep_id),
                             ("<extra_id_3>", tok.token_to_id("<extra_id_3>"))):
        assert MtObjective(MtObjective.Config(decoder_start=choice), tok).decoder_start_id == expected
    with pytest.raises(UserError, match="decoder_start 'nonexistent-token'"):
        MtObjective(MtObjective.Config(decoder_start="nonexistent-token"), tok)


def test_mt_bad_line_names_file_and_line(tok, tok_config, pair_corpus, tmp_path):
    text = pair_corpus.read_text(encoding="utf-8").splitlines()
    text[6] = "a line without a tab"
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(text) + "\n", encoding="utf-8")
    obj = MtObjective(MtObjective.Config(seq_length=48), tok)
    with pytest.raises(UserError, match=r"bad\.txt, line 7: .*1 tab-separated field"):
        prep(obj, tok_config, bad, tmp_path / "ds")
    manifest, ds = prep(obj, tok_config, bad, tmp_path / "ds2", on_bad_line="skip")
    assert manifest["skipped_lines"]["count"] == 1 and len(ds) == len(text) - 1


# ---------------------------------------------------------------------------------- prefixlm
def test_prefixlm_labels_only_on_the_target(tok, tok_config, pair_corpus, tmp_path):
    obj = PrefixLmObjective(PrefixLmObjective.Config(seq_length=64), tok)
    _, ds = prep(obj, tok_config, pair_corpus, tmp_path / "ds")
    inst = everything(ds)
    batch = obj.collate(inst, np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    tokens, segments, labels = batch.tokens.numpy(), batch.segments.numpy(), batch.labels["lm"].numpy()
    for b, (length, split) in enumerate(zip(inst.lengths, inst.fields["split"])):
        seq = tokens[b, :length]
        assert seq[0] == tok.cls_id and seq[split - 1] == tok.sep_id and seq[-1] == tok.sep_id
        assert (segments[b, :split] == 0).all() and (segments[b, split:length] == 1).all()
        assert (segments[b, length:] == 0).all()
        scored = np.flatnonzero(labels[b] != IGNORE_INDEX)
        # The prefix's [SEP] predicts the first target token, the last target token the [SEP].
        assert scored.tolist() == list(range(split - 1, length - 1))
        assert labels[b, scored].tolist() == seq[split:].tolist()


# ---------------------------------------------------------------------------------- bilm
def test_bilm_predicts_every_neighbour_once_and_survives_blank_lines(tok, tok_config, doc_corpus, tmp_path):
    lines = doc_corpus.read_text(encoding="utf-8").splitlines()[:20]
    # Blank lines everywhere, including many at the end, and tiny chunks so that chunk ends fall
    # on blank lines (TencentPretrain's bilm preprocessing loops forever there).
    text = "\n\n".join(lines[:10]) + "\n\n \n" + "\n".join(lines[10:]) + "\n\n\n\n"
    corpus = tmp_path / "blank.txt"
    corpus.write_text(text, encoding="utf-8")
    obj = BilmObjective(BilmObjective.Config(seq_length=48), tok)
    _, ds = prep(obj, tok_config, corpus, tmp_path / "ds", chunk_bytes=512)
    batch = obj.collate(everything(ds), np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    tokens, labels = batch.tokens.numpy(), batch.labels["bilm"].numpy()
    assert labels.shape == tokens.shape + (2,)
    pad = batch.padding_mask.numpy()
    assert (labels[pad] == IGNORE_INDEX).all()
    forward, backward = Counter(), Counter()
    for b in range(len(tokens)):
        for j in np.flatnonzero(labels[b, :, 0] != IGNORE_INDEX):
            forward[(tokens[b, j], labels[b, j, 0])] += 1
        for j in np.flatnonzero(labels[b, :, 1] != IGNORE_INDEX):
            backward[(labels[b, j, 1], tokens[b, j])] += 1
    expected = Counter()
    for ids in tok.encode_batch(lines):
        framed = [tok.cls_id, *ids, tok.sep_id]
        expected.update(zip(framed[:-1], framed[1:]))
    assert forward == expected and backward == expected


# ---------------------------------------------------------------------------------- cls_mlm
def test_cls_mlm(tok, tok_config, shared_data, tmp_path):
    body = slice_of(shared_data / "corpora/book_review_cls.txt", tmp_path / "body.txt", 200).read_bytes()
    corpus = tmp_path / "cls.tsv"
    corpus.write_bytes(b"label\ttext_a\n" + body)
    obj = ClsMlmObjective(ClsMlmObjective.Config(seq_length=64), tok)
    manifest, ds = prep(obj, tok_config, corpus, tmp_path / "ds")
    assert manifest["label_map"] == {"kind": "integer", "num_labels": 2}
    batch = obj.collate(everything(ds), np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    labels = [int(line.split(b"\t")[0]) for line in body.splitlines()]
    assert batch.labels["cls"].tolist() == labels
    ids, valid = everything(ds).padded(tok.pad_id)
    candidates = valid & ~np.isin(ids, list(tok.special_ids))
    selected = batch.labels["mlm"].numpy() != IGNORE_INDEX
    assert not (selected & ~candidates).any() and (selected.sum(1) >= 1).all()
    assert abs(selected.sum() / candidates.sum() - 0.15) < 0.02
    assert (batch.labels["mlm"].numpy()[selected] == ids[selected]).all()
    # A header-less file (TencentPretrain's cls format) is refused at line 1.
    with pytest.raises(UserError, match=r"body\.txt, line 1: expected a header"):
        prep(obj, tok_config, tmp_path / "body.txt", tmp_path / "ds2")


# ---------------------------------------------------------------------------------- llm
def test_llm_pretrain_reads_only_json_lines(tok, tok_config, doc_corpus, tmp_path):
    lines = doc_corpus.read_text(encoding="utf-8").splitlines()[:10]
    corpus = tmp_path / "pre.txt"  # no .jsonl suffix: JSON is not guessed, it is required
    corpus.write_text("\n".join(json.dumps({"text": t, "id": i}, ensure_ascii=False)
                                for i, t in enumerate(lines)) + "\n\n", encoding="utf-8")
    obj = LlmPretrainObjective(LlmPretrainObjective.Config(seq_length=64), tok)
    _, ds = prep(obj, tok_config, corpus, tmp_path / "ds")
    inst = everything(ds)
    predicted = np.concatenate([seq[1:] for seq in rows(inst)])
    expected = np.concatenate([[tok.cls_id, *ids, tok.sep_id] for ids in tok.encode_batch(lines)])
    assert predicted.tolist() == expected[1:].tolist()
    batch = obj.collate(inst[:4], np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(corpus.read_text(encoding="utf-8").replace('{"text"', "plain words", 1), encoding="utf-8")
    with pytest.raises(UserError, match=r"plain\.jsonl, line 1: the line is not valid JSON"):
        prep(obj, tok_config, plain, tmp_path / "ds2")
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"text": "ok"}\n{"content": "no text key"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r'wrong\.jsonl, line 2: .*"text"'):
        prep(obj, tok_config, wrong, tmp_path / "ds3")


def sft_examples():
    examples = []
    for i in range(40):
        example = {"instruction": f"请把第{i}句话改写得更礼貌", "output": "好的，" + "谢谢您的耐心。" * (1 + i % 5)}
        if i % 3:
            example["input"] = "你快点把东西给我" if i % 3 == 1 else ""
        examples.append(example)
    return examples


def write_jsonl(path, records, extra=""):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n" + extra,
                    encoding="utf-8")
    return path


def test_llm_sft_scores_only_the_response(tok, tok_config, tmp_path):
    examples = sft_examples()
    corpus = write_jsonl(tmp_path / "sft.jsonl", examples, extra="\n")
    template = "指令：{instruction}\n输入：{input}\n回答："
    no_input = "指令：{instruction}\n回答："
    obj = LlmSftObjective(LlmSftObjective.Config(seq_length=96, prompt_template=template,
                                                 prompt_template_no_input=no_input), tok)
    _, ds = prep(obj, tok_config, corpus, tmp_path / "ds")
    assert len(ds) == len(examples)
    inst = everything(ds)
    batch = obj.collate(inst, np.random.default_rng(0))
    assert batch.provided() == set(obj.provides)
    tokens, segments, labels = batch.tokens.numpy(), batch.segments.numpy(), batch.labels["lm"].numpy()
    pad = batch.padding_mask.numpy()
    for b, example in enumerate(examples):
        input_text = example.get("input", "")
        prompt = (template.replace("{input}", input_text) if input_text else no_input).replace(
            "{instruction}", example["instruction"])
        prompt_ids = [tok.cls_id] + tok.encode(prompt)
        response = tok.encode(example["output"]) + [tok.sep_id]
        n = len(prompt_ids) + len(response) - 1  # inputs are x[:-1]
        assert tokens[b, :n].tolist() == (prompt_ids + response)[:-1] and pad[b, n:].all()
        scored = np.flatnonzero(labels[b] != IGNORE_INDEX)
        assert labels[b, scored].tolist() == response  # the loss sees the response and EOS only
        assert scored.tolist() == list(range(len(prompt_ids) - 1, n))
        assert segments[b, :n].tolist() == [0] * len(prompt_ids) + [1] * (n - len(prompt_ids))
        assert (segments[b, n:] == 0).all()


def test_llm_sft_too_long(tok, tok_config, tmp_path):
    long_answer = {"instruction": "写一段话", "output": "这是一个很长的回答。" * 30}
    short = {"instruction": "问好", "output": "你好"}
    huge_prompt = {"instruction": "很长的指令" * 60, "output": "好"}
    corpus = write_jsonl(tmp_path / "long.jsonl", [short, long_answer, short])
    template = {"prompt_template": "{instruction}|{input}|", "prompt_template_no_input": "{instruction}|"}
    obj = LlmSftObjective(LlmSftObjective.Config(seq_length=40, **template), tok)
    _, ds = prep(obj, tok_config, corpus, tmp_path / "truncate")
    assert len(ds) == 3
    truncated = ds.take([1])
    assert truncated.lengths[0] == 41 and truncated.sequence(0)[-1] != tok.sep_id
    batch = obj.collate(truncated, np.random.default_rng(0))
    prompt_len = 1 + len(tok.encode("写一段话|"))
    assert (batch.labels["lm"] != IGNORE_INDEX).sum() == 41 - prompt_len
    skip = LlmSftObjective(LlmSftObjective.Config(seq_length=40, too_long="skip", **template), tok)
    with pytest.raises(UserError, match=r"long\.jsonl, line 2: .*too_long is 'skip'"):
        prep(skip, tok_config, corpus, tmp_path / "fail")
    manifest, ds = prep(skip, tok_config, corpus, tmp_path / "skip", on_bad_line="skip")
    assert len(ds) == 2 and manifest["skipped_lines"]["count"] == 1
    assert manifest["skipped_lines"]["examples"][0]["line"] == 2
    # A prompt that fills the window can never keep any response: a bad line even when truncating.
    corpus = write_jsonl(tmp_path / "prompt.jsonl", [short, huge_prompt])
    with pytest.raises(UserError, match=r"prompt\.jsonl, line 2: .*no room for the response"):
        prep(obj, tok_config, corpus, tmp_path / "huge")


def test_llm_sft_bad_records(tok):
    obj = LlmSftObjective(LlmSftObjective.Config(), tok)
    from pentad.data.corpus import BadLine

    for line, message in (("not json", "not valid JSON"), ("[1, 2]", "not an object"),
                          ('{"instruction": "x"}', 'no string "output"'),
                          ('{"instruction": "x", "output": "y", "input": 3}', '"input" field that is not'),
                          ('{"instruction": "x", "output": "  "}', 'empty "output"')):
        with pytest.raises(BadLine, match=message):
            obj.parse_line(line, None)
    assert obj.parse_line("   ", None) is None
    with pytest.raises(ValueError, match="must contain '{instruction}' and '{input}'"):
        LlmSftObjective.Config(prompt_template="no placeholders")


# ---------------------------------------------------------------------------------- workers
def test_one_and_two_workers_write_the_same_bytes(tok, tok_config, bert_corpus, tmp_path):
    obj = GsgObjective(GsgObjective.Config(seq_length=128, sentence_selection="random"), tok)
    one, _ = prep(obj, tok_config, bert_corpus, tmp_path / "one", workers=1, chunk_bytes=8192)
    two, _ = prep(obj, tok_config, bert_corpus, tmp_path / "two", workers=2, chunk_bytes=8192)
    assert len(one["shards"]) == len(two["shards"]) and one["num_instances"] == two["num_instances"]
    files = sorted(p.name for p in (tmp_path / "one").iterdir() if p.suffix == ".bin")
    assert files and all((tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()
                         for f in files)
