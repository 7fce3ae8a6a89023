"""Choosing the attention kernels, and the engine on the Triton kernels (interpreted on a CPU)."""
import os
import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.select import BACKEND_ENV, AttentionBackendError, pool_dtype, select_backend
from engine.errors import SwarmError
from engine.kv.cache import KVCache
from tests.helpers.kernel_calls import count_cascade_prefills
from tests.helpers.tiny_models import make_tiny_model

CPU = torch.device("cpu")
DEVICE = torch.device("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")


def backend_name() -> str:
    """The kernel set the engine's backend runs on, for a pool on the CPU."""
    pool = torch.zeros(2, 16, 1, 8)
    return select_backend(KVCache([(pool, pool.clone())], 16), scale=8 ** -0.5).name


def test_the_fused_cpu_kernels_serve_the_cpu_by_default_and_torch_on_request(monkeypatch):
    from kernels.cpu import native_attention

    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert backend_name() == ("native" if native_attention.available() else "sdpa")
    for name in ("sdpa", "torch"):
        monkeypatch.setenv(BACKEND_ENV, name)
        assert backend_name() == name


def test_the_pool_is_bfloat16_where_every_read_of_it_is_a_bfloat16_product(monkeypatch):
    from kernels.cpu import native_attention

    monkeypatch.delenv(BACKEND_ENV, raising=False)
    native = native_attention.available() and native_attention.bf16_products_native()
    assert pool_dtype(CPU, torch.float32, "bfloat16", "bfloat16") == (torch.bfloat16 if native else torch.float32)
    for prompt, decode in (("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")):
        assert pool_dtype(CPU, torch.float32, prompt, decode) == torch.float32
    assert pool_dtype(CPU, torch.bfloat16, "bfloat16", "bfloat16") == torch.bfloat16   # a named dtype is kept
    assert pool_dtype(torch.device("cuda"), torch.float16, "bfloat16", "bfloat16") == torch.float16
    for name in ("sdpa", "torch"):   # kernels whose attention reads float32
        monkeypatch.setenv(BACKEND_ENV, name)
        assert pool_dtype(CPU, torch.float32, "bfloat16", "bfloat16") == torch.float32


def test_an_unknown_backend_says_what_to_use_and_is_a_user_error(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "cuda")
    with pytest.raises(AttentionBackendError, match="use native, sdpa, torch or triton") as caught:
        backend_name()
    assert isinstance(caught.value, SwarmError)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv(BACKEND_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(AttentionBackendError, match="TRITON_INTERPRET=1"):
        backend_name()


def test_engine_on_triton_kernels_gives_the_same_greedy_tokens_and_logits(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 needs a GPU")
    from kernels.triton import attention as triton_attention

    shared_calls = []
    real_prefix_attention = triton_attention.prefix_attention
    monkeypatch.setattr(triton_attention, "prefix_attention",
                        lambda *args, **kw: shared_calls.append(1) or real_prefix_attention(*args, **kw))
    shared_prefills = count_cascade_prefills(monkeypatch, "sdpa")
    folder = str(make_tiny_model(tmp_path / "llama", "llama"))
    runs = {}
    names = ("torch", "triton", "sdpa", "native") if DEVICE.type == "cpu" else ("torch", "triton")
    for name in names:
        monkeypatch.setenv(BACKEND_ENV, name)
        llm = LLM(folder, device=DEVICE.type, dtype="float32", kv_budget_tokens=512)
        assert llm.engine.kernels()["attention"] == name
        runs[name] = greedy_swarm(llm)
    for name in names[1:]:
        assert runs[name][0] == runs["torch"][0]
        torch.testing.assert_close(runs[name][1], runs["torch"][1], atol=1e-5, rtol=1e-5)
    assert shared_calls, "the trunk should go through the Triton shared-prefix kernel"
    assert shared_prefills or DEVICE.type != "cpu", "on sdpa, the suffixes should read the cached trunk together"


def greedy_swarm(llm: LLM, agents: int = 3, steps: int = 4):
    """Three agents on a 70-token trunk (4 full blocks shared: cascade decode); tokens and logits."""
    rng = random.Random(0)
    trunk = [rng.randrange(4, 300) for _ in range(70)]
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    seqs = [llm.engine.add_request(trunk + [10 + i, rng.randrange(4, 300)], params) for i in range(agents)]
    logits = []
    while not all(seq.is_finished for seq in seqs):
        result = llm.engine.step()
        logits += list(result.logits) if result.logits is not None else []
    return [seq.output_token_ids for seq in seqs], torch.stack(logits)
