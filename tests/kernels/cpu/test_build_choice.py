"""kernels/cpu/build_choice.py: where the CPU has AVX-512, the process loads the quant_matmul build measured
faster here, the choice stored once per machine and build; elsewhere, and for every other kernel, the native
build. (That both builds give the same bits: tests/kernels/cpu/test_quant_matmul.py.)"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu import build_choice, native

AVX512 = "avx512f" in native._cpu_flags().split()
needs_avx512 = pytest.mark.skipif(not AVX512, reason="this CPU has no AVX-512: there is one build")
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler for the kernels")
ROOT = Path(__file__).parents[3]


def test_other_kernels_take_the_native_build():
    assert native.chosen_flags("paged_decode") == ()
    assert native.chosen_flags("decode_layer") == ()


@pytest.mark.skipif(AVX512, reason="this CPU has AVX-512")
def test_without_avx512_there_is_nothing_to_choose():
    assert native.chosen_flags("quant_matmul") == ()


@needs_avx512
def test_the_loaded_build_is_the_stored_choice_of_two_measured_builds():
    loaded = native.library_path("quant_matmul")
    wide = native.library_path("quant_matmul", ())
    entry = json.loads(build_choice.choice_file(wide.parent).read_text())[wide.name]
    assert set(entry["seconds"]) == {"native", "avx2"} and all(s > 0 for s in entry["seconds"].values())
    extra = build_choice.NARROWER if entry["build"] == "avx2" else ()
    assert loaded == native.library_path("quant_matmul", extra)


@needs_avx512
@pytest.mark.parametrize("stored,flags", [("avx2", build_choice.NARROWER), ("native", ())])
def test_a_stored_choice_is_taken_without_measuring_again(tmp_path, monkeypatch, stored, flags):
    choice_file = tmp_path / "build-choice.json"
    wide = native.library_path("quant_matmul", ())
    choice_file.write_text(json.dumps({wide.name: {"build": stored}}))
    monkeypatch.setattr(build_choice, "choice_file", lambda folder: choice_file)
    monkeypatch.setattr(build_choice, "measured_choice", lambda *builds: pytest.fail("measured again"))
    assert native.chosen_flags("quant_matmul") == flags


@needs_avx512
def test_processes_that_find_no_choice_at_once_all_take_the_choice_of_the_one_that_measured(tmp_path):
    """Each process here would measure a different winner, slowly: the second to look waits for the first's."""
    script = f"""
import json, sys, time
from pathlib import Path
import engine
from kernels.cpu import build_choice, native
build_choice.choice_file = lambda folder: Path({str(tmp_path / "build-choice.json")!r})
def measured_choice(wide, narrow):
    time.sleep(1.0)
    return {{"build": sys.argv[1]}}
build_choice.measured_choice = measured_choice
print(json.dumps(native.chosen_flags("quant_matmul")))
"""
    native.library_path("quant_matmul", ()), native.library_path("quant_matmul", build_choice.NARROWER)   # built
    runs = [subprocess.Popen([sys.executable, "-c", script, build], cwd=ROOT, stdout=subprocess.PIPE, text=True)
            for build in ("avx2", "native")]
    flags = [json.loads(run.communicate(timeout=300)[0].splitlines()[-1]) for run in runs]
    assert flags[0] == flags[1]


@pytest.mark.parametrize("native_s,avx2_s,chosen", [(1.0, 0.94, "avx2"), (1.0, 0.96, "native"),
                                                     (1.0, 1.3, "native")])
def test_the_narrower_build_wins_only_by_the_margin(monkeypatch, native_s, avx2_s, chosen):
    """The rule alone, on given pass times: each build's library stands for its time."""
    builds = {"wide": native_s, "narrow": avx2_s}
    monkeypatch.setattr(build_choice, "_declared", lambda path: path)
    monkeypatch.setattr(build_choice, "_pass_s", lambda library, weights: builds[library])
    monkeypatch.setattr(build_choice, "_q4_1_blocks", lambda generator: None)
    result = build_choice.measured_choice("wide", "narrow")
    assert result == {"build": chosen, "seconds": {"native": native_s, "avx2": avx2_s}}


def test_the_probe_weights_are_q4_1_blocks_with_finite_scales():
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, quants

    blocks = build_choice._q4_1_blocks(torch.Generator().manual_seed(0))
    values = quants.dequantize(blocks[:4].numpy(), GGMLQuantizationType.Q4_1)
    assert values.shape == (4, build_choice.COLS)
    assert np.isfinite(values).all() and -0.09 < values.min() and values.max() < 0.08
