"""``pentad finetune``, ``pentad infer`` and ``pentad evaluate`` for any registered task."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pentad import files, layout
from pentad.builder import build_model, check_memory
from pentad.config.base import freeze
from pentad.errors import UserError
from pentad.registry import TASKS
from pentad.runs import (
    absolute_paths,
    check_inputs_exist,
    complete_vocab,
    info,
    load_run,
    load_tokenizer,
    main_rank_speaks,
)
from pentad.tasks import finetune_defaults, search
from pentad.tasks.base import EpochBatches, Task, window_size, write_lines
from pentad.training import checkpoint as ckpt
from pentad.training.distill import make_distiller
from pentad.training.distributed import pick_device
from pentad.training.evaluation import BestModel, Evaluation
from pentad.training.plots import head_names, plot_losses
from pentad.training.session import Session, check_launch

if TYPE_CHECKING:
    import torch

    from pentad.data.tokenizers import Tokenizer
    from pentad.run_config import RunConfigBase
    from pentad.tasks.base import TaskConfig

# examples read, predicted and written at a time by streamed inference: large enough that the
# per-window overhead is nothing next to the model's work, small enough that a window's texts,
# instances and predictions take a few MB
INFER_WINDOW = 1024


@dataclass(frozen=True)
class FinetunePlan:
    """A fine-tuning run resolved before it starts (:func:`plan_finetune`): ``cfg`` is the complete run
    config, frozen (paths absolute, fine-tuning's train defaults, the tokenizer, the vocabulary size,
    the task's heads in ``model.targets``), which the run only reads and ``config.yaml`` records; beside
    it what resolving it made: the tokenizer and the task, fitted on the training input."""

    cfg: RunConfigBase
    tokenizer: Tokenizer | None
    task: Task | None  # None only in a partial plan (``--print-config`` without a task)
    sources: dict[str, Any]
    seq_length: int


def settle_finetune(cfg: RunConfigBase, partial: bool = False) -> RunConfigBase:
    """The part of resolving a fine-tuning config that a grid search or cross-validation shares with each
    of its runs: checks, absolute paths, the fine-tuning defaults (``task.defaults``), the tokenizer of the ``init`` run
    when the config names none. Returns a frozen config; ``partial``: see :func:`plan_finetune`."""
    if not partial:
        if cfg.task is None:
            raise UserError("task is not set (e.g. --task classification)")
        TASKS.get(cfg.task.type).sources(cfg.task, cfg.data)  # a missing input fails before the run starts
        if cfg.output is None:
            raise UserError("output is not set: give the run directory, e.g. output=runs/finetune")
    if not partial:
        check_launch(cfg.train)  # how it was started, before what follows from it
    check_inputs_exist(cfg, ("init", "train.distill.teacher"))
    cfg = finetune_defaults.apply(absolute_paths(cfg.model_copy(deep=True)))
    if cfg.tokenizer is None and cfg.init is not None and (Path(cfg.init) / layout.CONFIG).is_file():
        init_cfg, _ = load_run(Path(cfg.init))
        cfg.tokenizer = init_cfg.tokenizer
    return freeze(cfg)


def _tokenizer(cfg: RunConfigBase) -> Tokenizer | None:
    """The tokenizer of a settled config: its own, or the ``init`` run's saved one."""
    if cfg.tokenizer is not None and cfg.init is not None and (Path(cfg.init) / layout.CONFIG).is_file():
        init_cfg, init_tok = load_run(Path(cfg.init))
        if init_tok is not None and init_cfg.tokenizer == cfg.tokenizer:
            return init_tok  # (read from the run's tokenizer/ folder, where its files are)
    return load_tokenizer(cfg)


def plan_finetune(cfg: RunConfigBase, partial: bool = False) -> FinetunePlan:
    """``cfg`` resolved into the fine-tuning run it describes (:class:`FinetunePlan`): settled
    (:func:`settle_finetune`), ``model.vocab_size`` from the tokenizer, the task made, bound to the run
    and fitted on the training input, its heads put into the model config; then frozen. ``partial``
    (``--print-config``): what is missing to run (the task, its inputs, the output) is left unset
    instead of refused, and what depends on it unresolved."""
    with main_rank_speaks():
        cfg = settle_finetune(cfg, partial).model_copy(deep=True)
        tokenizer = _tokenizer(cfg)
        needs = cfg.task is None or TASKS.get(cfg.task.type).needs_tokenizer
        if tokenizer is None and needs and not partial:
            raise UserError("no tokenizer: set `tokenizer` in the config or initialise from a run directory "
                            "(init=DIR)")
        complete_vocab(cfg, tokenizer)
        seq_length = cfg.data.objective.seq_length if cfg.data.objective is not None else cfg.model.max_seq_length
        seq_length = min(seq_length, cfg.model.max_seq_length)
        if cfg.task is None or (tokenizer is None and needs):
            return FinetunePlan(freeze(cfg), tokenizer, None, {}, seq_length)
        task = TASKS.get(cfg.task.type)(cfg.task, tokenizer, seq_length)
        task.bind(cfg)
        sources = task.sources(cfg.task, cfg.data)
        if partial and sources.get("train") is None and task.trains:
            return FinetunePlan(freeze(cfg), tokenizer, None, sources, seq_length)
        task.fit(sources["train"])
        described = task.describe()
        info(f"{cfg.task.type}: {described}" if described else f"task {cfg.task.type}")
        model_dict = cfg.model.model_dump()
        model_dict["targets"] = [{**head, "init": cfg.task.head_init} for head in task.head_configs()]
        model_dict = task.model_config(model_dict)
        cfg.model = type(cfg.model).model_validate(model_dict)
    return FinetunePlan(freeze(cfg), tokenizer, task, sources, seq_length)


def finetune(cfg: RunConfigBase) -> dict[str, Any]:
    """Fine-tune on the training input (``data.train``, or what the task's ``sources`` names), pick the
    best model on dev, report dev and test scores (one process, or every rank of a launch). Each run
    (each trial and fold of a search) is resolved first (:func:`plan_finetune`) and reads its plan."""
    cfg = settle_finetune(cfg)
    if cfg.train.grid:
        return search.grid_search(cfg, _finetune_once, _finetune_or_cv)
    return _finetune_or_cv(cfg)


def _finetune_or_cv(cfg: RunConfigBase) -> dict[str, Any]:
    if cfg.train.folds:
        return search.cross_validate(cfg, _finetune_once, _predict_heldout(cfg))
    return _finetune_once(cfg)


def _finetune_once(cfg: RunConfigBase) -> dict[str, Any]:
    plan = plan_finetune(cfg)
    with Session(plan.cfg, "finetune") as session:
        return _finetune(plan, session)


def _predict_heldout(cfg: RunConfigBase):
    def predict(run_dir: Path, path: Path, output: Path) -> Path:
        return infer(run_dir, path, output, probabilities=True, batch_size=cfg.train.batch_size * 2,
                     device_choice=cfg.train.device)
    return predict


def _finetune(plan: FinetunePlan, session: Session) -> dict[str, Any]:
    cfg, tokenizer, task, sources, seq_length = plan.cfg, plan.tokenizer, plan.task, plan.sources, plan.seq_length
    if task is None:  # (only a partial plan, made for --print-config, has none)
        raise ValueError("a fine-tuning run needs a complete plan (plan_finetune without partial)")
    session.seed()
    train = task.read(sources["train"]) if task.trains else None
    evaluation = {name: task.read(sources[name]) for name in ("dev", "test") if sources.get(name) is not None}
    distiller = make_distiller(cfg.train, task_type=cfg.task.type, task_state=task.state(), tokenizer=tokenizer,
                               provided=task.provides, seq_length=seq_length, device=session.dist.device,
                               state_file=layout.LABELS, trains=task.trains)
    model = session.build(cfg.model, task.provides, cfg.init, new_heads=task.head_names(), drop_heads=True)
    if distiller is not None:
        distiller.attach(model)
    if cfg.init is None:
        info("no init: training from randomly initialised weights")
    run_dir = Path(cfg.output)
    changes = session.prepare_run_dir(tokenizer, extra={layout.LABELS: task.state()},
                                      unused=("train.steps", "data.dataset"))
    device = session.dist.device
    if not task.trains:
        return _evaluate_only(cfg, session, task, model, evaluation)
    batches = task.train_batches(train, cfg.train.batch_size, cfg.train.seed)
    batches.num_workers = cfg.data.loader_workers
    if cfg.train.data_order != "seeded":
        if not isinstance(batches, EpochBatches):
            raise UserError(f"train.data_order={cfg.train.data_order} shuffles one list of examples, but the "
                            f"{cfg.task.type} task batches its own way ({type(batches).__name__}); leave "
                            "train.data_order at seeded")
        batches.order = cfg.train.data_order
    steps_per_epoch = max(1, math.ceil(batches.batches_per_epoch / cfg.train.grad_accum))
    total = steps_per_epoch * cfg.train.epochs
    # the length TencentPretrain's fine-tuning scripts size their schedule to (its train_steps)
    examples = len(train) if train is not None else 0
    nominal = examples * cfg.train.epochs // (cfg.train.batch_size * cfg.train.grad_accum) + 1
    every = cfg.train.eval_every or steps_per_epoch
    eval_steps = set(range(every, total + 1, every)) | {total}
    labels = {name: task.gold(inst) for name, inst in evaluation.items()}
    best = BestModel(run_dir / layout.BEST, session)
    progress = cfg.train.progress and session.is_main

    def score(name: str) -> dict[str, float]:
        # every rank evaluates (a sharded model needs all ranks in its forward); the main rank's
        # numbers are the run's
        metrics = task.evaluate(trainer.model, evaluation[name], labels[name], cfg.train.batch_size * 2, device,
                                progress=f"evaluate {name}" if progress else None)
        return session.dist.broadcast_object(metrics)

    def evaluate(step: int) -> dict[str, float]:
        return score("dev") if "dev" in evaluation else {}

    patience = cfg.train.early_stopping
    if patience is not None and "dev" not in evaluation:
        raise UserError(f"train.early_stopping={patience} stops when the dev score stops improving, but there is no "
                        "dev set: give data.dev, or leave train.early_stopping unset")
    evaluator = Evaluation(evaluate, eval_steps, task.selection_score, best, total, patience)

    # set by the user (pre-training's length), not used here; a run's config.yaml spells out every default
    if "steps" in cfg.train.model_fields_set and cfg.train.steps != type(cfg.train).model_fields["steps"].default:
        info(f"note: train.steps={cfg.train.steps} is not used by fine-tuning, whose length is train.epochs: "
             f"{cfg.train.epochs} epoch(s) of {steps_per_epoch:,} steps = {total:,} steps; set train.epochs to "
             "change it")
    info(f"train {len(train):,} examples, {total:,} steps ({cfg.train.epochs} epochs) on {device}")
    trainer = session.trainer(model, total, "finetune", schedule_steps=nominal)
    evaluator.resume(session, trainer.resume(changes), trainer.step)
    start = time.perf_counter()
    stopped = evaluator.stopped(trainer.step)  # a resumed run that had already stopped early stays stopped
    if not stopped:
        trainer.train(batches.iterate, hooks=[evaluator] if distiller is None else [distiller, evaluator])
        stopped = trainer.stopped_early
    if session.is_main and cfg.train.plot:
        plot_losses(run_dir / layout.METRICS, run_dir / layout.LOSS_PLOT, head_names(model), task.selection_metric)
    if trainer.step < total and not stopped:
        info(f"stopped at step {trainer.step} of {total} (train.stop_at); run the same command again to resume")
        return {"stopped_at": trainer.step}
    results: dict[str, Any] = {"best_step": best.step, "selection": best.score,
                               "seconds": round(time.perf_counter() - start, 1)}
    if stopped:
        results["early_stopped_at"] = trainer.step
    if best.step != trainer.step:  # the model in memory is the last step's; evaluate the best one
        weights = None
        if session.strategy.sharded:  # the main rank reads, the strategy sends each rank its shards

            def read() -> None:
                nonlocal weights
                weights = ckpt.read_weights(best.weights, merge_adapters=False)

            session.on_main(read)
        else:
            weights = ckpt.read_weights(best.weights, merge_adapters=False)
        trainer.strategy.load_full_state_dict(weights)
    for name in evaluation:
        if name == "dev" and best.metrics:  # scored when it was chosen; evaluation is deterministic
            results[name] = best.metrics
        else:
            results[name] = score(name)
        info(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in results[name].items()))
    if session.is_main:
        files.write_json(run_dir / layout.RESULTS, results)
    return results


