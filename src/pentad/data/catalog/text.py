"""Text datasets fetched through pip: movie-review sentiment and the Wikipedia excerpt (the demo's data)."""

from __future__ import annotations

from pathlib import Path

from pentad.data.catalog import DATASETS, Prepared, PreparedDataset, copy_head
from pentad.files import atomic_write_text


@DATASETS.register("mr")
class MovieReviews(PreparedDataset):
    summary = ("movie-review sentiment (Pang & Lee's MR sentences from the vaderSentiment sdist): "
               "train/dev/test/test_nolabel.tsv, label<TAB>text_a")
    task = "finetune --task classification"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        from pentad.data.assets import ensure_mr_sentiment

        splits = ensure_mr_sentiment(cache)
        prepared = Prepared(source="vaderSentiment==3.3.2 sdist (PyPI), split with seed 0")
        for split in ("train", "dev", "test", "test_nolabel"):
            prepared.files[split] = f"{split}.tsv"
            prepared.rows[split] = copy_head(getattr(splits, split), output / f"{split}.tsv", rows)
        return prepared


@DATASETS.register("wikipedia")
class WikipediaExcerpt(PreparedDataset):
    summary = ("English Wikipedia excerpt (the gensim wheel's test dump, 437k words): docs.txt one article "
               "per line, sentences.txt one sentence per line with a blank line between articles")
    task = "preprocess (data.objective=mlm / lm: docs.txt; bert: sentences.txt)"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        from pentad.data.assets import ensure_wikipedia_corpus

        corpus = ensure_wikipedia_corpus(cache)
        prepared = Prepared(source="gensim wheel (PyPI), its enwiki test dump")
        prepared.files["docs"] = "docs.txt"
        prepared.rows["docs"] = copy_head(corpus.docs_path, output / "docs.txt", rows, header=False)
        if rows is None:
            prepared.rows["sentences"] = copy_head(corpus.sentences_path, output / "sentences.txt", None,
                                                   header=False)
        else:  # the sentences of the first ``rows`` articles
            articles = corpus.sentences_path.read_text(encoding="utf-8").split("\n\n")[:rows]
            text = "\n\n".join(a.strip("\n") for a in articles) + "\n"
            atomic_write_text(output / "sentences.txt", text)
            prepared.rows["sentences"] = sum(1 for line in text.splitlines() if line)
        prepared.files["sentences"] = "sentences.txt"
        return prepared
