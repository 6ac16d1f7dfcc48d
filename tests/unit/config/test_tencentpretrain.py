import pytest

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.errors import UserError
from pentad.model import count_parameters


@pytest.mark.parametrize("name", ["bert/base_config.json", "bert/large_config.json", "bert/tiny_config.json",
                                  "bert/mini_config.json", "bert/small_config.json", "bert/medium_config.json",
                                  "bert/xlarge_config.json", "gpt2/config.json", "gpt2/distil_config.json",
                                  "gpt2/medium_config.json", "gpt2/large_config.json", "gpt2/xlarge_config.json",
                                  "xlm-roberta/base_config.json", "xlm-roberta/large_config.json"])
def test_tencentpretrain_configs_import(shared_data, name):
    cfg = load_config(shared_data / "configs" / name, ["vocab_size=1000"])
    model = build_model(cfg.model, device="meta")
    assert count_parameters(model) > 0


def test_bert_base_import_matches_the_tencentpretrain_architecture(shared_data):
    cfg = load_config(shared_data / "configs/bert/base_config.json", ["vocab_size=21128"])
    m = cfg.model
    assert (m.hidden_size, m.encoder.num_layers, m.encoder.num_heads, m.encoder.ffn_size) == (768, 12, 12, 3072)
    assert [p.type for p in m.embedding.parts] == ["word", "pos", "seg"]
    assert [t.type for t in m.targets] == ["mlm", "sp"]
    assert m.tie_word_embeddings and m.encoder.mask == "bidirectional" and m.encoder.norm_position == "post"
    assert cfg.data.objective.type == "bert"


def test_gpt2_import(shared_data):
    cfg = load_config(shared_data / "configs/gpt2/config.json", ["vocab_size=50257"])
    m = cfg.model
    assert m.encoder.mask == "causal" and m.encoder.norm_position == "pre" and m.embedding.norm is False
    assert m.encoder.activation == "gelu_tanh"
    # TencentPretrain's GPT-2 equals GPT-2 small (124M), counted with the tied output once.
    assert count_parameters(build_model(m, device="meta")) == 124_439_808


def test_vocab_path_sets_the_tokenizer(shared_data):
    vocab = shared_data / "models/google_zh_vocab.txt"
    cfg = load_config(shared_data / "configs/bert/base_config.json", [f"vocab_path={vocab}"])
    assert cfg.tokenizer.type == "wordpiece"


def test_imported_tokenizers_split_literal_special_tokens_as_tencentpretrain_does(shared_data):
    """TencentPretrain's tokenizers have no special-token matching: "[CLS]" typed in the text is
    '[', 'cls', ']' there, so the import chooses special_tokens_in_text: split (overridable)."""
    from pentad.data.tokenizers import load_tokenizer

    vocab = shared_data / "models/google_uncased_en_vocab.txt"
    cfg = load_config(shared_data / "configs/bert/base_config.json", [f"vocab_path={vocab}"])
    assert cfg.tokenizer.special_tokens_in_text == "split"
    tok = load_tokenizer(cfg.tokenizer)
    assert tok.tokenize("a [CLS] b") == ["a", "[", "cl", "##s", "]", "b"]
    gpt2 = load_config(shared_data / "configs/gpt2/config.json",
                       [f"vocab_path={shared_data / 'models/huggingface_gpt2_vocab.txt'}",
                        f"merges_path={shared_data / 'models/huggingface_gpt2_merges.txt'}"])
    assert gpt2.tokenizer.type == "bpe" and gpt2.tokenizer.special_tokens_in_text == "split"
    kept = load_config(shared_data / "configs/bert/base_config.json",
                       [f"vocab_path={vocab}", "tokenizer.special_tokens_in_text=parse"])
    assert kept.tokenizer.special_tokens_in_text == "parse"


def test_unknown_tencentpretrain_key(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"hidden_size": 64, "layers_num": 2, "heads_num": 2, "encoder": "transformer", "bogus": 1}')
    with pytest.raises(UserError, match="'bogus': unknown TencentPretrain config key"):
        load_config(path, ["vocab_size=10"])
