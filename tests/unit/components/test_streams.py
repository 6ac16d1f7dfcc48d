"""Two-stream models (``model.streams``): shared or own modules, pooling, padding, which streams each
target reads, the pair targets (clr against a hand-computed InfoNCE, pair_cls, cosine), one embedding
norm per stream (TencentPretrain's double LayerNorm is absent), config errors that name the nested
key, and the former ``dual`` encoder's configs and checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pentad.builder import build_model, summarize
from pentad.components.base import Batch, PooledPair
from pentad.components.model_config import model_config_class
from pentad.components.targets.clr import ClrTarget
from pentad.components.targets.cosine import CosineTarget
from pentad.components.targets.pair_cls import PairClsTarget
from pentad.errors import UserError
from pentad.layers.pooling import pool
from pentad.model import count_parameters
from pentad.run_config import validate_raw

V, H = 40, 16
TRANSFORMER = {"type": "transformer", "num_layers": 2, "num_heads": 2, "ffn_size": 32, "dropout": 0.0}
LSTM = {"type": "lstm", "num_layers": 2, "dropout": 0.0}


pytestmark = pytest.mark.usefixtures("one_thread")


def dual_dict(tie: bool = True, inner: dict | None = None, pooling: str = "mean", targets=None, **second) -> dict:
    """Streams ``a`` (the model's slots) and ``b`` (shared with ``a`` when ``tie``, else its own, from
    ``second``); both pool by ``pooling`` unless ``second`` says otherwise."""
    return {
        "hidden_size": H, "vocab_size": V, "max_seq_length": 24,
        "embedding": {"parts": ["word", "pos", "seg"], "dropout": 0.0},
        "encoder": dict(inner or TRANSFORMER),
        "streams": {"a": {"pooling": pooling},
                    "b": {"pooling": pooling, **({"share": "a"} if tie else {}), **second}},
        "targets": targets or [{"type": "pair_cls", "num_labels": 3, "dropout": 0.0}],
    }


def legacy_dict(tie: bool = True, pooling: str = "mean", **stream_1) -> dict:
    """The same model in the former layout: an encoder of type dual."""
    return {
        "hidden_size": H, "vocab_size": V, "max_seq_length": 24,
        "embedding": {"parts": ["word", "pos", "seg"], "dropout": 0.0},
        "encoder": {"type": "dual", "tie": tie, "stream_0": {"encoder": dict(TRANSFORMER), "pooling": pooling},
                    "stream_1": stream_1},
        "targets": [{"type": "pair_cls", "num_labels": 3, "dropout": 0.0}],
    }


def build(d: dict, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(model_config_class().model_validate(d)).eval()


def pair_batch(b: int = 4, s0: int = 7, s1: int = 5, seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    pad0 = torch.zeros(b, s0, dtype=torch.bool)
    pad0[1, -2:] = True
    pad1 = torch.zeros(b, s1, dtype=torch.bool)
    pad1[2, -3:] = True
    return Batch(tokens=torch.randint(1, V, (b, s0), generator=g), segments=torch.zeros(b, s0, dtype=torch.long),
                 padding_mask=pad0,
                 pair=Batch(tokens=torch.randint(1, V, (b, s1), generator=g),
                            segments=torch.zeros(b, s1, dtype=torch.long), padding_mask=pad1),
                 labels={"pair_cls": torch.arange(b) % 3})


# ----------------------------------------------------------------------------- batch
def test_batch_carries_its_pair():
    batch = pair_batch()
    assert batch.provided() == {"tokens", "segments", "padding_mask", "pair.tokens", "pair.segments",
                                "pair.padding_mask", "labels.pair_cls"}
    moved = batch.to("cpu")
    assert moved.pair is not batch.pair and torch.equal(moved.pair.tokens, batch.pair.tokens)
    assert Batch(pair=batch.pair).batch_size == 4


# ----------------------------------------------------------------------------- tying
def test_tied_streams_share_everything_and_keep_one_stream_names():
    tied = build(dual_dict(tie=True))
    untied = build(dual_dict(tie=False))
    one_stream = build_model(model_config_class().model_validate(
        {**dual_dict(), "streams": None, "targets": [{"type": "cls", "num_labels": 3}]}), device="meta")
    body = {k for k in one_stream.state_dict() if not k.startswith("targets.")}
    assert {k for k in tied.state_dict() if not k.startswith("targets.")} == body  # BERT loads into SBERT
    assert tied.streams is None and set(untied.streams) == {"b"}
    stream_1 = sum(p.numel() for p in untied.streams.parameters())
    assert stream_1 == sum(p.numel() for p in untied.embedding.parameters()) + \
        sum(p.numel() for p in untied.encoder.parameters())
    assert count_parameters(untied) == count_parameters(tied) + stream_1
    own = {id(p) for p in untied.streams.parameters()}
    assert not own & {id(p) for n, p in untied.named_parameters() if not n.startswith("streams.b.")}
    assert "b (Batch.pair) through a's modules" in summarize(tied)
    assert "b (Batch.pair): embedding word+pos+seg" in summarize(untied) and "pair_cls reads a, b" in summarize(tied)


def test_untied_streams_train_separately():
    model = build(dual_dict(tie=False)).train()
    out = model(pair_batch())
    out["pair_cls"].loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert not torch.equal(model.embedding.word.weight.grad, model.streams["b"].embedding.word.weight.grad)


# ----------------------------------------------------------------------------- pooling and padding
@pytest.mark.parametrize("kind", ["first", "mean", "max", "last"])
@pytest.mark.parametrize("tie", [True, False])
def test_each_stream_is_pooled_over_its_real_tokens(kind, tie):
    model = build(dual_dict(tie=tie, pooling=kind))
    batch = pair_batch()
    pooled = model.encode_pair(batch)
    hidden, mask = model.encode(batch)
    assert torch.allclose(pooled.first, pool(hidden, mask, kind), atol=1e-5)
    emb, enc = (model.embedding, model.encoder) if tie else (model.streams["b"].embedding, model.streams["b"].encoder)
    assert (emb, enc) == model.stream_slots("b") == model.stream_slots(1)
    from pentad.components.stream import run_stream

    hidden_1, mask_1 = run_stream(emb, enc, batch.pair)
    assert torch.allclose(pooled.second, pool(hidden_1, mask_1, kind), atol=1e-5)


def test_stream_poolings_may_differ():
    model = build(dual_dict(pooling="first") | {"streams": {"a": {"pooling": "first"},
                                                            "b": {"share": "a", "pooling": "max"}}})
    assert model.stream_plan.pooling == {"a": "first", "b": "max"}
    batch = pair_batch()
    pooled, (hidden, mask) = model.encode_pair(batch), model.encode(batch)
    assert torch.allclose(pooled.first, hidden[:, 0], atol=1e-5)
    assert torch.allclose(pooled.second, model.encode(batch.pair)[0].masked_fill(
        batch.pair.padding_mask[..., None], -1e4).max(dim=1).values, atol=1e-5)
    assert torch.equal(mask, batch.padding_mask)


@pytest.mark.parametrize("inner", [TRANSFORMER, LSTM], ids=["transformer", "lstm"])
@pytest.mark.parametrize("tie", [True, False])
def test_pooled_vectors_ignore_padding(inner, tie):
    """A row's vectors do not change with extra padding, nor with the other stream's length (the
    tied streams run as one batch)."""
    model = build(dual_dict(tie=tie, inner=inner))
    batch = pair_batch()
    ref = model.encode_pair(batch)
    longer = Batch(tokens=F.pad(batch.tokens, (0, 3), value=7), segments=F.pad(batch.segments, (0, 3)),
                   padding_mask=F.pad(batch.padding_mask, (0, 3), value=True),
                   pair=Batch(tokens=F.pad(batch.pair.tokens, (0, 9), value=5),
                              segments=F.pad(batch.pair.segments, (0, 9)),
                              padding_mask=F.pad(batch.pair.padding_mask, (0, 9), value=True)))
    again = model.encode_pair(longer)
    assert torch.allclose(ref.first, again.first, atol=1e-5) and torch.allclose(ref.second, again.second, atol=1e-5)
    # row by row, alone (no padding at all) gives the same vectors
    for row in (1, 2):
        keep0, keep1 = ~batch.padding_mask[row], ~batch.pair.padding_mask[row]
        alone = Batch(tokens=batch.tokens[row, keep0][None], segments=batch.segments[row, keep0][None],
                      pair=Batch(tokens=batch.pair.tokens[row, keep1][None],
                                 segments=batch.pair.segments[row, keep1][None]))
        single = model.encode_pair(alone)
        assert torch.allclose(single.first[0], ref.first[row], atol=1e-5)
        assert torch.allclose(single.second[0], ref.second[row], atol=1e-5)


def test_tied_single_pass_equals_two_passes():
    model = build(dual_dict(tie=True))
    batch = pair_batch()
    merged = model.encode_pair(batch)
    batch.pair.positions = torch.arange(batch.pair.tokens.shape[1]).expand_as(batch.pair.tokens)  # not stackable
    separate = model.encode_pair(batch)
    assert torch.allclose(merged.first, separate.first, atol=1e-5)
    assert torch.allclose(merged.second, separate.second, atol=1e-5)


# ----------------------------------------------------------------------------- one norm per stream
def test_one_embedding_norm_per_stream():
    """TencentPretrain's DualEmbedding normalises each stream twice (LN of LN); here a stream's
    encoder sees exactly its embedding slot's output."""
    model = build(dual_dict(tie=False))
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm) and ".layers." not in n]
    assert norms == ["embedding.norm", "streams.b.embedding.norm"]
    with torch.no_grad():
        model.streams["b"].embedding.norm.weight.fill_(3.0)
        model.streams["b"].embedding.norm.bias.fill_(0.5)
    seen = []
    handle = model.streams["b"].encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    batch = pair_batch()
    model.encode_pair(batch)
    handle.remove()
    real = seen[0][~batch.pair.padding_mask]  # [N, H] rows the encoder received
    assert torch.allclose(real.mean(-1), torch.full((len(real),), 0.5), atol=1e-4)
    assert torch.allclose(real.std(-1, unbiased=False), torch.full((len(real),), 3.0), atol=1e-3)


