"""Engine profiles checked by vLLM's own argument parser, and the MoE observability parsers."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from prometheus_client import REGISTRY

from engine import launcher
from engine.observability import expert_usage, export_eplb, format_expert_trace, parse_eplb_line
from engine.pool import parse_vllm_metrics
from testkit.processes import ROOT

ENGINE_PYTHON = launcher.default_engine_python()


def run_in_engine_venv(module: str, payload: object) -> object:
    result = subprocess.run(
        [ENGINE_PYTHON, "-m", module],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def all_profile_commands() -> dict[str, list[str]]:
    profiles = dict(launcher.PROFILES)
    profiles["ernie-21b-a3b tp2 dp4"] = launcher.resolve_profile(
        "ernie-21b-a3b", tensor_parallel_size=2, data_parallel_size=4
    )
    profiles["multinode 3x4"] = launcher.resolve_profile("ernie-21b-a3b-multinode", nodes=3, gpus_per_node=4)
    commands = {}
    for name, profile in profiles.items():
        argv, _ = launcher.build_command(profile, python="python", host="127.0.0.1", port=8000)
        assert argv[1:4] == list(launcher.VLLM_SERVE)  # `vllm serve`, not the deprecated module
        commands[name] = argv[4:]
    return commands


def test_every_profile_is_accepted_by_vllms_parser() -> None:
    commands = all_profile_commands()
    wanted = {"tiny", "ernie-0.3b-cpu", "ernie-0.3b-gpu", "ernie-21b-a3b", "ernie-21b-a3b-multinode", "embed-bge-m3",
              "rerank-bge-v2-m3", "ernie-vl-28b-a3b", "asr-whisper-cpu", "asr-whisper-gpu"}  # fmt: skip
    assert wanted <= set(commands)
    bogus = [*commands["tiny"], "--enable-warp-drive"]
    two_models = [*commands["tiny"], "other-model"]  # a second positional: `vllm serve` takes one model
    errors = run_in_engine_venv("engine.argcheck", [*commands.values(), bogus, two_models])
    assert dict(zip(commands, errors[:-2], strict=True)) == dict.fromkeys(commands, "")
    assert "enable-warp-drive" in errors[-2], "the check must be able to fail"
    assert "other-model" in errors[-1]


def test_moe_profiles_carry_expert_parallelism_and_eplb() -> None:
    commands = all_profile_commands()
    for name in ("ernie-21b-a3b", "ernie-21b-a3b-multinode", "multinode 3x4"):
        argv = commands[name]
        assert "--enable-expert-parallel" in argv and "--enable-eplb" in argv
        assert json.loads(argv[argv.index("--eplb-config") + 1])["log_balancedness"] is True
    multinode = commands["multinode 3x4"]
    assert multinode[multinode.index("--data-parallel-size") + 1] == "3"
    assert multinode[multinode.index("--data-parallel-backend") + 1] == "ray"
    ray = launcher.multinode_ray_commands("10.1.2.3", 3)
    assert ray["head"][:3] == ["ray", "start", "--head"] and len(ray) == 3


def test_moe_profiles_divide_the_model_as_vllm_requires() -> None:
    """vLLM refuses to load when the experts with their EPLB copies do not divide among the TP x DP ranks, or when
    the tensor-parallel size does not divide the 20 attention heads: every MoE command must pass both."""

    def flag(argv: list[str], name: str) -> int:
        return int(argv[argv.index(name) + 1])

    commands = all_profile_commands()
    commands["ernie-21b-a3b tp4 dp2"] = launcher.build_command(
        launcher.ernie_21b_a3b_profile(4, 2), python="python", host="h", port=1
    )[0][4:]
    commands["multinode 2x8"] = launcher.build_command(
        launcher.ernie_21b_a3b_multinode_profile(2, 8), python="python", host="h", port=1
    )[0][4:]
    for name, argv in commands.items():
        if "--enable-eplb" not in argv:
            continue
        ranks = flag(argv, "--tensor-parallel-size") * flag(argv, "--data-parallel-size")
        redundant = json.loads(argv[argv.index("--eplb-config") + 1])["num_redundant_experts"]
        assert (launcher.ERNIE_21B_ROUTED_EXPERTS + redundant) % ranks == 0, name
        assert redundant >= 2 and launcher.ERNIE_21B_ATTENTION_HEADS % flag(argv, "--tensor-parallel-size") == 0, name
    two_by_eight = commands["multinode 2x8"]  # the documented deployment: 16 GPUs, groups of 4, 2 ranks a node
    assert [flag(two_by_eight, f) for f in ("--tensor-parallel-size", "--data-parallel-size",
                                            "--data-parallel-size-local")] == [4, 4, 2]  # fmt: skip
    for refused in (8, 3, 5, 20):
        with pytest.raises(ValueError, match="20 attention heads"):
            launcher.ernie_21b_a3b_profile(refused, 1)
    with pytest.raises(ValueError, match="2 GPUs or more"):  # vLLM refuses EPLB with nothing to balance over
        launcher.ernie_21b_a3b_profile(1, 1)


def test_engine_plan_refuses_parallel_sizes_the_model_cannot_run() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "engine", "plan", "--profile", "ernie-21b-a3b",
         "--tensor-parallel-size", "8", "--data-parallel-size", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "20 attention heads" in result.stderr and "unexpectedly" not in result.stderr


def test_eplb_log_line_becomes_gauges() -> None:
    line = (
        "(EngineCore_DP0 pid=42) INFO 11-29 10:00:00 [eplb_state.py:633] EPLB step: 1200 for model "
        "ernie-4.5-21b-a3b: avg_tokens=812.50, max_tokens=1024, balancedness=0.7935, "
        "steps until the next rearrangement: 1800"
    )
    stats = parse_eplb_line(line)
    assert stats is not None and (stats.step, stats.max_tokens, stats.balancedness) == (1200, 1024, 0.7935)
    export_eplb(stats)
    value = REGISTRY.get_sample_value("botgw_eplb_balancedness", {"model": "ernie-4.5-21b-a3b"})
    assert value == pytest.approx(0.7935)
    assert parse_eplb_line("INFO something else entirely") is None


def test_routed_experts_from_vllms_own_response_schema() -> None:
    """vLLM builds the response (its pydantic models, its numpy2base64); we decode what it would send."""
    routed = np.array([[[0, 3], [1, 2]], [[0, 1], [1, 2]], [[3, 0], [2, 2]]], dtype=np.uint8)  # tokens×layers×k
    script = """
