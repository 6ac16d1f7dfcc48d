"""``pentad grow SMALL_RUN --config BIG --output OUT``: initialise a larger model from a smaller trained
run (hot-start), so that training the larger one starts from the small one's loss, not from random.

OUT is a run directory (``config.yaml`` of the big model, the small run's tokenizer, ``model.safetensors``)
that ``init=OUT`` reads like any run. The big config must be the small one's architecture with larger
sizes: ``hidden_size``, ``num_layers``, ``num_heads`` (and ``num_kv_heads``), ``ffn_size`` may grow; every
other model key must be the same.

Width (function-preserving, Net2Net-style; Chen et al. 2016, and bert2BERT's function-preserving
initialisation, Chen et al. 2022): the hidden size grows by an integer factor ``k`` and every hidden
vector of the big model is the small one's repeated ``k`` times (``[x, x, ...]``). Its mean and (biased)
variance are the small vector's, so LayerNorm and RMSNorm give the repeated small result; a linear map
reading a hidden vector has its columns repeated and divided by ``k``, one writing a hidden vector its
rows repeated. Feed-forward units and attention heads (``head_size`` stays) grow to any larger count:
new units and heads copy existing ones in turn and the columns that read them out are divided by the
number of copies. A head tied to the word embedding would give ``k`` times the small logits (a repeated
vector against a repeated table): the norm right before it (the head's own, as in BERT's MLM head, or
the encoder's final norm under a lone LM head, as in GPT-2) writes its output divided by ``k``. The
result is the small model's function up to float rounding: exact for ``layernorm`` and ``rmsnorm``
(the repeated vector has the same mean, variance and mean square, so even the epsilon acts alike);
``layernorm_unbiased`` (TencentPretrain's) gets a correction of its weight, exact up to its epsilon.

Depth (not function-preserving, except ``identity``): the big stack's layer ``i`` copies small layer
``i mod L`` (``stack``: the stack repeated, Gong et al. 2019) or ``floor(i L / L')`` (``interleave``:
each layer repeated in place); ``identity`` (pre-norm models only) is ``interleave`` whose repeated
copies have zero output projections, so each is an identity map and the grown model computes exactly
the small one's function.

After growing, the small and big models are run on one probe batch and the largest difference of
their outputs is reported (:attr:`Grown.max_difference`); width growth that would not preserve the
function raises instead of writing OUT.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from pentad import layout, memory
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.norms import RMSNorm, UnbiasedLayerNorm
from pentad.outputs import OutputLock, check_apart, check_replaceable
from pentad.runs import complete_vocab, load_run
from pentad.training import checkpoint as ckpt
from pentad.training.export import write_derived_run

DepthMode = Literal["stack", "interleave", "identity"]
DEPTH_MODES = ("stack", "interleave", "identity")
GROWN_KEY = "pentad_grown_from"  # metadata of OUT/model.safetensors: where it came from
# model keys that may differ between the small and the big config (in model.encoder / model.decoder)
STACK_SIZES = ("num_layers", "num_heads", "num_kv_heads", "ffn_size")
LAYER_KEY = re.compile(r"^(?P<stack>(?:[\w.]*\.)?layers)\.(?P<index>\d+)\.(?P<rest>.+)$")
# parameters that write a layer's output into the residual stream (zeroed in identity copies)
RESIDUAL_WRITERS = ("attention.out.", "cross_attention.out.", "ffn.down.")
# largest output difference (probe batch) accepted for function-preserving growth
TOLERANCE = 1e-3


@dataclass
class Grown:
    out: Path
    source: Path
    small: dict[str, int]
    big: dict[str, int]
    depth: str
    max_difference: float
    preserving: bool
    tensors: int
    bytes: int

    def render(self) -> str:
        sizes = ", ".join(f"{k} {self.small[k]} -> {self.big[k]}" for k in self.big if self.small[k] != self.big[k])
        deeper = any(self.small[k] != self.big[k] for k in self.big if k.endswith("num_layers"))
        if self.preserving:
            kind = "function-preserving"
        elif deeper and self.depth != "identity":
            kind = f"depth by {self.depth}, not function-preserving"
        else:
            kind = "function-preserving up to the noise on the copies"
        return (f"grew {self.source} into {self.out / layout.WEIGHTS} ({sizes or 'same sizes'}; {kind}): "
                f"{self.tensors} tensors, {self.bytes / 1e6:,.1f} MB; largest output difference from the small "
                f"model on a probe batch {self.max_difference:.3g}. Train it with init={self.out}")


# ------------------------------------------------------------------------------------------ config checks
def _sizes(model_cfg: Any) -> dict[str, int]:
    sizes = {"hidden_size": model_cfg.hidden_size}
    for side in ("encoder", "decoder"):
        section = getattr(model_cfg, side, None)
        if section is None:
            continue
        for key in STACK_SIZES + ("head_size",):
            value = getattr(section, key, None)
            if key == "num_kv_heads" and value is None:
                value = getattr(section, "num_heads", None)
            if key == "head_size" and value is None and getattr(section, "num_heads", None):
                value = model_cfg.hidden_size // section.num_heads
            if value is not None:
                sizes[f"{side}.{key}"] = int(value)
    return sizes


def check_configs(small: Any, big: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(small sizes, big sizes) after checking that ``big`` (a model config) is ``small`` with larger sizes;
    UserError naming the keys otherwise."""
    if small.vocab_size != big.vocab_size or small.target_vocab_size != big.target_vocab_size:
        raise UserError(f"model.vocab_size: the small run has {small.vocab_size} tokens, the big config "
                        f"{big.vocab_size}; growing keeps the vocabulary (and the small run's tokenizer)")
    a, b = small.model_dump(mode="json"), big.model_dump(mode="json")
    b["hidden_size"] = a["hidden_size"]
    for side in ("encoder", "decoder"):
        if isinstance(a.get(side), dict) and isinstance(b.get(side), dict):
            for key in STACK_SIZES + ("head_size",):
                if key in a[side]:
                    b[side][key] = a[side].get(key)
    differ = sorted(_differences(a, b, "model"))
    if differ:
        raise UserError("the big config is not the small run's architecture with larger sizes: "
                        + "; ".join(differ[:6]) + (f"; ... {len(differ) - 6} more" if len(differ) > 6 else "")
                        + ". Only model.hidden_size and the encoder's/decoder's num_layers, num_heads, num_kv_heads "
                        "and ffn_size may differ")
    small_sizes, big_sizes = _sizes(small), _sizes(big)
    for key, value in small_sizes.items():
        if key.endswith("head_size"):
            continue
        if big_sizes[key] < value:
            raise UserError(f"model.{key}: the big config has {big_sizes[key]}, fewer than the small run's {value}; "
                            "growing cannot shrink a model")
    if big_sizes["hidden_size"] % small_sizes["hidden_size"]:
        raise UserError(f"model.hidden_size: {big_sizes['hidden_size']} is not a multiple of the small run's "
                        f"{small_sizes['hidden_size']}; function-preserving width growth repeats each hidden vector "
                        "a whole number of times")
    for side in ("encoder", "decoder"):
        key = f"{side}.head_size"
        if key in small_sizes and small_sizes[key] != big_sizes[key]:
            raise UserError(f"model.{side}: the head size (hidden_size / num_heads, or head_size) is "
                            f"{small_sizes[key]} in the small run and {big_sizes[key]} in the big config; width "
                            f"growth adds heads of the same size: set num_heads to hidden_size / {small_sizes[key]}")
        heads, kv = f"{side}.num_heads", f"{side}.num_kv_heads"
        if heads in small_sizes and small_sizes[heads] * big_sizes[kv] != big_sizes[heads] * small_sizes[kv]:
            raise UserError(f"model.{side}: num_heads / num_kv_heads is {small_sizes[heads]}/{small_sizes[kv]} in the "
                            f"small run and {big_sizes[heads]}/{big_sizes[kv]} in the big config; growing keeps the "
                            "number of query heads per key/value head")
    return small_sizes, big_sizes