def test_second_norm_normalises_twice():
    """second_norm (a converted TencentPretrain dual-stream checkpoint's stream_i_layer_norm): the
    slot's output is the second norm of the first norm's output; it needs the first norm."""
    d = dual_dict(tie=False)
    d["embedding"]["second_norm"] = True
    model = build(d)
    with torch.no_grad():
        model.embedding.norm.weight.normal_()
        model.embedding.second_norm.weight.fill_(2.0)
        model.embedding.second_norm.bias.fill_(-1.0)
    batch = pair_batch()
    hidden = model.embedding(batch).hidden
    parts = model.embedding.word(batch) + model.embedding.pos(batch, 7) + model.embedding.seg(batch, 7)
    torch.testing.assert_close(hidden, model.embedding.second_norm(model.embedding.norm(parts)))
    assert "streams.b.embedding.second_norm.weight" in model.state_dict()  # b defaults to the same slot config
    d["embedding"]["norm"] = False
    with pytest.raises(Exception, match="second_norm is true but norm is false"):
        model_config_class().model_validate(d)


# ----------------------------------------------------------------------------- targets
def _infonce(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """Symmetric InfoNCE by explicit sums."""
    a = a / a.norm(dim=-1, keepdim=True)
    b = b / b.norm(dim=-1, keepdim=True)
    n = a.shape[0]
    total = 0.0
    for x, y in ((a, b), (b, a)):
        for i in range(n):
            scores = [scale * float(x[i] @ y[j]) for j in range(n)]
            total += -(scores[i] - math.log(sum(math.exp(s) for s in scores)))
    return total / (2 * n)


def test_clr_loss_is_symmetric_infonce():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, H, generator=g), torch.randn(5, H, generator=g)
    target = ClrTarget("clr", (H, H))
    assert math.isclose(target.scale().item(), 1 / 0.07, rel_tol=1e-5)  # CLIP's initial scale
    out = target(PooledPair(a, b), Batch())
    assert math.isclose(out.loss.item(), _infonce(a, b, 1 / 0.07), rel_tol=1e-4)
    assert out.logits.shape == (5, 5) and int(out.metrics["count"]) == 10
    # identical streams: every row finds its partner
    same = target(PooledPair(a, a.clone()), Batch())
    assert int(same.metrics["correct"]) == 10
    fixed = ClrTarget("clr", (H, H), temperature=0.05)
    assert fixed.logit_scale is None
    assert math.isclose(fixed(PooledPair(a, b), Batch()).loss.item(), _infonce(a, b, 20.0), rel_tol=1e-4)
    with torch.no_grad():
        target.logit_scale.fill_(10.0)  # exp(10) is capped at 100 (CLIP)
    assert math.isclose(target(PooledPair(a, b), Batch()).loss.item(), _infonce(a, b, 100.0), rel_tol=1e-4)