def _evaluate_only(cfg: RunConfigBase, session: Session, task: Task, model: torch.nn.Module,
                   evaluation: dict[str, Any]) -> dict[str, Any]:
    """A task that does not train (zero-shot): the initial model is scored on dev/test and saved as the
    run's model (``RUN/model.safetensors``), which ``pentad infer`` then uses."""
    if session.dist.world_size > 1:
        raise UserError("a fine-tuning run that does not train (zero-shot) runs in one process; run it without "
                        "the launcher")
    run_dir, device = Path(cfg.output), session.dist.device
    model.to(device)
    info(f"no training ({cfg.task.type} evaluates the initial model) on {device}")
    start = time.perf_counter()
    results: dict[str, Any] = {"best_step": 0}
    for name, instances in evaluation.items():
        results[name] = task.evaluate(model, instances, task.gold(instances), cfg.train.batch_size * 2, device,
                                      progress=f"evaluate {name}" if cfg.train.progress else None)
        info(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in results[name].items()))
    results["seconds"] = round(time.perf_counter() - start, 1)
    ckpt.save_weights(model, run_dir / layout.WEIGHTS)
    files.write_json(run_dir / layout.RESULTS, results)
    return results


@dataclass(frozen=True)
class FinetunedRun:
    """A fine-tuned run loaded for inference (:func:`load_finetuned`): its directory (a grid search's
    best trial for a grid's directory), config, task (rebuilt with the saved state, bound to the run),
    model (the run's weights, eval-ready on ``device``)."""

    run_dir: Path
    cfg: RunConfigBase
    task: Task
    model: torch.nn.Module
    device: torch.device


