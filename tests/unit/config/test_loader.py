import json

import pytest

from pentad.assembly import load_config
from pentad.config.loader import dump_config, zoo_names
from pentad.errors import ConfigError, UserError


def test_zoo_recipes_are_listed():
    names = zoo_names()
    for name in ("bert/tiny", "bert/base", "bert/large", "roberta/base", "gpt2/base", "gpt2/xl"):
        assert name in names


def test_overrides_change_values_with_types():
    cfg = load_config("bert/tiny", ["train.lr=3e-4", "model.encoder.num_layers=3", "train.clip_grad_norm=null",
                                    "model.embedding.parts.1.max_positions=64"])
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.model.encoder.num_layers == 3
    assert cfg.train.clip_grad_norm is None
    assert cfg.model.embedding.parts[1].max_positions == 64


def test_every_problem_is_reported_at_once_with_source_and_suggestion():
    with pytest.raises(ConfigError) as info:
        load_config("bert/tiny", ["model.encoder.num_layerz=2", "model.embedding.parts.0.type=wrod",
                                  "train.schedule=cosin", "train.lr=fast"])
    problems = {p.path: p for p in info.value.problems}
    assert set(problems) == {"model.encoder.num_layerz", "model.embedding.parts.0.type", "train.schedule", "train.lr"}
    assert problems["model.encoder.num_layerz"].suggestion == "num_layers"
    assert problems["model.embedding.parts.0.type"].suggestion == "word"
    assert problems["train.schedule"].suggestion == "cosine"
    assert "fast" in problems["train.lr"].received
    assert all("override" in p.source for p in problems.values())
    text = str(info.value)
    assert "4 problem(s)" in text and "did you mean 'num_layers'" in text


