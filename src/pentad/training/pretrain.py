"""``pentad pretrain``: build the model from the config, stream the preprocessed dataset, train."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pentad import layout
from pentad.errors import UserError
from pentad.registry import OBJECTIVES
from pentad.runs import absolute_paths, complete_vocab, info, load_tokenizer
from pentad.training.session import Session
from pentad.training.trainer import Hook, Trainer, plot_losses


def pretrain(cfg: Any) -> dict[str, Any]:
    """Run pre-training as configured (one process, or every rank of a launch); returns the last
    logged metrics."""
    if cfg.data.dataset is None:
        raise UserError("data.dataset is not set: give the directory written by `pentad preprocess`")
    if cfg.data.objective is None:
        raise UserError("data.objective is not set (e.g. data.objective=bert)")
    if cfg.output is None:
        raise UserError("output is not set: give the run directory, e.g. output=runs/pretrain")
    for key in ("early_stopping", "folds", "grid"):
        if getattr(cfg.train, key) is not None:
            raise UserError(f"train.{key} is a fine-tuning option (pentad finetune); pre-training has no dev set "
                            f"to stop on or to pick by. Remove train.{key}")
    absolute_paths(cfg)
    with Session(cfg, "pretrain") as session:
        return _pretrain(cfg, session)


class LoggedLength(Hook):
    """``train.curriculum``: the stream already cuts its batches to the schedule's lengths; this hook logs
    the length of each interval's last step as ``seq_length``."""

    def __init__(self, lengths: Any):
        self.lengths = lengths  # a pentad.data.curriculum.LengthSchedule

    def on_log(self, trainer: Trainer) -> dict[str, Any]:
        return {"seq_length": self.lengths.length(trainer.step - 1)}


def _pretrain(cfg: Any, session: Session) -> dict[str, Any]:
    from pentad.data.curriculum import LengthSchedule, check_objective
    from pentad.data.loader import PretrainBatches, open_dataset

    tokenizer = load_tokenizer(cfg)
    needs = OBJECTIVES.get(cfg.data.objective.type).needs_tokenizer
    if tokenizer is None and needs:
        raise UserError("tokenizer is not set: pre-training needs the tokenizer the dataset was made with")
    if tokenizer is not None:
        complete_vocab(cfg, tokenizer)
    session.seed()
    objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
    target_tokenizer = getattr(objective, "target_tokenizer", tokenizer)
    if target_tokenizer is not tokenizer:  # translation with its own target vocabulary
        cfg.model.target_vocab_size = target_tokenizer.vocab_size
    else:
        target_tokenizer = None
    dataset = open_dataset(cfg.data.dataset, tokenizer, objective)
    lengths, shortest = None, 0
    curriculum = cfg.train.curriculum
    if curriculum is not None:
        if curriculum.start_length is not None:
            check_objective(objective)
        lengths = LengthSchedule.from_config(curriculum, objective.seq_length, cfg.train.grad_accum)
        shortest = curriculum.shortest_first * cfg.train.grad_accum * cfg.train.batch_size
    objective.check_model(cfg.model)
    model = session.build(cfg.model, objective.provides, cfg.init)
    changes = session.prepare_run_dir(tokenizer, target_tokenizer=target_tokenizer,
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
    if session.is_main:
        plot_losses(Path(cfg.output) / layout.METRICS, Path(cfg.output) / layout.LOSS_PLOT)
    if trainer.step < cfg.train.steps:
        info(f"stopped at step {trainer.step} of {cfg.train.steps} (train.stop_at); run the same command again "
             "to resume")
        return last
    info(f"pre-training done in {time.perf_counter() - start:.0f} s: " +
         ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step"))
    return last
