"""The key-map mechanism: templates, transforms, both directions, and the errors it reports."""

import pytest
import torch

from pentad.errors import UserError
from pentad.interop.keymap import WB, Rule, check_rules, expand, get_transform, to_foreign, to_pentad

H = 4


def test_expand_repeats_over_sequences_and_substitutes_scalars():
    rules = expand([("enc.{layer}.lin.{wb}", "{prefix}layer.{layer}.dense.{wb}"),
                    ("pos", "{prefix}pos", "leading_rows:{offset}")],
                   layer=range(2), wb=WB, prefix="bert.", offset=2)
    assert Rule(("enc.1.lin.bias",), ("bert.layer.1.dense.bias",)) in rules
    assert len(rules) == 5
    assert rules[-1] == Rule(("pos",), ("bert.pos",), "leading_rows:2")
    with pytest.raises(KeyError, match="prefix"):
        expand([("a", "{prefix}a")])


@pytest.mark.parametrize("name, theirs_shapes", [
    ("copy", [(3, H)]), ("conv1d", [(H, 3 * H)]), ("fuse_qkv", [(H, H)] * 3), ("fuse_qkv", [(H,)] * 3),
    ("leading_rows:2", [(6, H)]), ("seg_pad_row", [(3, H)]), ("fuse_qkv:4:2", [(8, H), (4, H), (4, H)]),
    ("fuse_qkv:4:2:meta", [(8, H), (4, H), (4, H)]), ("fuse_qkv:2:2:meta", [(4,)] * 3), ("fuse_kv", [(H, H)] * 2),
    ("heads_qkv:2", [(12, H)]), ("heads_qkv:2", [(12,)]), ("row_vector", [(1, 7)]), ("rotate_rows:1", [(3, H)]),
    ("leading_ones:2", [(1, 1, H)]), ("leading_ones:1", [(1, 5, H)]),
])
def test_transforms_invert_exactly(name, theirs_shapes):
    transform = get_transform(name)
    theirs = [torch.randn(s) for s in theirs_shapes]
    ours, extra = transform.to_ours(theirs)
    back = transform.to_theirs(ours, extra)
    assert len(back) == len(theirs)
    assert all(torch.equal(a, b) for a, b in zip(theirs, back))


def test_transform_shapes():
    q, k, v = (torch.full((H, H), float(i)) for i in range(3))
    (qkv,), _ = get_transform("fuse_qkv").to_ours([q, k, v])
    assert qkv.shape == (3 * H, H) and torch.equal(qkv[H:2 * H], k)  # rows [q; k; v]
    (w,), _ = get_transform("conv1d").to_ours([torch.randn(H, 3 * H)])
    assert w.shape == (3 * H, H)
    table = torch.arange(3 * H, dtype=torch.float32).view(3, H)
    (rows,), pad_row = get_transform("seg_pad_row").to_ours([table])
    assert torch.equal(rows, table[1:]) and torch.equal(pad_row, table[:1])
    # Without the extra row (a model trained in pentad) the exporter writes zeros.
    (back,) = get_transform("seg_pad_row").to_theirs([rows], None)
    assert torch.equal(back[0], torch.zeros(H)) and torch.equal(back[1:], rows)


def test_unknown_transform_and_bad_arity_are_programming_errors():
    with pytest.raises(ValueError, match="unknown"):
        get_transform("transpose")
    with pytest.raises(ValueError, match="does not fit"):
        check_rules([Rule(("qkv",), ("q", "k"), "fuse_qkv")])
    with pytest.raises(ValueError, match="two rules"):
        check_rules([Rule(("a",), ("x",)), Rule(("a",), ("y",))])
    with pytest.raises(ValueError, match="optional"):
        check_rules([Rule((), ("buffer",), "ignore")])


