"""``pentad pretrain``: build the model from the config, stream the preprocessed dataset, train."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pentad import layout
from pentad.config.base import freeze
from pentad.errors import UserError
from pentad.registry import OBJECTIVES
from pentad.runs import absolute_paths, check_inputs_exist, complete_vocab, info, load_tokenizer, main_rank_speaks
from pentad.training.plots import head_names, plot_losses
from pentad.training.session import Session, check_launch
from pentad.training.trainer import Hook, Trainer


@dataclass(frozen=True)
class PretrainPlan:
    """A pre-training run resolved before it starts (:func:`plan_pretrain`): ``cfg`` is the complete run
    config, frozen (paths absolute, vocabulary sizes from the tokenizers, every check passed), which the
    run only reads and ``config.yaml`` records; beside it what resolving it loaded."""

    cfg: Any
    tokenizer: Any  # None: the objective reads no text (images)
    objective: Any  # None only in a partial plan (``--print-config`` without data.objective)
    target_tokenizer: Any = None  # translation's own target vocabulary


def plan_pretrain(cfg: Any, partial: bool = False) -> PretrainPlan:
    """``cfg`` resolved into the run it describes: every path absolute, ``model.vocab_size`` (and
    ``model.target_vocab_size``) from the tokenizers, the objective made and checked against the model,
    then frozen. ``partial`` (``--print-config``): what is missing to run (dataset, objective, output,
    tokenizer) is left unset instead of refused, and what depends on it unresolved."""
    if not partial:
        if cfg.data.dataset is None:
            raise UserError("data.dataset is not set: give the directory written by `pentad preprocess`")
        if cfg.data.objective is None:
            raise UserError("data.objective is not set (e.g. data.objective=bert)")
        if cfg.output is None:
            raise UserError("output is not set: give the run directory, e.g. output=runs/pretrain")
    if not partial:
        check_launch(cfg.train)  # how it was started, before what follows from it
    check_inputs_exist(cfg)
    for key in ("early_stopping", "folds", "grid"):
        if getattr(cfg.train, key) is not None:
            raise UserError(f"train.{key} is a fine-tuning option (pentad finetune); pre-training has no dev set "
                            f"to stop on or to pick by. Remove train.{key}")
    from pentad.data.curriculum import check_objective

    cfg = absolute_paths(cfg.model_copy(deep=True))  # resolving changes a copy; the plan is frozen after
    with main_rank_speaks():
        tokenizer = load_tokenizer(cfg)
        if tokenizer is not None:
            complete_vocab(cfg, tokenizer)
        objective = target_tokenizer = None
        if cfg.data.objective is not None:
            needs = OBJECTIVES.get(cfg.data.objective.type).needs_tokenizer
            if tokenizer is None and needs:
                if not partial:
                    raise UserError("tokenizer is not set: pre-training needs the tokenizer the dataset was made with")
            else:
                objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
                target_tokenizer = getattr(objective, "target_tokenizer", tokenizer)
                if target_tokenizer is not tokenizer:  # translation with its own target vocabulary
                    cfg.model.target_vocab_size = target_tokenizer.vocab_size
                else:
                    target_tokenizer = None
                if cfg.train.curriculum is not None and cfg.train.curriculum.start_length is not None:
                    check_objective(objective)
                objective.check_model(cfg.model)
    return PretrainPlan(freeze(cfg), tokenizer, objective, target_tokenizer)


def pretrain(cfg: Any) -> dict[str, Any]:
    """Run pre-training as configured (one process, or every rank of a launch); returns the last
    logged metrics. The config is resolved first (:func:`plan_pretrain`); the run reads the plan."""
    plan = plan_pretrain(cfg)
    with Session(plan.cfg, "pretrain") as session:
        return _pretrain(plan, session)


class LoggedLength(Hook):
    """``train.curriculum``: the stream already cuts its batches to the schedule's lengths; this hook logs
    the length of each interval's last step as ``seq_length``."""

    def __init__(self, lengths: Any):
        self.lengths = lengths  # a pentad.data.curriculum.LengthSchedule

    def on_log(self, trainer: Trainer) -> dict[str, Any]:
        return {"seq_length": self.lengths.length(trainer.step - 1)}


def _pretrain(plan: PretrainPlan, session: Session) -> dict[str, Any]:
    from pentad.data.curriculum import LengthSchedule
    from pentad.data.loader import PretrainBatches, open_dataset

    cfg, tokenizer, objective = plan.cfg, plan.tokenizer, plan.objective
    session.seed()
    dataset = open_dataset(cfg.data.dataset, tokenizer, objective)
    lengths, shortest = None, 0
    curriculum = cfg.train.curriculum
    if curriculum is not None:
        lengths = LengthSchedule.from_config(curriculum, objective.seq_length, cfg.train.grad_accum)
        shortest = curriculum.shortest_first * cfg.train.grad_accum * cfg.train.batch_size
    model = session.build(cfg.model, objective.provides, cfg.init)
    changes = session.prepare_run_dir(tokenizer, target_tokenizer=plan.target_tokenizer,
                                      unused=("train.epochs", "data.train", "data.dev", "task"))
    # every rank makes the same global batches and trains on its rows of each (Trainer)
    batches = PretrainBatches(dataset, objective, cfg.train.batch_size, cfg.train.seed,
                              num_workers=cfg.data.loader_workers, lengths=lengths, shortest_first=shortest)
    # set by the user (fine-tuning's length), not used here; a run's config.yaml spells out every default
    if "epochs" in cfg.train.model_fields_set and cfg.train.epochs != type(cfg.train).model_fields["epochs"].default:
        info(f"note: train.epochs={cfg.train.epochs} is not used by pre-training, whose length is train.steps "
             f"({cfg.train.steps:,} steps); set train.steps to change it")
    info(f"dataset {cfg.data.dataset}: {len(dataset):,} instances, {batches.batches_per_epoch:,} batches per "
         f"epoch; training {cfg.train.steps:,} steps on {session.dist.device}")
    if lengths is not None:
        info(lengths.describe())
    if shortest:
        info(f"curriculum: the first {curriculum.shortest_first:,} steps take the {shortest:,} shortest instances, "
             "shortest first")
    trainer = session.trainer(model, cfg.train.steps, "pretrain")
    trainer.resume(changes)
    start = time.perf_counter()
    last = trainer.train(batches.iterate, hooks=[LoggedLength(lengths)] if lengths is not None else [])
    if session.is_main and cfg.train.plot:
        plot_losses(Path(cfg.output) / layout.METRICS, Path(cfg.output) / layout.LOSS_PLOT, head_names(model))
    if trainer.step < cfg.train.steps:
        info(f"stopped at step {trainer.step} of {cfg.train.steps} (train.stop_at); run the same command again "
             "to resume")
        return last
    info(f"pre-training done in {time.perf_counter() - start:.0f} s: " +
         ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step"))
    return last
