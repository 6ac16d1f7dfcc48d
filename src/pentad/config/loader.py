"""Reading configs: a file (YAML, JSON, a zoo recipe name, or another toolkit's config through an
importer), then ``key.path=value`` overrides; the problems of a strict validation, every one at once
(the run config itself is assembled in ``pentad.run_config``; ``pentad.assembly.load_config`` does all
of it)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ValidationError

from pentad.config.dual_layout import legacy_overrides
from pentad.config.schema import class_at
from pentad.errors import ConfigProblem, UserError, clipped, closest, shown

ZOO_PREFIX = "zoo:"


# ---------------------------------------------------------------------------------------- files
def zoo_names() -> list[str]:
    """Recipe names such as ``bert/base`` (the YAML files packaged in ``pentad/zoo``)."""
    root = resources.files("pentad") / "zoo"
    names = []
    for family in root.iterdir():
        if family.is_dir():
            names += [f"{family.name}/{f.name[:-5]}" for f in family.iterdir() if f.name.endswith(".yaml")]
    return sorted(names)


def resolve_config_path(spec: str | Path) -> Path:
    """A config argument is a file path, or a zoo recipe name (``bert/base`` or ``zoo:bert/base``)."""
    text = str(spec)
    if not text.startswith(ZOO_PREFIX):
        path = Path(text)
        if path.is_file():
            return path
        if path.is_dir():
            raise UserError(f"config '{text}' is a directory, expected a YAML or JSON file")
        if path.exists():  # reading a FIFO or /dev/zero would block or never end
            raise UserError(f"config '{text}' is not a regular file (a device, pipe or socket), expected a YAML or "
                            "JSON file")
    name = text[len(ZOO_PREFIX):] if text.startswith(ZOO_PREFIX) else text
    name = name.removesuffix(".yaml")
    if name.startswith("zoo/"):
        name = name[4:]
    candidate = resources.files("pentad") / "zoo" / f"{name}.yaml"
    if candidate.is_file():
        return Path(str(candidate))
    hint = closest(name, zoo_names())
    raise UserError(f"config '{text}' is neither an existing file nor a zoo recipe"
                    + (f"; did you mean '{hint}'?" if hint else "")
                    + " (`pentad list zoo` lists the recipes)")


# Bounds on a config file: far above any real config (a zoo recipe has a few hundred values, nested
# fewer than ten deep), far below what would exhaust memory or the stack. YAML anchors and aliases
# (``&a`` ... ``*a``) repeat a value wherever it is used, so a few hundred bytes can expand to billions
# of values: the count is of values after expansion.
MAX_CONFIG_BYTES = 16 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 64


class _BoundedYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no Python tags: plain data only) that refuses a document nested deeper than
    :data:`MAX_CONFIG_DEPTH` or holding more than :data:`MAX_CONFIG_VALUES` values once its aliases are
    expanded, checked on the node graph before any value is built."""

    def __init__(self, stream: str, source: str):
        super().__init__(stream)
        self.source, self.depth = source, 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        self.depth += 1
        try:
            if self.depth > MAX_CONFIG_DEPTH:
                raise UserError(f"{self.source}{_line(self.peek_event().start_mark)}: values are nested more than "
                                f"{MAX_CONFIG_DEPTH} levels deep; a config is a few levels of keys and lists")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self):  # type: ignore[no-untyped-def]
        node = super().compose_document()
        _expanded_size(node, self.source, {}, set(), 1)
        return node


def _line(mark: Any) -> str:
    return f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""


