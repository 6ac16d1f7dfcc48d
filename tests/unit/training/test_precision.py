"""train.precision (fp32, tf32, bf16, bf16-true, fp16; auto), the engines that offer each, the
trainer's device handling (pinned memory, synchronised clock, peak memory, MFU) and bf16-true
checkpoints: saved as bf16, resumed, loaded into an fp32 model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from tests.unit.test_zoo import batch_for, shrunk_model_config

from pentad import layout
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.layers.attention import AttentionInputs, SelfAttention
from pentad.layers.masks import attention_mask
from pentad.model import total_loss
from pentad.training import checkpoint as ckpt
from pentad.training import precision
from pentad.training.config import TrainConfig
from pentad.training.distributed import Dist
from pentad.training.strategies.deepspeed import DeepSpeedStrategy, build_config
from pentad.training.strategies.fsdp import FsdpStrategy
from pentad.training.strategies.single import DDPStrategy, SingleStrategy
from pentad.training.trainer import Trainer

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_auto_is_tf32_on_gpus_with_tensor_core_tf32_else_fp32(monkeypatch):
    assert precision.resolve("auto", CPU) == "fp32"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert precision.resolve("auto", CUDA) == "tf32"
    assert "auto on cuda" in precision.describe("auto", "tf32", CUDA)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert precision.resolve("auto", CUDA) == "fp32"
    assert "no TF32" in precision.describe("tf32", "tf32", CUDA)


def test_cpu_with_bf16_units_hinted(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: True)
    assert "bf16 matrix units" in precision.describe("auto", "fp32", cpu)
    assert "bf16 matrix units" not in precision.describe("fp32", "fp32", cpu)  # asked for: no advice
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: False)
    assert "bf16 matrix units" not in precision.describe("auto", "fp32", cpu)
    monkeypatch.undo()
    assert isinstance(precision.cpu_has_bf16_units(), bool)
    for mode in ("fp32", "tf32", "bf16", "bf16-true"):
        assert precision.resolve(mode, CPU) == mode


def test_fp16_needs_a_gpu():
    with pytest.raises(UserError, match="precision=fp16 needs a GPU"):
        precision.resolve("fp16", CPU)
    assert precision.resolve("fp16", CUDA) == "fp16"


def test_tf32_switches_are_set_on_a_gpu_only(monkeypatch):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        precision.apply_matmul_precision("tf32", CPU)
        assert not torch.backends.cuda.matmul.allow_tf32
        precision.apply_matmul_precision("tf32", CUDA)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        precision.apply_matmul_precision("bf16", CUDA)  # left as they are
        assert torch.backends.cuda.matmul.allow_tf32
        precision.apply_matmul_precision("fp32", CUDA)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_dtypes_of_each_mode():
    assert precision.param_dtype("bf16-true") == torch.bfloat16
    assert all(precision.param_dtype(m) is None for m in ("fp32", "tf32", "bf16", "fp16"))
    assert precision.autocast_dtype("bf16") == torch.bfloat16 and precision.autocast_dtype("fp16") == torch.float16
    assert precision.autocast_dtype("bf16-true") is None and precision.autocast_dtype("tf32") is None


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
@pytest.mark.parametrize("engine, refused", [(FsdpStrategy, ("bf16-true", "fp16")), (DeepSpeedStrategy, ("bf16-true",)),
                                            (SingleStrategy, ()), (DDPStrategy, ())])
def test_each_engine_refuses_the_modes_it_does_not_offer(engine, refused):
    for mode in ("fp32", "tf32", "bf16", "bf16-true", "fp16"):
        strategy = engine(TrainConfig(), Dist(device=CUDA))
        if mode in refused:
            with pytest.raises(UserError, match=f"precision={mode} is not offered with train.strategy="):
                strategy.set_precision(mode)
        else:
            strategy.set_precision(mode)
            assert strategy.precision == mode
            assert (strategy.scaler is not None) == (mode == "fp16" and strategy.autocast)


def test_deepspeed_takes_fp16_and_bf16_from_train_precision():
    cfg = TrainConfig(precision="fp16", batch_size=8)
    assert build_config(cfg, world_size=1)["fp16"] == {"enabled": True}
    assert build_config(cfg, world_size=1)["bf16"] == {"enabled": False}
    assert build_config(TrainConfig(batch_size=8), world_size=1)["fp16"] == {"enabled": False}


def test_gradient_scaler_step_equals_the_plain_step():
    """The fp16 path's logic (scale, unscale before clipping, step, update) on the CPU: with a power-of-
    two scale the unscaled gradients, the clipped norm and the step are exactly the plain ones."""
    results = []
    for scaled in (False, True):
        torch.manual_seed(0)
        model = build_model(shrunk_model_config("gpt2/base"))
        strategy = SingleStrategy(TrainConfig(), Dist(device=CPU))
        strategy.set_precision("fp32")
        if scaled:
            strategy.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        strategy.setup(model, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
        strategy.backward(total_loss(model(batch_for(model, 97))))
        norm = strategy.step(0.5)
        results.append((norm, [p.detach().clone() for p in model.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_batch_to_casts_float_inputs_only_and_pins():
    batch = Batch(tokens=torch.arange(6).view(2, 3), pixels=torch.randn(2, 3, 4, 4),
                  labels={"reg": torch.randn(2)}, pair=Batch(audio=torch.randn(2, 5, 3)))
    moved = batch.to("cpu", dtype=torch.bfloat16)
    assert moved.tokens.dtype == torch.long and moved.pixels.dtype == torch.bfloat16
    assert moved.pair.audio.dtype == torch.bfloat16 and moved.labels["reg"].dtype == torch.float32


def test_batches_go_to_a_gpu_through_pinned_memory_without_blocking(monkeypatch):
    calls = []
    monkeypatch.setattr(Batch, "without_empty_padding", lambda self: calls.append("unpad") or self)
    monkeypatch.setattr(Batch, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(Batch, "to", lambda self, device, non_blocking=False, dtype=None:
                        calls.append((str(device), non_blocking, dtype)) or self)
    batch = Batch(tokens=torch.zeros(1, 2, dtype=torch.long))
    gpu = SimpleNamespace(device=CUDA, strategy=SimpleNamespace(param_dtype=torch.bfloat16))
    Trainer.to_device(gpu, batch)
    assert calls == ["unpad", "pin", ("cuda:0", True, torch.bfloat16)]
    calls.clear()
    Trainer.to_device(SimpleNamespace(device=CPU, strategy=SimpleNamespace(param_dtype=None)), batch)
    assert calls == [("cpu", True, None)]  # no pinning for a CPU run


def test_padding_masks_that_mark_nothing_are_left_out():
    none = torch.zeros(2, 3, dtype=torch.bool)
    some = none.clone()
    some[1, -1] = True
    batch = Batch(tokens=torch.ones(2, 3, dtype=torch.long), padding_mask=none, decoder_padding_mask=some,
                  pair=Batch(tokens=torch.ones(2, 2, dtype=torch.long), padding_mask=none[:, :2]))
    out = batch.without_empty_padding()
    assert out.padding_mask is None and out.decoder_padding_mask is some and out.pair.padding_mask is None
    assert batch.padding_mask is none  # the batch itself is unchanged


def test_the_clock_waits_for_the_gpu(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    precision.synchronize(CPU)
    assert synced == []
    precision.synchronize(CUDA)
    assert synced == [CUDA]


def test_peak_memory_and_tflops(monkeypatch):
    assert precision.peak_memory_gib(CPU) > 0.01  # the process's max resident set
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 30)
    assert precision.peak_memory_gib(CUDA) == 3.0
    assert precision.peak_tflops("bf16", CPU, None) is None and precision.peak_tflops("fp32", CPU, 2.5) == 2.5
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert precision.peak_tflops("bf16-true", CUDA, None) == 989.0
    assert precision.peak_tflops("tf32", CUDA, None) == 494.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Other GPU")
    assert precision.peak_tflops("bf16", CUDA, None) is None


def test_model_flops_per_token():
    model = build_model(shrunk_model_config("gpt2/base"))  # 2 layers, 2 heads of 16 (width 32)
    linear, attention = precision.model_flops_per_token(model)
    assert linear == 6 * sum(p.numel() for p in model.parameters())
    assert attention == 12 * 2 * 32


def _stream(model, dtype=None):
    def batches(start):
        while True:
            yield batch_for(model, 97)
    return batches


def test_bf16_true_trains_saves_bf16_resumes_and_loads_into_fp32(tmp_path):
    cfg = TrainConfig(precision="bf16-true", steps=4, log_every=2, lr=1e-3, progress=False, tensorboard=False,
                      save_minutes=None, peak_tflops=1.0, stop_at=2)
    name = "llama/7b"  # rotary positions, RMSNorm, gated feed-forward
    torch.manual_seed(0)
    model = build_model(shrunk_model_config(name))
    trainer = Trainer(model, cfg, tmp_path, 4)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    trainer.resume()
    trainer.train(_stream(model))
    state = trainer.optimizer.state_dict()["state"]
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in state.values())
    path = layout.latest_checkpoint(tmp_path) / layout.WEIGHTS
    with safe_open(str(path), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 2 and records[-1]["peak_memory_gib"] > 0
    assert records[-1]["tokens_per_s"] > 0 and 0 < records[-1]["mfu"]
    # resume in bf16-true: the run goes on from step 2
    torch.manual_seed(0)
    again = build_model(shrunk_model_config(name))
    trainer = Trainer(again, cfg.model_copy(update={"stop_at": None}), tmp_path, 4)
    assert trainer.resume() and trainer.step == 2
    last = trainer.train(_stream(again))
    assert last["step"] == 4 and torch.isfinite(torch.tensor(last["loss"]))
    # a bf16-true run's weights load into an fp32 model (fine-tuning, inference, generation, convert)
    fp32 = build_model(shrunk_model_config(name))
    ckpt.load_weights(fp32, ckpt.read_weights(layout.latest_checkpoint(tmp_path) / layout.WEIGHTS), "bf16 run")
    assert all(p.dtype == torch.float32 for p in fp32.parameters())
    for (key, a), b in zip(again.state_dict().items(), fp32.state_dict().values()):
        assert torch.equal(a.float(), b), key
    fp32.eval()
    with torch.no_grad():
        assert torch.isfinite(total_loss(fp32(batch_for(fp32, 97))))


def test_fp32_run_logs_no_mfu_without_a_peak(tmp_path):
    cfg = TrainConfig(steps=2, log_every=1, progress=False, tensorboard=False, save_minutes=None)
    model = build_model(shrunk_model_config("bert/tiny"))
    trainer = Trainer(model, cfg, tmp_path, 2)
    assert trainer.precision == "fp32" and all(p.dtype == torch.float32 for p in model.parameters())
    trainer.resume()
    last = trainer.train(_stream(model))
    assert "mfu" not in last and last["peak_memory_gib"] > 0


# ---- attention without a mask when nothing is padded ------------------------------------------

@pytest.mark.parametrize("kind", ["bidirectional", "causal"])
def test_unpadded_batches_take_the_maskless_kernel_with_the_same_output(kind):
    b, s = 2, 7
    no_padding = torch.zeros(b, s, dtype=torch.bool)
    mask, is_causal = attention_mask(kind, s, no_padding)
    assert mask is None and is_causal == (kind == "causal")  # SDPA's fastest kernels (is_causal: fused)
    explicit = torch.ones(s, s, dtype=torch.bool)
    explicit = (explicit.tril() if kind == "causal" else explicit)[None, None].expand(b, 1, s, s)
    torch.manual_seed(0)
    attention = SelfAttention(32, 4).eval()
    x = torch.randn(b, s, 32)
    with torch.no_grad():
        fast, _ = attention(x, AttentionInputs(mask, is_causal))
        masked, _ = attention(x, AttentionInputs(explicit, False))
    torch.testing.assert_close(fast, masked, rtol=1e-6, atol=1e-6)
    padded = no_padding.clone()
    padded[0, -2:] = True
    assert attention_mask(kind, s, padded)[0] is not None


@pytest.mark.parametrize("name", ["bert/tiny", "gpt2/base", "t5/small", "sbert/base"])
def test_a_model_gives_the_same_losses_without_an_empty_padding_mask(name):
    torch.manual_seed(0)
    model = build_model(shrunk_model_config(name)).eval()
    batch = batch_for(model, 97)
    batch.padding_mask = torch.zeros_like(batch.padding_mask)
    if batch.decoder_padding_mask is not None:
        batch.decoder_padding_mask = torch.zeros_like(batch.decoder_padding_mask)
    if batch.pair is not None:
        batch.pair.padding_mask = torch.zeros_like(batch.pair.padding_mask)
    unpadded = batch.without_empty_padding()
    assert unpadded.padding_mask is None
    with torch.no_grad():
        first, second = model(batch), model(unpadded)
    for key in first:
        torch.testing.assert_close(first[key].loss, second[key].loss, rtol=1e-6, atol=1e-6)


def test_evaluation_inputs_follow_the_weights_dtype():
    from pentad.tasks.base import input_dtype

    model = torch.nn.Linear(2, 2)
    assert input_dtype(model) is None
    assert input_dtype(model.to(torch.bfloat16)) == torch.bfloat16
