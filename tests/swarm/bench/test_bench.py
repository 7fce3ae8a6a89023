"""`swarm bench` and `swarm bench-decode` on a tiny random model: the JSON schema, the sharing
arithmetic, the runs beside busy processes (`--busy`), the PNG.
The bench itself is not a test; this only checks that it runs and reports what it measured."""
import json
import statistics

import pytest
from typer.testing import CliRunner

from engine import cpu_threads
from engine.machine_probe import CACHE_FILE
from kernels.cpu import onednn_linear
from swarm.bench.decode import ModeResult, TrunkResult
from swarm.bench.workload import make_workload
from swarm.cli.main import app
from tests.helpers.tiny_models import make_tiny_model

T, S, G = 40, 5, 4
SYSTEM_FIELDS = {"label", "status", "reason", "kv_bytes_peak", "bytes_per_token", "prompt_tokens_computed",
                 "ttft_last_s", "decode_tok_s", "decode_tokens", "decode_s", "wall_s", "generated_tokens",
                 "matches_swarm", "ratios", "busy", "wall_over_floor"}
BUSY_FIELDS = {"processes", "status", "reason", "prompt_tokens_computed", "decode_tok_s", "decode_tokens", "decode_s",
               "wall_s", "decode_over_quiet", "wall_over_quiet", "matches_quiet"}
RATIO_FIELDS = {"kv_bytes_peak", "prompt_tokens_computed", "ttft_last_s", "decode_tok_s", "wall_s"}
MACHINE_FIELDS = {"key", "cpu", "cores", "flags", "threads", "torch_version", "matmul_flop_s", "read_bytes_per_s",
                  "probe_s", "attention_flop_s", "decode_flop_s", "panels_speedup", "codes_speedup", "int8_speedup",
                  "from_cache"}
