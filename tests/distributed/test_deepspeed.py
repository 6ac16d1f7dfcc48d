"""``deepspeed``: ZeRO stages 1-3 (and offload) on two gloo ranks train what one process trains.

pentad's own AdamW is DeepSpeed's optimizer here (a client optimizer), and DeepSpeed's shared-memory
communication op (inference only) is not built on the CPU, so no DeepSpeed op is JIT-compiled: the
launches point TORCH_EXTENSIONS_DIR at an empty folder and the first test checks that it stays so.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from tests.distributed.conftest import launch, launch_env, losses, single

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.heavy  # each test launches DeepSpeed (~10-30 s); the file ~3 min on 2 busy cores


EXTENSIONS = Path(tempfile.mkdtemp(prefix="pentad-torch-extensions-"))
atexit.register(shutil.rmtree, EXTENSIONS, ignore_errors=True)


def ds_env() -> dict[str, str]:
    return launch_env(TORCH_EXTENSIONS_DIR=str(EXTENSIONS))


def ds_launch(nproc: int, *args: object, **kw):
    return launch(nproc, *args, env=ds_env(), timeout=600, **kw)


def _common(pretrain_data):
    return ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=10"]


@pytest.fixture(scope="module")
def reference(single_pretrain) -> Path:
    """The single-process run every ZeRO run is compared with."""
    return single_pretrain


@pytest.fixture(scope="module")
def zero3(pretrain_data, tmp_path_factory) -> Path:
    """A 2-rank ZeRO-3 run with a checkpoint at step 5."""
    run = tmp_path_factory.mktemp("ds") / "zero3"
    ds_launch(2, *_common(pretrain_data), f"output={run}", "train.strategy=deepspeed", "train.deepspeed.stage=3",
              "train.save_every=5")
    return run


def assert_matches(reference: Path, run: Path) -> None:
    a, b = losses(reference), losses(run)
    assert len(a) == len(b) == 10
    # mlm + sp with count-weighted rank losses: fp32 rounding only (measured: <= 1e-6)
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert losses(reference, "grad_norm") == pytest.approx(losses(run, "grad_norm"), rel=1e-5)
    # the linear decay after one warmup step: ZeRO's optimizer steps with the trainer's schedule
    assert losses(reference, "lr") == losses(run, "lr") and len(set(losses(run, "lr"))) > 5


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_and_2_match_single(pretrain_data, reference, tmp_path, stage):
    run = tmp_path / f"zero{stage}"
    ds_launch(2, *_common(pretrain_data), f"output={run}", "train.strategy=deepspeed", f"train.deepspeed.stage={stage}")
    assert_matches(reference, run)
    assert not any(EXTENSIONS.iterdir()), "DeepSpeed compiled an op"
    assert (run / "checkpoints" / "step-00000010" / "deepspeed" / "zero").is_dir()
    if stage == 2:  # stages 1 and 2 share a checkpoint format, stage 3 has its own: a clear refusal
        proc = ds_launch(2, *_common(pretrain_data), f"output={run}", "train.strategy=deepspeed",
                         "train.deepspeed.stage=3", expect=2)
        assert "was written with ZeRO stage 2 and this run has stage 3" in proc.stderr


def test_zero3_matches_single_and_resumes_anywhere(pretrain_data, reference, zero3, tmp_path):
    assert_matches(reference, zero3)
    # resume from the step-5 checkpoint (a copy): the same losses, bit for bit
    resumed = tmp_path / "resumed"
    shutil.copytree(zero3, resumed)
    ds_launch(2, *_common(pretrain_data), f"output={resumed}", "train.strategy=deepspeed", "train.deepspeed.stage=3",
              "train.save_every=5", "train.resume_from=5")
    assert losses(resumed) == losses(zero3)
    # on one process: resharded through DeepSpeed's universal checkpoint, fp32 rounding only
    # (measured 9.5e-7, and the same for 1 -> 2)
    one = tmp_path / "one"
    shutil.copytree(zero3, one)
    proc = ds_launch(1, *_common(pretrain_data), f"output={one}", "train.strategy=deepspeed",
                     "train.deepspeed.stage=3", "train.save_every=5", "train.resume_from=5")
    assert "resharded the DeepSpeed checkpoint of 2 process(es) for 1" in proc.stderr
    assert max(abs(x - y) for x, y in zip(losses(one)[5:], losses(zero3)[5:])) < 1e-5
    assert not list((one / "checkpoints").glob(".*"))  # the universal checkpoint was temporary
    # and under the single strategy: the partitions' weights and Adam moments made whole
    plain = tmp_path / "plain"
    shutil.copytree(zero3, plain)
    single(*_common(pretrain_data), f"output={plain}", "train.strategy=single", "train.save_every=5",
           "train.resume_from=5")
    assert max(abs(x - y) for x, y in zip(losses(plain)[5:], losses(zero3)[5:])) < 1e-5
    assert not list((plain / "checkpoints").glob(".*"))


def test_export_consolidates_a_zero3_run(reference, zero3, tmp_path):
    # `pentad export` (and init=, convert, generate through find_weights) read ZeRO partitions in one process
    from pentad import layout
    from pentad.cli.main import main
    from pentad.training import checkpoint as ckpt

    out = tmp_path / "export"
    assert main(["export", str(zero3), str(out)]) == 0
    exported = ckpt.read_weights(out / layout.WEIGHTS)
    whole = ckpt.read_weights(ckpt.find_weights(reference))
    assert ckpt.find_weights(zero3) == layout.checkpoint_dir(zero3, 10)  # the checkpoint directory itself
    assert sorted(exported) == sorted(whole)  # the tied head stored once
    # the single run's weights, fp32 rounding apart (measured 6e-8)
    assert max((exported[k] - whole[k]).abs().max().item() for k in whole) < 1e-5
    # reloaded in one process (the single strategy's model), the export and the ZeRO-3 run read through its
    # partitions give the same outputs
    import torch

    from pentad.components.base import Batch
    from pentad.generation.text import load_model

    model, _, _ = load_model(out)
    direct, _, _ = load_model(zero3)
    assert model.targets["mlm"].output.weight is model.embedding.word.weight
    tokens = torch.randint(5, 100, (2, 12))
    batch = Batch(tokens=tokens, segments=torch.zeros_like(tokens))
    with torch.no_grad():
        assert torch.equal(model.encode(batch)[0], direct.encode(batch)[0])


def test_zero3_with_optimizer_and_parameter_offload_matches_single(pretrain_data, reference, tmp_path):
    run = tmp_path / "offload"
    ds_launch(2, *_common(pretrain_data), f"output={run}", "train.strategy=deepspeed", "train.deepspeed.stage=3",
              "train.deepspeed.offload_optimizer=true", "train.deepspeed.offload_parameters=true")
    assert_matches(reference, run)


def test_bf16_is_deepspeeds_and_close_to_fp32(pretrain_data, reference, tmp_path):
    # bf16 weights and gradients with fp32 master weights (DeepSpeed's bf16, no autocast on top)
    run = tmp_path / "bf16"
    ds_launch(1, *_common(pretrain_data), f"output={run}", "train.strategy=deepspeed", "train.deepspeed.stage=2",
              "train.precision=bf16")
    a, b = losses(reference), losses(run)
    assert a != b and max(abs(x - y) for x, y in zip(a, b)) < 5e-3


def test_a_deepspeed_json_that_contradicts_train_is_refused(pretrain_data, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}))
    proc = ds_launch(1, *_common(pretrain_data), f"output={tmp_path / 'run'}", "train.strategy=deepspeed",
                     f"train.deepspeed.config={config}", expect=2)
    assert f"the DeepSpeed config {config} sets train_micro_batch_size_per_gpu=2, but pentad's config gives 8" \
        in proc.stderr
    assert "change train.batch_size to match" in proc.stderr


def test_finetune_under_zero3_matches_single(english, pretrain_data, tmp_path):  # noqa: F811 - fixture
    # the best model is gathered from the partitions, saved, and loaded back into them for the test score
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    common = ["finetune", "--task", "classification", "--config", "bert/tiny", *base, f"data.train={english['train']}",
              f"data.dev={english['dev']}", f"data.test={english['test']}", "train.epochs=2", "task.head_dropout=0",
              "train.eval_every=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    ds_launch(2, *common, f"output={two}", "train.strategy=deepspeed", "train.deepspeed.stage=3")
    assert max(abs(x - y) for x, y in zip(losses(one), losses(two))) < 1e-5
    a, b = (json.loads((run / "results.json").read_text()) for run in (one, two))
    assert a["best_step"] == b["best_step"] and a["test"] == pytest.approx(b["test"])
    assert a["best_step"] < len(losses(one))  # the best model was loaded back for the test score

    from safetensors.torch import load_file

    x, y = (load_file(str(run / "best" / "model.safetensors")) for run in (one, two))
    assert x.keys() == y.keys()
    assert max(float((x[k] - y[k]).abs().max()) for k in x) < 1e-4


ROUNDTRIP = """
import os
import sys
import torch
from torch import nn
from pentad.training.config import TrainConfig
from pentad.training.distributed import connect
from pentad.training.optim import build_optimizer
from pentad.training.strategies import STRATEGIES


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.mid = nn.Embedding(10, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight
        self.tied = [("head.weight", "emb.weight")]

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.emb(x))))