def _differences(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b)):
            found += _differences(a.get(key), b.get(key), f"{path}.{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: small {a!r}, big {b!r}"]


# ------------------------------------------------------------------------------------------ width
def _copies(n: int, m: int) -> tuple[Tensor, Tensor]:
    """Units ``0..m-1`` copying units ``0..n-1`` in turn: (source of each new unit, copies of its source)."""
    source = torch.arange(m) % n
    counts = torch.bincount(source, minlength=n)
    return source, counts[source].to(torch.float32)


class _Widener:
    """The big model's tensors at the small model's depth (see the module docstring)."""

    def __init__(self, small: nn.Module, big: nn.Module, small_cfg: Any, k: int, noise: float = 0.0, seed: int = 0):
        self.small, self.big, self.k = small, big, k
        self.noise = noise
        self.generator = torch.Generator().manual_seed(seed)
        self.big_modules = dict(big.named_modules())
        self.h = small_cfg.hidden_size
        self.aliases = {head for head, _ in getattr(small, "tied", [])}
        # a head tied to the word table reads [x, x, ...] against [e, e, ...]: k times the small logits. The norm
        # right before it (the head's own, else the encoder's final norm) writes its output divided by k instead
        self.norm_scale: dict[str, float] = {}
        modules = dict(small.named_modules())
        norms = (nn.LayerNorm, RMSNorm, UnbiasedLayerNorm)
        for head, _ in getattr(small, "tied", []):
            target = ".".join(head.split(".")[:2])  # targets.<name>
            own = [n for n, m in modules[target].named_modules() if isinstance(m, norms)] \
                if head.startswith("targets.") else []
            if len(own) == 1:
                self.norm_scale[f"{target}.{own[0]}"] = 1.0 / k
            elif not own and isinstance(modules.get("encoder.final_norm"), norms) and len(small.targets) == 1:
                self.norm_scale["encoder.final_norm"] = 1.0 / k
            else:
                raise UserError(f"width growth: {head} is tied to the word embedding and reads a vector that no "
                                "single norm writes (a head with its own norm, or a lone head after the encoder's "
                                "final norm); untie it (model.tie_word_embeddings=false) or grow the depth only")
        self.out: dict[str, Tensor] = {}

    def _big_shape(self, name: str) -> tuple[int, ...]:
        owner, attr = name.rsplit(".", 1)
        return tuple(getattr(self.big_modules[owner], attr).shape)

    def _put(self, name: str, value: Tensor) -> None:
        if tuple(value.shape) != self._big_shape(name):
            raise UserError(f"grow: {name} became {tuple(value.shape)}, the big model has {self._big_shape(name)}")
        self.out[name] = value.contiguous()

    def hidden_in(self, w: Tensor, copies: Tensor | None = None) -> Tensor:
        """Columns that read a hidden vector (of scale 1): repeated, divided by k. With ``noise``, the repeated
        columns and the rows of copied units or heads (``copies``, bool per row) get N(0, (noise * std)^2)
        added, ``std`` that of the small weight's entries, so that copies can learn apart."""
        big = torch.cat([w] * self.k, dim=-1) / self.k
        if not self.noise:
            return big
        mask = torch.zeros(big.shape, dtype=torch.bool)
        mask[:, w.shape[1]:] = True
        if copies is not None:
            mask[copies] = True
        jitter = torch.randn(big.shape, generator=self.generator) * (self.noise * float(w.std()) / self.k)
        return big + jitter * mask

    def hidden_out(self, w: Tensor, scale: float = 1.0) -> Tensor:
        """Rows (or a bias) that write a hidden vector: repeated, times ``scale``."""
        return torch.cat([w] * self.k, dim=0) * scale

    def attention(self, name: str, module: Attention) -> None:
        big = self.big_modules[name]
        if module.cross:
            raise UserError(f"grow: width growth of cross-attention ({name}) is not supported; grow the depth only")
        d = module.head_size
        q_src, q_div = _copies(module.num_heads, big.num_heads)
        kv_src, _ = _copies(module.num_kv_heads, big.num_kv_heads)

        def rows(w: Tensor) -> Tensor:  # [q_dim + 2 kv_dim, ...] -> the big heads' rows
            q, k, v = w.split((module.q_dim, module.kv_dim, module.kv_dim), dim=0)
            rest = w.shape[1:]
            q = q.reshape(module.num_heads, d, *rest)[q_src].reshape(-1, *rest)
            k = k.reshape(module.num_kv_heads, d, *rest)[kv_src].reshape(-1, *rest)
            v = v.reshape(module.num_kv_heads, d, *rest)[kv_src].reshape(-1, *rest)
            return torch.cat([q, k, v], dim=0)

        def kv_rows(w: Tensor) -> Tensor:  # a pure-reuse layer's value rows (no queries, keys)
            return w.reshape(module.num_kv_heads, d, *w.shape[1:])[kv_src].reshape(-1, *w.shape[1:])

        q_copy = (torch.arange(big.num_heads) >= module.num_heads).repeat_interleave(d)
        kv_copy = (torch.arange(big.num_kv_heads) >= module.num_kv_heads).repeat_interleave(d)
        for part, pick, copies in (("qkv", rows, torch.cat([q_copy, kv_copy, kv_copy])), ("v", kv_rows, kv_copy)):
            linear = getattr(module, part, None)
            if linear is None:
                continue
            self._put(f"{name}.{part}.weight", self.hidden_in(pick(linear.weight), copies))
            if linear.bias is not None:
                self._put(f"{name}.{part}.bias", pick(linear.bias))
        w = module.out.weight.reshape(self.h, module.num_heads, d)[:, q_src] / q_div[None, :, None]
        self._put(f"{name}.out.weight", self.hidden_out(w.reshape(self.h, -1)))
        if module.out.bias is not None:
            self._put(f"{name}.out.bias", self.hidden_out(module.out.bias))

    def ffn(self, name: str, module: FeedForward) -> None:
        big = self.big_modules[name]
        src, div = _copies(module.up.weight.shape[0], big.up.weight.shape[0])
        copies = torch.arange(len(src)) >= module.up.weight.shape[0]  # the units added by the growth
        for part in ("gate", "up"):
            linear = getattr(module, part)
            if linear is None:
                continue
            self._put(f"{name}.{part}.weight", self.hidden_in(linear.weight[src], copies))
            if linear.bias is not None:
                self._put(f"{name}.{part}.bias", linear.bias[src])
        self._put(f"{name}.down.weight", self.hidden_out(module.down.weight[:, src] / div[None, :]))
        if module.down.bias is not None:
            self._put(f"{name}.down.bias", self.hidden_out(module.down.bias))

    def norm(self, name: str, module: nn.Module) -> None:
        # LayerNorm and RMSNorm of a repeated vector are the repeated norm; the unbiased std of k copies is
        # sqrt(k (H-1) / (kH-1)) times the small one's (the weight makes up for it)
        factor = math.sqrt(self.k * (self.h - 1) / (self.k * self.h - 1)) if isinstance(module, UnbiasedLayerNorm) \
            else 1.0
        scale = self.norm_scale.get(name, 1.0)
        self._put(f"{name}.weight", self.hidden_out(module.weight, factor * scale))
        if getattr(module, "bias", None) is not None:
            self._put(f"{name}.bias", self.hidden_out(module.bias, scale))

    def linear(self, name: str, module: nn.Linear) -> None:
        big = self.big_modules[name]
        w = module.weight
        if w.shape[1] == self.h and big.weight.shape[1] == self.h * self.k:
            w = self.hidden_in(w)
        elif w.shape[1] != big.weight.shape[1]:
            raise UserError(f"grow: {name}.weight reads {w.shape[1]} features in the small model and "
                            f"{big.weight.shape[1]} in the big one, which is neither the hidden size nor unchanged")
        grows = w.shape[0] == self.h and big.weight.shape[0] == self.h * self.k
        if not grows and w.shape[0] != big.weight.shape[0]:
            raise UserError(f"grow: {name}.weight writes {w.shape[0]} features in the small model and "
                            f"{big.weight.shape[0]} in the big one, which is neither the hidden size nor unchanged")
        self._put(f"{name}.weight", self.hidden_out(w) if grows else w)
        if module.bias is not None:
            self._put(f"{name}.bias", self.hidden_out(module.bias) if grows else module.bias)

    def run(self) -> dict[str, Tensor]:
        handled: set[str] = set()
        for name, module in self.small.named_modules():
            if isinstance(module, Attention):
                self.attention(name, module)
            elif isinstance(module, FeedForward):
                self.ffn(name, module)
            elif isinstance(module, (nn.LayerNorm, RMSNorm, UnbiasedLayerNorm)):
                self.norm(name, module)
            elif isinstance(module, nn.Linear) and not any(name.startswith(h + ".") for h in handled):
                self.linear(name, module)
            else:
                continue
            handled.add(name)
        for name, value in self.small.state_dict().items():
            if name in self.out or name in self.aliases:
                continue
            if name.startswith("embedding.") and value.dim() == 2 and value.shape[1] == self.h:
                self._put(name, torch.cat([value] * self.k, dim=1))
            elif name.endswith("relative_bias.weight") and value.dim() == 2:  # [buckets, heads]: copies of heads
                big_heads = self._big_shape(name)[1]
                self._put(name, value[:, _copies(value.shape[1], big_heads)[0]])
            else:
                raise UserError(f"grow: width growth does not know how to widen {name} {tuple(value.shape)}; "
                                "grow the depth only (keep model.hidden_size, num_heads and ffn_size)")
        return {name: value for name, value in self.out.items() if name not in self.aliases}


