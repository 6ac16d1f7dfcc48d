"""bench/speech_throughput.py --quick: the pentad and Hugging Face models have the same parameters,
both decode the same forced number of tokens, every row reports a positive rate, the JSON file holds
the versions and the device, and an unknown shape is refused with the list of shapes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "speech_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_speech_throughput", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_quick_run_compares_equal_models_and_writes_json(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "speech.json"
    report = bench.main(["--quick", "--cpu-only", "--threads", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["torch"] and report["transformers"] and report["quick"] is True
    assert set(report["shapes"]) == set(bench.available()) and "s2t-small" in report["shapes"]
    for shape, entry in report["shapes"].items():
        cpu = entry["devices"]["cpu"]
        assert cpu["device"]
        params = cpu["train"]["parameters"]
        assert min(params.values()) > 0
        if shape == "s2t-small":  # the same model (Whisper: pentad keeps the key biases HF leaves out)
            assert params["pentad"] == params["hf"]
        assert [(d["batch"], d["new_tokens"]) for d in cpu["decode"]] == [(2, 4)]
        assert cpu["feature_headroom"] > 0
        for rates in (entry["features"]["utterances_per_s"], entry["features"]["x_real_time"],
                      cpu["train"]["tokens_per_s"], cpu["decode"][0]["rtf"]):
            assert set(rates) == {"pentad", "hf"} and min(rates.values()) > 0
    assert "| s2t-small | cpu | train step" in capsys.readouterr().out


def test_unknown_shape_is_refused_with_the_available_ones(capsys):
    with pytest.raises(SystemExit):
        _bench().parse(["--shapes", "s2t-huge"])
    assert "unknown shape(s) s2t-huge; available in this checkout: s2t-small" in capsys.readouterr().err