FLOOR_FIELDS = {"matmul_dtype", "prefill_flops", "prefill_s", "decode_steps", "decode_step_bytes",
                "decode_step_flops", "decode_step_s", "decode_s", "total_s"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    model = make_tiny_model(root / "llama", "llama")
    out, plot = root / "bench.json", root / "bench.png"
    args = ["bench", "--model", str(model), "--agents", "1,2", "--trunk", str(T), "--suffix", str(S),
            "--new-tokens", str(G), "--peers", "hf,llamacpp", "--busy", "1", "--out", str(out), "--plot", str(plot),
            "--json"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SWARM_CACHE_DIR", str(root))   # the machine probe's cache: a fresh one, not the user's
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output, plot, root


def configs_by_agents(document):
    return {config["agents"]: config for config in document["configs"]}


def test_json_follows_the_documented_schema(bench_run):
    document, stdout, *_ = bench_run
    assert json.loads(stdout[stdout.index("{"):]) == document
    assert document["schema_version"] == 1
    assert {"model", "device", "dtype", "hf_dtype", "kernels", "machine", "workload", "systems", "versions",
            "configs"} <= set(document)
    assert document["kernels"]["attention"] in ("native", "sdpa")
    weights = document["kernels"]["weights"]   # a safetensors folder keeps its float weights: no blocks
    assert set(weights["by_format"]) == {"F32"} and weights["total_bytes"] == weights["by_format"]["F32"]
    assert document["kernels"]["matmuls"] == ("onednn" if onednn_linear.available() else "torch")
    assert document["workload"] == {"agents": [1, 2], "trunks": [T], "suffix": S, "new_tokens": G,
                                    "repeats": 1, "seed": 0, "busy": 1}
    assert document["kernels"]["threads"] >= 1
    assert document["kernels"]["openmp_wait"] in ({"OMP_WAIT_POLICY": "PASSIVE"}, cpu_threads.wait_settings())
    assert list(document["systems"]) == ["swarm", "swarm_no_sharing", "hf", "llamacpp"]
    for config in document["configs"]:
        assert (config["trunk"], config["suffix"], config["new_tokens"]) == (T, S, G)
        for name in ("swarm", "swarm_no_sharing", "hf"):
            system = config["systems"][name]
            assert system["status"] == "ok", system["reason"]
            assert set(system) == SYSTEM_FIELDS
            assert set(system["ratios"]) == RATIO_FIELDS
            assert system["generated_tokens"] == config["agents"] * G
            assert 0 < system["ttft_last_s"] <= system["wall_s"]


def test_the_machine_and_every_configuration_s_floor_are_reported(bench_run):
    document = bench_run[0]
    machine = document["machine"]
    assert set(machine) == MACHINE_FIELDS
    cached = json.loads((bench_run[3] / CACHE_FILE).read_text())   # measured in this run: the cache was empty
    assert [entry["matmul_flop_s"] for entry in cached.values()] == [machine["matmul_flop_s"]]
    assert machine["threads"] == document["kernels"]["threads"]
    assert set(machine["matmul_flop_s"]) >= {"float32", "bfloat16"}
    for config in document["configs"]:
        floor = config["floor"]
        assert set(floor) == FLOOR_FIELDS
        assert floor["decode_steps"] == G - 1
        assert 0 < floor["prefill_s"] < floor["total_s"] == pytest.approx(floor["prefill_s"] + floor["decode_s"])
        for name in ("swarm", "swarm_no_sharing", "hf"):
            system = config["systems"][name]
            assert system["wall_over_floor"] == pytest.approx(system["wall_s"] / floor["total_s"])


def test_busy_runs_are_reported_beside_the_quiet_ones(bench_run):
    for config in bench_run[0]["configs"]:
        for name in ("swarm", "swarm_no_sharing", "hf"):
            quiet = config["systems"][name]
            busy = quiet["busy"]
            assert set(busy) == BUSY_FIELDS and (busy["processes"], busy["status"]) == (1, "ok"), busy
            # the busy run computes what the quiet one did, its trunk too (swarm's runs start from a cold cache)
            assert busy["prompt_tokens_computed"] == quiet["prompt_tokens_computed"]
            assert 0 < busy["decode_tokens"] <= config["agents"] * G
            assert busy["decode_over_quiet"] == pytest.approx(busy["decode_tok_s"] / quiet["decode_tok_s"])
            assert busy["wall_over_quiet"] == pytest.approx(busy["wall_s"] / quiet["wall_s"])
            assert busy["matches_quiet"] == 1.0   # the same greedy tokens, busy or not
        assert "busy" not in config["systems"]["llamacpp"]   # it did not run at all


def test_busy_must_not_be_negative():
    result = CliRunner().invoke(app, ["bench", "--busy", "-1"])
    assert result.exit_code != 0
    assert "--busy" in str(result.exception)


def test_sharing_holds_less_kv_and_computes_the_trunk_once(bench_run):
    configs = configs_by_agents(bench_run[0])
    for n, config in configs.items():
        systems = config["systems"]
        assert systems["swarm"]["prompt_tokens_computed"] == T + n * S
        assert systems["swarm_no_sharing"]["prompt_tokens_computed"] == n * (T + S)
        assert systems["hf"]["prompt_tokens_computed"] == n * (T + S)
        assert systems["swarm_no_sharing"]["matches_swarm"] == 1.0
    two = configs[2]["systems"]
    assert two["swarm"]["kv_bytes_peak"] < two["swarm_no_sharing"]["kv_bytes_peak"]
    assert two["swarm_no_sharing"]["ratios"]["kv_bytes_peak"] > 1
    assert two["swarm"]["ratios"]["wall_s"] == 1.0


def test_transformers_kv_is_its_cache_size(bench_run):
    hf = configs_by_agents(bench_run[0])[2]["systems"]["hf"]
    assert hf["kv_bytes_peak"] == 2 * (T + S + G - 1) * hf["bytes_per_token"]


def test_llamacpp_reports_why_it_did_not_run_on_a_hugging_face_folder(bench_run):
    for config in bench_run[0]["configs"]:
        llamacpp = config["systems"]["llamacpp"]
        assert llamacpp["status"] in ("not installed", "unavailable")
        assert "pip install llama-cpp-python" in llamacpp["reason"] or ".gguf" in llamacpp["reason"]


def test_writes_a_png(bench_run):
    assert bench_run[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_pip_command(monkeypatch):
    import swarm.bench.chart as chart

    real = chart.importlib.util.find_spec
    monkeypatch.setattr(chart.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name))
    result = CliRunner().invoke(app, ["bench", "--plot", "x.png"])
    assert result.exit_code != 0
    assert "pip install" in str(result.exception)


def test_agents_share_the_trunk_and_diverge_at_their_first_suffix_token():
    workload = make_workload(agents=4, trunk=30, suffix=6, new_tokens=2, vocab_size=320, seed="t")
    prompts = workload.prompts
    assert all(p[:30] == workload.trunk for p in prompts)
    assert len({p[30] for p in prompts}) == 4
    assert make_workload(4, 30, 6, 2, 320, seed="u").trunk != workload.trunk


DECODE_N, DECODE_TRUNKS, DECODE_S, DECODE_K = 3, (80, 160), 8, 3
MODE_FIELDS = {"median_step_s", "step_s", "attention_bytes_per_step"}


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_decode")
    model = make_tiny_model(root / "llama", "llama")
    out = root / "decode.json"
    args = ["bench-decode", "--model", str(model), "--agents", str(DECODE_N),
            "--trunk", ",".join(map(str, DECODE_TRUNKS)), "--suffix", str(DECODE_S), "--steps", str(DECODE_K),
            "--dtype", "float32", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_decode_bench_json_follows_the_documented_schema(decode_run):
    document, table = decode_run
    assert {"schema_version", "model", "device", "dtype", "threads", "versions", "decode_steps"} <= set(document)
    decode = document["decode_steps"]
    assert (decode["agents"], decode["suffix"], decode["steps"]) == (DECODE_N, DECODE_S, DECODE_K)
    assert [t["trunk"] for t in decode["trunks"]] == list(DECODE_TRUNKS)
    for trunk in decode["trunks"]:
        for mode in ("cascade", "plain"):
            assert set(trunk[mode]) == MODE_FIELDS
            assert len(trunk[mode]["step_s"]) == DECODE_K
            assert trunk[mode]["median_step_s"] > 0
            assert trunk[mode]["median_step_s"] == statistics.median(trunk[mode]["step_s"])
        assert trunk["matches"] == 1.0
        assert 0 <= trunk["first_step_logit_diff"] < 1e-3
    assert "speedup" in table


def test_the_decode_speedup_is_plain_over_cascade_by_median_step():
    cascade = ModeResult(step_s=[0.030, 0.010, 0.020, 0.900], attention_bytes=1_000)  # median 0.025
    plain = ModeResult(step_s=[0.050, 0.100, 0.070, 0.060], attention_bytes=8_000)     # median 0.065
    trunk = TrunkResult(512, 512, 600.0, {"cascade": cascade, "plain": plain}, 1.0, 0.0)
    assert trunk.to_json()["speedup"] == pytest.approx(2.6)   # one slow cascade step does not move it
    assert trunk.to_json()["bytes_ratio"] == 8.0


def test_decode_bench_cascade_reads_the_trunk_once(decode_run):
    decode = decode_run[0]["decode_steps"]
    n, bpt = decode["agents"], decode["bytes_per_token"]
    for trunk in decode["trunks"]:
        t, context = trunk["trunk"], trunk["mean_context"]
        assert trunk["shared_tokens"] == t
        assert context == t + DECODE_S + (DECODE_K + 1) / 2
        assert trunk["plain"]["attention_bytes_per_step"] == round(n * context * bpt)
        assert trunk["cascade"]["attention_bytes_per_step"] == round((t + n * (context - t)) * bpt)
        assert trunk["cascade"]["attention_bytes_per_step"] < trunk["plain"]["attention_bytes_per_step"]


def test_decode_bench_needs_a_trunk_cascade_takes():
    result = CliRunner().invoke(app, ["bench-decode", "--trunk", "32"])
    assert result.exit_code != 0
    assert "--trunk" in str(result.exception)
