"""The Hugging Face families are declarations: every family module is registered, detection and
dispatch read the declarations and name no family, and each pentad model has exactly one family."""

import ast
import pkgutil
from pathlib import Path

import pytest

import pentad
from pentad.assembly import load_config
from pentad.components.model_config import model_config_class
from pentad.config.loader import zoo_names
from pentad.interop import hf
from pentad.interop.hf import HFFamily, KeyLayout
from pentad.interop.hf.families import describing, families, family_names, guess_family, guess_layout, registered

from .helpers import PENTAD_MODELS

# Modules of the package that are not families: the registry itself and shared helpers.
NOT_FAMILIES = {"families", "sbert"}
SRC = Path(pentad.__file__).parent
# Where detection and dispatch happen: these files must not branch on a family.
DISPATCH = ["interop/convert.py", "interop/verify.py", "interop/hf/__init__.py", "interop/hf/families.py",
            "cli/convert.py"]
# Literals there that spell a family's name but mean something else.
HOMONYMS = {
    ("interop/convert.py", "clip"): "task.normalise: clip, CLIP's pixel statistics",
    ("interop/convert.py", "whisper"): "the CTranslate2 directions, which read Whisper models only",
    ("interop/hf/__init__.py", "t5"): "a SentencePiece id layout a family declares (spm_layout)",
    ("interop/hf/__init__.py", "pegasus"): "a SentencePiece id layout a family declares (spm_layout)",
}


def test_every_family_module_is_registered():
    modules = {m.name for m in pkgutil.iter_modules(hf.__path__)} - NOT_FAMILIES
    assert set(registered()) == modules
    for module, family in registered().items():
        assert type(family).__module__ == f"{hf.__name__}.{module}", module
        assert family.name and family.model_types, module
        assert "describes" in vars(type(family)), f"{module} declares no describes()"
    types = [t for family in registered().values() for t in family.model_types]
    assert len(types) == len(set(types)) and family_names() == sorted(types) == sorted(families())


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


@pytest.mark.parametrize("path", DISPATCH)
def test_detection_and_dispatch_name_no_family(path):
    names = {f.name for f in registered().values()} | set(families())
    assert not {n for n in _literals(SRC / path) & names if (path, n) not in HOMONYMS}


