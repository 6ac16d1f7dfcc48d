"""Memory estimates before allocation (pentad.memory and the training session's check): absurd sizes are
refused in well under 2 s, before any of the model is allocated, with the estimate and the memory found
in the message; tiny models pass; the estimate follows the strategy's sharding; the check can be
skipped."""

from __future__ import annotations

import time

import pytest
import torch

from pentad import memory
from pentad.assembly import load_config
from pentad.builder import build_model, check_memory
from pentad.errors import UserError
from pentad.training.config import TrainConfig
from pentad.training.session import Session, training_memory

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_BERT = ["model.hidden_size=32", "model.encoder.num_heads=2", "model.encoder.ffn_size=64",
             "model.vocab_size=100", "model.max_seq_length=32"]
# Far beyond any machine's memory (petabytes, terabytes), so that the refusal holds everywhere.
ABSURD = {
    "hidden_size=1e7": ("bert/tiny", ["model.hidden_size=10000000", "model.encoder.num_heads=2"]),
    "100000 experts": ("mixtral/8x7b", ["model.hidden_size=1024", "model.encoder.num_layers=2",
                                        "model.encoder.num_heads=8", "model.encoder.num_kv_heads=8",
                                        "model.encoder.ffn_size=4096", "model.encoder.moe.num_experts=100000"]),
}


def build_in_session(cfg):
    with Session(cfg, "pretrain") as session:
        session.seed()
        return session.build(cfg.model, None)


@pytest.mark.parametrize("case", sorted(ABSURD))
def test_absurd_training_sizes_are_refused_before_allocation(case, tmp_path, monkeypatch):
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    recipe, overrides = ABSURD[case]
    cfg = load_config(recipe, [*overrides, f"output={tmp_path / 'run'}"])
    start = time.perf_counter()
    with pytest.raises(UserError) as error:
        build_in_session(cfg)
    assert time.perf_counter() - start < 2.0
    message = str(error.value)
    assert "not enough memory for training this model: it needs at least" in message
    assert "weights" in message and "AdamW's two moments" in message and "available" in message
    assert "TiB" in message or "PiB" in message
    assert memory.SKIP_ENV in message


def test_a_tiny_model_trains_and_the_check_can_be_skipped(tmp_path, monkeypatch):
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    cfg = load_config("bert/tiny", [*TINY_BERT, f"output={tmp_path / 'run'}"])
    model = build_in_session(cfg)
    assert next(model.parameters()).device.type == "cpu" and not next(model.parameters()).is_meta
    # with a machine that has next to nothing free the same model is refused, unless the check is skipped
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (1024, "this machine"))
    with pytest.raises(UserError, match=r"needs at least .* this machine has 1.0 KiB available"):
        build_in_session(cfg)
    monkeypatch.setenv(memory.SKIP_ENV, "1")
    build_in_session(cfg)


def test_the_estimate_counts_gradients_and_moments_and_divides_what_the_strategy_shards():
    model = build_model(load_config("bert/tiny", TINY_BERT).model, device="meta")
    weights, trainable = memory.tensor_bytes(model)
    assert weights >= trainable == 4 * sum(p.numel() for p in model.parameters())  # tied weights once
    single = training_memory(model, TrainConfig(), 1)
    assert (single.device, single.host, single.built) == (weights + 3 * trainable, 0, weights)
    assert "gradients" in single.shown
    assert training_memory(model, TrainConfig(strategy="ddp"), 4).device == single.device  # every rank: all of it
    fsdp = training_memory(model, TrainConfig(strategy="fsdp"), 4)
    assert fsdp.device == weights // 4 + trainable // 4 + 2 * trainable // 4 and "/ 4 ranks" in fsdp.shown

    def zero(**options):
        return training_memory(model, TrainConfig.model_validate({"strategy": "deepspeed", "deepspeed": options}), 4)
    assert zero(stage=1).device == weights + trainable + 2 * trainable // 4
    assert zero(stage=2).device == weights + trainable // 4 + 2 * trainable // 4
    offloaded = zero(stage=3, offload_optimizer=True, offload_parameters=True)
    assert offloaded.device == 0 and offloaded.host == fsdp.device and "(in CPU memory)" in offloaded.shown
    bf16 = training_memory(model, TrainConfig(precision="bf16-true"), 1)
    assert bf16.device == weights // 2 + 3 * (trainable // 2) and bf16.built == weights


