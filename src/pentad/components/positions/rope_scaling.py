"""RoPE scaling (``model.encoder.rope_scaling``, ``model.decoder.rope_scaling``): how the rotary scheme's
frequencies stretch past the length a model was trained on, and the factor its cos/sin tables are
multiplied by. One class per kind, chosen by ``type``; each is a
:class:`~pentad.layers.positions.RotaryScaling` that :class:`~pentad.layers.positions.Rotary` asks once
per forward. The kinds and their numbers are those of Hugging Face transformers' ``rope_type`` values
(``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``), under the same key names, so that a
config.json's ``rope_parameters`` (or ``rope_scaling``) section reads as this section.

A new kind is one class here, with ``type``, its fields, ``frequencies`` and ``attention_scaling``,
added to ``KINDS``.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

import torch
from pydantic import Field
from torch import Tensor

from pentad.config.base import StrictModel
from pentad.layers.positions import rotary_inv_freq

ORIGINAL = Field(None, ge=1, description="the length the model was trained on before scaling; default "
                 "model.max_seq_length")


class _Scaling(StrictModel):
    """What every kind shares: no sequence-length dependence and no attention factor unless it says so."""

    @property
    def length_dependent(self) -> bool:
        return False

    def attention_scaling(self) -> float:
        """The factor cos and sin are multiplied by."""
        return 1.0

    def resolved(self, max_seq_length: int) -> _Scaling:
        """This kind with the defaults that depend on the model (``model.max_seq_length``) filled in."""
        if getattr(self, "original_max_position_embeddings", 0) is None:
            return self.model_copy(update={"original_max_position_embeddings": max_seq_length})
        return self

    def problems(self, rotary_dim: int) -> list[tuple[str, str]]:
        """(sub-path, message) of what does not fit ``rotary_dim`` rotated dimensions per head."""
        return []


class LinearScaling(_Scaling):
    """Position interpolation: every frequency divided by ``factor`` (positions squeezed ``factor``-fold)."""

    type: Literal["linear"] = "linear"
    factor: float = Field(gt=0.0, description="how many times longer the sequences are than in training")

    def frequencies(self, dim: int, base: float, length: int | Tensor | None, device: torch.device) -> Tensor:
        return rotary_inv_freq(dim, base, device) / self.factor


class DynamicScaling(_Scaling):
    """Dynamic NTK: up to ``original_max_position_embeddings`` the plain frequencies; beyond, a larger
    base ``base * (factor * length / original - (factor - 1)) ^ (dim / (dim - 2))`` for the sequence
    length seen (cached positions included). Stateless: each forward uses its own length, which equals
    transformers' cached frequencies for one forward and for generation, where the length only grows."""

    type: Literal["dynamic"] = "dynamic"
    factor: float = Field(gt=0.0, description="the base's growth per original length beyond it")
    original_max_position_embeddings: int | None = ORIGINAL

    @property
    def length_dependent(self) -> bool:
        return True

    def frequencies(self, dim: int, base: float, length: int | Tensor | None, device: torch.device) -> Tensor:
        original = self.original_max_position_embeddings
        seen = torch.as_tensor(original if length is None else length, device=device)
        seen = torch.clamp(seen, min=original)
        stretched = base * ((self.factor * seen / original) - (self.factor - 1)) ** (dim / (dim - 2))
        return rotary_inv_freq(dim, stretched, device)

    def problems(self, rotary_dim: int) -> list[tuple[str, str]]:
        if rotary_dim <= 2:
            return [("rope_scaling.type", f"dynamic needs more than 2 rotated dimensions (its base grows by a power "
                                          f"dim / (dim - 2)); got {rotary_dim}")]
        return []


class YarnScaling(_Scaling):
    """YaRN (Peng et al. 2023): frequencies that turn fewer than ``beta_slow`` times over the original
    length are interpolated (divided by ``factor``), those turning more than ``beta_fast`` times kept,
    a linear ramp between; cos and sin multiplied by ``attention_factor`` (default
    ``0.1 * ln(factor) + 1``, or the ratio of ``mscale`` and ``mscale_all_dim``'s such terms)."""

    type: Literal["yarn"] = "yarn"
    factor: float | None = Field(None, gt=0.0, description="default: model.max_seq_length / "
                                 "original_max_position_embeddings")
    original_max_position_embeddings: int | None = ORIGINAL
    attention_factor: float | None = Field(None, ge=0.0, description="multiplies cos and sin; default from factor, "
                                           "mscale and mscale_all_dim")
    beta_fast: float | None = Field(None, description="default 32")
    beta_slow: float | None = Field(None, description="default 1")
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = Field(None, description="round the ramp's ends outwards to whole dimensions; default true")

    def resolved(self, max_seq_length: int) -> YarnScaling:
        done = super().resolved(max_seq_length)
        if done.factor is None:
            done = done.model_copy(update={"factor": max_seq_length / done.original_max_position_embeddings})
        return done

    def attention_scaling(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(mscale(self.factor, self.mscale) / mscale(self.factor, self.mscale_all_dim))
        return mscale(self.factor)

    def frequencies(self, dim: int, base: float, length: int | Tensor | None, device: torch.device) -> Tensor:
        fast, slow = self.beta_fast or 32, self.beta_slow or 1
        original = self.original_max_position_embeddings

        def dimension(turns: float) -> float:  # the dimension whose frequency turns `turns` times over `original`
            return (dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))

        low, high = dimension(fast), dimension(slow)
        if self.truncate is not False:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
        kept = 1 - ramp  # the share of each pair's plain (extrapolated) frequency
        turns = base ** (torch.arange(0, dim, 2, device=device).float() / dim)
        plain, squeezed = 1.0 / turns, 1.0 / (self.factor * turns)
        return squeezed * (1 - kept) + plain * kept

    def problems(self, rotary_dim: int) -> list[tuple[str, str]]:
        if (self.beta_fast or 32) < (self.beta_slow or 1):
            return [("rope_scaling.beta_fast", f"{self.beta_fast or 32} is below beta_slow {self.beta_slow or 1}; "
                                               "the fast boundary must be the larger number of turns")]
        return []


