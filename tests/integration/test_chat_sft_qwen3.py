"""A converted tiny Qwen3 fine-tuned on multi-turn conversations and talked to: Hugging Face checkpoint ->
``pentad convert`` -> ``pentad preprocess init=RUN`` (the llm_sft objective through the model's own chat
template) -> ``pentad pretrain init=RUN`` -> ``pentad chat``. The labels score the assistant turns alone,
and the fine-tuned model answers the question it was trained on."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.unit.data.chat_fixtures import CHATML, CONVERSATION, build_tokenizer  # noqa: E402

from pentad.cli.main import main  # noqa: E402
from pentad.components.base import IGNORE_INDEX  # noqa: E402
from pentad.data.objectives import LlmSftObjective  # noqa: E402
from pentad.data.shards import ShardDataset  # noqa: E402
from pentad.runs import load_run  # noqa: E402
from pentad.training.trainer import MetricsLog  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_multi_turn_sft_on_a_converted_qwen3_then_chat(tmp_path, monkeypatch, capsys):
    hf = tmp_path / "hf"
    # a table padded past the tokenizer's 400 ids, as Qwen's checkpoints are
    build_tokenizer(hf)
    vocab = 416
    config = transformers.Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(hf)
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>",
                                                          "pad_token": "<|endoftext|>"}), encoding="utf-8")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": CONVERSATION}) + "\n" for _ in range(16)), encoding="utf-8")
    base, data, sft = tmp_path / "qwen3", tmp_path / "ds", tmp_path / "sft"

    assert main(["convert", "hf-to-pentad", str(hf), str(base), "--verify"]) == 0
    assert main(["preprocess", f"init={base}", "data.objective.type=llm_sft", "data.objective.seq_length=96",
                 f"data.corpus={chat}", f"data.output={data}"]) == 0
    assert main(["pretrain", f"init={base}", f"data.dataset={data}", "train.steps=60", "train.batch_size=4",
                 "train.lr=1e-2", "train.progress=false", "train.log_every=1", "train.plot=false",
                 f"output={sft}"]) == 0

    # what was trained on: the two assistant replies and their end tokens, nothing of the prompt
    cfg, tok = load_run(sft)
    assert cfg.model.encoder.qk_norm == "before_rotary"  # Qwen3's own attention, rebuilt from the run
    objective = LlmSftObjective(cfg.data.objective, tok)
    batch = objective.collate(ShardDataset(data).take(np.arange(2)), np.random.default_rng(0))
    for row in range(2):
        labels = batch.labels["lm"][row]
        scored = tok.decode(labels[labels != IGNORE_INDEX].tolist())
        assert scored == "Paris.<|im_end|>\nRome, the city of seven hills.<|im_end|>\n"
        assert "What is the capital" in tok.decode(batch.tokens[row].tolist())
    losses = [r["loss"] for r in MetricsLog(sft / "metrics.jsonl").read() if "loss" in r]
    assert len(losses) == 60 and losses[-1] < 0.2 < 5 < losses[0]

    # and it talks: the conversation's first question gets the reply it was trained on
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n/exit\n"))
    assert main(["chat", str(sft), "--greedy", "--max-new-tokens", "8", "--system", "Answer briefly."]) == 0
    assert capsys.readouterr().out.strip() == "Paris."
