import pytest

from pentad.errors import UserError
from pentad.registry import ALL, EMBEDDINGS, Registry


def test_register_and_get():
    reg: Registry = Registry("widgets")

    @reg.register("a")
    class A:
        pass

    assert reg.get("a") is A
    assert A.registry_name == "a"
    assert "a" in reg and len(reg) == 1 and reg.names() == ["a"]


def test_unknown_name_suggests_the_closest():
    reg: Registry = Registry("widgets")

    @reg.register("transformer")
    class T:
        pass

    with pytest.raises(UserError, match="did you mean 'transformer'"):
        reg.get("transfomer")


def test_double_registration_is_refused():
    reg: Registry = Registry("widgets")

    @reg.register("a")
    class A:
        pass

    with pytest.raises(RuntimeError):
        @reg.register("a")
        class B:
            pass


def test_every_registry_is_populated_by_the_run_config():
    from pentad.assembly import run_config_class

    run_config_class()
    for kind in ("embeddings", "encoders", "targets", "objectives", "tasks", "tokenizers"):
        assert len(ALL[kind]) > 0, kind
    assert {"word", "pos", "seg", "sinusoidal"} <= set(EMBEDDINGS.names())