def test_clr_projects_streams_of_different_widths():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 10, generator=g)
    target = ClrTarget("clr", (6, 10), projection=True, feature_size=8)
    out = target(PooledPair(a, b), Batch())
    pa, pb = target.projection_0(a), target.projection_1(b)
    assert math.isclose(out.loss.item(), _infonce(pa.detach(), pb.detach(), 1 / 0.07), rel_tol=1e-4)
    out.loss.backward()
    assert target.logit_scale.grad is not None and target.projection_1.weight.grad is not None


def test_clr_trains_a_dual_model_without_labels():
    model = build(dual_dict(tie=False, targets=[{"type": "clr"}])).train()
    batch = pair_batch()
    batch.labels = {}
    from pentad.builder import check_requirements

    check_requirements(model, batch.provided())  # clr needs no labels
    out = model(batch)["clr"]
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.targets["clr"].logit_scale.grad is not None


def test_pair_cls_features_and_head():
    u, v = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 1.0]])
    head = PairClsTarget("cls", (2, 2), 3, ("u", "v", "abs_diff", "product"), mlp_size=4, dropout=0.0)
    feats = head.pair_features(PooledPair(u, v))
    assert feats.tolist() == [[1.0, -2.0, 3.0, 1.0, 2.0, 3.0, 3.0, -2.0]]
    assert head.hidden.in_features == 8 and head.classifier.in_features == 4
    out = head(PooledPair(u, v), Batch(labels={"cls": torch.tensor([2])}))
    assert out.logits.shape == (1, 3) and int(out.metrics["count"]) == 1
    sbert = PairClsTarget("cls", (H, H), 3)  # SBERT: (u, v, |u-v|) -> softmax
    assert sbert.hidden is None and sbert.classifier.in_features == 3 * H