import base64, io, json, sys
import numpy as np
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse
from vllm.utils.serial_utils import numpy2base64
array = np.load(io.BytesIO(base64.b64decode(sys.stdin.read())))
response = ChatCompletionResponse(model="m", choices=[{"index": 0, "message": {"role": "assistant", "content": "hi"},
    "finish_reason": "stop", "routed_experts": numpy2base64(array)}], usage={"prompt_tokens": 1, "completion_tokens": 3,
    "total_tokens": 4})
print(response.model_dump_json())
"""
    buffer = io.BytesIO()
    np.save(buffer, routed)
    result = subprocess.run(
        [ENGINE_PYTHON, "-c", script], input=base64.b64encode(buffer.getvalue()).decode(),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    response = json.loads(result.stdout.strip().splitlines()[-1])
    usage = expert_usage(response["choices"][0]["routed_experts"])
    assert usage == {(0, 0): 3, (0, 3): 2, (0, 1): 1, (1, 1): 2, (1, 2): 4}
    assert format_expert_trace(usage).startswith("[experts] L0: e0×3, e3×2")


def test_vllm_metrics_parsed_from_exposition_text() -> None:
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.95
"""
    load = parse_vllm_metrics(text)
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, 4.0, 0.95)


def test_the_embedding_profile_runs_vllms_pooling_runner_for_bge_m3() -> None:
    """`botgw engine serve --profile embed-bge-m3`: BAAI/bge-m3 under the name knowledge.embedding asks for, on the
    pooling runner (/v1/embeddings), without the chat model's template."""
    from knowledge.config import EmbeddingSettings

    argv = all_profile_commands()["embed-bge-m3"]
    assert argv[0] == "BAAI/bge-m3" and "--model" not in argv  # `vllm serve MODEL`
    assert argv[argv.index("--runner") + 1] == "pooling"
    served = argv[argv.index("--served-model-name") + 1]
    assert served == EmbeddingSettings(base_url="http://127.0.0.1:8001").model_name
    assert "--chat-template" not in argv and "--generation-config" not in argv
    # vLLM's own parser accepts it (runner is one of its choices): test_every_profile_is_accepted_by_vllms_parser