def test_an_offloaded_run_is_checked_against_the_cpu_not_the_gpu(tmp_path, monkeypatch):
    """ZeRO-3 with everything offloaded keeps nothing on the GPU: a GPU with 1 KiB free does not refuse
    it, the machine's memory does, when it is too small."""
    from pentad.training.distributed import Dist

    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    free = {"cpu": 1 << 40, "cuda:0": 1024}
    monkeypatch.setattr(memory, "available_memory",
                        lambda device=None: (free[str(device)], f"device {device}"))
    cfg = load_config("bert/tiny", [*TINY_BERT, f"output={tmp_path / 'run'}", "train.strategy=deepspeed",
                                    "train.deepspeed.stage=3", "train.deepspeed.offload_optimizer=true",
                                    "train.deepspeed.offload_parameters=true"])
    session = Session(cfg, "pretrain")
    session.dist = Dist(device=torch.device("cuda:0"))
    session.check_memory(cfg.model, None)
    free["cpu"] = 1024
    with pytest.raises(UserError, match=r"building this model on the CPU.*\(in CPU memory\).*device cpu has 1.0 KiB"):
        session.check_memory(cfg.model, None)
    cfg.train.deepspeed.offload_optimizer = cfg.train.deepspeed.offload_parameters = False
    free["cpu"] = 1 << 40
    with pytest.raises(UserError, match=r"training this model on each rank's device.*device cuda:0 has 1.0 KiB"):
        session.check_memory(cfg.model, None)


def test_inference_and_generation_check_the_weights_before_building(monkeypatch):
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    absurd = load_config("bert/tiny", ["model.hidden_size=10000000", "model.encoder.num_heads=2"]).model
    with pytest.raises(UserError, match=r"not enough memory for generating with this model: it needs at least "
                                        r"[\d.]+ PiB \(its weights\)"):
        check_memory(absurd, "generating")
    check_memory(load_config("bert/tiny", TINY_BERT).model, "inference", "cpu")


def test_require_compares_with_the_device_and_names_both_sizes(monkeypatch):
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (3 * 1024 ** 3, f"device {device}"))
    memory.require(3 * 1024 ** 3, "x", "weights", "cuda:0")  # fits exactly
    with pytest.raises(UserError, match=r"not enough memory for x: it needs at least 4.0 GiB \(weights\), and "
                                        r"device cuda:0 has 3.0 GiB available, so nothing was allocated. Smaller"):
        memory.require(4 * 1024 ** 3, "x", "weights", "cuda:0", "Smaller")
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (None, "this machine"))
    memory.require(1 << 60, "x", "weights")  # memory that cannot be measured refuses nothing


def test_available_memory_of_this_machine():
    available, where = memory.available_memory()
    assert available is not None and available > 0 and "this machine" in where
    assert memory.available_memory(torch.device("cpu"))[0] is not None
    assert memory.format_bytes(1536) == "1.5 KiB" and memory.format_bytes(12) == "12 B"


def test_a_cgroup_limit_counts_its_inactive_page_cache_as_room(tmp_path):
    """A container that has read a large dataset holds it as page cache, which memory.current counts;
    the kernel drops it before refusing memory, so it must not make a fitting model look too large."""
    from pentad.memory import _cgroup_room

    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    group = tmp_path / "fs" / "job"
    group.mkdir(parents=True)
    gib = 1 << 30
    (group / "memory.max").write_text(f"{24 * gib}\n")
    (group / "memory.current").write_text(f"{22 * gib}\n")
    assert _cgroup_room(proc, tmp_path / "fs") == 2 * gib
    (group / "memory.stat").write_text(f"anon {4 * gib}\nfile {18 * gib}\ninactive_file {16 * gib}\n")
    assert _cgroup_room(proc, tmp_path / "fs") == 18 * gib
    (group / "memory.max").write_text("max\n")  # no limit of its own, none above: no cgroup bound
    assert _cgroup_room(proc, tmp_path / "fs") is None
    proc.write_text("4:memory:/job\n")  # cgroup v1
    v1 = tmp_path / "fs" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{8 * gib}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{8 * gib}\n")
    (v1 / "memory.stat").write_text(f"total_inactive_file {3 * gib}\n")
    assert _cgroup_room(proc, tmp_path / "fs") == 3 * gib
