"""Models by name (``pentad convert hf-to-pentad ORG/NAME``, ``init=hf:NAME``) from a Hugging Face cache
built here, with the Hub unreachable (``HF_HUB_OFFLINE``): what a user with a cached model, or on a
machine without the network, gets."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
hub_constants = pytest.importorskip("huggingface_hub.constants")

from pentad.cli.main import main  # noqa: E402
from pentad.interop import hub  # noqa: E402
from pentad.runs import load_run  # noqa: E402
from pentad.training.checkpoint import find_weights, read_weights  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"
NAME = "test-org/tiny-bert"


@pytest.fixture
def cached(english, tmp_path, monkeypatch):
    """A Hugging Face cache holding NAME at COMMIT (its branch main), the Hub offline, pentad's cache apart;
    returns the snapshot folder."""
    cache = tmp_path / "hf-cache"
    repo = cache / ("models--" + NAME.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    vocab = english["vocab"].read_text(encoding="utf-8").split()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(snapshot)
    (snapshot / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (snapshot / "tokenizer_config.json").write_text('{"do_lower_case": true}', encoding="utf-8")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("PENTAD_CACHE", str(tmp_path / "pentad-cache"))
    return snapshot


def test_names_and_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_name("Qwen/Qwen3-0.6B") and hub.is_hub_name("hf:gpt2") and hub.is_hub_name("org/name@v1")
    (tmp_path / "runs" / "bert").mkdir(parents=True)
    assert not hub.is_hub_name("runs/bert")  # a local directory of that name wins
    assert not hub.is_hub_name("gpt2") and not hub.is_hub_name("a/b/c")
    assert hub.parse("hf:org/name@v2") == ("org/name", "v2")
    assert hub.parse("org/name", "abc") == ("org/name", "abc")
    with pytest.raises(Exception, match="names revision 'v2' and --revision gives 'v3'"):
        hub.parse("org/name@v2", "v3")


def test_convert_a_cached_model_by_name(cached, tmp_path, capsys):
    direct, named, pinned = tmp_path / "direct", tmp_path / "named", tmp_path / "pinned"
    assert main(["convert", "hf-to-pentad", str(cached), str(direct)]) == 0
    assert main(["convert", "hf-to-pentad", NAME, str(named)]) == 0
    assert f"{NAME}: {cached}" in capsys.readouterr().out
    assert main(["convert", "hf-to-pentad", f"hf:{NAME}", str(pinned), "--revision", COMMIT]) == 0
    a, b, c = (read_weights(find_weights(run)) for run in (direct, named, pinned))
    assert a.keys() == b.keys() == c.keys() and all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    assert load_run(named)[0].model == load_run(direct)[0].model


def test_a_model_missing_offline_is_one_clear_error(cached, tmp_path, capsys):
    assert main(["convert", "hf-to-pentad", "test-org/absent", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "test-org/absent is not in the Hugging Face cache" in err and "HF_HUB_OFFLINE is set" in err
    assert "hf download test-org/absent" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert main(["convert", "hf-to-pentad", NAME, str(tmp_path / "out"), "--revision", "f" * 40]) == 2
    assert f"{NAME} at revision {'f' * 40} is not in the Hugging Face cache" in capsys.readouterr().err
    assert main(["convert", "pentad-to-hf", str(cached), str(tmp_path / "x"), "--revision", "v1"]) == 2
    assert "--revision applies to hf-to-pentad of a Hugging Face Hub name" in capsys.readouterr().err


def test_init_from_a_hub_name_converts_once_and_finetunes(cached, english, tmp_path):
    args = ["finetune", "--task", "classification", f"init=hf:{NAME}", f"data.train={english['train']}",
            "train.epochs=1", "train.batch_size=8", "train.progress=false", "train.plot=false"]
    assert main([*args, f"output={tmp_path / 'ft1'}"]) == 0
    converted = tmp_path / "pentad-cache" / "hub" / "test-org--tiny-bert" / COMMIT
    assert (converted / "config.yaml").is_file()
    assert [p.name for p in converted.parent.iterdir()] == [COMMIT]  # no staging folder left behind
    written = (converted / "config.yaml").stat().st_mtime_ns
    assert main([*args, f"output={tmp_path / 'ft2'}"]) == 0
    assert (converted / "config.yaml").stat().st_mtime_ns == written  # converted once
    for run in ("ft1", "ft2"):
        assert (tmp_path / run / "results.json").is_file()