def test_cli_help_lists_the_registered_families(capsys, monkeypatch):
    from pentad.cli.main import parse_arguments

    monkeypatch.setenv("COLUMNS", "1000")  # argparse also wraps at hyphens ("xlm-roberta")

    with pytest.raises(SystemExit):
        parse_arguments(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(family_names()) in text


def _zoo_models():
    for name in zoo_names():
        model = load_config(name).model
        yield name, model


def test_one_family_describes_every_zoo_model():
    for name, model in _zoo_models():
        found = describing(model)
        assert len(found) == 1, (name, found)


def test_a_narrowing_family_narrows_registered_families():
    names = {f.name for f in registered().values()}
    for family in registered().values():
        assert set(family.narrows) <= names - {family.name}, family.name


@pytest.mark.parametrize("family, model", [(f, m) for _, f, m in PENTAD_MODELS], ids=[i for i, _, _ in PENTAD_MODELS])
def test_guessed_family_and_layout_of_each_exported_model(family, model):
    cfg = model_config_class().model_validate(model)
    chosen = families()[family]
    if chosen.name != "roberta":  # the helper's RoBERTa has no position table length of its own, which is what
        assert guess_family(cfg) == chosen.name  # tells it from BERT (test_hf_layout.py::test_guess_family)
    plan = chosen.plan_export(cfg, label="test", model_type=family, base_config=None, omittable=set(), pad_id=0,
                              eos_id=None, labels=None)
    keys = {name for rule in plan.rules for name in rule.theirs}
    guessed = guess_layout(keys)
    if chosen.layout is None:
        assert guessed is None
    else:  # this family's, or the first of the families with the same tensor names (mistral: llama's)
        assert guessed == chosen.name or families()[guessed].layout == chosen.layout


def test_key_layout_needs_a_mark_and_every_also():
    layout = KeyLayout(contains=("encoder_attn.q_proj",), also=("layernorm_embedding",))
    assert layout.matches(["d.0.encoder_attn.q_proj.weight", "e.layernorm_embedding.weight"])
    assert not layout.matches(["d.0.encoder_attn.q_proj.weight"])
    assert not layout.matches(["e.layernorm_embedding.weight"])
    assert KeyLayout(prefixes=("bert.",)).matches(["bert.x"]) and not KeyLayout(prefixes=("bert.",)).matches(["al.x"])


def test_a_family_without_describes_is_abstract():
    with pytest.raises(NotImplementedError):
        HFFamily().describes(None)


def test_field_tables_translate_both_ways_in_table_order():
    from types import SimpleNamespace

    from pentad.interop.hf import Field, export_fields, import_fields, owned_keys, with_rows

    table = [Field("n_layer", "encoder.num_layers", int), Field("eps", "encoder.layer_norm_eps", float),
             Field("act"), Field("width", write=lambda m: 2 * m.encoder.num_layers)]
    model = import_fields(table, {"n_layer": "3", "eps": 1, "act": "gelu"}, {"encoder": {"type": "transformer"}})
    assert model == {"encoder": {"type": "transformer", "num_layers": 3, "layer_norm_eps": 1.0}}
    built = SimpleNamespace(encoder=SimpleNamespace(num_layers=3, layer_norm_eps=1e-5))
    assert list(export_fields(table, built, act="gelu_new").items()) == \
        [("n_layer", 3), ("eps", 1e-5), ("act", "gelu_new"), ("width", 6)]
    with pytest.raises(ValueError, match="act"):
        export_fields(table, built)
    changed = with_rows(table, Field("eps", write=lambda m: 0.5), Field("extra", write=lambda m: None))
    assert [r.hf for r in changed] == ["n_layer", "eps", "act", "width", "extra"]
    assert export_fields(changed, built, act="x")["eps"] == 0.5
    assert owned_keys(table, "rope") == ("architectures", "model_type", "n_layer", "eps", "act", "width", "rope")


def test_field_rows_with_several_paths_list_items_kept_keys_and_activations():
    from types import SimpleNamespace

    from pentad.interop.hf import Field, activation_field, export_fields, import_fields

    table = [Field("drop", "encoder.dropout", float, also=("embedding.dropout",)),
             Field("channels", "embedding.parts.0.channels", int),
             activation_field("hidden_act", "encoder.activation"),
             Field("pooler_size", kept=True, write=lambda m: None)]
    model = import_fields(table, {"drop": 0, "channels": "3", "hidden_act": "gelu_pytorch_tanh", "pooler_size": 7},
                          {"embedding": {"parts": [{"type": "patch"}, {"type": "pos"}]}})
    assert model == {"encoder": {"dropout": 0.0, "activation": "gelu_tanh"},
                     "embedding": {"parts": [{"type": "patch", "channels": 3}, {"type": "pos"}], "dropout": 0.0}}
    built = SimpleNamespace(encoder=SimpleNamespace(dropout=0.1, activation="gelu_tanh"),
                            embedding=SimpleNamespace(parts=[SimpleNamespace(channels=1)]))
    # no imported config: pentad's names and the writers' values
    assert export_fields(table, built) == {"drop": 0.1, "channels": 1, "hidden_act": "gelu_new", "pooler_size": None}
    # the imported config's spelling of the same function and its own value of a key pentad does not hold
    assert export_fields(table, built, {"hidden_act": "gelu_pytorch_tanh", "pooler_size": 7}) == \
        {"drop": 0.1, "channels": 1, "hidden_act": "gelu_pytorch_tanh", "pooler_size": 7}
    # an imported name of another function is not kept; a value the family computed wins over all
    assert export_fields(table, built, {"hidden_act": "relu"}, pooler_size=5) == \
        {"drop": 0.1, "channels": 1, "hidden_act": "gelu_new", "pooler_size": 5}


def test_every_family_declares_its_config_table():
    """Each family module holds a Field table whose keys its export owns (a relative without one reads
    the table of the family it subclasses: RoBERTa BERT's, Pegasus BART's)."""
    import importlib

    from pentad.interop.hf import Field
    from pentad.interop.hf.families import registered

    for name, family in registered().items():
        module = importlib.import_module(f"pentad.interop.hf.{name}")
        if not hasattr(module, "FIELDS"):
            assert name in ("pegasus", "roberta"), f"{name} declares no FIELDS table"
            continue
        table = module.FIELDS
        assert table and all(isinstance(row, Field) for row in table), name
        keys = [row.hf for row in table]
        assert len(keys) == len(set(keys)), f"{name}: a config.json key twice in FIELDS"
        owned = set(getattr(family, "owned", None) or module.OWNED)
        assert set(keys) <= owned, f"{name}: FIELDS rows its export does not own: {set(keys) - owned}"