def load_finetuned(model_dir: Path, task: str | None = None, task_options: Sequence[str] = (),
                   device_choice: str = "auto") -> FinetunedRun:
    """A fine-tuned run directory as ``pentad infer`` and ``pentad evaluate`` use it. A grid search's run
    directory means its best trial; ``task`` (``--task``), when given,
    must be the run's task; ``task_options``: ``task.KEY=VALUE`` overrides of the options the task lets
    inference change (``Task.inference_options``: decoding, never the model)."""
    model_dir = search.resolve_model(model_dir)
    cfg, tokenizer = load_run(model_dir)
    if cfg.task is None:
        raise UserError(f"{model_dir} is not a fine-tuned run (its config has no task)")
    if task is not None and task != cfg.task.type:
        raise UserError(f"--task {task} does not match the run: {model_dir} was fine-tuned for {cfg.task.type} "
                        f"(use --task {cfg.task.type}, or leave --task out: the run's task is used)")
    task_cfg = cfg.task
    if task_options:
        task_cfg = inference_task_config(task_cfg, task_options, model_dir)
        cfg = cfg.model_copy(update={"task": task_cfg})
    seq_length = cfg.data.objective.seq_length if cfg.data.objective is not None else cfg.model.max_seq_length
    made = TASKS.get(task_cfg.type)(task_cfg, tokenizer, min(seq_length, cfg.model.max_seq_length),
                                    read_task_state(model_dir))
    made.bind(cfg)
    device = pick_device(device_choice)
    check_memory(cfg.model, "inference", device)
    model = build_model(cfg.model, provided=made.provides, training=False)
    ckpt.load_weights(model, ckpt.read_weights(ckpt.find_weights(model_dir)), str(model_dir))
    model.to(device)
    return FinetunedRun(model_dir, cfg, made, model, device)