def _expanded_size(node: yaml.Node, source: str, sizes: dict[int, int], open_: set[int], level: int) -> int:
    """How many values ``node`` stands for with every alias expanded (each shared node counted once per
    use, measured once); an error past the bounds, or for an alias inside the value it names."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise UserError(f"{source}{_line(node.start_mark)}: an alias refers to a value that contains it, so the "
                        "value would be infinite")
    if level > MAX_CONFIG_DEPTH:
        raise UserError(f"{source}{_line(node.start_mark)}: with its aliases expanded, values are nested more than "
                        f"{MAX_CONFIG_DEPTH} levels deep; a config is a few levels of keys and lists")
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    open_.add(key)
    total = 1
    for child in children:
        total += _expanded_size(child, source, sizes, open_, level + 1)
        if total > MAX_CONFIG_VALUES:
            raise UserError(f"{source}{_line(node.start_mark)}: this value holds more than {MAX_CONFIG_VALUES:,} "
                            "values, counting each use of an alias (*name) in full; a config has far fewer (an "
                            "alias bomb?)")
    open_.discard(key)
    sizes[key] = total
    return total


def parse_yaml(text: str, source: str) -> Any:
    """YAML ``text`` as plain data (``yaml.safe_load``), within the bounds on nesting and expanded size
    (a :class:`UserError` naming ``source`` and the line past them). YAML errors propagate."""
    loader = _BoundedYamlLoader(text, source)
    try:
        return loader.get_single_data()
    except ValueError as e:  # a value YAML accepts and Python cannot build, e.g. an integer of 5,000 digits
        raise UserError(f"{source}: a value cannot be read: {e}") from None
    finally:
        loader.dispose()


def _json_depth_ok(data: Any) -> bool:
    stack = [(data, 1)]
    while stack:
        node, level = stack.pop()
        if level > MAX_CONFIG_DEPTH:
            return False
        if isinstance(node, dict):
            stack += [(v, level + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, level + 1) for v in node]
    return True


def parse_json(text: str, source: str) -> Any:
    """JSON ``text`` as data, nested at most :data:`MAX_CONFIG_DEPTH` deep. JSON errors propagate."""
    too_deep = UserError(f"{source}: values are nested more than {MAX_CONFIG_DEPTH} levels deep; a config is a "
                         "few levels of keys and lists")
    try:
        data = json.loads(text)
    except RecursionError:
        raise too_deep from None
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            raise
        raise UserError(f"{source}: a value cannot be read: {e}") from None
    if not _json_depth_ok(data):
        raise too_deep
    return data


def read_config_file(path: Path, what: str = "config file") -> dict[str, Any]:
    """The mapping a YAML or JSON config file holds; a :class:`UserError` naming ``what`` and ``path`` for a
    file that is not UTF-8, not valid, not a mapping, or past the bounds on size, nesting and aliases."""
    label = f"{what} {path}"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise UserError(f"{label} is {size:,} bytes; a config file is at most {MAX_CONFIG_BYTES:,} bytes "
                            "(is it the right file?)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{label} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{label} cannot be read: {e.strerror or e}") from None
    try:
        data = parse_json(text, label) if path.suffix == ".json" else parse_yaml(text, label)
    except json.JSONDecodeError as e:
        raise UserError(f"{label}, line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        plain = (" (only plain data is read: keys, lists, text, numbers; a tag that would build a Python object "
                 "is refused, never run)" if isinstance(e, yaml.constructor.ConstructorError) else "")
        raise UserError(f"{label}{_line(mark)}: invalid YAML: {getattr(e, 'problem', None) or e}{plain}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{label}: expected a mapping of keys at the top, found {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------ overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise UserError(f"override '{text}' is not of the form key.path=value")
    key, value = text.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"override '{text}' has an empty key")
    try:
        parsed = parse_yaml(value, f"override '{key}'") if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.split("."), parsed


def set_path(data: dict[str, Any], keys: list[str], value: Any, source: str) -> None:
    node: Any = data
    for i, key in enumerate(keys[:-1]):
        if isinstance(node, list):
            node = _list_item(node, key, keys[: i + 1], source)
            continue
        nxt = node.get(key)
        if nxt is None:
            nxt = {}
            node[key] = nxt
        elif not isinstance(nxt, (dict, list)):
            # e.g. `model.encoder=transformer` then `model.encoder.num_layers=2`
            nxt = {"type": nxt} if isinstance(nxt, str) else {}
            node[key] = nxt
        node = nxt
    last = keys[-1]
    if isinstance(node, list):
        index = _index(last, keys, source)
        if index >= len(node):
            raise UserError(f"{source}: '{'.'.join(keys)}': index {index} is past the end of a list of {len(node)}")
        node[index] = value
    else:
        node[last] = value


def _index(key: str, keys: list[str], source: str) -> int:
    if not key.lstrip("-").isdigit():
        raise UserError(f"{source}: '{'.'.join(keys)}': '{key}' must be a list index here")
    return int(key)


def _list_item(node: list, key: str, keys: list[str], source: str) -> Any:
    index = _index(key, keys, source)
    if index >= len(node):
        raise UserError(f"{source}: '{'.'.join(keys)}': index {index} is past the end of a list of {len(node)}")
    if isinstance(node[index], str):  # shorthand "word" -> {"type": "word"} so sub-keys can be set
        node[index] = {"type": node[index]}
    return node[index]


# ------------------------------------------------------------------------------------ validation
def _data_path(raw: Any, loc: tuple[Any, ...]) -> str:
    """The dotted path a user wrote, i.e. ``loc`` without the union tags pydantic inserts."""
    parts: list[str] = []
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            parts.append(str(part))
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            parts.append(str(part))
        elif isinstance(node, dict) and node.get("type") == part:
            continue  # a discriminator tag
        elif isinstance(node, str) and node == part:
            continue  # shorthand "word" for {"type": "word"}
        else:
            parts.append(str(part))
            node = None
    return ".".join(parts)


def problems_from_validation(error: ValidationError, raw: dict[str, Any], root: type[BaseModel],
                             source_of) -> list[ConfigProblem]:
    from pentad.registry import ALL

    problems = []
    for err in error.errors():
        loc = tuple(err["loc"])
        path = _data_path(raw, loc)
        kind = err["type"]
        source = source_of(path)
        if kind == "extra_forbidden":
            parent = class_at(root, loc[:-1])
            fields = list(parent.model_fields) if parent is not None else []
            problems.append(ConfigProblem(path, "unknown key" + (f"; valid keys here: {', '.join(fields)}"
                                                                  if fields else ""),
                                          source, suggestion=closest(str(loc[-1]), fields)))
        elif kind == "union_tag_invalid":
            ctx = err.get("ctx", {})
            tag = ctx.get("tag")
            expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
            kind_name = next((r.kind.rstrip("s") for r in ALL.values() if set(expected) <= set(r.names())), "component")
            problems.append(ConfigProblem(path + ".type" if path else "type",
                                          f"unknown {kind_name} name; expected one of {', '.join(expected)}",
                                          source, received=shown(tag), suggestion=closest(tag, expected)))
        elif kind == "union_tag_not_found":
            problems.append(ConfigProblem(path, "a 'type' key is required to choose the component", source))
        elif kind == "literal_error":
            expected = str(err.get("ctx", {}).get("expected", ""))
            options = [o.strip(" '") for o in expected.replace(" or ", ",").split(",") if o.strip(" '")]
            what = "expected"
            if loc and loc[-1] == "type":  # a registry with a single member has no union, only a literal
                kind = next((r.kind.rstrip("s") for r in ALL.values() if set(options) == set(r.names())), None)
                what = f"unknown {kind} name; expected" if kind else what
            problems.append(ConfigProblem(path, f"{what} one of {', '.join(options)}", source,
                                          received=shown(err.get("input")),
                                          suggestion=closest(err.get("input"), options)))
        elif kind == "missing":
            problems.append(ConfigProblem(path, "required key is missing", source))
        else:
            message = clipped(err["msg"], 1000)  # a validator's own message may quote the value it refused
            problems.append(ConfigProblem(path, message[0].lower() + message[1:], source,
                                          received=shown(err.get("input"))))
    return problems


# ----------------------------------------------------------------------------- DeepSpeed configs
# Top-level keys of a DeepSpeed JSON config (TencentPretrain's --deepspeed_config file): the first set
# occurs only there; the second in DeepSpeed configs and elsewhere, so two of them are needed.
DEEPSPEED_ONLY = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization", "steps_per_print",
    "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimization", "flops_profiler",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "communication_data_type",
    "elasticity", "pipeline", "data_efficiency", "compression_training", "autotuning", "aio",
    "zero_optimization_stage", "dump_state", "comms_logger"})
DEEPSPEED_SHARED = frozenset({"gradient_accumulation_steps", "optimizer", "scheduler", "fp16", "bf16", "amp",
                              "gradient_clipping", "activation_checkpointing", "tensorboard", "wandb"})
# A DeepSpeed setting -> the pentad train key that does the same, for the message.
DEEPSPEED_EQUIVALENTS = {"train_micro_batch_size_per_gpu": "train.batch_size",
                         "gradient_accumulation_steps": "train.grad_accum", "optimizer.params.lr": "train.lr",
                         "optimizer.params.weight_decay": "train.weight_decay", "gradient_clipping":
                         "train.clip_grad_norm", "bf16.enabled": "train.precision=bf16"}


def is_deepspeed_config(raw: dict[str, Any]) -> bool:
    """Whether a config file's top level is a DeepSpeed config rather than a model or run config."""
    keys = set(raw)
    if "model" in keys or keys & {"layers_num", "encoder", "embedding", "target"}:
        return False
    return bool(keys & DEEPSPEED_ONLY) or len(keys & DEEPSPEED_SHARED) >= 2