def test_cosine_target_regresses_scaled_scores():
    u, v = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 1.0], [2.0, 2.0]])
    out = CosineTarget("sts", scale=5.0)(PooledPair(u, v), Batch(labels={"sts": torch.tensor([0.0, 2.5])}))
    assert torch.allclose(out.logits[:, 0], torch.tensor([0.0, 1.0]), atol=1e-6)
    assert math.isclose(out.loss.item(), ((0 - 0) ** 2 + (1 - 0.5) ** 2) / 2, rel_tol=1e-6)


# ----------------------------------------------------------------------------- config
def problems_of(raw_model: dict, build_it: bool = False) -> str:
    try:
        cfg = validate_raw({"model": raw_model}, {}, "test.yaml")
        if build_it:
            build_model(cfg.model, device="meta")
    except UserError as e:
        return str(e)
    pytest.fail("no error")


def test_nested_config_errors_name_the_nested_key():
    text = problems_of(dual_dict(tie=False, encoder={**TRANSFORMER, "num_layers": 0, "num_layer": 2},
                                 embedding={"parts": ["word", "pso"]}))
    assert "model.streams.b.encoder.num_layers: input should be greater than or equal to 1" in text
    assert "model.streams.b.encoder.num_layer: unknown key" in text and "did you mean 'num_layers'" in text
    assert "model.streams.b.embedding.parts.1.type: unknown embedding name" in text
    bad = dual_dict()
    bad["streams"]["b"]["shares"] = "a"
    assert "model.streams.b.shares: unknown key" in problems_of(bad) and "did you mean 'share'" in problems_of(bad)