def infer(model_dir: Path, test_path: Path, output: Path | None, probabilities: bool | None = None,
          batch_size: int = 64, device_choice: str = "auto", task: str | None = None,
          task_options: Sequence[str] = (), window: int | None = None) -> Path:
    """Predict with a fine-tuned run directory on its task's input file (labels optional).

    The run is loaded by :func:`load_finetuned` (``task``, ``task_options``: see there). A task that
    streams (``Task.read_windows``) is read, predicted and written ``window`` (default ``INFER_WINDOW``)
    examples at a time (rounded up to whole batches), so memory stays flat whatever the input's length."""
    run = load_finetuned(model_dir, task, task_options, device_choice)
    cfg, made, model, device = run.cfg, run.task, run.model, run.device
    output = output or run.run_dir / made.predictions_file
    want_probs = made.cfg.probabilities if probabilities is None else probabilities
    progress = "infer" if cfg.train.progress else None
    windows = made.read_windows(test_path, window_size(batch_size, window or INFER_WINDOW))
    if windows is None:  # the task needs its whole input at once (Task.read_windows says why)
        instances = made.read(test_path, with_labels=False)
        predictions = made.predict(model, instances, batch_size, device, progress)
        made.write_predictions(output, predictions, instances, want_probs)
        count = made.num_predictions(instances)
    else:
        count = stream_predictions(made, model, windows, output, want_probs, batch_size, device, progress)
    info(f"wrote {count:,} predictions to {output}")
    return output


