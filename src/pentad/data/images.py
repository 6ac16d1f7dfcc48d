"""Images as model input: decoding (Pillow), resizing, seeded augmentation and normalisation.

Images are decoded once, when a file of examples is read, into uint8 arrays ``[N, H, W, C]`` at
the model's image size (Pillow, bicubic, as Hugging Face's ViT image processor resizes); training
batches then crop, warp (random affine) and flip those arrays with the batch's seeded generator, and every batch is
normalised to float ``pixels [B, C, H, W]``. Nothing here needs a GPU, and nothing decodes an
image inside the training loop.

Colour: an image whose mode differs from the model's channels (grayscale for an RGB model, RGBA,
palette) is converted, and the conversion is reported once per file. Samples of more than 8 bits are
brought to 0..255 by their value range, never clipped: 16-bit images (``I;16``) are scaled by
255/65535; 32-bit integer images (``I``) are kept within 0..255 and read as 16-bit within 0..65535;
float images (``F``) are scaled by 255 within 0..1 and kept within 0..255. Any other range (negative
or non-finite samples, integers beyond 16 bits) is refused by name, as is a mode Pillow cannot
convert. Bad input (a missing path, a directory, FIFO or device, a file that is not an image or is
truncated, an image of more than ``max_pixels`` pixels: a decompression bomb) is a
:class:`~pentad.errors.UserError` naming the examples file, its line and the image path.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from pentad.config.base import StrictModel
from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.data.media_files import open_regular
from pentad.errors import UserError
from pentad.log import info

#: Normalisation presets: Hugging Face ViT's (0.5 everywhere) and ImageNet's (BEiT-style, timm).
NORMALISE = {"half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
             "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
             "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))}


class AugmentConfig(StrictModel):
    """Training-time augmentation (evaluation and inference never augment)."""

    crop_scale: list[float] | None = Field(
        [0.08, 1.0], description="random resized crop: the crop's share of the image area is drawn from "
        "this range (and its aspect ratio from 3/4..4/3), then resized back to the image size; null: no crop")
    flip: bool = Field(True, description="mirror half of the training images left to right (off for digits "
                       "and text, whose meaning a mirror changes)")
    rotate: float = Field(0.0, ge=0.0, le=180.0, description="random affine: rotate by an angle drawn from "
                          "-rotate..rotate degrees (0: no rotation)")
    translate: float = Field(0.0, ge=0.0, lt=1.0, description="random affine: shift by up to this share of the "
                             "width (across) and of the height (down), each drawn uniformly (0: no shift)")
    zoom: list[float] | None = Field(None, description="random affine: scale by a factor drawn from [low, high] "
                                     "(e.g. [0.9, 1.1]); null: no scaling")
    shear: float = Field(0.0, ge=0.0, lt=90.0, description="random affine: shear along the width by an angle "
                         "drawn from -shear..shear degrees (slants the image; 0: none)")

    @field_validator("zoom")
    @classmethod
    def _zoom(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or not 0.0 < value[0] <= value[1]):
            raise ValueError(f"expected [low, high] with 0 < low <= high, found {value}")
        return value

    @property
    def affine(self) -> bool:
        """Whether any random affine option is on."""
        return bool(self.rotate or self.translate or self.shear or self.zoom is not None)

    @field_validator("crop_scale")
    @classmethod
    def _range(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or not 0.0 < value[0] <= value[1] <= 1.0):
            raise ValueError(f"expected [low, high] with 0 < low <= high <= 1, found {value}")
        return value


class MixConfig(StrictModel):
    """Mixup and CutMix of training batches (Zhang et al. 2018; Yun et al. 2019; DeiT's recipe):
    each image blended with, or given a box cut from, another image of the batch, and its target
    becoming the two labels weighted by their share."""

    mixup: float = Field(0.8, ge=0.0, description="mixup: the Beta(a, a) the blend weight is drawn from "
                         "(DeiT: 0.8); 0: no mixup")
    cutmix: float = Field(1.0, ge=0.0, description="CutMix: the Beta(a, a) that sets the share of the image a "
                          "box from the other one replaces (DeiT: 1.0); 0: no CutMix")
    prob: float = Field(1.0, ge=0.0, le=1.0, description="the share of training batches that are mixed")
    switch: float = Field(0.5, ge=0.0, le=1.0, description="with both on, the share of mixed batches that use "
                          "CutMix rather than mixup")

    @property
    def on(self) -> bool:
        return self.prob > 0 and (self.mixup > 0 or self.cutmix > 0)


def mix_batch(pixels, labels: np.ndarray, num_labels: int, cfg: MixConfig, rng: np.random.Generator):
    """``pixels`` [B, C, H, W] (a float tensor) and class ids ``labels`` [B] -> mixed pixels and
    target distributions [B, num_labels] (float32), drawn with ``rng``. Row i is mixed with row
    B-1-i (the batch reversed, as timm pairs them); the weight of its own label is the share of
    its own pixels: lambda for mixup, the area outside the box for CutMix (the box is clipped to
    the image, and lambda recomputed from what is left). A batch that is not drawn for mixing keeps
    its pixels and gets one-hot targets."""
    import torch

    targets = np.zeros((len(labels), num_labels), dtype=np.float32)
    targets[np.arange(len(labels)), labels] = 1.0
    if not cfg.on or rng.random() >= cfg.prob:
        return pixels, torch.from_numpy(targets)
    cutmix = cfg.cutmix > 0 and (cfg.mixup <= 0 or rng.random() < cfg.switch)
    other = pixels.flip(0)
    if cutmix:
        lam = float(rng.beta(cfg.cutmix, cfg.cutmix))
        height, width = pixels.shape[-2:]
        cut_h, cut_w = int(height * np.sqrt(1.0 - lam)), int(width * np.sqrt(1.0 - lam))
        cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
        top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
        left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
        pixels = pixels.clone()
        pixels[..., top:bottom, left:right] = other[..., top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    else:
        lam = float(rng.beta(cfg.mixup, cfg.mixup))
        pixels = pixels * lam + other * (1.0 - lam)
    targets = lam * targets + (1.0 - lam) * targets[::-1]
    return pixels, torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float32))


def _mode(channels: int) -> str:
    if channels == 3:
        return "RGB"
    if channels == 1:
        return "L"
    raise UserError(f"images with {channels} channels are not supported: the patch embedding's channels must "
                    "be 3 (RGB) or 1 (grayscale)")


def _to_8bit(image: Any, where: str) -> tuple[Any, str]:
    """A single-channel image of more than 8 bits (``I;16*``, ``I``, ``F``) -> mode ``L`` by its value
    range (see the module's docstring), and what was done, for the log; other ranges are refused."""
    from PIL import Image

    samples = np.asarray(image)
    mode = image.mode
    if mode.startswith("I;16"):
        scaled, how = samples.astype(np.float64) * (255.0 / 65535.0), "16-bit samples scaled by 255/65535"
    else:
        kind = "float" if mode == "F" else "32-bit integer"
        reads = "float images within 0..1 or 0..255" if mode == "F" else "integer images within 0..65535"
        if not np.isfinite(samples).all():
            raise UserError(f"{where} has {kind} samples that are not finite (NaN or infinity); pentad reads {reads}")
        low, high = (float(samples.min()), float(samples.max())) if samples.size else (0.0, 0.0)
        if mode == "F" and low >= 0 and high <= 1.0:
            scaled, how = samples.astype(np.float64) * 255.0, "float samples within 0..1 scaled by 255"
        elif low >= 0 and high <= 255.0:
            scaled, how = samples.astype(np.float64), f"{kind} samples within 0..255 kept"
        elif mode != "F" and low >= 0 and high <= 65535.0:
            scaled, how = samples.astype(np.float64) * (255.0 / 65535.0), \
                "32-bit integer samples within 0..65535 read as 16-bit and scaled by 255/65535"
        else:
            raise UserError(f"{where} has {kind} samples from {low:g} to {high:g}; pentad reads {reads} and does not "
                            "guess how to map other values: convert the image to 8 or 16 bits first")
    out = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    return Image.fromarray(out), f"{mode} ({how})"


def decode_image(path: Path, where: str, size: tuple[int, int], channels: int,
                 max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
                 limit_key: str = "data.max_image_pixels") -> tuple[np.ndarray, str | None]:
    """One image file -> uint8 ``[H, W, C]`` at ``size`` (Pillow, bicubic), and what it was converted
    from (None when it already had the model's mode); ``where`` names it in errors.

    An image whose header declares more than ``max_pixels`` pixels (``limit_key`` names the setting in
    the error) is refused before it is decoded; Pillow's own guard (``Image.MAX_IMAGE_PIXELS``, which
    also checks the frames of GIF, ICO, ... while they load) is set to the same limit for the call."""
    from PIL import Image, UnidentifiedImageError

    mode = _mode(channels)
    height, width = size
    converted = None
    with open_regular(path, where, "image") as file:
        pillow_limit = Image.MAX_IMAGE_PIXELS
        try:
            with warnings.catch_warnings():
                # Pillow's guard is off while the header is read (the size is checked here, and named in the
                # error), then on at the same limit while frames load, its warning past the limit an error
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                Image.MAX_IMAGE_PIXELS = None
                with Image.open(file) as image:
                    pixels = image.size[0] * image.size[1]
                    if pixels > max_pixels:
                        raise UserError(f"{where} is {image.size[0]}x{image.size[1]} = {pixels:,} pixels, more than "
                                        f"{limit_key} {max_pixels:,} allows (a guard against decompression bombs); "
                                        f"raise {limit_key} if the image is genuine")
                    Image.MAX_IMAGE_PIXELS = max_pixels
                    image.load()
                    if image.mode.startswith("I;16") or image.mode in ("I", "F"):
                        image, converted = _to_8bit(image, where)
                        if mode != "L":
                            image = image.convert(mode)
                    elif image.mode != mode:
                        converted = image.mode
                        try:
                            image = image.convert(mode)
                        except ValueError:
                            raise UserError(f"{where} has the mode {converted}, which Pillow cannot convert to "
                                            f"{mode}") from None
                    if image.size != (width, height):
                        image = image.resize((width, height), Image.Resampling.BICUBIC)
                    array = np.asarray(image, dtype=np.uint8)
        except UnidentifiedImageError:
            raise UserError(f"{where} is not an image file Pillow can read") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise UserError(f"{where} holds a frame larger than {limit_key} {max_pixels:,} pixels allows ({error}); "
                            f"raise {limit_key} if the image is genuine") from None
        except OSError as error:
            raise UserError(f"{where} could not be decoded ({error}); the file may be truncated") from None
        finally:
            Image.MAX_IMAGE_PIXELS = pillow_limit
    return array.reshape(height, width, channels), converted


def load_images(paths: Sequence[Path], lines: Sequence[int], source: Path, size: tuple[int, int],
                channels: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """Decode and resize ``paths`` -> uint8 ``[N, H, W, C]``; ``lines``: each path's line in ``source``
    (the examples file), for errors; ``max_pixels``: ``data.max_image_pixels``."""
    height, width = size
    out = np.empty((len(paths), height, width, channels), dtype=np.uint8)
    converted: Counter[str] = Counter()
    for i, (path, line) in enumerate(zip(paths, lines)):
        out[i], mode = decode_image(path, f"{source}, line {line}: image {path}", size, channels, max_pixels)
        if mode is not None:
            converted[mode] += 1
    if converted:
        found = ", ".join(f"{n} {m}" for m, n in sorted(converted.items()))
        info(f"{source}: converted {found} image(s) to {_mode(channels)} (the model takes {channels} channel(s))")
    return out


def random_resized_crop(image: np.ndarray, scale: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """A crop covering a random share of ``image``'s area (``scale``) with an aspect ratio in 3/4..4/3,
    resized back to the image's size (uint8 ``[H, W, C]``). After ten draws that do not fit, the
    central crop of the largest fitting ratio (as torchvision's RandomResizedCrop)."""
    from PIL import Image

    height, width, channels = image.shape
    area = height * width
    log_ratio = (np.log(3 / 4), np.log(4 / 3))
    box = None
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        ratio = float(np.exp(rng.uniform(*log_ratio)))
        w = int(round(np.sqrt(target * ratio)))
        h = int(round(np.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            box = (left, top, left + w, top + h)
            break
    if box is None:
        ratio = width / height
        w, h = (width, int(round(width / 4 * 3))) if ratio > 4 / 3 else (
            (int(round(height * 3 / 4)), height) if ratio < 3 / 4 else (width, height))
        left, top = (width - w) // 2, (height - h) // 2
        box = (left, top, left + w, top + h)
    pil = Image.fromarray(image[..., 0] if channels == 1 else image)
    resized = pil.resize((width, height), Image.Resampling.BILINEAR, box=box)
    return np.asarray(resized, dtype=np.uint8).reshape(height, width, channels)


def random_affine(image: np.ndarray, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """``image`` (uint8 ``[H, W, C]``) rotated, sheared, scaled about its centre and shifted, by amounts
    drawn from ``cfg``'s ranges (as torchvision's RandomAffine), bilinear, the uncovered border black;
    the same shape. Only the options that are on draw from ``rng``."""
    from PIL import Image

    height, width, channels = image.shape
    angle = np.deg2rad(rng.uniform(-cfg.rotate, cfg.rotate)) if cfg.rotate else 0.0
    shear = np.deg2rad(rng.uniform(-cfg.shear, cfg.shear)) if cfg.shear else 0.0
    scale = rng.uniform(cfg.zoom[0], cfg.zoom[1]) if cfg.zoom is not None else 1.0
    dx, dy = (rng.uniform(-cfg.translate, cfg.translate, size=2) * (width, height) if cfg.translate
              else (0.0, 0.0))
    cx, cy = width / 2, height / 2
    # output = shift(centre + d) . rotate . shear . scale . shift(-centre) of the input (pixel-centre coordinates)
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0, 0, 1]])
    shearing = np.array([[1.0, np.tan(shear), 0.0], [0.0, 1.0, 0.0], [0, 0, 1]])
    forward = (np.array([[1.0, 0.0, cx + dx], [0.0, 1.0, cy + dy], [0, 0, 1]]) @ rotation @ shearing
               @ np.diag([scale, scale, 1.0]) @ np.array([[1.0, 0.0, -cx], [0.0, 1.0, -cy], [0, 0, 1]]))
    inverse = np.linalg.inv(forward)  # Pillow maps each output pixel back to the input
    pil = Image.fromarray(image[..., 0] if channels == 1 else image)
    out = pil.transform((width, height), Image.Transform.AFFINE, tuple(inverse[:2].ravel()),
                        resample=Image.Resampling.BILINEAR, fillcolor=0)
    return np.asarray(out, dtype=np.uint8).reshape(height, width, channels)


def to_pixels(images: np.ndarray, mean: Sequence[float], std: Sequence[float]):
    """uint8 ``[B, H, W, C]`` -> float32 tensor ``[B, C, H, W]``, scaled to 0..1 then normalised."""
    import torch

    channels = images.shape[-1]
    m = np.asarray(mean[:channels], dtype=np.float32).reshape(1, channels, 1, 1)
    s = np.asarray(std[:channels], dtype=np.float32).reshape(1, channels, 1, 1)
    pixels = images.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    return torch.from_numpy((pixels - m) / s)


def augment(images: np.ndarray, cfg: AugmentConfig | None, rng: np.random.Generator) -> np.ndarray:
    """The training view of a batch of uint8 images (a copy; the stored images stay as read): per
    image, the random resized crop, then the random affine, then the flip, as ``cfg`` turns them on."""
    if cfg is None:
        return images
    out = images.copy()
    for i in range(len(out)):
        if cfg.crop_scale is not None:
            out[i] = random_resized_crop(out[i], cfg.crop_scale, rng)
        if cfg.affine:
            out[i] = random_affine(out[i], cfg, rng)
        if cfg.flip and rng.random() < 0.5:
            out[i] = out[i][:, ::-1]
    return out