def refuse_deepspeed_config(raw: dict[str, Any], label: str) -> None:
    """One clear error (exit 2) for a DeepSpeed JSON given where a model or run config belongs."""
    if not is_deepspeed_config(raw):
        return
    found = sorted(set(raw) & (DEEPSPEED_ONLY | DEEPSPEED_SHARED))
    present = []
    for path, ours in DEEPSPEED_EQUIVALENTS.items():
        node: Any = raw
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if path.endswith(".enabled"):
            if node is True:
                present.append(f"{path.split('.')[0]} -> {ours}")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            present.append(f"{path} {node} -> {ours}={node}")
    mapping = f" Its settings that pentad has: {', '.join(present)}." if present else ""
    raise UserError(
        f"{label} is a DeepSpeed config (keys {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}), not a "
        "model config. Give the model config instead: a pentad YAML (a zoo recipe such as bert/base) or "
        "TencentPretrain's model JSON (the file its pretrain.py takes as --config_path, e.g. "
        "models/bert/base_config.json), with training settings as train.* overrides." + mapping +
        " pentad does not run DeepSpeed yet (DeepSpeed support is planned: train.strategy), so the file's ZeRO, "
        "offload and fp16 settings have no equivalent here.")


# ------------------------------------------------------------------------------------ entry point
class Importer(Protocol):
    """Reads a config file written for another toolkit (TencentPretrain's JSON configs) as a pentad run
    config; given to :func:`load_raw` by the floor that knows the importers (``pentad.assembly``)."""

    def detects(self, raw: dict[str, Any]) -> bool: ...

    def convert(self, raw: dict[str, Any], overrides: list[str], label: str) -> tuple[dict[str, Any], list[str]]: ...


def load_raw(config: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
             importers: tuple[Importer, ...] = ()) -> tuple[dict[str, Any], dict[str, str], str]:
    """Read the file (through the first of ``importers`` that detects it as its own, if one does) and
    apply overrides. Returns (raw data, {override path: text}, file label)."""
    label = "<no config file>"
    raw: dict[str, Any] = {}
    if config is not None:
        path = resolve_config_path(config)
        label = str(config)
        raw = read_config_file(path)
        refuse_deepspeed_config(raw, label)
        importer = next((i for i in importers if i.detects(raw)), None)
        if importer is not None:
            raw, overrides = importer.convert(raw, list(overrides), label)
        overrides = legacy_overrides(raw, list(overrides))
    applied: dict[str, str] = {}
    for text in overrides:
        keys, value = parse_override(text)
        set_path(raw, keys, value, f"override '{text}'")
        applied[".".join(keys)] = text
    return raw, applied, label


def dump_config(cfg: BaseModel) -> str:
    """The fully resolved config as YAML (paths as strings)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