def test_cross_field_config_problems_name_the_nested_key():
    text = problems_of(dual_dict(tie=False, hidden_size=18, encoder={**TRANSFORMER, "num_heads": 4}), build_it=True)
    assert "model.streams.b.encoder.num_heads: hidden_size 18 is not divisible by num_heads 4" in text
    text = problems_of(dual_dict(tie=True, encoder=TRANSFORMER), build_it=True)
    assert "model.streams.b.encoder: set, but the stream shares 'a''s embedding and encoder" in text
    first = dual_dict()
    first["streams"]["a"]["encoder"] = TRANSFORMER
    assert "model.streams.a.encoder: set on the first stream, which is the model's own" in \
        problems_of(first, build_it=True)
    wrong_share = dual_dict()
    wrong_share["streams"]["b"]["share"] = "c"
    assert "model.streams.b.share: 'c' is not the first stream" in problems_of(wrong_share, build_it=True)
    three = dual_dict()
    three["streams"]["c"] = {"share": "a"}
    assert "model.streams: found 3 streams (a, b, c)" in problems_of(three, build_it=True)
    assert "model.targets.0.streams: 'mlm' reads token states and labels of the batch's own input" in \
        problems_of(dual_dict(targets=[{"type": "mlm", "streams": ["b"]}]), build_it=True)
    unread = problems_of(dual_dict(targets=["mlm"]), build_it=True)
    assert "model.streams.b: no target reads stream 'b'" in unread and "task.pair_input=separate" in unread
    one_stream = {**dual_dict(), "streams": None}
    assert "model.targets.0.type: 'pair_cls' compares two streams, but the model has one" in \
        problems_of(one_stream, build_it=True)
    assert "model.targets.0.streams: set, but the model has no streams section" in problems_of(
        {**dual_dict(), "streams": None, "targets": [{"type": "mlm", "streams": ["a"]}]}, build_it=True)
    assert "model.targets.0.streams: no stream named 'c'" in problems_of(
        dual_dict(targets=[{"type": "clr", "streams": ["a", "c"]}]), build_it=True)
    assert "model.targets.0.streams: 'clr' compares two different streams; found ['a', 'a']" in problems_of(
        dual_dict(targets=[{"type": "clr", "streams": ["a", "a"]}, {"type": "clr", "name": "other"}]),
        build_it=True)
    wide = dual_dict(tie=False, hidden_size=24, targets=["clr"])
    assert "model.targets.0.projection: the streams are 16 and 24 wide" in problems_of(wide, build_it=True)
    assert "model.decoder: a model with streams has no decoder" in problems_of(
        {**dual_dict(), "decoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 8},
         "target_embedding": {"parts": ["word"]}}, build_it=True)


def test_targets_read_the_streams_they_name():
    """A pair target compares its streams in the order it names them; a token target reads the first
    stream's states beside it (e.g. a masked LM on the text of a contrastive pair)."""
    model = build(dual_dict(tie=False, hidden_size=H, targets=[
        {"type": "cosine", "name": "ab"}, {"type": "cosine", "name": "ba", "streams": ["b", "a"]},
        {"type": "mlm"}]))
    assert model.stream_plan.reads == {"ab": ("a", "b"), "ba": ("b", "a"), "mlm": ("a",)}
    batch = pair_batch()
    batch.labels = {"ab": torch.rand(4), "ba": torch.rand(4),
                    "mlm": torch.where(batch.padding_mask, -100, batch.tokens)}
    out = model(batch)
    pooled = model.encode_pair(batch)
    torch.testing.assert_close(out["ab"].logits[:, 0], F.cosine_similarity(pooled.first, pooled.second))
    torch.testing.assert_close(out["ba"].logits, out["ab"].logits)  # cosine is symmetric
    hidden, _ = model.encode(batch)
    reference = model.targets["mlm"](hidden, batch)
    torch.testing.assert_close(out["mlm"].loss, reference.loss)
    # a shared tower stacks both inputs into one pass; the first stream's states keep its own length
    shared = build(dual_dict(tie=True, targets=[{"type": "clr"}, {"type": "mlm"}]))
    batch = pair_batch(s0=5, s1=9)
    batch.labels = {"mlm": torch.where(batch.padding_mask, -100, batch.tokens)}
    out = shared(batch)
    torch.testing.assert_close(out["mlm"].loss, shared.targets["mlm"](shared.encode(batch)[0], batch).loss)