def test_the_rerank_profile_serves_the_model_knowledge_rerank_asks_for() -> None:
    """`botgw engine serve --profile rerank-bge-v2-m3`: the cross-encoder on the pooling runner (vLLM's /rerank),
    under the name knowledge.rerank.model asks for by default; its arguments pass vLLM's parser with the others."""
    from knowledge.config import RerankSettings

    argv = all_profile_commands()["rerank-bge-v2-m3"]
    assert argv[0] == "BAAI/bge-reranker-v2-m3"
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert argv[argv.index("--served-model-name") + 1] == RerankSettings().model
    assert "--chat-template" not in argv


def test_the_vision_profile_serves_ernie_vl_with_its_own_code_and_template() -> None:
    """`botgw engine plan --profile ernie-vl-28b-a3b`: the MoE vision model with --trust-remote-code, room for images
    per prompt, and the model's own chat template (ERNIE's text template cannot place images); vLLM's parser accepts
    it with the others (test_every_profile_is_accepted_by_vllms_parser)."""
    argv = all_profile_commands()["ernie-vl-28b-a3b"]
    assert argv[0] == "baidu/ERNIE-4.5-VL-28B-A3B-PT"
    assert "--trust-remote-code" in argv and "--chat-template" not in argv
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1])["image"] >= 1
    assert int(argv[argv.index("--max-model-len") + 1]) >= 8192
    assert "--enable-eplb" not in argv  # vLLM's ERNIE-VL is no MixtureOfExperts model: EPLB would refuse to start


def test_the_whisper_profiles_serve_the_model_asr_asks_for(capsys: pytest.CaptureFixture[str]) -> None:
    """`botgw engine plan --profile asr-whisper-cpu`: Whisper on the generate runner (vLLM's transcription endpoint)
    under the name asr.model asks for by default, without a chat template."""
    from engine.asr import AsrSettings
    from gateway.cli.main import main as botgw

    commands = all_profile_commands()
    for name in ("asr-whisper-cpu", "asr-whisper-gpu"):
        argv = commands[name]
        assert argv[0].startswith("openai/whisper-")
        assert argv[argv.index("--runner") + 1] == "generate"
        assert argv[argv.index("--served-model-name") + 1] == AsrSettings(base_url="http://asr:8000").model
        assert "--chat-template" not in argv and "--generation-config" not in argv
    assert botgw(["engine", "plan", "--profile", "asr-whisper-cpu"]) == 0
    assert "vllm serve openai/whisper-" in capsys.readouterr().out


def test_serve_args_take_the_model_positionally_and_overrides_replace_it() -> None:
    """`vllm serve MODEL`: vLLM 0.32 warns that `--model` will go (vllm/utils/argparse_utils.py), so an operator's
    `-- --model X` replaces the positional model instead of being passed on."""
    profile = launcher.get_profile("ernie-0.3b-cpu")
    overrides = ["--model", "my/model", "--max-num-seqs", "4"]
    args = launcher.serve_args(profile, host="0.0.0.0", port=8000, overrides=overrides)
    assert args[0] == "my/model" and "--model" not in args
    assert args[args.index("--max-num-seqs") + 1] == "4" and args.count("--max-num-seqs") == 1
    args = launcher.serve_args(profile, host="h", port=1, overrides=["--model=other/model"])
    assert args[0] == "other/model" and not any(a.startswith("--model") for a in args)
    inside = launcher.serve_args(profile, host="h", port=1, chat_template="/etc/t.jinja")
    assert inside[inside.index("--chat-template") + 1] == "/etc/t.jinja"
    argv, env = launcher.build_command(profile, python="/py", host="h", port=1)
    assert argv == ["/py", *launcher.VLLM_SERVE, *launcher.serve_args(profile, host="h", port=1)]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "4"}


