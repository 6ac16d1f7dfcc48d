"""The ``train`` section of a run config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from pentad.config.base import StrictModel


class FsdpConfig(StrictModel):
    """``train.fsdp``: options of the ``fsdp`` strategy (FSDP2 ``fully_shard``)."""

    reshard_after_forward: bool = Field(True, description="free each block's gathered weights after its forward "
                                        "(less memory; false keeps them until backward: less communication)")
    param_dtype: Literal["fp32", "bf16"] = Field("fp32", description="dtype of the gathered weights during forward "
                                                 "and backward (MixedPrecisionPolicy); sharded weights stay fp32")
    reduce_dtype: Literal["fp32", "bf16"] = Field("fp32", description="dtype in which gradients are reduced")


class DeepSpeedConfig(StrictModel):
    """``train.deepspeed``: options of the ``deepspeed`` strategy (ZeRO)."""

    stage: Literal[1, 2, 3] = Field(2, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, "
                                    "3 also parameters")
    offload_optimizer: bool = Field(False, description="keep optimizer state (and its step) in CPU memory")
    offload_parameters: bool = Field(False, description="stage 3: keep parameters in CPU memory")
    config: Path | None = Field(None, description="a DeepSpeed JSON file for other engine settings; pentad fills "
                               "batch size, accumulation, clipping and precision from train.* and refuses a "
                               "file that contradicts them")


class AdversarialConfig(StrictModel):
    """``train.adversarial``: adversarial training on the word embeddings (docs/tasks.md). After each
    micro-batch's backward the embedding table(s) move along their gradient, the loss of the perturbed
    model is backpropagated as well, and the tables are restored: FGM (Miyato et al. 2017) takes one
    step of length ``epsilon``; PGD (Madry et al. 2018) takes ``steps`` steps of length ``alpha``, each
    projected back into the ball of radius ``epsilon`` around the clean table."""

    method: Literal["none", "fgm", "pgd"] = Field("none", description="none (off), fgm or pgd")
    epsilon: float = Field(1.0, gt=0.0, description="fgm: the perturbation's norm; pgd: the radius of the ball "
                           "the perturbation stays in (the L2 norm over each whole table)")
    alpha: float = Field(0.3, gt=0.0, description="pgd: the length of each step")
    steps: int = Field(3, ge=1, description="pgd: steps per micro-batch (each one more forward and backward)")
    parameter: str | None = Field(None, description="which parameter(s) to perturb: a glob over parameter names "
                                  "(e.g. 'embedding.word.weight'); default: every word-embedding table")


class DistillConfig(StrictModel):
    """``train.distill``: soft-label distillation from a fine-tuned teacher run (docs/tasks.md). Each head's
    loss becomes ``(1 - alpha) * hard + alpha * soft``, the soft loss comparing the head's logits with the
    teacher's on the same batch (Hinton et al. 2015)."""

    teacher: Path | None = Field(None, description="a fine-tuned run directory of the same task, labels and "
                                 "vocabulary (pentad finetune --teacher RUN); None: no distillation")
    temperature: float = Field(2.0, gt=0.0, description="kl: the softmax temperature T of both sides (the loss "
                               "is multiplied by T^2)")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="weight of the soft loss; the head's own loss gets "
                         "1 - alpha")
    loss: Literal["kl", "mse"] = Field("kl", description="kl: KL(teacher || student) of the softened "
                                       "distributions; mse: mean squared error of the raw logits (TencentPretrain's "
                                       "--soft_targets)")
    hidden_weight: float = Field(0.0, ge=0.0, description="hidden-state transfer: weight of the mean squared "
                                 "error between each student layer's output and its mapped teacher layer's (of "
                                 "their token-similarity matrices when the widths differ); 0: off (docs/compress.md)")
    attention_weight: float = Field(0.0, ge=0.0, description="attention transfer: weight of KL(teacher || student) "
                                    "of the attention distributions of mapped layers (head-averaged when the head "
                                    "counts differ); 0: off")
    layer_map: list[int] | None = Field(None, description="hidden and attention transfer: student layer i learns "
                                        "from teacher layer layer_map[i] (0-based); default: evenly spaced, the last "
                                        "on the last ((i + 1) * T // S - 1)")


# LoRA targets: the projections of every attention (self and cross) and feed-forward block, by role,
# whatever their layout (a fused qkv projection adapts only the rows of the named part); groups name
# several at once. docs/training.md, "LoRA".
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LORA_GROUPS = {"attention": ("q", "k", "v", "o"), "ffn": ("gate", "up", "down"), "all": LORA_TARGETS}
LoraTarget = Literal["q", "k", "v", "o", "gate", "up", "down", "attention", "ffn", "all"]