def test_missing_pair_data_is_named():
    model = build(dual_dict())
    with pytest.raises(UserError, match=r"stream 'b' embedding part 'word' needs Batch.pair.tokens.*"
                                        r"task.pair_input"):
        from pentad.builder import check_requirements

        check_requirements(model, {"tokens", "segments", "padding_mask", "labels.pair_cls"})


def test_streams_config_round_trips_and_has_a_schema():
    from pentad.assembly import run_config_class

    cls = model_config_class()
    cfg = cls.model_validate(dual_dict(tie=False, encoder=LSTM, hidden_size=24, embedding={"parts": ["word"]}))
    again = cls.model_validate(cfg.model_dump())
    assert again == cfg and again.streams["b"].encoder.type == "lstm" and list(again.streams) == ["a", "b"]
    assert cls.model_validate(cfg.model_dump(mode="json")) == cfg
    schema = run_config_class().model_json_schema()
    assert "StreamConfig" in str(schema)


# ----------------------------------------------------------------------------- one owner
def test_the_stream_section_is_its_components():
    """The stream section's schema is beside the streams' code (pentad.components.stream), not in config/."""
    import importlib.util

    from pentad.components.stream import StreamConfigBase

    cfg = model_config_class().model_validate(dual_dict(tie=False, encoder=LSTM))
    assert all(isinstance(stream, StreamConfigBase) for stream in cfg.streams.values())
    assert importlib.util.find_spec("pentad.config.streams") is None


def test_streams_are_built_with_the_builders_embedding_slot():
    from pentad.components.stream import StreamPlan, build_streams

    calls = []

    def slot(slot_cfg, sizes, encoder_cfg):
        calls.append((slot_cfg, sizes.hidden_size, encoder_cfg.type))
        return nn.Identity()

    own = model_config_class().model_validate(dual_dict(tie=False, hidden_size=24, encoder=LSTM))
    modules, plan = build_streams(own, slot)
    assert calls == [(own.embedding, 24, "lstm")] and list(modules) == ["b"]
    assert modules["b"].encoder.registry_name == "lstm" and isinstance(modules["b"].embedding, nn.Identity)
    assert plan == StreamPlan(("a", "b"), {"a": "mean", "b": "mean"}, False, {"pair_cls": ("a", "b")})
    calls.clear()
    assert build_streams(model_config_class().model_validate(dual_dict(tie=True)), slot) == (
        {}, StreamPlan(("a", "b"), {"a": "mean", "b": "mean"}, True, {"pair_cls": ("a", "b")}))
    one = {k: v for k, v in dual_dict(targets=[{"type": "mlm"}]).items() if k != "streams"}
    assert build_streams(model_config_class().model_validate(one), slot) == ({}, None) and calls == []


def test_the_plan_runs_the_models_streams():
    """Model's stream methods are the plan's, over the model's modules."""
    model = build(dual_dict(tie=False, targets=[{"type": "pair_cls", "num_labels": 3, "dropout": 0.0},
                                                 {"type": "mlm", "streams": ["a"]}]))
    batch, plan = pair_batch(), model.stream_plan
    with torch.no_grad():
        states = plan.states(model, batch)
        assert set(states) == {"a", "b"} and states["b"][0].shape == (4, 5, H)
        pooled = plan.pooled(states)
        torch.testing.assert_close(pooled["b"], model.encode_stream(batch.pair, "b"), rtol=0, atol=0)
        torch.testing.assert_close(plan.pair(model, batch).first, model.encode_pair(batch).first, rtol=0, atol=0)
        assert plan.requirements(model) == [("stream 'b' embedding part 'word'", "pair.tokens"),
                                            ("stream 'b' embedding part 'seg'", "pair.segments")]
        assert plan.describe(model) in summarize(model) and set(plan.forward(model, batch)) == {"pair_cls", "mlm"}


