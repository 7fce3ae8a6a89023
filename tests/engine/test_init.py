"""engine/__init__.py: the public API the app lives on, loaded on first use."""
import subprocess
import sys

import engine


def test_every_exported_name_resolves_to_what_its_module_defines():
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    from engine.llm import LLM
    assert engine.LLM is LLM


def test_an_unknown_name_is_an_attribute_error():
    try:
        engine.NoSuchThing
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("engine.NoSuchThing resolved")


def test_importing_an_error_type_does_not_import_torch():
    code = "import sys; from engine import SpecError, DEFAULT_MODEL, resolve_model; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
