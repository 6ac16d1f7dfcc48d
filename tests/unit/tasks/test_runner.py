"""tasks.runner: the best model's record read back when a fine-tuning run resumes."""

from __future__ import annotations

import json

import pytest
import torch

from pentad.errors import UserError
from pentad.tasks.runner import BestModel
from pentad.training import checkpoint as ckpt


def _best(tmp_path, record: str) -> BestModel:
    best = BestModel(tmp_path / "best")
    ckpt.save_tensors({"w": torch.zeros(2)}, best.weights, {BestModel.KEY: record})
    return best


def test_the_best_models_record_is_read_back(tmp_path):
    best = _best(tmp_path, json.dumps({"step": 6, "score": 0.75, "metrics": {"accuracy": 0.75}}))
    best.restore()
    assert (best.step, best.score, best.metrics) == (6, 0.75, {"accuracy": 0.75})


@pytest.mark.parametrize("record", ["garbage{", "[1, 2]", '{"step": 3}', '{"step": "x", "score": 1, "metrics": {}}',
                                    '{"step": 3, "score": "high", "metrics": {}}',
                                    '{"step": 3, "score": NaN, "metrics": {}}',
                                    '{"step": 3, "score": 1, "metrics": 7}'])
def test_a_corrupt_best_model_record_is_a_clean_error(tmp_path, record):
    best = _best(tmp_path, record)
    with pytest.raises(UserError, match=f"{best.weights}: its record of the best model \\(metadata 'pentad_best'\\) "
                                        f"is corrupt.*Delete {best.directory} to resume without it"):
        best.restore()
