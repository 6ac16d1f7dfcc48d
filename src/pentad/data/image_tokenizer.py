"""A discrete image tokenizer pentad trains itself: a k-means codebook over image patches (BEiT's
visual tokens, without DALL-E's or VQGAN's weights, which are not downloadable here).

An image (uint8 ``[H, W, C]``, H and W multiples of ``patch_size``) is cut into non-overlapping
``patch_size`` squares, row by row; each patch, scaled to 0..1 (``pixel / 255``) and flattened to
``patch_size * patch_size * C`` numbers, becomes the id of its nearest centroid (squared Euclidean
distance). Decoding puts each id's centroid back as pixels, so ``decode(encode(x))`` is the image
as the codebook can draw it.

Fitting (:func:`fit_image_tokenizer`) is mini-batch k-means (Sculley, "Web-scale k-means
clustering", 2010) in numpy over at most ``max_patches`` patches sampled from the images
(reservoir sampling, so memory stays bounded whatever the number of images), seeded: the same
images, options and seed give the same codebook bit for bit. Centroids start at distinct sampled
patches; one that no patch chose for a while is moved to a random sampled patch.

The file is one safetensors file (``codebook``: float32 ``[K, P*P*C]``) whose header metadata holds
the options as JSON; it loads without pickle and without torch (preprocess workers load it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.errors import UserError
from pentad.log import info

FORMAT_NAME = "pentad-image-tokenizer"
FORMAT_VERSION = 1
#: visual token ids are stored as uint16 in the shards
MAX_CODEBOOK_SIZE = 65536
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class ImageTokenizer:
    """A patch codebook: ``encode`` uint8 images ``[B, H, W, C]`` -> ids ``[B, (H/p)(W/p)]``,
    ``decode`` ids -> uint8 images. ``codebook``: float32 ``[K, p*p*C]`` in 0..1 pixel units."""

    def __init__(self, codebook: np.ndarray, patch_size: int, channels: int, meta: dict[str, Any] | None = None):
        codebook = np.ascontiguousarray(codebook, dtype=np.float32)
        if codebook.ndim != 2 or codebook.shape[1] != patch_size * patch_size * channels:
            raise ValueError(f"a codebook for {patch_size}-pixel patches of {channels} channel(s) has rows of "
                             f"{patch_size * patch_size * channels} numbers, found shape {list(codebook.shape)}")
        self.codebook = codebook
        self.patch_size = int(patch_size)
        self.channels = int(channels)
        self.meta = dict(meta or {})
        self._squares = (codebook.astype(np.float64) ** 2).sum(1).astype(np.float32)

    @property
    def codebook_size(self) -> int:
        return len(self.codebook)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Patches along the height and the width of a ``height x width`` image."""
        p = self.patch_size
        if height % p or width % p:
            raise UserError(f"images of {height}x{width} pixels do not divide into the image tokenizer's "
                            f"{p}-pixel patches; choose an image size that is a multiple of {p}")
        return height // p, width // p

    def patches(self, images: np.ndarray) -> np.ndarray:
        """uint8 ``[B, H, W, C]`` -> float32 ``[B, N, p*p*C]`` in 0..1, patches row by row."""
        images = np.asarray(images)
        if images.ndim != 4 or images.shape[-1] != self.channels:
            raise ValueError(f"expected uint8 images [B, H, W, {self.channels}], found shape {list(images.shape)}")
        b, h, w, c = images.shape
        rows, cols = self.grid(h, w)
        p = self.patch_size
        out = images.reshape(b, rows, p, cols, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, rows * cols, p * p * c)
        return out.astype(np.float32) / 255.0

    def nearest(self, vectors: np.ndarray) -> np.ndarray:
        """float32 ``[M, D]`` (0..1) -> int64 ``[M]`` ids of the nearest centroids."""
        return nearest(vectors, self.codebook, self._squares)

    def encode(self, images: np.ndarray) -> np.ndarray:
        """uint8 ``[B, H, W, C]`` -> int64 ids ``[B, N]``, N = (H/p)(W/p), patches row by row."""
        vectors = self.patches(images)
        b, n, d = vectors.shape
        return self.nearest(vectors.reshape(b * n, d)).reshape(b, n)

    def decode(self, ids: np.ndarray, grid: tuple[int, int] | None = None) -> np.ndarray:
        """int ids ``[B, N]`` -> uint8 images ``[B, H, W, C]`` (each patch its centroid); ``grid``: patches
        along the height and width (default: a square grid)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2:
            raise ValueError(f"expected ids [B, N], found shape {list(ids.shape)}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.codebook_size):
            raise ValueError(f"ids must lie in 0..{self.codebook_size - 1}, found {ids.min()}..{ids.max()}")
        b, n = ids.shape
        if grid is None:
            side = int(round(n ** 0.5))
            if side * side != n:
                raise ValueError(f"{n} patches are not a square grid: give grid=(rows, columns)")
            grid = (side, side)
        rows, cols = grid
        if rows * cols != n:
            raise ValueError(f"grid {rows}x{cols} does not hold {n} patches")
        p, c = self.patch_size, self.channels
        pixels = self.codebook[ids].reshape(b, rows, cols, p, p, c).transpose(0, 1, 3, 2, 4, 5)
        return np.clip(np.rint(pixels.reshape(b, rows * p, cols * p, c) * 255.0), 0, 255).astype(np.uint8)

    def metadata(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "patch_size": self.patch_size,
                "channels": self.channels, "codebook_size": self.codebook_size,
                "normalise": "pixel / 255 (0..1), patches flattened as [row, column, channel]", **self.meta}

    def fingerprint(self) -> str:
        """sha256 of the codebook and options (what a dataset's visual tokens depend on)."""
        digest = hashlib.sha256(self.codebook.tobytes())
        digest.update(f"{self.patch_size},{self.channels}".encode())
        return digest.hexdigest()[:16]

    def save(self, path: Path) -> None:
        """One safetensors file: the codebook, and the metadata as JSON in its header."""
        from safetensors.numpy import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file({"codebook": self.codebook}, str(tmp), metadata={FORMAT_NAME: json.dumps(self.metadata())})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, what: str = "image tokenizer") -> ImageTokenizer:
        """Read a file :meth:`save` wrote; ``what`` names the option it came from in errors."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise UserError(f"{what} {path} does not exist; fit one with `pentad image-tokenizer fit --images DIR "
                            f"--output {path.name}`")
        try:
            with safe_open(str(path), framework="numpy") as f:
                header = f.metadata() or {}
                codebook = f.get_tensor("codebook") if "codebook" in f.keys() else None
        except Exception as error:  # safetensors raises its own error types for a damaged header
            raise UserError(f"{what} {path} is not a safetensors file ({error})") from None
        try:
            meta = json.loads(header.get(FORMAT_NAME, "null"))
        except json.JSONDecodeError:
            meta = None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME or codebook is None:
            raise UserError(f"{what} {path} is a safetensors file but not a pentad image tokenizer (expected a "
                            f"'codebook' tensor and '{FORMAT_NAME}' metadata, as `pentad image-tokenizer fit` "
                            "writes)")
        if meta.get("version") != FORMAT_VERSION:
            raise UserError(f"{what} {path} has format version {meta.get('version')}; this pentad reads version "
                            f"{FORMAT_VERSION}")
        extra = {k: v for k, v in meta.items() if k not in ("format", "version", "patch_size", "channels",
                                                             "codebook_size", "normalise")}
        try:
            return cls(codebook, int(meta["patch_size"]), int(meta["channels"]), extra)
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"{what} {path}: inconsistent metadata and codebook ({error})") from None


PIXEL_RANGES = {"0-1": (0.0, 1.0), "0-255": (0.0, 255.0), "symmetric": (-1.0, 1.0)}


def import_codebook(path: Path, patch_size: int, channels: int, layout: str = "hwc",
                    pixel_range: str = "0-1") -> ImageTokenizer:
    """A codebook made elsewhere as a pentad image tokenizer: ``path`` is a ``.npy`` file (read without
    pickle) or a safetensors file holding one 2-D tensor, ``[K, patch_size * patch_size * channels]``,
    one centroid per row. ``layout``: how a row flattens a patch, ``hwc`` (row, column, channel: pentad's)
    or ``chw`` (channel first, as a convolution's weights); ``pixel_range``: the units of its numbers
    (``0-1``, ``0-255`` or ``symmetric``, -1..1), rescaled to pentad's 0..1. UserError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"codebook {path} does not exist")
    if layout not in ("hwc", "chw"):
        raise UserError(f"--layout {layout!r}: expected hwc (row, column, channel) or chw (channel first)")
    if pixel_range not in PIXEL_RANGES:
        raise UserError(f"--pixel-range {pixel_range!r}: expected one of {', '.join(PIXEL_RANGES)}")
    if path.suffix == ".npy":
        try:
            codebook = np.load(path, allow_pickle=False)
        except ValueError as error:
            raise UserError(f"codebook {path} cannot be read without unpickling objects ({error}); save the "
                            "centroids as a plain numeric array") from None
        except OSError as error:
            raise UserError(f"codebook {path} is not a .npy file ({error})") from None
    else:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                names = list(f.keys())
                if len(names) != 1:
                    raise UserError(f"codebook {path} holds {len(names)} tensors ({', '.join(names[:5])}); expected "
                                    "one [K, D] tensor of centroids")
                codebook = f.get_tensor(names[0])
        except UserError:
            raise
        except Exception as error:
            raise UserError(f"codebook {path} is neither a .npy nor a safetensors file ({error})") from None
    width = patch_size * patch_size * channels
    if codebook.ndim != 2 or codebook.shape[1] != width or codebook.dtype.kind not in "fiu":
        raise UserError(f"codebook {path}: expected numbers of shape [K, {width}] (patches of {patch_size}x"
                        f"{patch_size} pixels, {channels} channel(s)), found {codebook.dtype} {list(codebook.shape)}")
    if not 1 <= len(codebook) <= MAX_CODEBOOK_SIZE:
        raise UserError(f"codebook {path} has {len(codebook)} centroids; pentad stores visual tokens as uint16 "
                        f"(1 to {MAX_CODEBOOK_SIZE})")
    values = codebook.astype(np.float64)
    if not np.isfinite(values).all():
        raise UserError(f"codebook {path} holds non-finite numbers")
    low, high = PIXEL_RANGES[pixel_range]
    if values.min() < low - 1e-3 * (high - low) or values.max() > high + 1e-3 * (high - low):
        raise UserError(f"codebook {path}: its numbers run from {values.min():.4g} to {values.max():.4g}, outside "
                        f"--pixel-range {pixel_range}; give the range its centroids are in")
    values = (values - low) / (high - low)
    if layout == "chw":
        values = values.reshape(-1, channels, patch_size, patch_size).transpose(0, 2, 3, 1).reshape(-1, width)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return ImageTokenizer(values.astype(np.float32), patch_size, channels,
                          {"imported_from": path.name, "source_sha256": digest, "source_layout": layout,
                           "source_pixel_range": pixel_range})


def nearest(vectors: np.ndarray, codebook: np.ndarray, squares: np.ndarray | None = None,
            chunk: int = 4096) -> np.ndarray:
    """The nearest row of ``codebook [K, D]`` to each row of ``vectors [M, D]`` -> int64 ``[M]``; in
    chunks of ``chunk`` rows, so the ``[chunk, K]`` distance block bounds the memory. ``squares``:
    the rows' squared norms, when known."""
    if squares is None:
        squares = (codebook.astype(np.float64) ** 2).sum(1).astype(np.float32)
    out = np.empty(len(vectors), dtype=np.int64)
    for start in range(0, len(vectors), chunk):
        block = vectors[start:start + chunk]
        # |x - c|^2 = |x|^2 - 2 x.c + |c|^2, and |x|^2 is the same for every c
        out[start:start + chunk] = (squares[None, :] - 2.0 * (block @ codebook.T)).argmin(1)
    return out


def _reservoir(batches: Iterable[np.ndarray], size: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """At most ``size`` rows sampled uniformly from the rows of ``batches`` (float32 [M, D] each),
    holding no more than ``size`` rows at a time (Algorithm R, vectorised per batch); and the count seen."""
    sample: np.ndarray | None = None
    seen = 0
    for rows in batches:
        if sample is None:
            sample = np.empty((size, rows.shape[1]), dtype=np.float32)
        take = min(len(rows), max(0, size - seen))
        sample[seen:seen + take] = rows[:take]
        rest = rows[take:]
        if len(rest):
            # row j of the stream (0-based) replaces a random slot with probability size / (j + 1)
            index = seen + take + np.arange(len(rest))
            slots = (rng.random(len(rest)) * (index + 1)).astype(np.int64)
            keep = slots < size
            # later rows win over earlier ones drawing the same slot, as in the sequential algorithm
            sample[slots[keep]] = rest[keep]
        seen += len(rows)
    if sample is None:
        return np.zeros((0, 0), dtype=np.float32), 0
    return sample[:min(seen, size)], seen


def minibatch_kmeans(data: np.ndarray, k: int, rng: np.random.Generator, steps: int = 100,
                     batch_size: int = 1024, reassign_after: int = 10) -> np.ndarray:
    """Mini-batch k-means (Sculley 2010) of float32 ``data [M, D]`` -> centroids ``[k, D]``.

    Each step assigns ``batch_size`` random rows to their nearest centroid and moves each chosen
    centroid towards its rows' mean with a per-centroid rate of 1 / (rows it has seen); a centroid
    not chosen for ``reassign_after`` steps moves to a random row (so no code stays dead)."""
    m = len(data)
    if m < k:
        raise UserError(f"the images hold {m} patch(es), fewer than the codebook's {k} codes; give more images "
                        "or a smaller codebook")
    centroids = data[rng.choice(m, size=k, replace=False)].astype(np.float32).copy()
    counts = np.zeros(k, dtype=np.float64)
    idle = np.zeros(k, dtype=np.int64)
    for _ in range(steps):
        batch = data[rng.integers(0, m, size=min(batch_size, m))]
        ids = nearest(batch, centroids)
        hits = np.bincount(ids, minlength=k).astype(np.float64)
        sums = np.zeros_like(centroids, dtype=np.float64)
        np.add.at(sums, ids, batch)
        chosen = hits > 0
        counts[chosen] += hits[chosen]
        rate = (hits[chosen] / counts[chosen])[:, None]
        centroids[chosen] = ((1.0 - rate) * centroids[chosen] + rate * sums[chosen] / hits[chosen, None]).astype(
            np.float32)
        idle = np.where(chosen, 0, idle + 1)
        dead = np.flatnonzero(idle >= reassign_after)
        if len(dead):
            centroids[dead] = data[rng.integers(0, m, size=len(dead))]
            counts[dead] = 0.0
            idle[dead] = 0
    return centroids


def image_files(source: Path) -> tuple[list[Path], str]:
    """The images of ``source``: a folder (searched recursively, sorted) or a corpus file (a header line
    with a ``path`` column, tab-separated, or JSON lines with a "path" key; paths relative to its folder).
    Returns the paths and a description for messages."""
    source = Path(source)
    if source.is_dir():
        paths = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise UserError(f"{source} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
        return paths, f"{len(paths)} image(s) under {source}"
    if not source.is_file():
        raise UserError(f"--images {source} does not exist (give a folder of images or a corpus file)")
    folder = source.resolve().parent
    lines = source.read_text(encoding="utf-8").splitlines()
    paths: list[Path] = []
    column = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                value = json.loads(line).get("path")
            except (json.JSONDecodeError, AttributeError):
                value = None
            if not isinstance(value, str):
                raise UserError(f"{source}, line {number}: expected a JSON object with the string 'path'")
        elif column is None:
            names = [c.strip().lower() for c in line.split("\t")]
            if "path" not in names:
                raise UserError(f"{source}, line {number}: expected a header line naming a 'path' column (or JSON "
                                f"lines with a \"path\" key), found {line.strip()[:80]!r}")
            column = names.index("path")
            continue
        else:
            fields = line.split("\t")
            if len(fields) <= column:
                raise UserError(f"{source}, line {number}: has no column {column + 1} (path)")
            value = fields[column].strip()
        paths.append(Path(value) if Path(value).is_absolute() else folder / value)
    if not paths:
        raise UserError(f"{source} names no images")
    return paths, f"{len(paths)} image(s) named in {source}"


def fit_image_tokenizer(images: Iterable[np.ndarray], patch_size: int, codebook_size: int, seed: int = 0,
                        max_patches: int = 200_000, steps: int = 200, batch_size: int = 2048,
                        channels: int | None = None) -> ImageTokenizer:
    """Fit a k-means patch codebook on ``images`` (an iterable of uint8 ``[B, H, W, C]`` batches, read
    once); memory is bounded by ``max_patches`` sampled patches. Seeded and deterministic."""
    if not 2 <= codebook_size <= MAX_CODEBOOK_SIZE:
        raise UserError(f"codebook size {codebook_size}: expected 2..{MAX_CODEBOOK_SIZE} (ids are stored as uint16)")
    rng = np.random.default_rng(seed)
    found: dict[str, int] = {}

    def patches() -> Iterator[np.ndarray]:
        for batch in images:
            batch = np.asarray(batch, dtype=np.uint8)
            found.setdefault("channels", batch.shape[-1])
            cutter = ImageTokenizer(np.zeros((1, patch_size * patch_size * batch.shape[-1]), np.float32),
                                    patch_size, batch.shape[-1])
            vectors = cutter.patches(batch)
            yield vectors.reshape(-1, vectors.shape[-1])

    sample, seen = _reservoir(patches(), max_patches, rng)
    if not seen:
        raise UserError("no images to fit the image tokenizer on")
    got = found["channels"]
    if channels is not None and got != channels:
        raise ValueError(f"images of {got} channel(s), expected {channels}")
    centroids = minibatch_kmeans(sample, codebook_size, rng, steps=steps, batch_size=batch_size)
    meta = {"fit": {"patches_seen": int(seen), "patches_sampled": int(len(sample)), "seed": int(seed),
                    "steps": int(steps), "batch_size": int(batch_size)}}
    return ImageTokenizer(centroids, patch_size, got, meta)


def fit_on_files(source: Path, output: Path, image_size: int | tuple[int, int], patch_size: int,
                 codebook_size: int, channels: int = 3, seed: int = 0, max_patches: int = 200_000,
                 steps: int = 200, batch_size: int = 2048,
                 max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> ImageTokenizer:
    """``pentad image-tokenizer fit``: decode the images of ``source`` (a folder or a corpus file; see
    :func:`image_files`) at ``image_size`` (Pillow, bicubic, as preprocessing does), fit and save."""
    from pentad.data.images import decode_image

    size = (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))
    if size[0] % patch_size or size[1] % patch_size:
        raise UserError(f"image size {size[0]}x{size[1]} is not a multiple of the patch size {patch_size}")
    paths, described = image_files(source)

    def batches() -> Iterator[np.ndarray]:
        for start in range(0, len(paths), 64):
            yield np.stack([decode_image(p, f"{source}: image {p}", size, channels, max_pixels,
                                         "--max-image-pixels")[0]
                            for p in paths[start:start + 64]])

    tokenizer = fit_image_tokenizer(batches(), patch_size, codebook_size, seed, max_patches, steps, batch_size)
    tokenizer.meta["fit"]["images"] = len(paths)
    tokenizer.meta["image_size"] = list(size)
    tokenizer.save(output)
    info(f"image tokenizer: {codebook_size} codes of {patch_size}x{patch_size}x{channels} patches fitted on "
         f"{described} ({tokenizer.meta['fit']['patches_sampled']:,} sampled patches) -> {output}")
    return tokenizer


def load_for_objective(path: Path | None, objective: str, purpose: str, image_size: tuple[int, int],
                       channels: int) -> tuple[ImageTokenizer, tuple[int, int]]:
    """The image tokenizer an objective's ``image_tokenizer`` option names, checked against the
    objective's images, and the patch grid (rows, cols) of one image; ``purpose``: what its ids are to
    the objective, for the error when the option is missing."""
    if path is None:
        raise UserError(f"objective '{objective}' needs data.objective.image_tokenizer=FILE: {purpose} are the ids of "
                        "an image tokenizer's codebook (fit one with `pentad image-tokenizer fit --images DIR "
                        "--output FILE`)")
    image = ImageTokenizer.load(Path(path), "data.objective.image_tokenizer")
    if image.channels != channels:
        raise UserError(f"data.objective.image_tokenizer {path} encodes images of {image.channels} channel(s), but "
                        f"data.objective.channels is {channels}")
    if image_size[0] % image.patch_size or image_size[1] % image.patch_size:
        raise UserError(f"data.objective.image_size {list(image_size)} is not a multiple of the image tokenizer's "
                        f"patch size {image.patch_size} ({path})")
    return image, image.grid(*image_size)