class LoraConfig(StrictModel):
    """``train.lora``: train low-rank adapters on a frozen base (``init``) instead of every weight."""

    rank: int = Field(8, ge=1, description="rank r of each adapter (B [rows, r] A [r, in])")
    alpha: float = Field(16.0, gt=0.0, description="the adapters' output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input")
    targets: list[LoraTarget] = Field(
        default_factory=lambda: ["q", "v"], min_length=1,
        description="projections to adapt: q, k, v, o (attention: queries, keys, values, output; the rows of a "
        "fused projection), gate, up, down (feed-forward); groups: attention, ffn, all")
    modules: str | None = Field(None, description="a regular expression: adapt only the projections whose "
                                "module name it matches (re.search), e.g. 'encoder\\.layers\\.(10|11)\\.'")
    heads: Literal["task", "all", "none"] = Field(
        "task", description="heads that train (and are saved) beside the adapters: task: a fine-tuning "
        "task's heads (none in pre-training); all: every target head; none. Weights tied to the word "
        "embedding stay frozen")

    def expanded_targets(self) -> list[str]:
        """``targets`` with groups replaced by their members, in the order of ``LORA_TARGETS``."""
        chosen = {name for target in self.targets for name in LORA_GROUPS.get(target, (target,))}
        return [name for name in LORA_TARGETS if name in chosen]


class CurriculumConfig(StrictModel):
    """``train.curriculum``: sequence-length warm-up in pre-training (docs/training.md, "Curriculum").
    Step ``s`` trains on its batches cut to the first ``length(s)`` positions, a length that grows from
    ``start_length`` at step 0 to the objective's ``seq_length`` at step ``steps`` (and stays there);
    ``shortest_first`` also orders the first batches by the length of their instances."""

    start_length: int | None = Field(64, ge=1, description="the length at step 0 (tokens per sequence, special "
                                     "tokens included); null: no length warm-up (shortest_first alone)")
    steps: int = Field(1000, ge=1, description="the step from which batches have their full length")
    schedule: Literal["linear", "step"] = Field(
        "linear", description="linear: the length grows with every step; step: it grows in `stages` "
        "equal jumps, each held for steps/stages steps")
    stages: int = Field(4, ge=1, description="schedule step: how many lengths the warm-up trains at")
    multiple_of: int = Field(8, ge=1, description="the length is rounded down to a multiple of this "
                             "(never below start_length), so that few distinct shapes are compiled")
    shortest_first: int = Field(0, ge=0, description="difficulty ordering: during this many steps the batches of "
                                "the first epoch take the dataset's shortest instances, in increasing length (ties "
                                "in the seeded order); the rest of the epoch follows in its seeded order. 0: off")


