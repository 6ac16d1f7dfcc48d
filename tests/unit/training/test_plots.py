"""``loss.png``: one panel per family of logged values (training losses, auxiliary losses, learning rate,
the dev selection metric), each drawn only when the run logged it, no line drawn twice, and markers for
the few points of a short run. The axes' labels and lines are checked, not pixels."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.training.plots import families, head_names, loss_figure, plot_losses


def _panels(fig) -> dict[str, list[str]]:
    """Each axis's label -> the labels of its lines."""
    return {ax.get_ylabel(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes}


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_pretraining_with_two_heads_and_moe_gets_losses_aux_and_lr_panels():
    records = [{"step": s, "loss": 9.0 - s // 10, "mlm_loss": 6.0 - s // 10, "sp_loss": 0.7, "moe_balance_loss": 0.011,
                "moe_z_loss": 0.002, "mlm_accuracy": 0.1, "aux_moe_dropped": 0.01, "grad_norm": 1.2,
                "lr": 1e-4 * s, "tokens_per_s": 900.0, "peak_memory_gib": 0.0} for s in range(10, 60, 10)]
    fig = loss_figure(records, heads=["mlm", "sp"])
    assert _panels(fig) == {"loss": ["loss", "mlm_loss", "sp_loss"],
                            "auxiliary losses": ["moe_balance_loss", "moe_z_loss"],
                            "learning rate": ["lr"]}
    assert fig.axes[-1].get_xlabel() == "step"
    first = fig.axes[0].get_lines()[0]
    assert list(first.get_xdata()) == [10, 20, 30, 40, 50] and list(first.get_ydata()) == [8.0, 7.0, 6.0, 5.0, 4.0]
    plt.close(fig)


def test_fine_tuning_adds_the_selection_metric_and_one_head_is_not_drawn_twice():
    records = [{"step": 1, "loss": 1.1, "cls_loss": 1.1, "lr": 2e-5},
               {"step": 2, "loss": 0.9, "cls_loss": 0.9, "lr": 1e-5},
               {"step": 2, "dev_accuracy": 0.5, "dev_macro_f1": 0.4},
               {"step": 3, "loss": 0.7, "cls_loss": 0.7, "lr": 0.0},
               {"step": 3, "dev_accuracy": 0.75, "dev_macro_f1": 0.6},
               {"step": 3, "config_changes": {"train.lr": [1e-4, 2e-5]}}]
    fig = loss_figure(records, heads=["cls"], selection="accuracy")
    assert _panels(fig) == {"loss": ["loss = cls_loss"], "learning rate": ["lr"], "dev accuracy": ["dev_accuracy"]}
    dev = fig.axes[2].get_lines()[0]
    assert list(dev.get_xdata()) == [2, 3] and list(dev.get_ydata()) == [0.5, 0.75]
    # a run of three logged points marks them
    assert all(line.get_marker() == "o" for ax in fig.axes for line in ax.get_lines())
    plt.close(fig)


def test_distillation_and_adversarial_losses_are_auxiliary_and_a_long_run_has_no_markers():
    records = [{"step": s, "loss": 2.0, "cls_loss": 1.5, "cls_distill_loss": 0.4, "cls_hard_loss": 1.6,
                "adv_loss": 1.7, "lr": 1e-5} for s in range(1, 41)]
    fig = loss_figure(records, heads=["cls"], selection="accuracy")  # no dev evaluation logged: no dev panel
    assert _panels(fig) == {"loss": ["loss", "cls_loss"],
                            "auxiliary losses": ["adv_loss", "cls_distill_loss", "cls_hard_loss"],
                            "learning rate": ["lr"]}
    assert all(line.get_marker() in (None, "None") for ax in fig.axes for line in ax.get_lines())
    plt.close(fig)


def test_one_logged_point_draws_a_marker_and_nothing_logged_draws_nothing(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [{"step": 1, "loss": 3.0, "lm_loss": 3.0, "lr": 1e-3}])
    out = plot_losses(metrics, tmp_path / "loss.png", heads=["lm"])
    assert out == tmp_path / "loss.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))
    assert families([{"step": 1, "loss": 3.0, "lm_loss": 3.0, "lr": 1e-3}], ["lm"]) == \
        [("loss", ["loss", "lm_loss"]), ("learning rate", ["lr"])]
    fig = loss_figure([{"step": 0, "config_changes": {}}, {"step": 1, "loss": 3.0, "lm_loss": 3.0, "lr": 1e-3}],
                      ["lm"])
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "loss = lm_loss" and line.get_marker() == "o"
    assert fig.axes[-1].get_xlim() == (0.0, 2.0)  # whole steps around the point
    plt.close(fig)
    _write(metrics, [{"step": 0, "config_changes": {}}])
    assert plot_losses(metrics, tmp_path / "empty.png", heads=["lm"]) is None
    assert not (tmp_path / "empty.png").exists()


def test_head_names_are_the_models_targets():
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(
        tiny_model_dict(targets=[{"type": "cls", "num_labels": 3}])))
    assert head_names(model) == ["cls"]
    assert head_names(torch.nn.Linear(2, 2)) == []
