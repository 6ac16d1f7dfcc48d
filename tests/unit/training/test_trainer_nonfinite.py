"""The trainer never saves non-finite weights (train.on_nonfinite): a checkpoint of a model whose update
overflowed (finite gradients, an absurd learning rate) is refused with a Diverged error."""

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad import layout
from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.errors import Diverged
from pentad.training.config import TrainConfig
from pentad.training.trainer import Trainer


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_non_finite_weights_are_never_saved(tmp_path, policy):
    model = build_model(model_config_class().model_validate(tiny_model_dict()))
    trainer = Trainer(model, TrainConfig(device="cpu", on_nonfinite=policy, tensorboard=False, progress=False),
                      tmp_path, total_steps=4)
    trainer.step = 3
    assert trainer.save().name == "step-00000003"
    with torch.no_grad():
        next(trainer.model.parameters())[0].fill_(float("inf"))
    trainer.step = 4
    with pytest.raises(Diverged, match="after step 4 the model's weights are not finite"):
        trainer.save()
    assert layout.checkpoint_steps(tmp_path) == [3] and layout.latest_checkpoint(tmp_path).name == "step-00000003"
    assert Diverged.exit_code == 1