class TrainConfig(StrictModel):
    """Optimisation and bookkeeping options shared by pre-training and fine-tuning."""

    steps: int = Field(1000, ge=1, description="optimizer steps (pre-training)")
    epochs: int = Field(3, ge=1, description="passes over the training set (fine-tuning)")
    batch_size: int = Field(32, ge=1, description="sequences per micro-batch, over all processes together "
                            "(each of N ranks takes batch_size/N); a step trains on batch_size x grad_accum")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-6, gt=0.0)
    adam_bias_correction: bool = Field(True, description="Adam's bias correction of its moment estimates; "
                                       "false: BERT's and TencentPretrain's AdamW, whose steps are larger "
                                       "(up to ~6x) in the first few hundred steps")
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    warmup: float = Field(0.1, ge=0.0, description="warmup: a fraction of the steps if < 1, else a step count")
    schedule_convention: Literal["pentad", "tencentpretrain"] = Field(
        "pentad", description="how warmup and decay count steps. pentad: step s (from 0) trains at lr x (s + 1) / "
        "warmup during warmup (the first step at lr / warmup), warmup is rounded down to whole steps and the "
        "decay ends at the run's last step; tencentpretrain: as TencentPretrain's scripts, step s at lr x s / "
        "warmup (the first step at lr 0), warmup unrounded (train.warmup x the length), and a fine-tune's "
        "length counted as int(examples x epochs / batch) + 1 (docs/tasks.md, recipes)")
    data_order: Literal["seeded", "tencentpretrain"] = Field(
        "seeded", description="fine-tuning: the order of the training examples. seeded: each epoch a permutation "
        "drawn from (train.seed, epoch); tencentpretrain: Python's random.shuffle of the example list, in place, "
        "once per epoch, seeded with train.seed, as TencentPretrain's fine-tuning scripts (the same batches "
        "from the same file and seed)")
    clip_grad_norm: float | None = Field(1.0, gt=0.0, description="None disables clipping")
    precision: Literal["auto", "fp32", "tf32", "bf16", "bf16-true", "fp16"] = Field(
        "auto", description="fp32; tf32 (fp32 weights, TF32 matmuls on GPUs that have them); bf16 (autocast, fp32 "
        "weights); bf16-true (bf16 weights and optimizer state); fp16 (autocast + gradient scaler, GPUs only); "
        "auto: tf32 on a GPU of compute capability >= 8, else fp32 (docs/training.md)")
    peak_tflops: float | None = Field(None, gt=0.0, description="the device's peak TFLOP/s in this precision, for "
                                      "the logged model FLOPs utilisation (mfu); default: a table of known GPUs")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: a GPU when there is one "
                                                   "(cuda:LOCAL_RANK under a launcher), else the CPU")
    strategy: Literal["single", "ddp", "fsdp", "deepspeed"] = Field(
        "single", description="single: one process; ddp, fsdp, deepspeed: every process of a torchrun or "
        "deepspeed launch trains one model (docs/distributed.md)")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="collective backend: auto = nccl "
                                                          "on GPUs, gloo on CPU")
    dist_timeout: float = Field(600.0, gt=0.0, description="seconds a rank waits for the others in a collective "
                                "before the run stops with an error (a rank that died or hangs)")
    activation_checkpointing: bool = Field(False, description="recompute each transformer block's activations "
                                           "in backward instead of keeping them (less memory, ~30% more compute)")
    compile: Literal["off", "blocks", "model"] = Field(
        "off", description="torch.compile: blocks (each transformer layer, compiled once per layer kind), model "
        "(the whole forward), off; the first steps of each input shape compile (docs/training.md); YAML's "
        "bare off/false is off, on/true is blocks")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_switch(cls, value: Any) -> Any:
        """YAML reads a bare ``off`` / ``on`` as a boolean: false is ``off``, true the default mode, ``blocks``."""
        return ("blocks" if value else "off") if isinstance(value, bool) else value
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    adversarial: AdversarialConfig = Field(default_factory=AdversarialConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    lora: LoraConfig | None = Field(None, description="train LoRA adapters on the frozen init weights (needs "
                                    "init); null: train every weight (docs/training.md)")
    curriculum: CurriculumConfig | None = Field(
        None, description="pre-training: sequence-length warm-up, short sequences first (docs/training.md); "
        "null: every step trains at full length")
    seed: int = 7
    log_every: int = Field(10, ge=1)
    save_every: int | None = Field(None, ge=1, description="also save a checkpoint every N steps")
    save_minutes: float | None = Field(10.0, gt=0.0, description="save a checkpoint when this many minutes "
                                                                 "have passed since the last one; null: off")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept in RUN/checkpoints (oldest removed)")
    resume_from: int | None = Field(None, ge=1, description="resume from this kept checkpoint step instead of "
                                                            "the latest (later checkpoints are discarded)")
    allow_changes: bool = Field(False, description="resume even though train/data/task settings that "
                                                   "change the course of training differ from the run's")
    overwrite: bool = Field(False, description="start afresh in a run directory that holds an earlier run: its "
                            "checkpoints, best model, metrics and results are deleted first (--overwrite); a "
                            "one-off instruction, not recorded in config.yaml")
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="a step whose loss or gradient norm is NaN or infinite is never applied; stop: the "
        "run then stops with an error (exit status 1) at the next logging step, evaluation or save; skip: "
        "training goes on (skipped steps are logged as skipped_steps) unless more than max_skipped_steps "
        "in a row are skipped. Under fp16 the gradient scaler skips overflowing gradients itself; only a "
        "non-finite loss counts then (docs/training.md)")
    max_skipped_steps: int = Field(10, ge=0, description="on_nonfinite=skip: the run stops with an error when more "
                                   "than this many steps in a row were skipped")
    eval_every: int | None = Field(None, ge=1, description="fine-tuning: evaluate on dev every N steps; "
                                                           "default: once per epoch")
    early_stopping: int | None = Field(None, ge=1, description="fine-tuning: stop when this many dev evaluations "
                                       "in a row did not improve on the best one (patience); null: train all epochs")
    folds: int | None = Field(None, ge=2, description="fine-tuning: k-fold cross-validation over the training file "
                              "(one run per fold in RUN/fold-K, out-of-fold predictions, mean scores; docs/tasks.md)")
    grid: dict[str, list[Any]] | None = Field(None, description="fine-tuning: a grid search, config key -> values "
                                              "(e.g. {train.lr: [1e-4, 3e-5], train.epochs: [2, 3]}): one run per "
                                              "combination in RUN/grid/, picked by dev score (docs/tasks.md)")
    threads: int | None = Field(None, ge=1, description="CPU threads per operation (torch intra-op threads); "
                                "default: one per core. 1 on a machine shared with busy jobs (docs/config.md)")
    stop_at: int | None = Field(None, ge=1, description="stop with a checkpoint at this step, as if "
                                                        "interrupted; running again resumes")
    progress: bool = Field(True, description="progress bars on stderr (training, evaluation, infer)")
    progress_every_s: float = Field(30.0, gt=0.0, description="when stderr is not a terminal (a CI log, nohup, a "
                                    "file), training shows a plain progress line instead of the bar: after the "
                                    "first step, then every this many seconds, and after the last step")
    tensorboard: bool = Field(True, description="also write TensorBoard event files into the run directory "
                                                "(needs the tensorboard package: pip install 'pentad[tensorboard]')")
    plot: bool = Field(True, description="draw loss.png into the run directory when training ends (matplotlib): "
                       "one panel each for the training losses, the auxiliary losses, the learning rate and the "
                       "dev selection metric, against step")

    def warmup_steps(self, total: int) -> int:
        return int(self.warmup * total) if self.warmup < 1 else int(self.warmup)

