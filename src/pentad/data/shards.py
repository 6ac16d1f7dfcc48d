"""Typed shards on disk: columnar instances, the shard writer, the manifest and the memmap reader.

A preprocessed dataset is a directory::

    manifest.json                   what was built, from what, with which tokenizer
    shard-00000.tokens.bin          all instances' token ids back to back (uint16 or uint32)
    shard-00000.offsets.bin         int64 [n+1]: instance i is tokens[offsets[i]:offsets[i+1]]
    shard-00000.<field>.bin         int32 [n] per-instance integers (segment split, labels, ...)
    shard-00000.<array>.bin         typed rows of every instance back to back (speech features:
                                    float16 [frames, bins]; the dtype and row shape in the manifest)
    shard-00000.<array>.rows.bin    int64 [n+1]: instance i holds rows rows[i]:rows[i+1]
    shard-00001.tokens.bin ...

Every file is raw little-endian binary, so ``np.memmap`` reads it without parsing and the training
process only pages in the instances it touches. Arrays are optional: a dataset of token-only
objectives has none, and a dataset written before arrays existed reads as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pentad.errors import UserError
from pentad.files import write_json

FORMAT_NAME = "pentad-token-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OFFSET_DTYPE = np.dtype("<i8")
FIELD_DTYPE = np.dtype("<i4")


def token_dtype_for(vocab_size: int) -> np.dtype:
    """The narrowest little-endian unsigned dtype that holds ids ``0 .. vocab_size-1``."""
    return np.dtype("<u2") if vocab_size < 65536 else np.dtype("<u4")


@dataclass
class Ragged:
    """Per-instance arrays of a common row shape and varying row counts, back to back: ``data``
    [R, *row_shape] and ``rows`` [N] int64 (instance i holds ``rows[i]`` rows)."""

    data: np.ndarray
    rows: np.ndarray

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray], dtype: np.dtype | str, row_shape: Sequence[int]) -> Ragged:
        shape = tuple(int(d) for d in row_shape)
        for a in arrays:
            if tuple(a.shape[1:]) != shape:
                raise ValueError(f"an array of shape {tuple(a.shape)} does not have rows of shape {shape}")
        rows = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        data = np.concatenate([np.asarray(a, dtype=dtype) for a in arrays]) if arrays else \
            np.zeros((0, *shape), dtype=dtype)
        return cls(data, rows)

    @property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.rows) + 1, dtype=np.int64)
        np.cumsum(self.rows, out=out[1:])
        return out

    def item(self, i: int) -> np.ndarray:
        """The rows of instance ``i``."""
        offsets = self.offsets
        return self.data[offsets[i]:offsets[i + 1]]

    def select(self, index: np.ndarray) -> Ragged:
        rows = self.rows[index]
        return Ragged(self.data[concat_ranges(self.offsets[index], rows)], rows)

    @classmethod
    def concat(cls, parts: Sequence[Ragged]) -> Ragged:
        return cls(np.concatenate([p.data for p in parts]), np.concatenate([p.rows for p in parts]))


@dataclass
class Instances:
    """Instances in columnar form: variable-length token sequences plus integer fields.

    tokens: [T] every instance's ids back to back; lengths: [N] int64; fields: name -> [N] int64
    (e.g. ``split``, the position where segment B starts); labels: raw string labels, one per
    instance, for objectives whose label ids are only known once the whole corpus is read;
    arrays: name -> :class:`Ragged` typed per-instance arrays (speech features).
    Indexing with an int, slice or index array gives another ``Instances``.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    labels: list[str] | None = None
    arrays: dict[str, Ragged] = field(default_factory=dict)

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int] | np.ndarray],
                       **fields: Sequence[int] | np.ndarray) -> Instances:
        """Instances from a list of id sequences and per-instance field values."""
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        if len(sequences):
            tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
        else:
            tokens = np.zeros(0, dtype=np.int64)
        return cls(tokens, lengths, {k: np.asarray(v, dtype=np.int64) for k, v in fields.items()})

    @classmethod
    def concat(cls, parts: Sequence[Instances]) -> Instances:
        """All instances of ``parts``, in order (the parts must have the same fields)."""
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        names = parts[0].fields.keys()
        labels = None
        if all(p.labels is not None for p in parts):
            labels = [lab for p in parts for lab in p.labels or ()]
        return cls(np.concatenate([p.tokens for p in parts]),
                   np.concatenate([p.lengths for p in parts]),
                   {k: np.concatenate([p.fields[k] for p in parts]) for k in names}, labels,
                   {k: Ragged.concat([p.arrays[k] for p in parts]) for k in parts[0].arrays})

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """[N+1] int64: instance i is ``tokens[offsets[i]:offsets[i+1]]``."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def sequence(self, i: int) -> np.ndarray:
        """The token ids of instance ``i``."""
        start = int(self.lengths[:i].sum())
        return self.tokens[start:start + int(self.lengths[i])]

    def __getitem__(self, key: int | slice | np.ndarray | Sequence[int]) -> Instances:
        if isinstance(key, (int, np.integer)):
            key = [int(key) % len(self)]
        index = np.arange(len(self))[key] if isinstance(key, slice) else np.asarray(key, np.int64)
        offsets = self.offsets
        lengths = self.lengths[index]
        tokens = self.tokens[concat_ranges(offsets[index], lengths)]
        labels = [self.labels[i] for i in index] if self.labels is not None else None
        return Instances(tokens, lengths, {k: v[index] for k, v in self.fields.items()}, labels,
                         {k: v.select(index) for k, v in self.arrays.items()})

    def padded(self, pad_id: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids [N, W] int64 and a validity mask [N, W] bool (True = real token).

        W is the longest instance unless ``width`` is given (longer instances are an error).
        """
        longest = int(self.lengths.max()) if len(self) else 0
        width = longest if width is None else width
        if longest > width:
            raise ValueError(f"an instance has {longest} tokens, more than the width {width}")
        valid = np.arange(width)[None, :] < self.lengths[:, None]
        ids = np.full((len(self), width), pad_id, dtype=np.int64)
        ids[valid] = self.tokens  # row-major order of the mask is the concatenation order
        return ids, valid


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices ``[s0, s0+1, .., s0+l0-1, s1, ...]``: the concatenation of ranges, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    # Each position's offset inside its range is its global position minus its range's start.
    shift = np.repeat(starts - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


class ShardWriter:
    """Appends instances to shard files in ``directory``; memory does not grow with the corpus.

    A shard holds at most ``max_shard_tokens`` tokens (an instance is never split between shards;
    one longer than that gets a shard of its own). ``close()`` returns the shard list for the manifest.
    """

    def __init__(self, directory: Path, token_dtype: np.dtype, field_names: Sequence[str],
                 max_shard_tokens: int = 1 << 28, arrays: dict[str, dict[str, Any]] | None = None):
        self.directory = Path(directory)
        self.token_dtype = np.dtype(token_dtype)
        self.field_names = tuple(field_names)
        # name -> {"dtype": "<f2", "shape": [80]}: typed per-instance arrays (see the module docstring)
        self.arrays = {name: {"dtype": np.dtype(spec["dtype"]).str, "shape": [int(d) for d in spec["shape"]]}
                       for name, spec in (arrays or {}).items()}
        self._array_rows: dict[str, int] = {}
        self.max_shard_tokens = max_shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.num_instances = 0
        self.num_tokens = 0
        self._files: dict[str, Any] = {}
        self._shard_instances = 0
        self._shard_tokens = 0

    def _open_shard(self) -> None:
        stem = f"shard-{len(self.shards):05d}"
        names = {"tokens": f"{stem}.tokens.bin", "offsets": f"{stem}.offsets.bin"}
        names.update({f: f"{stem}.{f}.bin" for f in self.field_names})
        for a in self.arrays:
            names[f"array:{a}"], names[f"rows:{a}"] = f"{stem}.{a}.bin", f"{stem}.{a}.rows.bin"
        self._files = {k: open(self.directory / v, "wb") for k, v in names.items()}
        self._files["offsets"].write(np.zeros(1, OFFSET_DTYPE).tobytes())
        shard: dict[str, Any] = {"tokens": names["tokens"], "offsets": names["offsets"],
                                 "fields": {f: names[f] for f in self.field_names},
                                 "num_instances": 0, "num_tokens": 0}
        if self.arrays:
            shard["arrays"] = {a: {"data": names[f"array:{a}"], "rows": names[f"rows:{a}"], "num_rows": 0}
                               for a in self.arrays}
            for a in self.arrays:
                self._files[f"rows:{a}"].write(np.zeros(1, OFFSET_DTYPE).tobytes())
        self._array_rows = {a: 0 for a in self.arrays}
        self.shards.append(shard)
        self._shard_instances = self._shard_tokens = 0

    def _close_shard(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
        self.shards[-1].update(num_instances=self._shard_instances, num_tokens=self._shard_tokens)
        for a, rows in self._array_rows.items():
            self.shards[-1]["arrays"][a]["num_rows"] = rows

    def write(self, instances: Instances) -> None:
        """Append ``instances`` (fields must be exactly ``field_names``)."""
        if set(instances.fields) != set(self.field_names):
            raise ValueError(f"fields {sorted(instances.fields)} != {sorted(self.field_names)}")
        if set(instances.arrays) != set(self.arrays):
            raise ValueError(f"arrays {sorted(instances.arrays)} != {sorted(self.arrays)}")
        for name, spec in self.arrays.items():
            got = instances.arrays[name].data
            if list(got.shape[1:]) != spec["shape"]:
                raise ValueError(f"array {name}: rows of shape {list(got.shape[1:])}, expected {spec['shape']}")
        begin = 0
        ends = np.cumsum(instances.lengths)
        while begin < len(instances):
            if not self._files:
                self._open_shard()
            room = self.max_shard_tokens - self._shard_tokens
            before = int(ends[begin - 1]) if begin else 0
            # The longest run of instances that fits the room (an instance is never split).
            stop = int(np.searchsorted(ends, before + room, side="right"))
            if stop == begin:
                if self._shard_instances:  # the next instance does not fit: start a new shard
                    self._close_shard()
                    continue
                stop = begin + 1  # an instance longer than a whole shard gets a shard of its own
            self._append(instances, begin, stop, before, int(ends[stop - 1]))
            begin = stop

    def _append(self, inst: Instances, begin: int, stop: int, tok_begin: int, tok_end: int) -> None:
        tokens = inst.tokens[tok_begin:tok_end]
        if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(self.token_dtype).max):
            raise ValueError(f"token id out of range for {self.token_dtype}")
        self._files["tokens"].write(tokens.astype(self.token_dtype).tobytes())
        ends = self._shard_tokens + np.cumsum(inst.lengths[begin:stop])
        self._files["offsets"].write(ends.astype(OFFSET_DTYPE).tobytes())
        for name in self.field_names:
            self._files[name].write(inst.fields[name][begin:stop].astype(FIELD_DTYPE).tobytes())
        for name, spec in self.arrays.items():
            ragged = inst.arrays[name]
            offsets = ragged.offsets
            data = ragged.data[offsets[begin]:offsets[stop]]
            self._files[f"array:{name}"].write(np.ascontiguousarray(data, dtype=spec["dtype"]).tobytes())
            ends = self._array_rows[name] + np.cumsum(ragged.rows[begin:stop])
            self._files[f"rows:{name}"].write(ends.astype(OFFSET_DTYPE).tobytes())
            self._array_rows[name] += int(offsets[stop] - offsets[begin])
        self._shard_instances += stop - begin
        self._shard_tokens += tok_end - tok_begin
        self.num_instances += stop - begin
        self.num_tokens += tok_end - tok_begin

    def close(self) -> list[dict[str, Any]]:
        """Flush and close the open shard; returns the manifest's shard list."""
        if self._files:
            self._close_shard()
        return self.shards


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically (a reader never sees half of it)."""
    write_json(Path(directory) / MANIFEST, manifest)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a preprocessed dataset directory; UserError if it is not one."""
    directory = Path(directory)
    if not directory.exists():
        raise UserError(f"dataset directory {directory} does not exist; create it with "
                        f"`pentad preprocess ... data.output={directory}`.")
    if not directory.is_dir():
        raise UserError(f"dataset path {directory} is a file; expected the directory written by "
                        f"`pentad preprocess`.")
    path = directory / MANIFEST
    if not path.is_file():
        raise UserError(f"{directory} has no {MANIFEST}: it is not a dataset written by `pentad "
                        f"preprocess` (or preprocessing did not finish).")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); re-run `pentad preprocess`.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise UserError(f"{path} is not a pentad dataset manifest (expected format "
                        f"'{FORMAT_NAME}').")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path} has format version {manifest.get('format_version')}; this "
                        f"version of pentad reads version {FORMAT_VERSION}. Re-run `pentad "
                        f"preprocess`.")
    return manifest


