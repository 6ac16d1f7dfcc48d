"""Distillation from a teacher run (``train.distill``, ``pentad finetune --teacher RUN``).

A :class:`Teacher` is a model loaded from a run directory, kept in eval mode without gradients on the
training device; it runs on every micro-batch the student trains on (the rank's rows, the same autocast).
A :class:`Distiller` mixes, for every head that has a loss, ``(1 - alpha) * hard + alpha * soft``, where
``soft`` sums what its *transfers* give that head. The one transfer today is :class:`LogitsTransfer`:
soft labels from the teacher's logits, each head saying how through ``Target.distill_loss`` (a softmax
over classes, sigmoids for multi-label, the teacher's value for regression, start/end distributions over
positions for span extraction; ``None`` where the head's logits are not class scores).

The pieces are kept apart so that other transfers and other kinds of teacher can join without changing
this code: a transfer is any object with ``name`` and ``losses(student, outputs, teacher_outputs, batch)
-> {head: loss}`` (hidden-state or attention transfer would read what a teacher returns beside its
heads' outputs), and :func:`load_teacher` reads any run directory (a pre-training run as well), while
the checks that a fine-tuning teacher fits the student's task are :func:`check_teacher`.

Each rank holds a whole teacher (not sharded, not wrapped: it needs no gradient and no reduction) and
scores its own rows, so every strategy works alike: ``single``, ``ddp``, ``fsdp`` and ``deepspeed`` (the
student sharded as usual; a teacher too large for one device is beyond what this runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.builder import build_model
from pentad.components.base import Batch, TargetOutput
from pentad.errors import UserError
from pentad.layers.attention import attention_probabilities
from pentad.layers.soft_labels import SoftLoss
from pentad.layers.transformer import TransformerLayer
from pentad.runs import info, load_run
from pentad.training import checkpoint as ckpt
from pentad.training.config import TrainConfig
from pentad.training.precision import param_dtype, resolve
from pentad.training.trainer import Hook, Trainer


@dataclass
class Teacher:
    """A model loaded from ``run_dir`` (eval mode, no gradients) and its run's config and tokenizer."""

    model: nn.Module
    run_dir: Path
    config: Any
    tokenizer: Any

    @torch.no_grad()
    def outputs(self, batch: Batch) -> dict[str, TargetOutput]:
        """The teacher's head outputs on ``batch`` (labels are not given: heads return their logits)."""
        return self.model(replace(batch, labels={}))


