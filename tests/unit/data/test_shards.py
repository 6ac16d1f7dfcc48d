"""Columnar instances, the shard writer and the memory-mapped reader."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from pentad.data.shards import (
    MANIFEST,
    Instances,
    ShardDataset,
    ShardWriter,
    concat_ranges,
    read_manifest,
    token_dtype_for,
    write_manifest,
)
from pentad.errors import UserError


def random_instances(n: int, seed: int = 0, vocab: int = 1000) -> Instances:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, size=int(rng.integers(1, 40))) for _ in range(n)]
    return Instances.from_sequences(seqs, split=rng.integers(0, 5, n), sp=rng.integers(0, 2, n))


def write_dataset(directory, instances: Instances, vocab: int = 1000, max_shard_tokens: int = 1 << 20,
                  parts: int = 3) -> dict:
    writer = ShardWriter(directory, token_dtype_for(vocab), ["split", "sp"], max_shard_tokens)
    for piece in np.array_split(np.arange(len(instances)), parts):
        writer.write(instances[piece])
    shards = writer.close()
    manifest = {"format": "pentad-token-shards", "format_version": 1, "token_dtype": writer.token_dtype.str,
                "fields": {"split": "<i4", "sp": "<i4"}, "shards": shards,
                "num_instances": writer.num_instances, "num_tokens": writer.num_tokens}
    write_manifest(directory, manifest)
    return manifest


def test_instances_indexing_and_padding():
    inst = Instances.from_sequences([[1, 2, 3], [4], [5, 6]], split=[1, 0, 2])
    assert len(inst) == 3 and inst.offsets.tolist() == [0, 3, 4, 6]
    sub = inst[np.array([2, 0])]
    assert sub.tokens.tolist() == [5, 6, 1, 2, 3] and sub.fields["split"].tolist() == [2, 1]
    assert inst[1].tokens.tolist() == [4] and inst[1:].lengths.tolist() == [1, 2]
    ids, valid = inst.padded(pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert valid.sum(1).tolist() == [3, 1, 2]
    assert inst.padded(9, width=5)[0].shape == (3, 5)
    both = Instances.concat([inst, sub])
    assert len(both) == 5 and both.sequence(3).tolist() == [5, 6]


def test_concat_ranges():
    assert concat_ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist() == [5, 6, 9, 10, 11]


def test_token_dtype():
    assert token_dtype_for(21128) == np.dtype("<u2")
    assert token_dtype_for(65535) == np.dtype("<u2")
    assert token_dtype_for(250002) == np.dtype("<u4")


def test_round_trip_across_shards(tmp_path):
    inst = random_instances(200)
    manifest = write_dataset(tmp_path, inst, max_shard_tokens=500)
    assert len(manifest["shards"]) > 3  # the small limit forces several shards
    assert sum(s["num_instances"] for s in manifest["shards"]) == 200
    assert all(s["num_tokens"] <= 500 for s in manifest["shards"])
    dataset = ShardDataset(tmp_path)
    assert len(dataset) == 200 and dataset.num_tokens == int(inst.lengths.sum())
    order = np.random.default_rng(1).permutation(200)[:77]
    got = dataset.take(order)
    want = inst[order]
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.lengths.tolist() == want.lengths.tolist()
    assert got.fields["split"].tolist() == want.fields["split"].tolist()
    assert got.fields["sp"].tolist() == want.fields["sp"].tolist()
    assert dataset[5].tokens.tolist() == inst.sequence(5).tolist()
    with pytest.raises(IndexError):
        dataset.take([200])


def test_files_are_raw_memmappable_arrays(tmp_path):
    inst = random_instances(30)
    manifest = write_dataset(tmp_path, inst)
    shard = manifest["shards"][0]
    tokens = np.memmap(tmp_path / shard["tokens"], dtype="<u2", mode="r")
    offsets = np.memmap(tmp_path / shard["offsets"], dtype="<i8", mode="r")
    split = np.memmap(tmp_path / shard["fields"]["split"], dtype="<i4", mode="r")
    assert offsets[0] == 0 and offsets[-1] == len(tokens) == inst.lengths.sum()
    assert tokens[offsets[3]:offsets[4]].tolist() == inst.sequence(3).tolist()
    assert split.tolist() == inst.fields["split"].tolist()


def test_large_vocab_uses_uint32(tmp_path):
    inst = Instances.from_sequences([[70000, 1], [2]], split=[0, 0], sp=[0, 1])
    manifest = write_dataset(tmp_path, inst, vocab=100000, parts=1)
    assert manifest["token_dtype"] == "<u4"
    assert ShardDataset(tmp_path).take([0, 1]).tokens.tolist() == [70000, 1, 2]


def test_dataset_pickles_without_maps(tmp_path):
    write_dataset(tmp_path, random_instances(10))
    dataset = ShardDataset(tmp_path)
    dataset.take([1, 2])
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._maps is None
    assert clone.take([3]).tokens.tolist() == dataset.take([3]).tokens.tolist()


def test_manifest_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_manifest(tmp_path / "nope")
    with pytest.raises(UserError, match="no manifest.json"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "pentad-token-shards", "format_version": 99}))
    with pytest.raises(UserError, match="version 99"):
        read_manifest(tmp_path)


def test_damaged_shard_is_a_user_error(tmp_path):
    manifest = write_dataset(tmp_path, random_instances(10))
    path = tmp_path / manifest["shards"][0]["tokens"]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(UserError, match="damaged"):
        ShardDataset(tmp_path)


def test_typed_arrays_round_trip_across_shards(tmp_path):
    """Per-instance arrays (speech features: [frames, bins] rows) are written beside the tokens,
    split with their instances across shards, memory-mapped and gathered in any order."""
    from pentad.data.shards import Ragged

    inst = random_instances(60, seed=3)
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((int(rng.integers(0, 9)), 5)).astype(np.float16) for _ in range(60)]
    inst.arrays["audio"] = Ragged.from_arrays(arrays, "<f2", [5])
    assert inst[np.array([7, 2])].arrays["audio"].item(1).tolist() == arrays[2].tolist()
    writer = ShardWriter(tmp_path, token_dtype_for(1000), ["split", "sp"], 300,
                         arrays={"audio": {"dtype": "float16", "shape": [5]}})
    for piece in np.array_split(np.arange(60), 4):
        writer.write(inst[piece])
    shards = writer.close()
    assert len(shards) > 2 and sum(s["arrays"]["audio"]["num_rows"] for s in shards) == sum(len(a) for a in arrays)
    write_manifest(tmp_path, {"format": "pentad-token-shards", "format_version": 1, "token_dtype": "<u2",
                              "fields": {"split": "<i4", "sp": "<i4"}, "arrays": writer.arrays, "shards": shards,
                              "num_instances": 60, "num_tokens": writer.num_tokens})
    dataset = pickle.loads(pickle.dumps(ShardDataset(tmp_path)))
    order = np.random.default_rng(5).permutation(60)
    got = dataset.take(order)
    for i, k in enumerate(order):
        assert got.arrays["audio"].item(i).dtype == np.float16
        np.testing.assert_array_equal(got.arrays["audio"].item(i), arrays[k])
        assert got.sequence(i).tolist() == inst.sequence(int(k)).tolist()
    with pytest.raises(ValueError, match="rows of shape"):
        writer2 = ShardWriter(tmp_path / "x", token_dtype_for(1000), ["split", "sp"],
                              arrays={"audio": {"dtype": "float16", "shape": [4]}})
        writer2.write(inst[:2])
    damaged = tmp_path / shards[0]["arrays"]["audio"]["data"]
    damaged.write_bytes(damaged.read_bytes()[:-2])
    with pytest.raises(UserError, match="damaged"):
        ShardDataset(tmp_path)
