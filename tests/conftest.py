"""Suite-wide settings: property tests are judged on what they find, never on how fast a busy
machine runs them (Hypothesis's deadline and too-slow check are timings).

The README's command runs the suite in two pytest-xdist workers with `--dist loadfile`: each test file
goes to one worker whole, so its module fixtures are made once. (`loadgroup` would let files share a
worker, but pytest-xdist 3.8 cannot name groups under pytest 9: it sets a node id pytest 9 no longer reads.)"""
import importlib.util
import os
import sys

import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    # Triton's own library functions (tl.sum, tl.cumsum) are interpreted only if defined so: set before
    # anything imports triton (transformers does, through flash-linear-attention, below)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _refuse_the_hub_kernels_package() -> None:
    """The Hugging Face hub's `kernels` package (a hard requirement of transformers 5.25 on) has the import
    name of swarm's kernels/: with both installed, transformers imports ours and every oracle test fails on
    `cannot import name 'CUDAProperties'`. Say so once, with the fix, instead."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        hub_version = version("kernels")
    except PackageNotFoundError:
        return
    raise SystemExit(f"the test environment has the hub's `kernels` {hub_version}, whose import name is swarm's "
                     "kernels/: pip uninstall kernels, and pip install -e '.[test]' (it pins transformers < 5.25)")


_refuse_the_hub_kernels_package()

settings.register_profile("swarm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("swarm")


def _import_transformers_qwen3_5_without_fla() -> None:
    """transformers' Qwen3.5 binds flash-linear-attention's kernels when its module is imported, wherever fla
    imports, and would then run them on CPU tensors too (no Triton driver there: it fails). The oracle is its
    PyTorch rule, so its module is imported once here with fla hidden; swarm's own fla path
    (kernels/triton/gated_delta_rule.py) imports fla afterwards as usual."""
    if importlib.util.find_spec("fla") is None:
        return
    loaded = {name: sys.modules.pop(name) for name in list(sys.modules) if name == "fla" or name.startswith("fla.")}
    sys.modules["fla"] = None   # import fla -> ImportError
    try:
        import transformers.models.qwen3_5.modeling_qwen3_5  # noqa: F401
    except ImportError:   # a transformers without Qwen3.5: its tests skip
        pass
    finally:
        del sys.modules["fla"]
        sys.modules.update(loaded)


_import_transformers_qwen3_5_without_fla()
