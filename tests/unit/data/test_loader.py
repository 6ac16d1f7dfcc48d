"""Opening datasets (checks) and the resumable pre-training batch stream."""

from __future__ import annotations

import numpy as np
import pytest

from pentad.data.loader import PretrainBatches, open_dataset
from pentad.data.objectives import BertObjective, LmObjective, MlmObjective
from pentad.data.preprocess import preprocess
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError


@pytest.fixture(scope="module")
def tok_config(shared_data):
    return {"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")}


@pytest.fixture(scope="module")
def tok(tok_config):
    return load_tokenizer(tok_config)


@pytest.fixture(scope="module")
def bert_dataset(shared_data, tok, tok_config, tmp_path_factory):
    """A bert dataset from a slice of the real sentence corpus, and its objective."""
    root = tmp_path_factory.mktemp("loader")
    with open(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", "rb") as f:
        (root / "bert.txt").write_bytes(b"".join(next(f) for _ in range(300)))
    obj = BertObjective(BertObjective.Config(seq_length=48), tok)
    preprocess(obj, tok, tok_config, root / "bert.txt", root / "ds", progress=False)
    return root / "ds", obj


def same_batch(a, b) -> bool:
    return (a.tokens.equal(b.tokens) and a.segments.equal(b.segments)
            and a.padding_mask.equal(b.padding_mask) and a.labels.keys() == b.labels.keys()
            and all(a.labels[k].equal(b.labels[k]) for k in a.labels))


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_open_and_iterate(bert_dataset, tok):
    path, obj = bert_dataset
    dataset = open_dataset(path, tok, obj)
    batches = PretrainBatches(dataset, obj, batch_size=8, seed=5)
    assert batches.batches_per_epoch == len(dataset) // 8 == len(batches)
    first = next(batches.iterate())
    assert first.tokens.shape[0] == 8 and first.provided() == set(obj.provides)


def test_resume_gives_the_same_batches(bert_dataset, tok):
    path, obj = bert_dataset
    batches = PretrainBatches(open_dataset(path, tok, obj), obj, batch_size=8, seed=5)
    k = batches.batches_per_epoch - 2  # the resumed run crosses an epoch boundary
    straight = take(batches.iterate(0), k + 5)
    fresh = PretrainBatches(open_dataset(path, tok, obj), obj, batch_size=8, seed=5)
    resumed = take(fresh.iterate(k), 5)
    assert all(same_batch(a, b) for a, b in zip(straight[k:], resumed))
    other_seed = next(PretrainBatches(open_dataset(path, tok, obj), obj, 8, seed=6).iterate(0))
    assert not same_batch(straight[0], other_seed)


def test_workers_give_the_same_batches(bert_dataset, tok):
    path, obj = bert_dataset
    dataset = open_dataset(path, tok, obj)
    serial = take(PretrainBatches(dataset, obj, 8, seed=1).iterate(3), 4)
    parallel_stream = PretrainBatches(dataset, obj, 8, seed=1, num_workers=2).iterate(3)
    parallel = take(parallel_stream, 4)
    parallel_stream.close()
    assert all(same_batch(a, b) for a, b in zip(serial, parallel))


def test_epochs_are_permutations_without_the_last_partial_batch(bert_dataset, tok):
    path, obj = bert_dataset
    dataset = open_dataset(path, tok, obj)
    batches = PretrainBatches(dataset, obj, batch_size=7, seed=2)
    per_epoch = batches.batches_per_epoch
    epoch0 = np.concatenate([batches.indices(i) for i in range(per_epoch)])
    epoch1 = np.concatenate([batches.indices(i) for i in range(per_epoch, 2 * per_epoch)])
    assert len(set(epoch0.tolist())) == len(epoch0) == per_epoch * 7 > len(dataset) - 7
    assert epoch0.tolist() != epoch1.tolist()


def test_batch_larger_than_dataset(bert_dataset, tok):
    path, obj = bert_dataset
    dataset = open_dataset(path, tok, obj)
    with pytest.raises(UserError, match="fewer than one batch"):
        PretrainBatches(dataset, obj, batch_size=len(dataset) + 1, seed=0)


def test_open_dataset_errors(bert_dataset, tok, shared_data, tmp_path):
    path, obj = bert_dataset
    with pytest.raises(UserError, match=r"missing_ds does not exist"):
        open_dataset(tmp_path / "missing_ds", tok, obj)
    (tmp_path / "no_manifest").mkdir()
    with pytest.raises(UserError, match="no manifest.json"):
        open_dataset(tmp_path / "no_manifest", tok, obj)
    mlm = MlmObjective(MlmObjective.Config(seq_length=48), tok)
    with pytest.raises(UserError, match=r"preprocessed for objective 'bert'.*'mlm'"):
        open_dataset(path, tok, mlm)
    longer = BertObjective(BertObjective.Config(seq_length=64), tok)
    with pytest.raises(UserError, match=r"objective.seq_length: dataset 48, config 64"):
        open_dataset(path, tok, longer)
    # Collate-only options may change freely.
    other_masking = BertObjective(BertObjective.Config(seq_length=48, mask_prob=0.2), tok)
    assert len(open_dataset(path, tok, other_masking)) > 0
    english = load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models/google_uncased_en_vocab.txt")})
    # the differing key with both values, not two configs and two fingerprints
    with pytest.raises(UserError, match=r"different tokenizer \(tokenizer.vocab: dataset '[^']*', config '[^']*"
                                        r"google_uncased_en_vocab.txt'"):
        open_dataset(path, english, BertObjective(BertObjective.Config(seq_length=48), english))


def test_lm_batches(shared_data, tok, tok_config, tmp_path):
    with open(shared_data / "corpora/CLUECorpusSmall_sampled.txt", "rb") as f:
        (tmp_path / "docs.txt").write_bytes(b"".join(next(f) for _ in range(30)))
    obj = LmObjective(LmObjective.Config(seq_length=32), tok)
    preprocess(obj, tok, tok_config, tmp_path / "docs.txt", tmp_path / "ds", progress=False)
    batches = PretrainBatches(open_dataset(tmp_path / "ds", tok, obj), obj, 4, seed=0)
    batch = next(batches.iterate(2))
    assert batch.tokens.shape == batch.labels["lm"].shape == (4, 32)
    real = ~batch.padding_mask[:, 1:]
    assert batch.tokens[:, 1:][real].equal(batch.labels["lm"][:, :-1][real])  # labels are the shift


def test_shortest_first_orders_the_first_batches_and_resumes(bert_dataset, tok):
    """train.curriculum.shortest_first: epoch 0 starts with the shortest instances in increasing length, the
    rest follows in the seeded order, later epochs are untouched, and a resumed stream gives the same batches
    (also from DataLoader workers)."""
    path, obj = bert_dataset
    dataset = open_dataset(path, tok, obj)
    lengths = dataset.instance_lengths()
    assert len(lengths) == len(dataset) and lengths.tolist() == dataset.take(np.arange(len(dataset))).lengths.tolist()
    plain = PretrainBatches(dataset, obj, batch_size=8, seed=5)
    ordered = PretrainBatches(dataset, obj, batch_size=8, seed=5, shortest_first=24)
    first = ordered.indices(0).tolist() + ordered.indices(1).tolist() + ordered.indices(2).tolist()
    assert lengths[first].tolist() == sorted(lengths[first].tolist())
    assert lengths[first].max() <= np.sort(lengths)[23]  # the 24 shortest
    assert lengths[first].mean() < lengths.mean() - 5
    # after them, the other instances in the plain seeded order; epoch 1 as without ordering
    rest = [i for i in plain.indices(0).tolist() + np.concatenate(
        [plain.indices(b) for b in range(1, plain.batches_per_epoch)]).tolist() if i not in set(first)]
    later = np.concatenate([ordered.indices(b) for b in range(3, ordered.batches_per_epoch)]).tolist()
    assert later == rest[:len(later)]
    epoch1 = plain.batches_per_epoch
    assert ordered.indices(epoch1).tolist() == plain.indices(epoch1).tolist()
    straight = take(ordered.iterate(0), 5)
    resumed = take(PretrainBatches(dataset, obj, batch_size=8, seed=5, shortest_first=24).iterate(2), 3)
    assert all(same_batch(a, b) for a, b in zip(straight[2:], resumed))
    workers = take(PretrainBatches(dataset, obj, batch_size=8, seed=5, shortest_first=24, num_workers=2).iterate(1), 3)
    assert all(same_batch(a, b) for a, b in zip(straight[1:4], workers))