def test_unknown_key_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("model:\n  hidden_size: 8\n  hiden: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    paths = {p.path for p in info.value.problems}
    assert "model.hiden" in paths
    assert all(str(path) in p.source for p in info.value.problems)
    # missing required sections are reported too
    assert "model.embedding" in paths and "model.encoder" in paths


def test_unknown_encoder_name_lists_the_registered_ones():
    with pytest.raises(ConfigError) as info:
        load_config("bert/tiny", ["model.encoder.type=transfomer"])
    (problem,) = info.value.problems
    assert problem.path == "model.encoder.type"
    assert problem.suggestion == "transformer"
    assert "transformer" in problem.message


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  hidden_size: [1, 2\n")
    with pytest.raises(UserError, match=r"bad.yaml, line \d+"):
        load_config(path)


def test_missing_config_suggests_a_recipe():
    with pytest.raises(UserError, match="did you mean 'bert/tiny'"):
        load_config("bert/tiyn")


def test_bad_override_syntax():
    with pytest.raises(UserError, match="key.path=value"):
        load_config("bert/tiny", ["train.lr"])


def test_json_config_and_dump_round_trip(tmp_path):
    cfg = load_config("gpt2/tiny")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    again = load_config(path)
    assert dump_config(again) == dump_config(cfg)


def test_string_shorthand_for_components():
    cfg = load_config("bert/tiny", ["data.objective=mlm"])
    assert cfg.data.objective.type == "mlm"


# ------------------------------------------------------------------------ hostile files and values
def _alias_bomb(levels: int, width: int = 10) -> str:
    """YAML of a few hundred bytes whose aliases expand to ``width ** levels`` values."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nmodel: {{hidden_size: 8, encoder: *a{levels - 1}}}\n"


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(6))  # a million values from under 400 bytes
    with pytest.raises(UserError, match=r"bomb\.yaml, line \d+ column \d+: this value holds more than 100,000 "
                                        r"values, counting each use of an alias \(\*name\) in full") as info:
        load_config(path)
    assert len(str(info.value)) < 400


def test_an_alias_bomb_in_an_override_and_an_alias_inside_itself(tmp_path):
    from pentad.config.loader import parse_override

    levels = ["&a0 [" + ", ".join(["1"] * 10) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    with pytest.raises(UserError, match="override 'model.hidden_size'.*more than 100,000 values"):
        parse_override(f"model.hidden_size=[{', '.join(levels)}]")
    path = tmp_path / "loop.yaml"
    path.write_text("model: &a [1, *a]\n")
    with pytest.raises(UserError, match=r"loop\.yaml, line 1 column 8: an alias refers to a value that contains it"):
        load_config(path)


@pytest.mark.parametrize("name, text", [("deep.yaml", "model: " + "[" * 5000 + "]" * 5000 + "\n"),
                                        ("deep.json", '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                                        ("less_deep.json", '{"model": ' + "[" * 200 + "]" * 200 + "}")])
def test_deeply_nested_yaml_and_json_are_clean_errors(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError, match=f"{name}.*: values are nested more than 64 levels deep"):
        load_config(path)


def test_config_file_size_is_bounded(tmp_path, monkeypatch):
    from pentad.config import loader

    monkeypatch.setattr(loader, "MAX_CONFIG_BYTES", 100)
    path = tmp_path / "big.yaml"
    path.write_text("model:\n" + "".join(f"  k{i}: {i}\n" for i in range(20)))
    with pytest.raises(UserError, match=r"big\.yaml is \d+ bytes; a config file is at most 100 bytes"):
        load_config(path)


def test_values_in_messages_are_shown_without_building_their_whole_repr():
    from pentad.run_config import validate_raw

    class Trap:
        """A value deeper or later than a message shows: building its repr fails the test."""

        def __repr__(self) -> str:
            raise AssertionError("the whole value was written out")

        __str__ = __repr__

    raw = {"model": {"hidden_size": [[[[Trap()]]]], "max_seq_length": ["x" * 10**6]},
           "train": {"schedule": [0] * 10 + [Trap()]}}
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, {}, "hostile.yaml")
    problems = {p.path: p for p in info.value.problems}
    assert problems["model.hidden_size"].received == "[[[[...]]]]"
    assert len(problems["model.max_seq_length"].received) <= 80
    assert problems["train.schedule"].received.startswith("[0, 0, 0, 0, 0, 0, ...]")
    assert problems["train.schedule"].suggestion is None


def test_a_long_list_of_problems_is_counted_past_fifty():
    from pentad.run_config import validate_raw

    with pytest.raises(ConfigError) as info:
        validate_raw({f"key{i}": i for i in range(500)}, {}, "many.yaml")
    assert len(info.value.problems) > 500
    lines = str(info.value).splitlines()
    assert len(lines) == 52 and lines[-1] == f"  ... and {len(info.value.problems) - 50} more"


@pytest.mark.parametrize("override", ["model.encoder.moe.capacity_factor=inf", "model.encoder.moe.capacity_factor=.inf",
                                      "train.lr=.nan", "train.lr=-.inf"])
def test_non_finite_numbers_are_config_errors(override):
    moe = ["model.encoder.ffn=moe", "model.encoder.moe.num_experts=4", "model.encoder.moe.top_k=1"]
    with pytest.raises(ConfigError) as info:
        load_config("bert/tiny", [*moe, override])
    (problem,) = info.value.problems
    assert problem.path == override.split("=")[0] and "finite number" in problem.message


def test_json_nan_is_a_config_error(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps({"model": {"hidden_size": 8}, "train": {"lr": float("nan")}}))
    with pytest.raises(ConfigError, match="train.lr: input should be a finite number"):
        load_config(path)


def test_python_tags_are_refused_with_a_clean_message(tmp_path):
    path = tmp_path / "tag.yaml"
    path.write_text('model: !!python/object/apply:os.system ["echo run"]\n')
    with pytest.raises(UserError, match=r"tag\.yaml, line 1 column 8: invalid YAML: .*python/object/apply:os.system"
                                        r".*refused, never run"):
        load_config(path)


def test_a_block_style_alias_bomb_in_a_grid_value():
    from pentad.cli.main import grid_option

    text = "a0: &a0\n" + "  - 1\n" * 10 + "".join(f"a{i}: &a{i}\n" + f"  - *a{i - 1}\n" * 10 for i in range(1, 6))
    with pytest.raises(UserError, match=r"--grid train.lr, line 45 column 5: this value holds more than 100,000"):
        grid_option([f"train.lr={text}"])
    assert grid_option(["train.lr=1e-4,3e-5"]) == {"train.lr": [1e-4, 3e-5]}


def test_a_config_that_is_a_pipe_or_a_device_is_refused_unread(tmp_path):
    import os

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    for path in (fifo, "/dev/zero"):
        with pytest.raises(UserError, match=f"config '{path}' is not a regular file"):
            load_config(path)
    with pytest.raises(UserError, match=f"config '{tmp_path}' is a directory"):
        load_config(tmp_path)