dist = connect("deepspeed", "cpu", "auto", 60, needs_launcher=True)
for stage in map(int, sys.argv[1:]):
    cfg = TrainConfig(strategy="deepspeed", batch_size=2, deepspeed={"stage": stage})
    strategy = STRATEGIES.get("deepspeed")(cfg, dist)
    torch.manual_seed(0)
    strategy.setup(Net(), lambda m: build_optimizer(m, cfg))
    torch.manual_seed(1)
    other = Net()
    tensors = {k: v.clone() for k, v in other.state_dict().items()}
    strategy.load_full_state_dict(tensors)  # every rank reads the file (the strategy is not sharded)
    x = torch.arange(10).reshape(2, 5)
    with torch.no_grad():
        same_output = torch.equal(strategy.model(x), other(x))
    full = strategy.full_state_dict()
    if dist.is_main:
        assert full is not None and full.keys() == tensors.keys(), (full.keys(), tensors.keys())
        assert all(torch.equal(full[k], tensors[k]) for k in tensors), "full_state_dict differs"
        assert same_output, "the engine's forward does not use the loaded weights"
        print(f"stage {stage}: round trip ok")
    else:
        assert full is None
    strategy.close()
dist.close()
sys.stdout.flush()
os._exit(0)  # as pentad's own entry point does under a launcher (pentad/__main__.py)
"""


def test_whole_weights_in_and_out_of_the_partitions(tmp_path):
    # load_full_state_dict (fine-tuning's best model) and full_state_dict (its gather) through ZeRO's partitions,
    # stages 2 and 3 one after the other in one launch
    import subprocess

    from tests.distributed.conftest import free_port

    script = tmp_path / "roundtrip.py"
    script.write_text(ROUNDTRIP)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), "2", "3"],
                          capture_output=True, text=True, timeout=600, env=ds_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "stage 2: round trip ok" in proc.stdout and "stage 3: round trip ok" in proc.stdout
