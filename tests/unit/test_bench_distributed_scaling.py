"""``bench/distributed_scaling.py`` without running it: the commands it launches, its arguments, its rate."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "distributed_scaling.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("distributed_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_dry_run_prints_the_real_cli_with_the_same_global_batch(bench, tmp_path, capsys) -> None:
    assert bench.main(["--quick", "--dry-run", "--workdir", str(tmp_path / "w")]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "pretrain --config" in ln]
    assert len(lines) == 8  # 2 models x 4 configurations
    for line in lines:
        assert "train.batch_size=16" in line and "train.steps=6" in line
    single = [ln for ln in lines if ln.startswith("pentad pretrain")]
    launched = [ln for ln in lines if ln.startswith("torchrun --nproc_per_node=2 --master_addr=127.0.0.1")]
    assert len(single) == 4 and len(launched) == 4
    assert sum("train.threads=2 train.strategy=single" in ln for ln in single) == 2
    assert sum("train.threads=1 train.strategy=ddp" in ln for ln in launched) == 2
    assert sum("train.strategy=fsdp" in ln for ln in launched) == 2
    assert not (tmp_path / "w").exists()  # a dry run writes nothing


@pytest.mark.parametrize("argv", [["--batch-size", "15"], ["--steps", "2"], ["--models", "t5"],
                                  ["--configs", "zero"]])
def test_bad_arguments_are_refused(bench, argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_rate_leaves_out_the_first_intervals(bench, tmp_path) -> None:
    records = [{"step": 2, "tokens_per_s": 100.0}, {"step": 4, "tokens_per_s": 1000.0},
               {"step": 4, "dev_loss": 1.0}, {"step": 6, "tokens_per_s": 3000.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rate, intervals = bench.read_rate(tmp_path, skip=1)
    assert intervals == [100.0, 1000.0, 3000.0]
    assert rate == pytest.approx(1500.0)  # equal-step intervals: all tokens over all time
    assert bench.read_rate(tmp_path, skip=3) == (None, intervals)
    assert bench.read_rate(tmp_path / "absent", skip=1) == (None, [])


def test_pool_groups_runs_by_the_other_processes_load(bench, tmp_path, capsys) -> None:
    def run(setup: str, tps: float, others: float) -> dict:
        return {"model": "gpt2", "setup": setup, "tokens_per_s": tps, "others_cores": others}

    first = {"summary": [], "runs": [run("1x2", 3000, 0.1), run("ddp", 3300, 0.0), run("1x2", 1000, 1.2),
                                     run("ddp", 1500, 1.5), run("ddp", 2000, 0.5), run("fsdp", None, 0.0)]}
    second = {"summary": [], "runs": [run("1x2", 1200, 1.0), run("ddp", 1900, 1.1)]}
    paths = [tmp_path / "1.json", tmp_path / "2.json"]
    for path, data in zip(paths, (first, second)):
        path.write_text(json.dumps(data))
    assert bench.main(["--pool", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "pooled over 2 file(s), 7 runs" in out  # the failed run is left out
    assert "| gpt2 | (a) 1 process x 2 threads | 1, 3000, 1.00 | 2, 1100, 1.00 |" in out
    assert "| gpt2 | (c) 2 ranks x 1 thread ddp | 1, 3300, 1.10 | 2, 1700, 1.55 |" in out  # 0.5 cores: neither