def load_teacher(run_dir: Path, provided: Any, device: torch.device | str, dtype: torch.dtype | None = None,
                 loaded: tuple[Any, Any] | None = None) -> Teacher:
    """The model of ``run_dir`` (its best model, as ``pentad infer`` reads it) on ``device``, for a batch that
    provides the fields ``provided``; ``loaded``: the run's (config, tokenizer) when already read. The random
    number generator is left as it was, so a student built after it starts from the weights it would have
    without a teacher."""
    run_dir = Path(run_dir)
    cfg, tokenizer = loaded if loaded is not None else load_run(run_dir)
    with torch.random.fork_rng(devices=[]):
        model = build_model(cfg.model, provided=provided, training=False)
    ckpt.load_weights(model, ckpt.read_weights(ckpt.find_weights(run_dir)), str(run_dir))
    model.to(device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return Teacher(model, run_dir, cfg, tokenizer)


def read_state(run_dir: Path, state_file: str) -> Any:
    """A fine-tuned run's task state (``labels.json``)."""
    path = run_dir / state_file
    if not path.is_file():
        raise UserError(f"the teacher {run_dir} has no {state_file} (the task state of a fine-tuned run): is it a "
                        f"finished pentad finetune run directory?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"the teacher's {path} is not valid JSON ({e})") from None


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def check_teacher(run_dir: Path, teacher_cfg: Any, teacher_tokenizer: Any, *, task_type: str, task_state: Any,
                  tokenizer: Any, seq_length: int, state_file: str) -> None:
    """A UserError naming what differs unless the run at ``run_dir`` is a fine-tuned run of the same task
    type, with the same task state (labels), the same tokenizer vocabulary, and positions for
    ``seq_length`` tokens."""
    where = f"train.distill.teacher={run_dir}"
    if teacher_cfg.task is None:
        raise UserError(f"{where} is not a fine-tuned run (its config has no task); the teacher must be a run of "
                        f"pentad finetune --task {task_type}")
    if teacher_cfg.task.type != task_type:
        raise UserError(f"{where} was fine-tuned for task {teacher_cfg.task.type}, this run is {task_type}: the "
                        f"teacher must be a run of the same task")
    state = read_state(run_dir, state_file)
    if state != task_state:
        raise UserError(f"{where} has other labels than this run: its {state_file} is {_short(state)}, this run's "
                        f"training data gives {_short(task_state)}; the teacher's heads must score the same labels "
                        f"(fine-tune the teacher on data with the same label set)")
    if teacher_tokenizer is None:
        raise UserError(f"{where} has no tokenizer files; the teacher must read the same token ids as the student")
    size, mine = teacher_tokenizer.vocab_size, tokenizer.vocab_size
    if size != mine:
        raise UserError(f"{where} has another vocabulary: {size} tokens, this run's tokenizer has {mine}; the "
                        f"teacher must read the same token ids (use the teacher's tokenizer.vocab)")
    for i in range(size):
        if teacher_tokenizer.id_to_token(i) != tokenizer.id_to_token(i):
            raise UserError(f"{where} has another vocabulary: token id {i} is {teacher_tokenizer.id_to_token(i)!r} "
                            f"for the teacher and {tokenizer.id_to_token(i)!r} here; the teacher must read the same "
                            f"token ids (use the teacher's tokenizer.vocab)")
    limit = teacher_cfg.model.max_seq_length
    if limit < seq_length:
        raise UserError(f"{where} takes at most {limit} tokens (its model.max_seq_length), this run's sequences "
                        f"have up to {seq_length}: set data.objective.seq_length={limit} (or less)")


class Transfer(Protocol):
    """What the student learns from the teacher beside its hard labels: per head, a loss to mix in."""

    name: str

    def losses(self, student: nn.Module, outputs: dict[str, TargetOutput], teacher: dict[str, TargetOutput],
               batch: Batch) -> dict[str, Tensor]: ...


class LogitsTransfer:
    """Soft labels from the teacher's logits, per head: ``Target.distill_loss`` of the student's head."""

    name = "logits"

    def __init__(self, temperature: float, kind: SoftLoss):
        self.temperature = temperature
        self.kind = kind

    def losses(self, student: nn.Module, outputs: dict[str, TargetOutput], teacher: dict[str, TargetOutput],
               batch: Batch) -> dict[str, Tensor]:
        found: dict[str, Tensor] = {}
        for name, out in outputs.items():
            if out.loss is None:
                continue
            soft = student.targets[name].distill_loss(out, teacher.get(name), batch, self.temperature, self.kind)
            if soft is not None:
                found[name] = soft
        return found


class Distiller(Hook):
    """Runs the teacher on each micro-batch (:meth:`teach`) and mixes the transfers' losses into the
    student's heads (:meth:`combine`): a hook of the training loop (before each forward, the teacher's
    outputs; the student's outputs transformed).

    A head's loss becomes ``(1 - alpha) * hard + alpha * soft``; its metrics gain ``distill_loss`` (soft)
    and ``hard_loss``, logged as ``<head>_distill_loss`` and ``<head>_hard_loss``. Heads the transfers
    give nothing keep their loss. The first batch on which no head takes a transfer is a UserError.
    """

    def __init__(self, teacher: Teacher, alpha: float, transfers: Sequence[Transfer], task: str = ""):
        self.teacher = teacher
        self.alpha = alpha
        self.transfers = list(transfers)
        self.task = task
        self._checked = False
        self._taught: dict[str, TargetOutput] = {}  # the teacher's outputs on the current micro-batch

    def attach(self, student: nn.Module) -> None:
        """Let the transfers that read the student's inner states (:class:`LayerTransfer`) hook into it;
        called once, after the student is built."""
        for transfer in self.transfers:
            if hasattr(transfer, "attach"):
                transfer.attach(student)

    def teach(self, batch: Batch, autocast: Callable[[], AbstractContextManager[Any]]) -> dict[str, TargetOutput]:
        with autocast():
            return self.teacher.outputs(batch)

    def before_forward(self, trainer: Trainer, batch: Batch) -> None:
        self._taught = self.teach(batch, trainer.autocast)

    def transform(self, trainer: Trainer, outputs: dict[str, Any], batch: Batch) -> dict[str, Any]:
        return self.combine(trainer.model, outputs, self._taught, batch)

    def combine(self, student: nn.Module, outputs: dict[str, TargetOutput], teacher: dict[str, TargetOutput],
                batch: Batch) -> dict[str, TargetOutput]:
        soft: dict[str, Tensor] = {}
        for transfer in self.transfers:
            for name, loss in transfer.losses(student, outputs, teacher, batch).items():
                soft[name] = soft[name] + loss if name in soft else loss
        if not self._checked:
            scored = [n for n, out in outputs.items() if out.loss is not None]
            if scored and not soft:
                heads = ", ".join(f"{n} ({getattr(student.targets[n], 'registry_name', '?')})" for n in scored)
                raise UserError(f"train.distill: no head of this model takes soft labels from the teacher "
                                f"{self.teacher.run_dir} (heads {heads}: they give no class scores while "
                                f"training){f', so task {self.task} cannot be distilled' if self.task else ''}; "
                                "leave train.distill.teacher unset")
            self._checked = bool(scored)
        combined = dict(outputs)
        for name, loss in soft.items():
            out = outputs[name]
            hard = out.loss
            metrics = {**out.metrics, "distill_loss": loss.detach(), "hard_loss": hard.detach()}
            combined[name] = TargetOutput(loss=(1 - self.alpha) * hard + self.alpha * loss, metrics=metrics,
                                          logits=out.logits)
        return combined


def make_distiller(train: TrainConfig, *, task_type: str, task_state: Any, tokenizer: Any, provided: Any,
                   seq_length: int, device: torch.device, state_file: str, trains: bool = True) -> Distiller | None:
    """The Distiller ``train.distill`` asks for (None when ``teacher`` is unset), its teacher loaded from
    the run directory (in the weights' dtype of ``train.precision``) and checked against the student's task
    (:func:`check_teacher`). ``trains``: False for a run that only evaluates (zero-shot), which is refused."""
    options = train.distill
    if options.teacher is None:
        return None
    if not trains:
        raise UserError(f"train.distill.teacher is set, but this {task_type} run does not train (it scores the "
                        "initial model, zero-shot), so there is nothing to distil into: leave --teacher out (or "
                        "let it train, e.g. task.zero_shot=false with a training file)")
    run_dir = Path(options.teacher)
    teacher_cfg, teacher_tokenizer = load_run(run_dir)
    check_teacher(run_dir, teacher_cfg, teacher_tokenizer, task_type=task_type, task_state=task_state,
                  tokenizer=tokenizer, seq_length=seq_length, state_file=state_file)
    teacher = load_teacher(run_dir, provided, device, param_dtype(resolve(train.precision, device)),
                           loaded=(teacher_cfg, teacher_tokenizer))
    transfers: list[Transfer] = [LogitsTransfer(options.temperature, options.loss)]
    extra = ""
    if options.hidden_weight or options.attention_weight:
        transfers.append(LayerTransfer(teacher.model, options.hidden_weight, options.attention_weight,
                                       options.layer_map))
        extra = f", hidden {options.hidden_weight:g}, attention {options.attention_weight:g}"
    elif options.layer_map is not None:
        raise UserError("train.distill.layer_map is set but neither hidden_weight nor attention_weight is: the map "
                        "is for hidden-state and attention transfer (set one of them above 0)")
    info(f"distillation from {run_dir}: alpha {options.alpha:g}, {options.loss}"
         + (f", temperature {options.temperature:g}" if options.loss == "kl" else "") + extra)
    return Distiller(teacher, options.alpha, transfers, task=task_type)


# ------------------------------------------------------------------------------- hidden and attention transfer
def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The layers of ``model``'s encoder (a transformer stack), in order: what hidden-state and attention
    transfer map (a shared-layer stack, ALBERT's, has one)."""
    layers = getattr(model.encoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(isinstance(layer, TransformerLayer) for layer in layers):
        raise UserError(f"hidden-state and attention transfer read the layers of a transformer encoder; this model's "
                        f"encoder is a {type(model.encoder).__name__}: set train.distill.hidden_weight=0 and "
                        "train.distill.attention_weight=0")
    return list(layers)


def default_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Student layer i <- teacher layer (i + 1) * T // S - 1: evenly spaced, the last on the last."""
    return [(i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)]


class LayerTap:
    """Forward hooks on a model's encoder layers that keep, per forward, each layer's output (``hidden``)
    and, when ``attention`` is set, its self-attention distributions (recomputed from the block's input by
    :func:`~pentad.layers.attention.attention_probabilities`). Read and cleared by :meth:`take`. Hooks are
    only on models that distil with these transfers: nothing else changes."""

    def __init__(self, model: nn.Module, attention: bool, training_only: bool = False):
        self.layers = transformer_layers(model)
        self.count = int(getattr(model.encoder, "num_layers", len(self.layers)))  # calls per forward
        self.training_only = training_only  # the student: not while it is evaluated
        self.hidden: list[Tensor] = []
        self.attention: list[Tensor] = []
        self.handles = []
        self.model = model
        self.all_positions = getattr(model, "all_positions", False)
        model.all_positions = True  # every layer's states in full (no head-driven trimming of the last)
        for layer in self.layers:
            self.handles.append(layer.register_forward_hook(self._keep_hidden))
            if attention:
                self.handles.append(layer.attention.register_forward_hook(self._keep_attention))

    def _keep_hidden(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if module.training or not self.training_only:
            self.hidden.append(output[0] if isinstance(output, tuple) else output)

    def _keep_attention(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if module.training or not self.training_only:
            self.attention.append(attention_probabilities(module, args[0], args[1]))

    def take(self) -> tuple[list[Tensor], list[Tensor]]:
        hidden, attention = self.hidden, self.attention
        self.hidden, self.attention = [], []
        return hidden, attention

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.model.all_positions = self.all_positions


def _first_scored(outputs: dict[str, TargetOutput]) -> str | None:
    return next((name for name, out in outputs.items() if out.loss is not None), None)


def _token_mask(batch: Batch, hidden: Tensor) -> Tensor:
    """[B,S] float: 1 at real tokens, 0 at padding."""
    if batch.padding_mask is None:
        return hidden.new_ones(hidden.shape[:2])
    return (~batch.padding_mask[:, -hidden.shape[1]:]).to(hidden.dtype)


def hidden_loss(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error of two layers' outputs [B,S,H] over real tokens; of their token-similarity
    matrices (cosine, [B,S,S]) when the widths differ, which needs no projection to train."""
    if student.shape[-1] != teacher.shape[-1]:
        def similarity(h: Tensor) -> Tensor:
            h = F.normalize(h.float(), dim=-1)
            return h @ h.transpose(-1, -2)
        pair = mask[:, :, None] * mask[:, None, :]
        return ((similarity(student) - similarity(teacher)) ** 2 * pair).sum() / pair.sum().clamp_min(1.0)
    err = ((student.float() - teacher.float()) ** 2).mean(dim=-1)
    return (err * mask).sum() / mask.sum().clamp_min(1.0)


def attention_loss(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """KL(teacher || student) of attention distributions [B,heads,q,k], averaged over real query tokens
    (and heads); head-averaged distributions when the head counts differ."""
    if student.shape[1] != teacher.shape[1]:
        student, teacher = student.mean(dim=1, keepdim=True), teacher.mean(dim=1, keepdim=True)
    kl = (torch.xlogy(teacher, teacher) - teacher * student.clamp_min(1e-12).log()).sum(dim=-1)  # [B,h,q]
    weights = mask[:, None, :].expand_as(kl)
    return (kl * weights).sum() / weights.sum().clamp_min(1.0)


class LayerTransfer:
    """Hidden-state and attention transfer (TinyBERT, Jiao et al. 2020; MiniLM-style relations when widths
    differ): student layer i learns from teacher layer ``layer_map[i]``. The loss, ``hidden_weight *
    sum_i hidden_loss + attention_weight * sum_i attention_loss``, is given to the first head with a loss
    (these transfers are not per head), beside the logits' soft loss. :meth:`attach` puts the taps on the
    student (the teacher's are put on at construction)."""

    name = "layers"

    def __init__(self, teacher: nn.Module, hidden_weight: float, attention_weight: float,
                 layer_map: Sequence[int] | None = None):
        self.hidden_weight, self.attention_weight = hidden_weight, attention_weight
        self.teacher_tap = LayerTap(teacher, attention_weight > 0)
        self.layer_map = list(layer_map) if layer_map is not None else None
        self.student_tap: LayerTap | None = None
        self._teacher: tuple[list[Tensor], list[Tensor]] = ([], [])

    def attach(self, student: nn.Module) -> None:
        tap = LayerTap(student, self.attention_weight > 0, training_only=True)
        teacher_layers = self.teacher_tap.count
        layer_map = self.layer_map or default_layer_map(tap.count, teacher_layers)
        if len(layer_map) != tap.count or not all(0 <= j < teacher_layers for j in layer_map):
            tap.remove()
            raise UserError(f"train.distill.layer_map {layer_map}: expected one teacher layer (0 to "
                            f"{teacher_layers - 1}) for each of the student's {tap.count} layers")
        self.layer_map = layer_map
        self.student_tap = tap

    def losses(self, student: nn.Module, outputs: dict[str, TargetOutput], teacher: dict[str, TargetOutput],
               batch: Batch) -> dict[str, Tensor]:
        if self.student_tap is None:
            raise RuntimeError("LayerTransfer.attach(student) was not called before training")
        s_hidden, s_attention = self.student_tap.take()
        taken = self.teacher_tap.take()
        if taken[0]:  # a second student forward on the same batch (adversarial training) reuses them
            self._teacher = taken
        t_hidden, t_attention = self._teacher
        head = _first_scored(outputs)
        if head is None or len(s_hidden) != len(self.layer_map) or not t_hidden:
            return {}
        mask = _token_mask(batch, s_hidden[0])
        # a shared-layer stack runs its one layer several times: each call is a layer here
        total = s_hidden[0].new_zeros((), dtype=torch.float32)
        for i, j in enumerate(self.layer_map):
            if self.hidden_weight:
                total = total + self.hidden_weight * hidden_loss(s_hidden[i], t_hidden[j], mask)
            if self.attention_weight:
                total = total + self.attention_weight * attention_loss(s_attention[i], t_attention[j], mask)
        return {head: total}