def test_the_former_dual_layout_is_read_without_torch():
    """Reading a config (the loader, the TencentPretrain importer) rewrites the former dual layout and imports
    no torch (pentad preprocess needs none)."""
    import subprocess
    import sys

    code = ("import sys, pentad.config.loader, pentad.config.model, pentad.tencentpretrain.config; "
            "from pentad.config.dual_layout import from_dual_encoder; "
            "assert 'streams' in from_dual_encoder({'encoder': {'type': 'dual', 'stream_0': {}}}); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# ----------------------------------------------------------------------------- the former dual encoder
@pytest.mark.parametrize("tie", [True, False])
def test_dual_encoder_configs_load_as_streams(tie, capsys):
    from pentad.config import dual_layout

    dual_layout._warned.clear()
    second = {} if tie else {"hidden_size": 24, "encoder": {**TRANSFORMER, "num_heads": 4}}
    legacy = model_config_class().model_validate(legacy_dict(tie=tie, pooling="first", **second))
    assert "model.encoder type 'dual' (stream_0 / stream_1) is now model.streams (text_a, text_b)" in \
        capsys.readouterr().err
    expected = {"text_a": {"pooling": "first"}, "text_b": {"pooling": "first", **({"share": "text_a"} if tie else {}),
                                                           **second}}
    assert legacy == model_config_class().model_validate({**legacy_dict(), "encoder": TRANSFORMER,
                                                          "streams": expected})
    assert legacy.encoder.type == "transformer"
    # a saved config is written in the new form
    assert "'dual'" not in str(legacy.model_dump()) and legacy.model_dump()["streams"]["text_b"]["pooling"] == "first"
    bad = legacy_dict(tie=True, hidden_size=24)
    assert "model.streams.text_b.hidden_size: set, but the stream shares 'text_a''s" in problems_of(bad, build_it=True)


def test_dual_checkpoints_load_into_streams(tmp_path):
    """A checkpoint of the former layout (the second stream under pair.*) loads as streams.<second>.*."""
    from pentad.training.checkpoint import load_weights

    model = build(model_config_class().model_validate(legacy_dict(tie=False)))
    old = {k.replace("streams.text_b.", "pair."): v.clone() + 1 for k, v in model.state_dict().items()}
    assert any(k.startswith("pair.embedding.") for k in old) and any(k.startswith("pair.encoder.") for k in old)
    notes = load_weights(model, old, "old run")
    assert any("read as streams.text_b" in n for n in notes)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, old[key.replace("streams.text_b.", "pair.")])


def _clr_rank(rank: int, init_file: str, out_dir: str, negatives: bool = False) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        x, y, z, lin, target = _clr_problem()
        rows = slice(4 * rank, 4 * rank + 4)
        out = target(PooledPair(lin(x[rows]), lin(y[rows]), lin(z[rows]) if negatives else None), Batch())
        out.loss.backward()
        torch.save({"loss": out.loss.detach(), "weight": lin.weight.grad, "scale": target.logit_scale.grad,
                    "count": out.metrics["count"]}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _clr_problem():
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(8, 5, generator=g) for _ in range(3))
    torch.manual_seed(1)
    return x, y, z, nn.Linear(5, 4), ClrTarget("clr", (4, 4), init_temperature=0.5)


@pytest.mark.parametrize("negatives", [False, True], ids=["pairs", "hard-negatives"])
def test_clr_under_data_parallelism_matches_the_global_batch(tmp_path, negatives):
    """Two ranks with half the batch each: same loss, and gradients averaged over the ranks (as
    DDP does) equal to one process's gradients on the whole batch (hard negatives gathered too)."""
    import torch.multiprocessing as mp

    x, y, z, lin, target = _clr_problem()
    whole = target(PooledPair(lin(x), lin(y), lin(z) if negatives else None), Batch())
    whole.loss.backward()
    mp.spawn(_clr_rank, args=(str(tmp_path / "init"), str(tmp_path), negatives), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in ranks:
        assert torch.allclose(r["loss"], whole.loss, atol=1e-6) and int(r["count"]) == 8  # 4 rows, 2 directions
    assert torch.allclose((ranks[0]["weight"] + ranks[1]["weight"]) / 2, lin.weight.grad, atol=1e-6)
    assert torch.allclose((ranks[0]["scale"] + ranks[1]["scale"]) / 2, target.logit_scale.grad, atol=1e-6)


# ----------------------------------------------------------------------------- hard negatives
def _negative_batch(b: int = 4, s: int = 6, seed: int = 3) -> Batch:
    batch = pair_batch(b)
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, -1:] = True
    batch.negative = Batch(tokens=torch.randint(1, V, (b, s), generator=g),
                           segments=torch.zeros(b, s, dtype=torch.long), padding_mask=pad)
    return batch


