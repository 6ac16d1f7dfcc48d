"""tasks.image_text: the zero_shot task's class-text template is checked when the config is read."""

from __future__ import annotations

import pytest

from pentad.assembly import load_config
from pentad.errors import ConfigError


@pytest.mark.parametrize("template", ["{x}", "{} and {}", "a photo", "{", "}", "{0.__class__}", "{:d}", "{1}"])
def test_a_zero_shot_template_without_one_slot_is_a_config_error(template):
    with pytest.raises(ConfigError) as info:
        load_config("clip/base-32", ["task.type=zero_shot", f"task.template='{template}'"])
    (problem,) = info.value.problems
    assert problem.path == "task.template"
    assert "expected a text with one {} where the class name goes" in problem.message and template in problem.message


@pytest.mark.parametrize("template, text", [("a photo of {}", "a photo of seven"), ("{0}, {0}!", "seven, seven!"),
                                            ("{{{}}}", "{seven}")])
def test_good_templates_are_kept(template, text):
    cfg = load_config("clip/base-32", ["task.type=zero_shot", f"task.template='{template}'"])
    assert cfg.task.template == template and cfg.task.template.format("seven") == text
