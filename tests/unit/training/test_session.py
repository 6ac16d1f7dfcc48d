"""training.session: why the weights of a compressed ``init=`` run do not fit the model being built."""

from __future__ import annotations

from pentad.assembly import load_config
from pentad.config.model import CompressionConfig
from pentad.runs import prepare_run_dir
from pentad.training.session import _compressed_init_error


def test_a_pruned_init_run_is_named_with_the_config_that_fits_it(tmp_path):
    cfg = load_config("bert/tiny", ["model.vocab_size=50"])
    plain = tmp_path / "plain"
    prepare_run_dir(plain, cfg.model_copy(deep=True), None)
    assert _compressed_init_error(plain, cfg.model) is None  # not compressed: the mismatch message stands
    pruned = tmp_path / "pruned"
    cfg.model.compression = CompressionConfig(heads={"encoder.layers.0.attention": 1}, ffn={"encoder.layers.1.ffn": 8})
    prepare_run_dir(pruned, cfg.model_copy(deep=True), None)
    assert _compressed_init_error(pruned, cfg.model) is None  # compressed alike: not the reason
    error = _compressed_init_error(pruned, load_config("bert/tiny", ["model.vocab_size=50"]).model)
    assert str(error) == (
        f"init={pruned} is a compressed run (attention heads pruned in 1 block(s), feed-forward units pruned in 1 "
        f"block(s); model.compression in {pruned / 'config.yaml'}): its weights fit only a model compressed the same "
        f"way, and this config's model is not. Fine-tune it with its own model, which records the pruned sizes: "
        f"leave the model out of the config (init={pruned} then takes the run's), or --config "
        f"{pruned / 'config.yaml'}.")