def test_hard_negatives_travel_in_the_batch_and_through_stream_1():
    batch = _negative_batch()
    assert {"negative.tokens", "negative.padding_mask"} <= batch.provided()
    part = batch.rows(torch.tensor([2, 3]))
    assert torch.equal(part.negative.tokens, batch.negative.tokens[2:]) and part.negative.batch_size == 2
    assert batch.to("cpu").negative is not batch.negative
    for tie in (True, False):
        model = build(dual_dict(tie=tie, targets=[{"type": "clr"}]))
        pooled = model.encode_pair(batch)
        # the negatives' vectors are stream 1's vectors of those sentences, in one pass or three
        alone = model.encode_pair(Batch(tokens=batch.tokens, segments=batch.segments, padding_mask=batch.padding_mask,
                                        pair=batch.negative))
        assert torch.allclose(pooled.negative, alone.second, atol=1e-5)
        no_negatives = model.encode_pair(pair_batch())
        assert torch.allclose(pooled.second, no_negatives.second, atol=1e-5) and no_negatives.negative is None


def test_clr_with_hard_negatives_is_infonce_over_positives_and_negatives():
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(4, H, generator=g) for _ in range(3))
    target = ClrTarget("clr", (H, H), temperature=0.05, symmetric=False)
    out = target(PooledPair(a, b, c), Batch())
    assert out.logits.shape == (4, 8)
    an, cand = F.normalize(a, dim=-1), F.normalize(torch.cat([b, c]), dim=-1)
    expected = 0.0
    for i in range(4):
        scores = [20.0 * float(an[i] @ cand[j]) for j in range(8)]
        expected += -(scores[i] - math.log(sum(math.exp(s) for s in scores)))
    assert math.isclose(out.loss.item(), expected / 4, rel_tol=1e-4)
    # the negatives are candidates only: the symmetric direction scores stream 1 against stream 0
    symmetric = ClrTarget("clr", (H, H), temperature=0.05)
    plain = ClrTarget("clr", (H, H), temperature=0.05, symmetric=False)
    back = F.cross_entropy(20.0 * F.normalize(b, dim=-1) @ an.T, torch.arange(4))
    assert math.isclose(symmetric(PooledPair(a, b, c), Batch()).loss.item(),
                        (out.loss.item() + back.item()) / 2, rel_tol=1e-4)
    assert plain(PooledPair(a, b), Batch()).logits.shape == (4, 4)


def test_clr_logits_in_eval_mode_give_each_pair_its_cosine():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, H, generator=g), torch.randn(5, H, generator=g)
    target = ClrTarget("clr", (H, H), temperature=0.05, symmetric=False).eval()
    cosine = torch.diagonal(target(PooledPair(a, b), Batch()).logits) * 0.05
    assert torch.allclose(cosine, F.cosine_similarity(a, b, dim=-1), atol=1e-6)


def test_clr_with_fixed_temperature_survives_a_saved_config():
    from pentad.components.model_config import model_config_class

    cfg = model_config_class().model_validate(dual_dict(targets=[{"type": "clr", "temperature": 0.05}]))
    again = model_config_class().model_validate(cfg.model_dump())  # a run's config.yaml spells out defaults
    build_model(again)
    with pytest.raises(Exception, match="init_temperature"):
        build_model(model_config_class().model_validate(
            dual_dict(targets=[{"type": "clr", "temperature": 0.05, "init_temperature": 0.1}])))