RULES = expand([
    ("emb.weight", "E.w"),
    ("emb.weight", "head.w?", "tied"),
    ("layer.{layer}.qkv.{wb}", ("L.{layer}.q.{wb}", "L.{layer}.k.{wb}", "L.{layer}.v.{wb}"), "fuse_qkv"),
    ("seg.weight", "S.w", "seg_pad_row"),
    ((), "L.{layer}.mask?", "ignore"),
], layer=range(2), wb=WB)


def foreign_state(tied_copy: bool = True):
    state = {"E.w": torch.randn(10, H), "S.w": torch.randn(3, H), "L.0.mask?": None}
    state.pop("L.0.mask?")
    for i in range(2):
        for n in "qkv":
            state[f"L.{i}.{n}.weight"] = torch.randn(H, H)
            state[f"L.{i}.{n}.bias"] = torch.randn(H)
    state["L.1.mask"] = torch.ones(2, 2)  # a buffer: consumed and dropped
    if tied_copy:
        state["head.w"] = state["E.w"].clone()
    return state


def expected():
    shapes = {"emb.weight": (10, H), "seg.weight": (2, H)}
    for i in range(2):
        shapes[f"layer.{i}.qkv.weight"] = (3 * H, H)
        shapes[f"layer.{i}.qkv.bias"] = (3 * H,)
    return shapes


def test_round_trip_through_computed_inverse():
    state = foreign_state()
    ours, extras = to_pentad(state, RULES, expected(), source="ckpt", layout="toy")
    assert set(ours) == set(expected())
    assert set(extras) == {"seg.weight"}
    back = to_foreign(ours, RULES, source="ours", layout="toy", extras=extras)
    # Optional keys (the tied duplicate, the buffer) are consumed on import and not written back.
    assert set(back) == set(state) - {"head.w", "L.1.mask"}
    assert all(torch.equal(back[k], state[k]) for k in back)


def test_tied_copy_may_be_absent_but_must_match_when_present():
    to_pentad(foreign_state(tied_copy=False), RULES, expected(), source="ckpt", layout="toy")
    state = foreign_state()
    state["head.w"] = state["head.w"] + 1
    with pytest.raises(UserError, match="head.w must be the same tensor as E.w"):
        to_pentad(state, RULES, expected(), source="ckpt", layout="toy")


def test_every_problem_is_listed_at_once():
    state = foreign_state()
    del state["L.1.k.weight"]
    state["S.w"] = torch.randn(4, H)
    state["stray.tensor"] = torch.zeros(1)
    with pytest.raises(UserError) as info:
        to_pentad(state, RULES, expected(), source="ckpt.bin", layout="toy")
    text = str(info.value)
    assert "ckpt.bin" in text and "L.1.k.weight" in text
    assert "S.w (4, 4) -> pentad seg.weight needs (2, 4)" in text
    assert "stray.tensor" in text


def test_another_layout_is_named_as_such():
    with pytest.raises(UserError, match="does not look like a toy checkpoint"):
        to_pentad({"h.0.attn.c_attn.weight": torch.zeros(1)}, RULES, expected(), source="x", layout="toy")


def test_export_lists_unplaced_and_missing_weights():
    ours, extras = to_pentad(foreign_state(), RULES, expected(), source="ckpt", layout="toy")
    with pytest.raises(UserError, match="no place in the toy layout: extra.weight"):
        to_foreign({**ours, "extra.weight": torch.zeros(1)}, RULES, source="run", layout="toy")
    del ours["layer.0.qkv.bias"]
    with pytest.raises(UserError, match="missing: layer.0.qkv.bias"):
        to_foreign(ours, RULES, source="run", layout="toy")


def test_synthesized_keys_are_zeros_and_omitted_keys_are_not_written():
    # The foreign model has no classifier (a bare encoder): the import fills pentad's with zeros ...
    shapes = {**expected(), "head.classifier.weight": (2, H)}
    ours, _ = to_pentad(foreign_state(), RULES, shapes, source="ckpt", layout="toy",
                        synthesize=["head.classifier.weight"])
    assert torch.equal(ours["head.classifier.weight"], torch.zeros(2, H))
    # ... and an export to an architecture with the head leaves it out when asked to.
    rules = RULES + expand([("head.classifier.weight", "cls.w")])
    assert "cls.w" in to_foreign(ours, rules, source="run", layout="toy")
    assert "cls.w" not in to_foreign(ours, rules, source="run", layout="toy", omit={"head.classifier.weight"})