def check_widenable(cfg: Any) -> None:
    """UserError for model options whose width growth is not function-preserving."""
    if cfg.decoder is not None or cfg.target_embedding is not None:
        raise UserError("width growth of an encoder-decoder model is not supported; grow the depth only "
                        "(keep model.hidden_size, num_heads and ffn_size)")
    if getattr(cfg.encoder, "type", None) != "transformer":
        raise UserError(f"width growth needs a transformer encoder; this one is {getattr(cfg.encoder, 'type', '?')!r}")
    if getattr(cfg.encoder, "positions", "none") == "alibi":
        raise UserError("width growth with ALiBi positions (model.encoder.positions=alibi) is not function-preserving: "
                        "each head's slope depends on the number of heads; grow the depth only")
    if cfg.embedding_size is not None:
        raise UserError("width growth of a factorised embedding (model.embedding_size) is not supported")
    if getattr(cfg.encoder, "moe", None) is not None or getattr(cfg.encoder, "ffn", "dense") == "moe":
        raise UserError("width growth of mixture-of-experts layers (model.encoder.ffn=moe) is not supported")
    for part in cfg.embedding.parts:
        if part.type not in ("word", "pos", "seg"):
            raise UserError(f"width growth: embedding part {part.type!r} is not a table that can be repeated "
                            "(word, pos and seg are)")
        if getattr(part, "scale", False):
            raise UserError("width growth: model.embedding word part has scale: true (times sqrt(hidden_size)), "
                            "which a wider model changes")
    for target in cfg.targets:
        if getattr(target, "scale_hidden", False):
            raise UserError(f"width growth: target {target.type!r} has scale_hidden: true (times "
                            "hidden_size^-0.5), which a wider model changes")


