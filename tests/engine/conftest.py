import os

import pytest

from engine.gpu_check.suites import DTYPE_ENV
from tests.helpers.tiny_gguf import smollm2_or_skip
from tests.helpers.tiny_models import VARIANTS, make_tiny_model


@pytest.fixture(scope="session", autouse=True)
def auto_dtype_from_environment():
    """SWARM_TEST_DTYPE=float32 makes dtype "auto" mean float32 in every engine these tests build: the
    GPU check (engine.gpu_check.suites) reruns the equivalence tests so where bfloat16 flips a near-tie."""
    name = os.environ.get(DTYPE_ENV)
    if not name:
        yield
        return
    from engine import llm_engine

    real = llm_engine.pick_dtype
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llm_engine, "pick_dtype", lambda dtype, device: real(name if dtype == "auto" else dtype, device))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Builds each tiny random model once per session; returns a folder per variant."""
    root = tmp_path_factory.mktemp("tiny_models")
    built = {}

    def get(variant: str):
        if variant not in built:
            built[variant] = make_tiny_model(root / variant, variant)
        return built[variant]

    return get


@pytest.fixture(scope="session")
def smollm2_in_transformers():
    """transformers' own SmolLM2-135M-Instruct, read from the embedded GGUF in float32: the oracle.
    Loaded once for every test file that needs it (the load takes about 20 s)."""
    import torch
    import transformers

    path = smollm2_or_skip()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


ALL_VARIANTS = list(VARIANTS)


@pytest.fixture(scope="session")
def smollm2_q4_k_m_in_transformers():
    """transformers' own model of the Q4_K_M file llama.cpp made from SmolLM2 (kquant_files), float32:
    the oracle for the K-quant tests. Loaded once (about 25 s, most of it gguf's reader)."""
    import torch
    import transformers

    from tests.helpers.kquant_files import smollm2_quantized

    path = smollm2_quantized("Q4_K_M")
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_kquant(tmp_path_factory):
    """The tiny random llama quantized by llama.cpp, one file per file type, made once per session."""
    from tests.helpers.kquant_files import tiny_quantized

    root = tmp_path_factory.mktemp("tiny_kquant")
    return lambda file_type: tiny_quantized(root, file_type)
