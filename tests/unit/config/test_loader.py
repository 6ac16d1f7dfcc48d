import json

import pytest

from pentad.config.loader import dump_config, load_config, zoo_names
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