class Llama3Scaling(_Scaling):
    """Llama 3.1's: wavelengths shorter than ``original / high_freq_factor`` kept, longer than
    ``original / low_freq_factor`` divided by ``factor``, a smooth blend between; no attention factor."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0.0, description="8 in Llama 3.1")
    low_freq_factor: float = Field(gt=0.0, description="1 in Llama 3.1")
    high_freq_factor: float = Field(gt=0.0, description="4 in Llama 3.1")
    original_max_position_embeddings: int | None = ORIGINAL

    def frequencies(self, dim: int, base: float, length: int | Tensor | None, device: torch.device) -> Tensor:
        plain = rotary_inv_freq(dim, base, device)
        original, low, high = self.original_max_position_embeddings, self.low_freq_factor, self.high_freq_factor
        wavelength = 2 * math.pi / plain
        scaled = torch.where(wavelength > original / low, plain / self.factor, plain)
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelength < original / high) * ~(wavelength > original / low)
        return torch.where(medium, blended, scaled)

    def problems(self, rotary_dim: int) -> list[tuple[str, str]]:
        if self.high_freq_factor <= self.low_freq_factor:
            return [("rope_scaling.high_freq_factor", f"{self.high_freq_factor} is not above low_freq_factor "
                                                      f"{self.low_freq_factor}; the blend lies between them")]
        return []


class LongRopeScaling(_Scaling):
    """LongRoPE (Ding et al. 2024; Phi-3): a factor per dimension pair dividing the frequency,
    ``long_factor`` once the sequence length seen exceeds ``original_max_position_embeddings``,
    ``short_factor`` up to it; cos and sin multiplied by ``attention_factor`` (default
    ``sqrt(1 + ln(factor) / ln(original))``)."""

    type: Literal["longrope"] = "longrope"
    long_factor: list[float] = Field(description="one per rotated dimension pair (rotary_dim / 2)")
    short_factor: list[float] = Field(description="one per rotated dimension pair (rotary_dim / 2)")
    factor: float | None = Field(None, gt=0.0, description="default: model.max_seq_length / "
                                 "original_max_position_embeddings")
    attention_factor: float | None = Field(None, ge=0.0, description="multiplies cos and sin; default from factor")
    original_max_position_embeddings: int | None = ORIGINAL

    @property
    def length_dependent(self) -> bool:
        return True

    def resolved(self, max_seq_length: int) -> LongRopeScaling:
        done = super().resolved(max_seq_length)
        if done.factor is None:
            done = done.model_copy(update={"factor": max_seq_length / done.original_max_position_embeddings})
        return done

    def attention_scaling(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))

    def frequencies(self, dim: int, base: float, length: int | Tensor | None, device: torch.device) -> Tensor:
        factors = torch.tensor(self.short_factor, dtype=torch.float32, device=device)
        if length is not None:
            long = torch.tensor(self.long_factor, dtype=torch.float32, device=device)
            beyond = torch.as_tensor(length, device=device) > self.original_max_position_embeddings
            factors = torch.where(beyond, long, factors)
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (factors * base ** exponent)

    def problems(self, rotary_dim: int) -> list[tuple[str, str]]:
        return [(f"rope_scaling.{key}", f"{len(getattr(self, key))} factors; longrope needs one per rotated "
                                        f"dimension pair, {rotary_dim // 2} (rotary_dim {rotary_dim} / 2)")
                for key in ("long_factor", "short_factor") if len(getattr(self, key)) != rotary_dim // 2]


KINDS = (LinearScaling, DynamicScaling, YarnScaling, Llama3Scaling, LongRopeScaling)
SCALING_NAMES: tuple[str, ...] = tuple(kind.model_fields["type"].default for kind in KINDS)
RopeScaling = Annotated[Union[KINDS], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
