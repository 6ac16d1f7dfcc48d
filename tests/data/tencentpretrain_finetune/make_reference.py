"""Regenerate the TencentPretrain whole-run fine-tuning references in this folder (not run by the test suite).

Usage::

    python tests/data/tencentpretrain_finetune/make_reference.py TENCENTPRETRAIN_CHECKOUT [--extra-path DIR] [CASE ...]

TENCENTPRETRAIN_CHECKOUT is a checkout of TencentPretrain's public repository (``finetune/`` and the
``tencentpretrain`` package; made against commit ed79843); its Python requirements (torch, six) must be
importable, and for ``ner_crf`` also ``torchcrf`` (PyPI ``pytorch-crf``), e.g. installed with
``pip install --target DIR pytorch-crf`` and given as ``--extra-path DIR``. The run is forced onto the
CPU (``CUDA_VISIBLE_DEVICES`` empty) with one thread; running the script twice writes identical files.

It writes, next to itself:

* ``vocab.txt``: [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0..4) and 100 common CJK characters;
* ``config.json``: TencentPretrain's ``models/bert/base_config.json`` shrunk (hidden 32, 4 heads, 2 layers,
  feed-forward 32 * 2, 32 positions, dropout 0.0); written from ``BERT_BASE`` where the checkout lacks it;
* synthetic data sets drawn from ``random.Random(DATA_SEED)`` (99 training and 30 dev rows each):
  ``classification/`` (3 labels, the label's marker characters among filler), ``pair/`` (2 labels, given
  by markers in text_b), ``ner/`` (BIO tags for PER and LOC, ``label2id.json`` without [PAD]);
* per case (``CASES``), ``CASE.safetensors``: the initial weights under ``state.NAME`` (exactly the keys
  of the model.bin TencentPretrain loaded, which are all of its model's state), ``losses`` (float64
  [steps], each step's ``loss.item()``), ``lrs`` (float64 [steps], the learning rate of the step:
  ``param_groups[0]["lr"]`` before its ``optimizer.step()``), ``dev`` (float64 [epochs], accuracy for the
  classifier, f1 for ner, after each epoch), ``order`` (int64 [epochs, rows], the training file's row
  indices, 0-based after the header, in the order each epoch visits them) and JSON metadata (case,
  script, the command line given to TencentPretrain with paths relative to this folder, the
  hyper-parameters, train_steps, commit, torch version).

How: for each case TencentPretrain's own ``main()`` of ``finetune/run_classifier.py`` or
``finetune/run_ner.py`` runs in-process with ``sys.argv`` set. A first, aborted run captures the model its
``main()`` builds; ``trained_like`` (from ``tencentpretrain_reference/make_reference.py``, seed
``WEIGHT_SEED``) gives every parameter, the new head's included, deterministic values, written to
model.bin; the second run loads that with ``--pretrained_model_path`` and the script checks that every
entry of the model's state equals the file's. The module globals ``train_model``/``train``, ``evaluate``
and ``random`` are wrapped to record losses, rates, dev metrics and the data order.

What a faithful reimplementation must reproduce (found reading the code at ed79843, the checks marked
"asserted" are made by this script on every run):

* Hyper-parameters: ``load_hyperparam`` gives defaults < config file < command line (a key counts as on the
  command line when ``--key`` is a separate argv item; ``--key=value`` breaks it). The config's
  ``dropout`` (0.0) applies since ``--dropout`` is not given (asserted: every nn.Dropout has p 0).
  ``layernorm_eps`` is not in the BERT config: 1e-6, LayerNorm is ``gamma * (x - mean) / (x.std() + eps) +
  beta`` with the unbiased std and eps outside the root.
* Data order: ``set_seed(seed)`` (``random.seed``, numpy, torch) runs before the model is built; nothing
  consumes Python's ``random`` before the first ``random.shuffle(trainset)`` (asserted: the state there is
  ``random.Random(seed)``'s), and each epoch shuffles the already shuffled list again, so the order is
  ``rng = random.Random(seed); idx = list(range(n)); for epoch: rng.shuffle(idx)`` (asserted).
* Batches: consecutive slices of ``batch_size`` and the last partial batch kept (99 rows, 8 a batch: 12
  of 8 and one of 3 per epoch, 26 steps in 2 epochs). ``train_steps = int(rows * epochs / batch_size) + 1``
  = 25, fewer than the 26 steps that run.
* Optimiser: TencentPretrain's AdamW with ``correct_bias=False`` (no bias correction), betas (0.9, 0.999),
  eps 1e-6 added to ``sqrt(v)``; weight decay 0.01 for parameters whose name contains none of "bias",
  "gamma", "beta" (0 for those), applied after the Adam update as ``p -= lr * 0.01 * p`` (on the updated p).
* Schedule: linear, ``LambdaLR`` with warmup = ``train_steps * warmup`` = 2.5 (a float, not rounded):
  the step with index t (0-based) uses ``lr * t / 2.5`` for t < 2.5, else
  ``lr * max(0, (25 - t) / (25 - 2.5))``; step 0 runs with lr 0 (its Adam moments still update) and the
  26th step (t = 25) with lr 0 too.
* Loss per step: the mean over the batch (the last batch of 3 rows is a mean over 3); ``model.zero_grad()``
  before each step, no gradient clipping, fp32.
* Classifier inputs: ``[CLS] + tokens(text_a) + [SEP]`` (segment 1), pairs ``+ tokens(text_b) + [SEP]``
  (segment 2), then cut to seq_length (a cut text loses its final [SEP]; a cut pair is cut at the end, in
  text_b, or in text_a with text_b gone), padded with [PAD] and segment 0. The BERT tokenizer splits CJK
  characters one by one. Head: pooling ("first": position 0) -> tanh(output_layer_1) -> output_layer_2,
  loss NLL of log_softmax. Attention masks keys with segment 0 by adding -10000.
* NER inputs: space-separated characters, no [CLS]/[SEP]; ``[PAD]`` is appended to label2id as the last
  class (id = len(label2id)), padded positions get that tag and segment 0; a text longer than seq_length is
  cut. Softmax loss: ``sum(seg_mask * -log_softmax(logits)[tag]) / (sum(seg_mask) + 1e-6)`` over the whole
  batch's tokens (padding masked, so the [PAD] class is never a target but is still in the softmax).
* CRF (``--crf_target``): torchcrf ``CRF(labels_num incl. [PAD], batch_first=True)`` with mask = segment
  != 0, on ``log_softmax(logits, -1)`` (not the raw logits): loss = ``-mean over rows of the CRF
  log-likelihood`` (reduction "mean": per sequence, not per token). Its start/end/transition parameters
  are named ``crf.start_transitions``, ``crf.end_transitions``, ``crf.transitions``.
* Evaluation each epoch on the dev file, in eval mode (no effect with dropout 0), and the best model saved
  (not used here). With 26 steps both ner cases still score f1 0 on dev (the tagger predicts O); the
  classifiers reach 0.63 and 0.73 accuracy.

To read the initial weights in pentad, write ``torch.save`` of the ``state.*`` tensors as model.bin next to
config.json and vocab.txt (and ner's label2id.json) and run ``pentad convert tencentpretrain-to-pentad``.
label2id.json has no [PAD] while the tagger has 6 rows, so the conversion keeps the 6 rows but names the
labels 0..5; with ``"[PAD]": 5`` added to the file it names them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # TencentPretrain picks cuda when it sees one

import torch  # noqa: E402
from safetensors.torch import save  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tencentpretrain_reference"))
from make_reference import trained_like  # noqa: E402

COMMIT = "ed79843"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIAL_TOKENS_MAP = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                      "mask_token": "[MASK]", "sentinel_token": "[unused1]"}
CHARS = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小"
         "么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知")
assert len(CHARS) == 100 and len(set(CHARS)) == 100
# markers: classification labels 0/1/2, pair labels 0/1 (in text_b), NER person and location characters
CLS_MARKERS = (CHARS[0:8], CHARS[8:16], CHARS[16:24])
PAIR_MARKERS = (CHARS[24:32], CHARS[32:40])
PER_CHARS, LOC_CHARS = CHARS[40:50], CHARS[50:60]
FILLER = CHARS[60:]
BERT_BASE = {"emb_size": 768, "feedforward_size": 3072, "hidden_size": 768, "hidden_act": "gelu",
             "heads_num": 12, "layers_num": 12, "max_seq_length": 512, "dropout": 0.1, "data_processor": "bert",
             "embedding": ["word", "pos", "seg"], "encoder": "transformer", "mask": "fully_visible",
             "target": ["mlm", "sp"], "tie_weights": True, "layernorm_positioning": "post"}
SHRINK = {"emb_size": 32, "hidden_size": 32, "heads_num": 4, "layers_num": 2, "feedforward_size": 64,
          "max_seq_length": 32, "dropout": 0.0}
NER_LABELS = {"O": 0, "B-PER": 1, "I-PER": 2, "B-LOC": 3, "I-LOC": 4}
RUN = {"seq_length": 24, "batch_size": 8, "epochs_num": 2, "learning_rate": 1e-3, "warmup": 0.1, "seed": 7}
TRAIN_ROWS, DEV_ROWS = 99, 30
DATA_SEED, WEIGHT_SEED = 2024, 11
# case -> (script, data folder, extra command-line arguments)
CASES = {
    "classification": ("run_classifier", "classification", ["--pooling", "first"]),
    "pair": ("run_classifier", "pair", ["--pooling", "first"]),
    "ner": ("run_ner", "ner", []),
    "ner_crf": ("run_ner", "ner", ["--crf_target"]),
}


# ---------------------------------------------------------------- files


def write_vocab_and_config(checkout: Path) -> None:
    (HERE / "vocab.txt").write_text("".join(t + "\n" for t in SPECIALS + list(CHARS)), encoding="utf-8")
    shipped = checkout / "models" / "bert" / "base_config.json"
    config = json.loads(shipped.read_text(encoding="utf-8")) if shipped.exists() else dict(BERT_BASE)
    config.update(SHRINK)
    (HERE / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def marked_text(rng: random.Random, markers: str, low: int, high: int) -> str:
    """low..high characters, about a third of them the markers, the rest filler."""
    return "".join(rng.choice(markers) if rng.random() < 0.35 else rng.choice(FILLER)
                   for _ in range(rng.randint(low, high)))


def classification_rows(rng: random.Random, n: int) -> list[str]:
    rows = ["label\ttext_a"]
    for _ in range(n):
        label = rng.randrange(3)
        rows.append(f"{label}\t{marked_text(rng, CLS_MARKERS[label], 5, 40)}")
    return rows


def pair_rows(rng: random.Random, n: int) -> list[str]:
    rows = ["label\ttext_a\ttext_b"]
    for _ in range(n):
        label = rng.randrange(2)
        text_a = "".join(rng.choice(FILLER) for _ in range(rng.randint(3, 20)))
        rows.append(f"{label}\t{text_a}\t{marked_text(rng, PAIR_MARKERS[label], 3, 20)}")
    return rows


def ner_rows(rng: random.Random, n: int) -> list[str]:
    rows = ["text_a\tlabel"]
    for _ in range(n):
        length = rng.randint(5, 40)
        chars, tags = [], []
        while len(chars) < length:
            if rng.random() < 0.2 and length - len(chars) >= 2:
                kind, pool = rng.choice((("PER", PER_CHARS), ("LOC", LOC_CHARS)))
                span = rng.randint(2, min(4, length - len(chars)))
                chars += [rng.choice(pool) for _ in range(span)]
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (span - 1)
            else:
                chars.append(rng.choice(FILLER))
                tags.append("O")
        rows.append(" ".join(chars) + "\t" + " ".join(tags))
    return rows


def write_datasets() -> None:
    rng = random.Random(DATA_SEED)
    for folder, make in (("classification", classification_rows), ("pair", pair_rows), ("ner", ner_rows)):
        (HERE / folder).mkdir(exist_ok=True)
        for split, n in (("train", TRAIN_ROWS), ("dev", DEV_ROWS)):
            (HERE / folder / f"{split}.tsv").write_text("\n".join(make(rng, n)) + "\n", encoding="utf-8")
    (HERE / "ner" / "label2id.json").write_text(json.dumps(NER_LABELS, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- running TencentPretrain


class _Built(Exception):
    def __init__(self, model):
        super().__init__("model built")
        self.model = model


@contextlib.contextmanager
def patched(module, **replacements):
    old = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(module, name, value)


def command_line(case: str, weights: bool, work: Path) -> tuple[list[str], list[str]]:
    """TencentPretrain's argv for ``case`` and the same with paths relative to this folder (metadata);
    model.bin and the fine-tuned output live in the temporary ``work`` folder."""
    script, folder, extra = CASES[case]
    data = {"--config_path": "config.json", "--vocab_path": "vocab.txt",
            "--train_path": f"{folder}/train.tsv", "--dev_path": f"{folder}/dev.tsv"}
    if script == "run_ner":
        data["--label2id_path"] = f"{folder}/label2id.json"
    outputs = {"--output_model_path": "finetuned_model.bin"}
    if weights:
        outputs["--pretrained_model_path"] = "model.bin"
    argv, shown = [f"{script}.py"], [f"finetune/{script}.py"]
    for paths, base in ((data, HERE), (outputs, work)):
        for flag, rel in paths.items():
            argv += [flag, str(base / rel)]
            shown += [flag, rel]
    rest = ["--log_level", "ERROR"]
    for key, value in RUN.items():
        rest += [f"--{key}", str(value)]
    rest += extra
    return argv + rest, shown + rest


def build_model(module, case: str, work: Path):
    argv, _ = command_line(case, False, work)
    sys.argv = argv
    def capture(args, model):
        raise _Built(model)
    try:
        with patched(module, load_or_initialize_parameters=capture):
            module.main()
    except _Built as built:
        return built.model
    raise RuntimeError(f"{case}: TencentPretrain's main() did not build a model")


def run_case(case: str, work: Path) -> None:
    script = CASES[case][0]
    module = importlib.import_module(f"finetune.{script}")
    model = build_model(module, case, work)
    trained_like(model, WEIGHT_SEED)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(initial, work / "model.bin")

    losses, lrs, dev, orders = [], [], [], []
    info = {}
    real_load, real_evaluate = module.load_or_initialize_parameters, module.evaluate
    real_step = module.train_model if script == "run_classifier" else module.train

    def load(args, model):
        real_load(args, model)
        state = model.state_dict()
        if set(state) != set(initial) or not all(torch.equal(state[k], initial[k]) for k in state):
            raise RuntimeError(f"{case}: the model's state after loading model.bin differs from the file")
        dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        if not dropouts or any(p != 0.0 for p in dropouts):
            raise RuntimeError(f"{case}: dropout is not 0 everywhere: {dropouts}")
        info["loaded"] = len(state)

    def step(args, model, optimizer, scheduler, *batch):
        rates = {group["lr"] for group in optimizer.param_groups}
        if len(rates) != 1:
            raise RuntimeError(f"{case}: parameter groups with different rates {rates}")
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        loss = real_step(args, model, optimizer, scheduler, *batch)
        losses.append(float(loss.item()))
        info["train_steps"] = args.train_steps
        return loss

    def evaluate(args, dataset):
        result = real_evaluate(args, dataset)
        dev.append(float(result[0] if isinstance(result, tuple) else result))
        return result

    expected = random.Random(RUN["seed"])
    current = list(range(TRAIN_ROWS))

    def shuffle(x):
        if not orders and random.getstate() != expected.getstate():
            raise RuntimeError(f"{case}: Python's random was consumed between set_seed and the first shuffle")
        state = random.getstate()
        raw = list(range(len(x)))
        random.shuffle(raw)
        random.setstate(state)
        before = list(x)
        random.shuffle(x)
        if x != [before[i] for i in raw]:
            raise RuntimeError(f"{case}: the shuffle could not be replayed")
        current[:] = [current[i] for i in raw]
        orders.append(list(current))
        simulated = list(range(TRAIN_ROWS))
        replay = random.Random(RUN["seed"])
        for _ in orders:
            replay.shuffle(simulated)
        if simulated != current:
            raise RuntimeError(f"{case}: the order is not successive shuffles from random.Random(seed)")

    argv, shown = command_line(case, True, work)
    sys.argv = argv
    step_name = "train_model" if script == "run_classifier" else "train"
    with patched(module, load_or_initialize_parameters=load, evaluate=evaluate, random=_Shuffler(shuffle),
                 **{step_name: step}):
        module.main()
    if info.get("loaded") is None or len(dev) != RUN["epochs_num"]:
        raise RuntimeError(f"{case}: the run did not load the weights or evaluate each epoch")
    write_reference(case, model_state=initial, losses=losses, lrs=lrs, dev=dev, orders=orders, argv=shown,
                    train_steps=info["train_steps"])


class _Shuffler:
    """Stands in for the ``random`` module in a fine-tuning script, which only calls ``shuffle``."""

    def __init__(self, shuffle):
        self.shuffle = shuffle


def write_reference(case: str, model_state: dict, losses, lrs, dev, orders, argv, train_steps) -> None:
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in model_state.items():
        ident = value.data_ptr()
        if ident in first:
            aliases[key] = first[ident]
            continue
        first[ident] = key
        tensors[f"state.{key}"] = value.contiguous()
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["lrs"] = torch.tensor(lrs, dtype=torch.float64)
    tensors["dev"] = torch.tensor(dev, dtype=torch.float64)
    tensors["order"] = torch.tensor(orders, dtype=torch.int64)
    script, folder, extra = CASES[case]
    metadata = {
        "case": case, "script": f"finetune/{script}.py", "argv": json.dumps(argv), "data": folder,
        "hyperparameters": json.dumps({**RUN, "pooling": "first" if script == "run_classifier" else None,
                                       "crf": "--crf_target" in extra}),
        "train_steps": str(train_steps), "steps": str(len(losses)), "state_order": json.dumps(list(model_state)),
        "aliases": json.dumps(aliases), "weight_seed": str(WEIGHT_SEED), "tencentpretrain_commit": COMMIT,
        "torch": torch.__version__.split("+")[0],
    }
    save_deterministic(tensors, HERE / f"{case}.safetensors", metadata)
    size = (HERE / f"{case}.safetensors").stat().st_size
    print(f"{case}: {len(losses)} steps (train_steps {train_steps}), loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"dev {dev}, {size / 1024:.0f} KiB")


def save_deterministic(tensors: dict, path: Path, metadata: dict) -> None:
    """safetensors' save, with the metadata keys sorted: the library writes them in hash order, which
    changes from run to run."""
    blob = save(tensors, metadata=metadata)
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    header = {"__metadata__": dict(sorted(header.pop("__metadata__").items())), **header}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + size:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of TencentPretrain's repository")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="a folder put on sys.path (e.g. where pytorch-crf is installed)")
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_intermixed_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    checkout = args.checkout.resolve()
    for extra in args.extra_path:
        sys.path.insert(0, str(Path(extra).resolve()))
    sys.path.insert(0, str(checkout))
    torch.set_num_threads(1)
    write_vocab_and_config(checkout)
    write_datasets()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # tencentpretrain.utils.constants reads models/special_tokens_map.json from the working directory at
        # import; use the checkout's where it has one, else the map TencentPretrain ships.
        (work / "models").mkdir()
        shipped = checkout / "models" / "special_tokens_map.json"
        if shipped.exists():
            shutil.copy(shipped, work / "models" / "special_tokens_map.json")
        else:
            (work / "models" / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS_MAP), encoding="utf-8")
        cwd = os.getcwd()
        os.chdir(work)
        try:
            for case in args.cases:
                run_case(case, work)
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    main()