# ------------------------------------------------------------------------------------------ depth
def deepen(tensors: dict[str, Tensor], big_keys: set[str], mode: DepthMode, pre_norm: bool) -> dict[str, Tensor]:
    """``tensors`` (the small depth) with each ``…layers.i.`` stack mapped onto the big model's layers."""
    if mode == "identity" and not pre_norm:
        raise UserError("--depth identity needs pre-norm layers (model.encoder.norm_position=pre): a post-norm "
                        "layer computes norm(x + f(x)), which is no identity even when f is zero; use stack or "
                        "interleave")
    small_counts: dict[str, int] = {}
    big_counts: dict[str, int] = {}
    for key in tensors:
        m = LAYER_KEY.match(key)
        if m:
            small_counts[m["stack"]] = max(small_counts.get(m["stack"], 0), int(m["index"]) + 1)
    for key in big_keys:
        m = LAYER_KEY.match(key)
        if m:
            big_counts[m["stack"]] = max(big_counts.get(m["stack"], 0), int(m["index"]) + 1)
    out = {k: v for k, v in tensors.items() if not LAYER_KEY.match(k)}
    for stack, n in small_counts.items():
        m_big = big_counts.get(stack, n)
        for i in range(m_big):
            source = i % n if mode == "stack" else i * n // m_big
            repeat = mode == "identity" and i > 0 and (i - 1) * n // m_big == source
            prefix = f"{stack}.{source}."
            for key, value in tensors.items():
                if key.startswith(prefix):
                    rest = key[len(prefix):]
                    out[f"{stack}.{i}.{rest}"] = torch.zeros_like(value) \
                        if repeat and rest.startswith(RESIDUAL_WRITERS) else value.clone()
            if repeat and not any(k.startswith(f"{stack}.{i}.ffn.down.") for k in out):
                raise UserError(f"--depth identity: {stack}.{i} has no ffn.down projection to zero (a mixture of "
                                "experts?); use stack or interleave")
    return out