def test_new_transform_layouts():
    # Grouped-query attention: k and v have kv_heads / heads of q's rows.
    q, k, v = torch.randn(8, H), torch.randn(4, H), torch.randn(4, H)
    (qkv,), _ = get_transform("fuse_qkv:4:2").to_ours([q, k, v])
    assert torch.equal(qkv, torch.cat([q, k, v]))
    with pytest.raises(ValueError, match="do not fit 4 query and 4 key/value heads"):
        get_transform("fuse_qkv:4:4").to_ours([q, k, v])
    # Meta's interleaved rotary rows (pairs 2i, 2i+1) -> rotate-half (i, i + D/2), per head.
    rows = torch.arange(8.0)[:, None].expand(8, H)  # 2 heads of 4 rows
    (fused,), _ = get_transform("fuse_qkv:2:2:meta").to_ours([rows, rows, rows])
    assert fused[:8, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7] and torch.equal(fused[16:], rows)
    # BLOOM: rows grouped per head [q0; k0; v0; q1; k1; v1] -> [q0; q1; k0; k1; v0; v1].
    blocks = torch.arange(6.0).repeat_interleave(2)[:, None].expand(12, H)
    (regrouped,), _ = get_transform("heads_qkv:2").to_ours([blocks])
    assert regrouped[::2, 0].tolist() == [0, 3, 1, 4, 2, 5]
    # TencentPretrain's segment rows (pad, A, B) -> pentad's (A, B, pad).
    (seg,), _ = get_transform("rotate_rows:1").to_ours([torch.arange(3.0)[:, None].expand(3, H)])
    assert seg[:, 0].tolist() == [1, 2, 0]
    (bias,), _ = get_transform("row_vector").to_ours([torch.ones(1, 5)])
    assert bias.shape == (5,)
    with pytest.raises(ValueError, match=r"\[1, N\]"):
        get_transform("row_vector").to_ours([torch.ones(2, 5)])
    # ViT's cls_token [1, 1, H] and position table [1, P, H].
    (cls,), _ = get_transform("leading_ones:2").to_ours([torch.ones(1, 1, H)])
    assert cls.shape == (H,)
    with pytest.raises(ValueError, match="leading dimension"):
        get_transform("leading_ones:1").to_ours([torch.ones(2, 5, H)])


def test_sinusoidal_table_is_checked_and_kept():
    from pentad.components.embeddings.sinusoidal import sinusoidal_table

    transform = get_transform("sinusoidal:10:8")
    table = sinusoidal_table(10, 8, interleave=False)
    ours, extra = transform.to_ours([table.clone()])
    assert ours == [] and torch.equal(extra, table)
    assert torch.equal(transform.to_theirs([], None)[0], table)  # recomputed without an extra
    with pytest.raises(ValueError, match="differs from the sinusoidal table"):
        transform.to_ours([table + 0.01])
    rules = expand([((), "pos?", "ignore"), ((), "emb.pos", "sinusoidal:10:8"), ("w", "w")])
    state = {"emb.pos": table, "w": torch.ones(2)}
    ours_state, extras = to_pentad(state, rules, {"w": (2,)}, source="x", layout="test")
    assert set(ours_state) == {"w"} and torch.equal(extras["emb.pos"], table)
    back = to_foreign(ours_state, rules, source="x", layout="test", extras=extras)
    assert set(back) == {"emb.pos", "w"} and torch.equal(back["emb.pos"], table)


def test_parameterised_transform_names_are_checked():
    with pytest.raises(ValueError, match="fuse_qkv takes 2 count"):
        get_transform("fuse_qkv:4")
    with pytest.raises(ValueError, match="heads_qkv takes 1"):
        get_transform("heads_qkv:2:meta")