def test_the_launcher_runs_the_vllm_console_scripts_function_as_vllm_serve() -> None:
    """VLLM_MAIN calls what the `vllm` console script calls (vLLM's entry_points), and in the engine venv it gets as
    far as `vllm serve`'s own parser: `--help` of the serve subcommand, where the console script itself fails."""
    probe = (
        "import importlib.metadata as m\n"
        "print([e.value for e in m.entry_points(group='console_scripts') if e.name == 'vllm'])"
    )
    result = subprocess.run([ENGINE_PYTHON, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr(["vllm.entrypoints.cli.main:main"])
    assert "from vllm.entrypoints.cli.main import main" in launcher.VLLM_MAIN
    helped = subprocess.run([ENGINE_PYTHON, *launcher.VLLM_SERVE, "--help"], capture_output=True, text=True,
                            timeout=300, cwd="/")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "usage: vllm serve [model_tag] [options]" in helped.stdout
    assert "deprecated" not in (helped.stdout + helped.stderr).lower()


# --- the supervisor's relay ----------------------------------------------------------------------------------

ACCESS = 'INFO:     127.0.0.1:51234 - "GET {path} HTTP/1.1" {status}\n'


def test_the_relay_drops_the_probes_access_lines_only() -> None:
    from engine.supervisor import Relay, is_probe_access_line

    lines = [
        ACCESS.format(path="/metrics", status="200 OK"),
        "(APIServer pid=7) " + ACCESS.format(path="/health", status="200 OK"),
        ACCESS.format(path="/health", status="503 Service Unavailable"),   # a failing probe says something
        ACCESS.format(path="/v1/models", status="200 OK"),
        'INFO:     10.0.0.2:4000 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
        ACCESS.format(path="/metricsx", status="200 OK"),
        "INFO 12-02 10:00:00 [core.py:1] something about /metrics\n",
    ]
    out, status = io.StringIO(), io.StringIO()
    relay = Relay(out, status)
    for line in lines:
        relay(line)
    assert out.getvalue() == "".join(lines[2:])
    assert status.getvalue() == ""
    assert is_probe_access_line(lines[0]) and not is_probe_access_line(lines[3])


def test_the_relay_turns_loading_lines_into_botgw_status_lines() -> None:
    """The lines in vLLM 0.32's wording (its log calls), as `botgw engine serve` shows them on stderr; each step
    once, a progress bar by its last state, and every vLLM line still relayed."""
    from engine.supervisor import Relay, loading_status

    lines = [
        "(EngineCore pid=9) INFO 12-02 10:00:01 [cpu_model_runner.py:68] Starting to load model /m/ernie-tiny...\n",
        "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\r"
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]\n",
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]\n",
        "INFO 12-02 10:00:03 [default_loader.py:502] Loading weights took 1.52 seconds\n",
        "INFO 12-02 10:00:03 [gpu_model_runner.py:5150] Model loading took 0.57 GiB memory and 2.345678 seconds\n",
        "INFO 12-02 10:00:04 [cpu_model_runner.py:87] Warming up model for the compilation...\n",
        "INFO 12-02 10:00:09 [core.py:403] init engine (profile, create kv cache, warmup model) took 8.10 s\n",
        "(APIServer pid=8) INFO 12-02 10:00:10 [entry.py:140] Starting vLLM server on http://127.0.0.1:8010\n",
        "(APIServer pid=8) INFO:     Application startup complete.\n",
        "INFO 12-02 10:00:11 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s\n",
    ]
    out, status = io.StringIO(), io.StringIO()
    relay = Relay(out, status)
    for line in lines:
        relay(line)
    assert out.getvalue() == "".join(lines)
    assert status.getvalue().splitlines() == [
        "botgw: engine loading the model /m/ernie-tiny",
        "botgw: engine loading weights: shard 1/2 (50%)",
        "botgw: engine weights loaded in 1.52 s",
        "botgw: engine model loaded (0.57 GiB, 2.3 s)",
        "botgw: engine warming up",
        "botgw: engine initialised in 8.10 s (KV cache, warm-up)",
        "botgw: engine starting the API server on http://127.0.0.1:8010",
        "botgw: engine ready",
    ]
    assert loading_status("INFO something else entirely\n") is None
