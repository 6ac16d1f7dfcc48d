"""A CLIP-style two-tower model trained from scratch on real image–text pairs: the emoji of the Noto
Color Emoji font, each drawn with Pillow and captioned by its Unicode name, scored by retrieval on
held-out emoji against chance in the same run.

Data: Debian's ``fonts-noto-color-emoji`` (SIL Open Font License; ``apt-get download
fonts-noto-color-emoji`` fetches the .deb from the Debian archive, and ``dpkg-deb -x`` unpacks it; or
pass ``--font`` where it is installed). Every single-code-point character the font maps and
``unicodedata`` names is drawn at the font's bitmap size (109 px) on white, resized to ``--image``
pixels, and captioned with its name in lower case ("grinning face with smiling eyes"); a seeded
80/10/10 split of the characters gives train/dev/test pairs, so every test emoji is unseen in
training. A WordPiece vocabulary is built from the training captions only.

The model is ``clip/base-32`` shrunk (both towers ``--width`` wide and ``--layers`` deep, patches of
``--patch`` pixels, ``model.init_std`` = width^-0.5 as CLIP's own initialisation), trained with
``pentad finetune --task image_text``; the table gives recall@1 and @5 in both directions on the
test pairs against chance (k / number of test pairs). Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/clip_emoji.py            # ~10 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/clip_emoji.py --quick    # 3 epochs
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
import unicodedata
from pathlib import Path

FONT = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")


def find_font(given: str | None, work: Path) -> Path:
    if given:
        return Path(given)
    if FONT.is_file():
        return FONT
    subprocess.run(["apt-get", "download", "fonts-noto-color-emoji"], cwd=work, check=True, capture_output=True)
    deb = next(work.glob("fonts-noto-color-emoji_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "font")], check=True)
    return next((work / "font").rglob("NotoColorEmoji.ttf"))


def draw_emoji(font_path: Path, out: Path, size: int, seed: int) -> dict[str, Path]:
    from fontTools.ttLib import TTFont
    from PIL import Image, ImageDraw, ImageFont

    cmap = TTFont(str(font_path)).getBestCmap()
    font = ImageFont.truetype(str(font_path), 109)
    pairs = []
    (out / "img").mkdir(parents=True, exist_ok=True)
    for code in sorted(cmap):
        char = chr(code)
        name = unicodedata.name(char, "")
        if code < 0x2000 or not name or "VARIATION SELECTOR" in name or "TAG " in name or "MODIFIER" in name:
            continue
        image = Image.new("RGB", (136, 128), "white")
        ImageDraw.Draw(image).text((0, 0), char, font=font, embedded_color=True)
        if image.getextrema() == ((255, 255),) * 3:
            continue  # nothing drawn
        path = f"img/{code:05x}.png"
        image.resize((size, size), Image.Resampling.LANCZOS).save(out / path)
        pairs.append((name.lower(), path))
    random.Random(seed).shuffle(pairs)
    n = len(pairs)
    splits = {"train": pairs[:int(0.8 * n)], "dev": pairs[int(0.8 * n):int(0.9 * n)], "test": pairs[int(0.9 * n):]}
    files = {}
    for split, rows in splits.items():
        files[split] = out / f"{split}.tsv"
        files[split].write_text("text\tpath\n" + "".join(f"{t}\t{p}\n" for t, p in rows), encoding="utf-8")
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--font", default=None)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from pentad.cli.main import main as cli
    from pentad.data.vocab_builder import build_vocab

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = draw_emoji(find_font(args.font, root), root / "emoji", args.image, seed=0)
        captions = root / "captions.txt"
        captions.write_text("\n".join(line.split("\t")[0] for line in files["train"].read_text().splitlines()[1:]))
        build_vocab([captions], "wordpiece", 2000, root / "vocab", lowercase=True, min_frequency=1, show_progress=False)
        counts = {k: len(p.read_text().splitlines()) - 1 for k, p in files.items()}
        positions = (args.image // args.patch) ** 2 + 1
        heads = max(1, args.width // 32)
        tower = [f"num_layers={args.layers}", f"num_heads={heads}", f"ffn_size={4 * args.width}"]
        overrides = [f"model.hidden_size={args.width}", "model.max_seq_length=32",
                     *(f"model.encoder.{t}" for t in tower),
                     f"model.streams.image.hidden_size={args.width}",
                     f"model.streams.image.max_seq_length={positions}",
                     f"model.streams.image.embedding.parts.0.image_size={args.image}",
                     f"model.streams.image.embedding.parts.0.patch_size={args.patch}",
                     *(f"model.streams.image.encoder.{t}" for t in tower),
                     f"model.targets.0.feature_size={args.width}", f"model.init_std={args.width ** -0.5:.4f}",
                     "tokenizer.type=wordpiece", f"tokenizer.vocab={root / 'vocab' / 'vocab.txt'}",
                     f"data.train={files['train']}", f"data.dev={files['dev']}", f"data.test={files['test']}",
                     f"output={root / 'run'}", f"train.epochs={3 if args.quick else args.epochs}",
                     f"train.batch_size={args.batch_size}", f"train.lr={args.lr}", "train.weight_decay=0.1",
                     "train.progress=false", f"train.threads={args.threads}"]
        start = time.perf_counter()
        assert cli(["finetune", "--task", "image_text", "--config", "clip/base-32", *overrides]) == 0
        seconds = time.perf_counter() - start
        test = json.loads((root / "run" / "results.json").read_text())["test"]
    n = counts["test"]
    print(f"\nemoji pairs train/dev/test {counts['train']}/{counts['dev']}/{counts['test']}, {args.image}px images, "
          f"towers {args.layers}x{args.width}, {3 if args.quick else args.epochs} epochs, {seconds:.0f} s")
    print("| direction | recall@1 | chance@1 | recall@5 | chance@5 |\n|---|---:|---:|---:|---:|")
    for key, label in (("t2i", "text → image"), ("i2t", "image → text")):
        print(f"| {label} | {test[key + '_r1']:.3f} | {1 / n:.3f} | {test[key + '_r5']:.3f} | {5 / n:.3f} |")


if __name__ == "__main__":
    main()
