"""The former two-stream layout, read as ``model.streams`` (docs/streams.md).

Before ``model.streams`` existed, a two-stream model was an encoder of type ``dual`` with ``stream_0`` /
``stream_1``. Such configs (saved runs, old recipes) are rewritten on load (:func:`from_dual_encoder`, with
a notice), overrides written for that layout are renamed (:func:`legacy_overrides`) and their checkpoints'
``pair.*`` keys read as the second stream's (:func:`legacy_key`). Everything here works on raw mappings
and key strings, without torch: the loader and the TencentPretrain importer use it while reading a config
(``pentad preprocess`` imports no torch). The stream section's schema and everything that runs streams
are in :mod:`pentad.components.stream`.
"""

from __future__ import annotations

import sys
from typing import Any

_warned: set[str] = set()


def default_names(second_embedding: Any) -> tuple[str, str]:
    """The names an imported or legacy two-stream config gets: (text, image) when the second stream
    embeds images (a ``patch`` part), else (text_a, text_b), after the pair columns of a TSV."""
    parts = second_embedding.get("parts", []) if isinstance(second_embedding, dict) else []
    kinds = [p if isinstance(p, str) else p.get("type") if isinstance(p, dict) else None for p in parts]
    return ("text", "image") if any(k in ("patch", "masked_patch") for k in kinds) else ("text_a", "text_b")


def from_dual_encoder(model: dict[str, Any]) -> dict[str, Any]:
    """A model config dict whose encoder is the former ``dual`` pseudo-encoder, rewritten to
    ``model.streams`` (anything else is returned as it is). Keys the old form refused (e.g. sizes on a
    tied stream) are carried over, so the new checks name them."""
    encoder = model.get("encoder")
    if not isinstance(encoder, dict) or encoder.get("type") != "dual":
        return model
    known = {"type", "tie", "stream_0", "stream_1"}
    if set(encoder) - known:
        return model  # let validation report the unknown key at model.encoder
    zero = dict(encoder.get("stream_0") or {})
    one = {k: v for k, v in dict(encoder.get("stream_1") or {}).items() if v is not None}
    names = default_names(one.get("embedding", model.get("embedding")))
    pooling = zero.pop("pooling", "mean")
    first: dict[str, Any] = {"pooling": pooling, **{k: v for k, v in zero.items() if k != "encoder"}}
    second: dict[str, Any] = {"pooling": one.pop("pooling", None) or pooling}
    if encoder.get("tie", True):
        second["share"] = names[0]
    second.update(one)
    out = {k: v for k, v in model.items() if k != "encoder"}
    out["encoder"] = zero.get("encoder")
    out["streams"] = {names[0]: first, names[1]: second}
    if "dual" not in _warned:
        _warned.add("dual")
        print(f"pentad: notice: model.encoder type 'dual' (stream_0 / stream_1) is now model.streams "
              f"({names[0]}, {names[1]}); the config was rewritten on load and its checkpoints' pair.* keys read as "
              f"streams.{names[1]}.* (docs/streams.md)", file=sys.stderr, flush=True)
    return out


def legacy_overrides(raw: dict[str, Any], overrides: list[str]) -> list[str]:
    """Overrides written for the former ``dual`` layout (``model.encoder.stream_0.encoder.X``,
    ``model.encoder.stream_0.pooling``, ``model.encoder.stream_1.X``) rewritten to ``model.streams``
    when ``raw`` (the config file) has a streams section; other overrides unchanged."""
    model = raw.get("model") if isinstance(raw, dict) else None
    streams = model.get("streams") if isinstance(model, dict) else None
    if not isinstance(streams, dict) or len(streams) != 2:
        return list(overrides)
    first, second = list(streams)
    prefixes = (("model.encoder.stream_0.encoder.", "model.encoder."),
                ("model.encoder.stream_0.", f"model.streams.{first}."),
                ("model.encoder.stream_1.", f"model.streams.{second}."))
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        for old, new in prefixes:
            if key.startswith(old):
                print(f"pentad: notice: override {key} names the former dual layout; read as "
                      f"{new}{key[len(old):]} (docs/streams.md)", file=sys.stderr, flush=True)
                key = new + key[len(old):]
                break
        out.append(key + sep + value)
    return out


def legacy_key(key: str, second: str) -> str:
    """A checkpoint key of the former dual layout (``pair.embedding.*``, ``pair.encoder.*``) under the
    second stream's name; other keys unchanged."""
    for part in ("embedding.", "encoder."):
        if key.startswith("pair." + part):
            return f"streams.{second}.{key[len('pair.'):]}"
    return key