# ------------------------------------------------------------------------------------------ probe
def probe_batch(model_cfg: Any, seed: int = 0) -> Batch:
    """Two sequences of random tokens (and segments when the model reads them), for comparing outputs."""
    generator = torch.Generator().manual_seed(seed)
    length = min(16, model_cfg.max_seq_length)
    tokens = torch.randint(0, model_cfg.vocab_size, (2, length), generator=generator)
    segments = torch.zeros_like(tokens)
    segments[:, length // 2:] = 1
    padding = torch.zeros_like(tokens, dtype=torch.bool)
    padding[1, -3:] = True
    return Batch(tokens=tokens, segments=segments, padding_mask=padding)


def output_difference(small: nn.Module, big: nn.Module, batch: Batch) -> float:
    """The largest absolute difference between the two models' target logits on ``batch`` (eval mode)."""
    small.eval()
    big.eval()
    with torch.no_grad():
        a, b = small(batch), big(batch)
    worst = 0.0
    for name, out in a.items():
        if out.logits is None or b[name].logits is None:
            continue
        x, y = out.logits.float(), b[name].logits.float()
        if batch.padding_mask is not None and x.dim() >= 2 and x.shape[:2] == batch.padding_mask.shape:
            keep = ~batch.padding_mask
            x, y = x[keep], y[keep]
        worst = max(worst, float((x - y).abs().max()))
    return worst


# ------------------------------------------------------------------------------------------ the whole step
def grow_model(small: nn.Module, big: nn.Module, small_cfg: Any, big_cfg: Any, depth: DepthMode = "stack",
               noise: float = 0.0, seed: int = 0) -> dict[str, Tensor]:
    """The big model's weights grown from ``small``'s (model configs ``small_cfg``, ``big_cfg``, already
    checked by :func:`check_configs`); loaded into ``big`` as well."""
    k = big_cfg.hidden_size // small_cfg.hidden_size
    small_sizes, big_sizes = _sizes(small_cfg), _sizes(big_cfg)
    wider = any(small_sizes[key] != big_sizes[key] for key in small_sizes if not key.endswith("num_layers"))
    with torch.no_grad():
        if wider:
            check_widenable(small_cfg)
            tensors = _Widener(small, big, small_cfg, k, noise, seed).run()
        else:
            aliases = {head for head, _ in getattr(small, "tied", [])}
            tensors = {n: v.detach().clone() for n, v in small.state_dict().items() if n not in aliases}
        aliases = {head for head, _ in getattr(big, "tied", [])}
        big_keys = {n for n in big.state_dict() if n not in aliases}
        pre = getattr(small_cfg.encoder, "norm_position", "post") == "pre"
        if small_cfg.decoder is not None and getattr(small_cfg.decoder, "norm_position", "post") != "pre":
            pre = False
        tensors = deepen(tensors, big_keys, depth, pre)
        ckpt.load_weights(big, tensors, "the grown weights")
    return tensors


def check_memory(small_cfg: Any, big_cfg: Any) -> None:
    """Refuse (UserError) a big model whose growing cannot fit in this machine's memory, before either
    model is allocated: its weights twice (the model, then the grown tensors written from it) and the
    small model's twice (the model and the tensors read into it), counted on the meta device."""
    big, _ = memory.tensor_bytes(build_model(big_cfg, training=False, device="meta"))
    small, _ = memory.tensor_bytes(build_model(small_cfg, training=False, device="meta"))
    memory.require(2 * big + 2 * small, "growing into this model",
                   f"the big model's weights {memory.format_bytes(big)} twice and the small run's "
                   f"{memory.format_bytes(small)} twice", "cpu",
                   "Grow to smaller sizes (model.hidden_size, num_layers, num_heads, ffn_size of --config)")


def grow_run(run: Path, big_cfg: Any, out: Path, depth: DepthMode = "stack", noise: float = 0.0,
             overwrite: bool = False) -> Grown:
    """Write OUT, the big model of config ``big_cfg`` grown from the run ``run`` (module docstring); ``noise``:
    relative noise on the copies' incoming weights (:meth:`_Widener.hidden_in`), 0 for an exact copy."""
    run, out = Path(run), Path(out)
    check_apart(out, "--output", [("small run", run)])
    with OutputLock(out, "--output", "pentad grow"):  # from the checks to the last write
        return _grow_run(run, big_cfg, out, depth, noise, overwrite)


def _grow_run(run: Path, big_cfg: Any, out: Path, depth: DepthMode, noise: float, overwrite: bool) -> Grown:
    if depth not in DEPTH_MODES:
        raise UserError(f"--depth {depth!r}: expected one of {', '.join(DEPTH_MODES)}")
    if not 0.0 <= noise < 1.0:
        raise UserError(f"--noise {noise}: expected a small relative noise, 0 <= noise < 1 (e.g. 0.01)")
    small_cfg, tokenizer = load_run(run)
    for name, cfg in (("the small run", small_cfg), ("--config", big_cfg)):
        if cfg.model.compression is not None:
            raise UserError(f"{name} has model.compression set (pruned or quantized by pentad compress): grow from "
                            "and into uncompressed models (grow the run it was compressed from)")
    check_replaceable(out, "--output", overwrite, "grow")
    if big_cfg.tokenizer is None:
        big_cfg.tokenizer = small_cfg.tokenizer
    complete_vocab(big_cfg, tokenizer)
    small_sizes, big_sizes = check_configs(small_cfg.model, big_cfg.model)
    source = ckpt.find_weights(run)
    check_memory(small_cfg.model, big_cfg.model)
    torch.manual_seed(small_cfg.train.seed)
    small = build_model(small_cfg.model, training=False)
    ckpt.load_weights(small, ckpt.read_weights(source), str(source))
    torch.manual_seed(big_cfg.train.seed)
    big = build_model(big_cfg.model, training=False)
    tensors = grow_model(small, big, small_cfg.model, big_cfg.model, depth, noise, big_cfg.train.seed)
    preserving = small_sizes.get("encoder.num_layers") == big_sizes.get("encoder.num_layers") and \
        small_sizes.get("decoder.num_layers") == big_sizes.get("decoder.num_layers") or depth == "identity"
    difference = output_difference(small, big, probe_batch(small_cfg.model))
    if preserving and not noise and not difference <= TOLERANCE:
        raise UserError(f"grow: the grown model's outputs differ from the small run's by {difference:.3g} on a probe "
                        f"batch (more than {TOLERANCE}), so this model's growth is not function-preserving; grow the "
                        "depth only (keep model.hidden_size, num_heads and ffn_size)")
    info = {"run": str(run.resolve()), "weights": str(source.resolve()), "depth": depth, "noise": noise,
            "small": small_sizes, "big": big_sizes, "max_difference": difference}
    _write(run, out, big_cfg, tensors, info)
    return Grown(out=out, source=source, small=small_sizes, big=big_sizes, depth=depth, max_difference=difference,
                 preserving=preserving and not noise, tensors=len(tensors),
                 bytes=sum(t.numel() * t.element_size() for t in tensors.values()))


def _write(run: Path, out: Path, big_cfg: Any, tensors: dict[str, Tensor], info: dict[str, Any]) -> None:
    cfg = big_cfg.model_copy(deep=True)
    cfg.init = None
    cfg.output = None
    write_derived_run(run, out, cfg, lambda path: ckpt.save_tensors(tensors, path, {GROWN_KEY: json.dumps(info)}),
                      leave_out=(layout.LABELS,))
