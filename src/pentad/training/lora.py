"""``train.lora``: low-rank adapters on a frozen base model, and folding them back into its weights.

:func:`apply_lora` runs after the model is built and its ``init`` weights are loaded, before the
strategy wraps it: it replaces the configured projections of every attention and feed-forward
block with :class:`~pentad.layers.lora.LoraLinear`, freezes every other weight (the task's heads
excepted, by ``train.lora.heads``) and records on the model (``model.lora``, a :class:`LoraState`)
which tensors are saved and what the adapters are. Targets are roles, not layer names: ``q`` of a
fused ``qkv`` projection is its first ``num_heads * head_size`` rows, ``k`` and ``v`` the
``num_kv_heads * head_size`` rows after (grouped-query attention), in cross-attention ``q`` is its
own projection and ``k``/``v`` halves of ``kv``; a layer that only reuses attention probabilities
(``attention_reuse`` with no query/key projections) has ``v`` alone.

A LoRA run saves only what trains (the adapters, the trained heads) with the adapters' record in
the weights file's metadata (:data:`METADATA_KEY`): the adapted rows of each module, the scaling,
the base weights' path and a fingerprint of them. :func:`merge` folds such a file into the base's
tensors, which is what :func:`pentad.training.checkpoint.read_weights` does by default, so that
``pentad infer``, ``generate``, ``export``, ``convert`` and ``init=`` read a LoRA run as a whole model.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pentad.errors import UserError
from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.lora import LoraLinear, merge_part
from pentad.training.config import LORA_TARGETS, LoraConfig

METADATA_KEY = "pentad_lora"  # in a safetensors file's metadata: the JSON record of its adapters
LORA_KEYS = (".lora_A.", ".lora_B.")
UNSUPPORTED_STRATEGIES: dict[str, str] = {}  # strategy -> why it cannot train adapters alone (none today)


@dataclass
class LoraState:
    """What :func:`apply_lora` records on the model: ``record`` (JSON-able: rank, alpha, scaling,
    ``modules`` {module name: {part: [start, end]}}, ``heads``, ``base``, ``base_fingerprint``) and
    ``saved``: the state-dict keys a checkpoint holds (adapters and trained heads)."""

    record: dict[str, Any]
    saved: frozenset[str] = field(default_factory=frozenset)

    def metadata(self) -> dict[str, str]:
        return {METADATA_KEY: json.dumps(self.record, sort_keys=True)}


def is_adapter_key(key: str) -> bool:
    return any(part in key for part in LORA_KEYS)


# ----------------------------------------------------------------------------- which rows of which layer
def candidates(model: nn.Module) -> dict[str, dict[str, tuple[int, int]]]:
    """Every projection LoRA can adapt: module name -> {target: (first row, end row)}."""
    found: dict[str, dict[str, tuple[int, int]]] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        # each attention variant says which rows are queries, keys, values, output; a feed-forward names
        # its gate, up and down projections
        if isinstance(module, (Attention, FeedForward)):
            found.update({prefix + projection: roles for projection, roles in module.roles().items()})
    return found


def _layer_pattern(names: list[str]) -> str:
    """Module names with layer numbers folded: ``encoder.layers.N.attention.qkv (N = 0-11)``."""
    groups: dict[str, list[int]] = {}
    for name in names:
        key = re.sub(r"\.(\d+)\.", ".N.", name, count=1)
        number = re.search(r"\.(\d+)\.", name)
        groups.setdefault(key, []).append(int(number.group(1)) if number else -1)
    shown = []
    for key, numbers in groups.items():
        numbers = sorted(n for n in numbers if n >= 0)
        shown.append(f"{key} (N = {numbers[0]}-{numbers[-1]})" if numbers and ".N." in key else key)
    return ", ".join(shown)


def select(model: nn.Module, cfg: LoraConfig) -> dict[str, dict[str, tuple[int, int]]]:
    """The modules and rows ``cfg`` adapts in ``model``; a target or pattern that matches nothing is a
    UserError that lists what the model has."""
    available = candidates(model)
    if not available:
        raise UserError("train.lora: this model has no attention or feed-forward projection to adapt (its "
                        "encoder is not a transformer); LoRA adapts the q, k, v, o, gate, up and down "
                        "projections of transformer blocks")
    if cfg.modules is not None:
        try:
            pattern = re.compile(cfg.modules)
        except re.error as e:
            raise UserError(f"train.lora.modules={cfg.modules!r} is not a valid regular expression ({e})") from None
        matched = {name: parts for name, parts in available.items() if pattern.search(name)}
        if not matched:
            raise UserError(f"train.lora.modules={cfg.modules!r} matches none of the model's adaptable "
                            f"projections: {_layer_pattern(list(available))}")
        available = matched
    wanted = cfg.expanded_targets()
    roles = {role for parts in available.values() for role in parts}
    explicit = [t for t in cfg.targets if t in LORA_TARGETS]
    missing = [t for t in explicit if t not in roles]
    if missing or not any(t in roles for t in wanted):
        where = f" (among the modules matching {cfg.modules!r})" if cfg.modules else ""
        raise UserError(f"train.lora.targets: {', '.join(missing or cfg.targets)} match no projection of this "
                        f"model{where}; it has {', '.join(r for r in LORA_TARGETS if r in roles)}")
    chosen = {}
    for name, parts in available.items():
        picked = {role: rows for role, rows in parts.items() if role in wanted}
        if picked:
            chosen[name] = picked
    return chosen


# ----------------------------------------------------------------------------- applying
def check_usable(train: Any, init: Any) -> None:
    """A UserError when LoRA cannot run as configured (``train``: the TrainConfig): no base weights
    (``init``), a strategy that cannot train adapters alone, or an option that needs frozen weights'
    gradients."""
    strategy = train.strategy
    adversarial = getattr(getattr(train, "adversarial", None), "method", "none")
    if adversarial != "none":
        raise UserError(f"train.adversarial.method={adversarial} cannot be combined with train.lora: it moves the "
                        "word embeddings along their gradient, and under LoRA they are frozen and get none")
    if init is None:
        raise UserError("train.lora needs base weights to adapt: set init=RUN (a run directory, checkpoint or "
                        ".safetensors file); LoRA freezes them and trains only the adapters")
    if strategy in UNSUPPORTED_STRATEGIES:
        raise UserError(f"train.lora is not offered with train.strategy={strategy}: "
                        f"{UNSUPPORTED_STRATEGIES[strategy]}; use train.strategy=ddp or fsdp")


def check_rank(model: nn.Module, chosen: dict[str, dict[str, tuple[int, int]]], rank: int) -> None:
    """A UserError when ``rank`` exceeds a chosen part's own rank bound min(rows, input features): B A
    of a larger rank spans nothing more than a full-rank update, and only costs memory."""
    bound, where = None, ""
    for name, parts in chosen.items():
        features = model.get_submodule(name).in_features
        for role, (start, end) in parts.items():
            if bound is None or min(end - start, features) < bound:
                bound, where = min(end - start, features), f"{name} ({role}: {end - start} rows x {features} inputs)"
    if bound is not None and rank > bound:
        raise UserError(f"train.lora.rank={rank} is larger than the projections it adapts allow: {where} has rank "
                        f"at most {bound}, and an adapter B [rows, r] A [r, inputs] of a larger rank r can express "
                        f"nothing more, only take memory; use train.lora.rank <= {bound} (commonly 4 to 64)")


def apply_lora(model: nn.Module, cfg: LoraConfig, base: str, base_fingerprint: str,
               task_heads: tuple[str, ...] = (), fresh_heads: tuple[str, ...] = ()) -> LoraState:
    """Adapt ``model`` in place as ``cfg`` says (see the module docstring) and record the adapters on
    it (``model.lora``). ``base``: where its weights came from, ``base_fingerprint`` their
    :func:`fingerprint`; ``task_heads``: the fine-tuning task's head names (``heads: task``);
    ``fresh_heads``: heads the base lacks (saved even when frozen). Returns the :class:`LoraState`."""
    chosen = select(model, cfg)
    check_rank(model, chosen, cfg.rank)
    for name, parts in chosen.items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, LoraLinear(getattr(parent, attr), parts, cfg.rank, cfg.alpha, cfg.dropout))
    target_names = [n for n, _ in getattr(model, "targets", nn.ModuleDict()).named_children()]
    heads = {"task": [h for h in task_heads if h in target_names], "all": target_names, "none": []}[cfg.heads]
    tied = {id(model.get_parameter(shared)) for _, shared in getattr(model, "tied", [])}
    for pname, param in model.named_parameters(remove_duplicate=False):
        in_head = any(pname.startswith(f"targets.{h}.") for h in heads)
        param.requires_grad_(is_adapter_key(pname) or (in_head and id(param) not in tied))
    fresh = tuple(f"targets.{h}." for h in fresh_heads)
    saved = frozenset(n for n, p in model.named_parameters(remove_duplicate=False)
                      if p.requires_grad or (n.startswith(fresh) and id(p) not in tied))
    saved |= {n for n, _ in model.named_buffers() if n.startswith(fresh)}
    record = {"version": 1, "rank": cfg.rank, "alpha": cfg.alpha, "scaling": cfg.alpha / cfg.rank,
              "targets": cfg.expanded_targets(), "heads": sorted(heads), "model_heads": target_names,
              "modules": {name: {role: list(rows) for role, rows in parts.items()} for name, parts in chosen.items()},
              "base": base, "base_fingerprint": base_fingerprint}
    state = LoraState(record, saved)
    model.lora = state
    return state


def describe(model: nn.Module) -> str:
    """One line: what is adapted and how many parameters train."""
    state: LoraState = model.lora
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = state.record["modules"]
    heads = state.record["heads"]
    return (f"LoRA rank {state.record['rank']} (alpha {state.record['alpha']:g}) on "
            f"{', '.join(state.record['targets'])} of {len(layers)} projection(s)"
            + (f", heads {', '.join(heads)} trained" if heads else "")
            + f": {trained:,} of {total:,} parameters train ({100 * trained / max(1, total):.2f}%)")


# ----------------------------------------------------------------------------- merging
def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """A cheap fingerprint of a set of weights: names, shapes, dtypes and up to 256 evenly spaced values
    of each tensor (hashed). Detects a base that was retrained or replaced since adapters were trained."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        value = tensors[key].detach()
        digest.update(f"{key}:{tuple(value.shape)}:{value.dtype};".encode())
        flat = value.reshape(-1)
        if flat.numel():
            step = max(1, flat.numel() // 256)
            digest.update(flat[::step][:256].to("cpu", torch.float64).numpy().tobytes())
    return digest.hexdigest()[:32]


def parse_record(raw: str, source: str) -> dict[str, Any]:
    try:
        record = json.loads(raw)
        record["modules"], record["scaling"], record["base"]  # noqa: B018 - the fields merging needs
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise UserError(f"{source}: the record of its LoRA adapters ({METADATA_KEY} in the file's metadata) is "
                        f"damaged ({type(e).__name__}: {e})") from None
    return record


def merge(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], record: dict[str, Any],
          source: str, check_fingerprint: bool = True) -> dict[str, torch.Tensor]:
    """The base's tensors with ``adapters`` (a LoRA run's saved tensors, described by ``record``) folded
    in: ``W[rows] += scaling * B A`` for each adapted part, trained heads replacing the base's.
    A base whose fingerprint differs from the record's, or tensors that do not fit, are a UserError."""
    if check_fingerprint and record.get("base_fingerprint") and fingerprint(base) != record["base_fingerprint"]:
        raise UserError(f"the base weights {record['base']} are not the ones the LoRA adapters in {source} were "
                        "trained on (their fingerprint differs: was the base run trained further, or replaced?); "
                        "restore that base, or give the right one with `pentad merge-lora RUN --base PATH`")
    heads = record.get("model_heads")
    # the base's heads that the adapted model did not have (pre-training heads under a fine-tuning task)
    merged = {k: v for k, v in base.items()
              if heads is None or not k.startswith("targets.") or k.split(".")[1] in heads}
    used: set[str] = set()
    scaling = float(record["scaling"])
    for module, parts in record["modules"].items():
        key = f"{module}.weight"
        if key not in merged:
            raise UserError(f"{source}: its adapters are for {module}, which the base weights {record['base']} "
                            "do not have (another model?)")
        weight = merged[key]
        for part, (start, end) in parts.items():
            a_key, b_key = f"{module}.lora_A.{part}", f"{module}.lora_B.{part}"
            if a_key not in adapters or b_key not in adapters:
                raise UserError(f"{source}: the adapter tensors {a_key} / {b_key} are missing")
            a, b = adapters[a_key], adapters[b_key]
            if b.shape[0] != end - start or a.shape[1] != weight.shape[1] or a.shape[0] != b.shape[1]:
                raise UserError(f"{source}: adapter {module}.{part} (A {tuple(a.shape)}, B {tuple(b.shape)}) does "
                                f"not fit rows {start}:{end} of the base's {key} {tuple(weight.shape)}")
            weight = merge_part(weight, start, end, a, b, scaling)
            used.update((a_key, b_key))
        merged[key] = weight
    for key, value in adapters.items():
        if key in used:
            continue
        if is_adapter_key(key):
            raise UserError(f"{source}: adapter tensor {key} belongs to no module of its record")
        merged[key] = value  # a trained head
    return merged