class ShardDataset:
    """Random access to the instances of a preprocessed dataset through memory maps.

    ``take(indices)`` gathers any set of instances into an :class:`Instances` in one vectorised
    pass per shard. The memory maps open lazily and are not pickled, so the dataset can be sent
    to DataLoader worker processes cheaply.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any] | None = None):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory) if manifest is None else manifest
        self.token_dtype = np.dtype(self.manifest["token_dtype"])
        self.field_names = tuple(self.manifest["fields"])
        self.arrays = {name: (np.dtype(spec["dtype"]), tuple(spec["shape"]))
                       for name, spec in (self.manifest.get("arrays") or {}).items()}
        shards = self.manifest["shards"]
        counts = np.array([s["num_instances"] for s in shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._maps: list[dict[str, np.ndarray]] | None = None
        self._check_files()

    def _check_files(self) -> None:
        for shard in self.manifest["shards"]:
            n, t = shard["num_instances"], shard["num_tokens"]
            expected = [(shard["tokens"], t * self.token_dtype.itemsize),
                        (shard["offsets"], (n + 1) * OFFSET_DTYPE.itemsize)]
            expected += [(name, n * FIELD_DTYPE.itemsize) for name in shard["fields"].values()]
            for array, files in (shard.get("arrays") or {}).items():
                dtype, row = self.arrays[array]
                expected += [(files["data"], files["num_rows"] * int(np.prod(row, dtype=np.int64)) * dtype.itemsize),
                             (files["rows"], (n + 1) * OFFSET_DTYPE.itemsize)]
            for name, size in expected:
                path = self.directory / name
                if not path.is_file() or path.stat().st_size != size:
                    found = f"{path.stat().st_size} bytes" if path.is_file() else "no file"
                    raise UserError(f"dataset {self.directory} is damaged: {name} should have "
                                    f"{size} bytes, found {found}. Re-run `pentad preprocess`.")

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._maps is None:
            self._maps = []
            for shard in self.manifest["shards"]:
                maps = {"tokens": self._memmap(shard["tokens"], self.token_dtype),
                        "offsets": self._memmap(shard["offsets"], OFFSET_DTYPE)}
                for name, file in shard["fields"].items():
                    maps[name] = self._memmap(file, FIELD_DTYPE)
                for array, files in (shard.get("arrays") or {}).items():
                    dtype, row = self.arrays[array]
                    maps[f"array:{array}"] = self._memmap(files["data"], dtype).reshape(-1, *row)
                    maps[f"rows:{array}"] = self._memmap(files["rows"], OFFSET_DTYPE)
                self._maps.append(maps)
        return self._maps

    def _memmap(self, name: str, dtype: np.dtype) -> np.ndarray:
        path = self.directory / name
        if path.stat().st_size == 0:  # mmap cannot map an empty file
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = None
        return state

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def instance_lengths(self) -> np.ndarray:
        """[N] int64: the length in tokens of every instance (read from the offsets, 8 bytes per instance)."""
        parts = [np.diff(np.asarray(maps["offsets"], dtype=np.int64)) for maps in self._open()]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def take(self, indices: np.ndarray | Sequence[int]) -> Instances:
        """Instances ``indices`` (global, 0 <= i < len), in the given order."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"instance index out of range 0..{len(self) - 1}")
        maps = self._open()
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        local = indices - self._starts[shard_of]
        starts = np.empty_like(indices)
        lengths = np.empty_like(indices)
        fields = {name: np.empty(len(indices), dtype=np.int64) for name in self.field_names}
        for s in np.unique(shard_of):
            sel = shard_of == s
            offsets = maps[s]["offsets"]
            starts[sel] = offsets[local[sel]]
            lengths[sel] = offsets[local[sel] + 1] - starts[sel]
            for name in self.field_names:
                fields[name][sel] = maps[s][name][local[sel]]
        tokens = np.empty(int(lengths.sum()), dtype=np.int64)
        dest = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        for s in np.unique(shard_of):
            sel = shard_of == s
            tokens[concat_ranges(dest[sel], lengths[sel])] = maps[s]["tokens"][
                concat_ranges(starts[sel], lengths[sel])]
        arrays = {name: self._take_array(name, maps, shard_of, local) for name in self.arrays}
        return Instances(tokens, lengths, fields, arrays=arrays)

    def _take_array(self, name: str, maps: list[dict[str, np.ndarray]], shard_of: np.ndarray,
                    local: np.ndarray) -> Ragged:
        """The rows of array ``name`` of the instances (shard, local index), in their order."""
        dtype, row = self.arrays[name]
        starts = np.empty(len(local), dtype=np.int64)
        rows = np.empty(len(local), dtype=np.int64)
        for s in np.unique(shard_of):
            sel = shard_of == s
            offsets = maps[s][f"rows:{name}"]
            starts[sel] = offsets[local[sel]]
            rows[sel] = offsets[local[sel] + 1] - starts[sel]
        data = np.empty((int(rows.sum()), *row), dtype=dtype)
        dest = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        for s in np.unique(shard_of):
            sel = shard_of == s
            data[concat_ranges(dest[sel], rows[sel])] = maps[s][f"array:{name}"][concat_ranges(starts[sel], rows[sel])]
        return Ragged(data, rows)

    def __getitem__(self, i: int) -> Instances:
        return self.take([i])