def evaluate_file(model_dir: Path, source: Path | dict[str, Path], batch_size: int | None = None,
                  device_choice: str = "auto", task: str | None = None, task_options: Sequence[str] = ()
                  ) -> dict[str, float]:
    """The task metrics of a fine-tuned run on a labelled input (``pentad evaluate``): the run loaded as
    inference loads it (:func:`load_finetuned`), the input read with its labels, then ``Task.evaluate``
    against ``Task.gold``, the evaluation fine-tuning scores dev and test with; ``batch_size`` None:
    fine-tuning's evaluation batch size (``train.batch_size`` x 2). ``source``: one file
    (``data.test=FILE``), or for a task reading one file per dataset (``Task.named_inputs``: multi_task)
    ``{dataset name: file}`` (``data.test.NAME=FILE``)."""
    named = dict(source) if isinstance(source, dict) else {"": source}
    for name, path in named.items():
        key = f"data.test.{name}" if name else "data.test"
        if not Path(path).exists():
            raise UserError(f"{key}={path} does not exist; pentad evaluate needs a labelled input file of the "
                            "run's task (the format of its dev file)")
    run = load_finetuned(model_dir, task, task_options, device_choice)
    cfg, made = run.cfg, run.task
    if isinstance(source, dict) and not made.named_inputs:
        raise UserError(f"data.test.NAME=FILE is for a task that reads one file per dataset (multi_task); "
                        f"{run.run_dir} is a {made.cfg.type} run, which reads one file: give data.test=FILE")
    if not isinstance(source, dict) and made.named_inputs:
        raise UserError(f"{run.run_dir} is a {made.cfg.type} run, which scores each dataset on its own labelled "
                        f"file: give data.test.NAME=FILE for the datasets to score, not data.test={source}")
    instances = made.read(source, with_labels=True)
    batch_size = batch_size or cfg.train.batch_size * 2
    return made.evaluate(run.model, instances, made.gold(instances), batch_size, run.device,
                         progress="evaluate" if cfg.train.progress else None)


def stream_predictions(task: Task, model: torch.nn.Module, windows: Iterable[Any], output: Path, probabilities: bool,
                       batch_size: int, device: torch.device, progress: str | None) -> int:
    """Predict window after window of the input and write each window's lines as it is done (one
    window in memory at a time), to a temporary file renamed to ``output`` at the end: a bad line or a
    crash part way leaves no predictions file. Returns the number of predictions."""
    count = 0
    with files.atomic_open(output) as f:
        write_lines(f, [task.prediction_header(probabilities)])
        for instances in windows:
            predictions = task.predict(model, instances, batch_size, device, progress)
            write_lines(f, task.prediction_lines(predictions, instances, probabilities))
            count += task.num_predictions(instances)
    return count


def inference_task_config(task_cfg: TaskConfig, options: Sequence[str], model_dir: Path) -> TaskConfig:
    """The run's task config with ``task.KEY=VALUE`` overrides of the options its task lets inference
    change; UserError naming the key when it is not one of them or its value is invalid."""
    from pydantic import ValidationError

    from pentad.config.loader import parse_override, problems_from_validation
    from pentad.errors import ConfigError

    allowed = TASKS.get(task_cfg.type).inference_options
    data = task_cfg.model_dump()
    for text in options:
        keys, value = parse_override(text)
        if len(keys) != 2 or keys[1] not in allowed:
            what = ", ".join(sorted(allowed)) if allowed else "none"
            raise UserError(f"'{text}': pentad infer changes only the decoding options of the run's task "
                            f"({task_cfg.type}: {what}); the rest is what {model_dir} was fine-tuned with")
        data[keys[1]] = value
    try:
        return type(task_cfg).model_validate(data)
    except ValidationError as e:
        raise ConfigError(problems_from_validation(e, data, type(task_cfg), lambda _: "task override"),
                          f"invalid task options for {model_dir}") from None


def default_predictions(model_dir: Path) -> Path:
    """Where ``pentad infer`` writes without ``--output``: the run's task's ``predictions_file`` in the run
    (``predictions.tsv`` when the run cannot be read: the command's own checks report why)."""
    try:
        model_dir = search.resolve_model(model_dir, quiet=True)
        cfg, _ = load_run(model_dir)
    except (UserError, OSError):
        return model_dir / Task.predictions_file
    return model_dir / (TASKS.get(cfg.task.type).predictions_file if cfg.task is not None else Task.predictions_file)


def read_task_state(run_dir: Path) -> dict[str, Any]:
    """The task state a fine-tuned run saved (``labels.json``)."""
    path = run_dir / layout.LABELS
    if not path.is_file():
        raise UserError(f"{run_dir} has no {layout.LABELS}; was fine-tuning interrupted before it began?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); it holds the task's state (labels), written by "
                        "pentad finetune") from None
