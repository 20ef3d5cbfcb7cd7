"""Build a tiny, randomly initialised ERNIE-4.5 MoE model for tests and offline demos.

Why this exists: there is no model hub reachable from CI or from the offline demo
machines, yet the gateway must be exercised against a real vLLM engine running the
same architecture as production (``Ernie4_5_MoeForCausalLM``, with routed and shared
experts). This module produces such a model from nothing: a small byte-level BPE
tokenizer trained on a built-in English/Chinese corpus (plus ERNIE's tool-call and thinking markers as single
tokens, as vLLM's ernie45 parsers expect), the ERNIE-4.5 chat template,
and a ~1M-parameter bf16 MoE with fixed-seed random weights. Its replies are
gibberish and it never emits EOS on its own, so always send ``max_tokens``.

Runs inside the engine venv (stdlib + torch + transformers + tokenizers only)::

    PYTHONPATH=/work/main python -m engine.tiny --out ~/.cache/botgw/models/ernie-tiny

The build is idempotent (a complete directory is left alone), deterministic (same
seed, same corpus -> same files) and atomic (built in a temporary sibling directory,
then renamed into place; the completion marker is written last).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when anything below changes what gets written; a directory whose marker
# carries another recipe is rebuilt.
RECIPE = "ernie45-tiny-moe-v4"
MARKER = ".botgw-complete"
SEED = 20250630
VOCAB_SIZE = 2000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|begin_of_sentence|>", "<|end_of_sentence|>"]
# ERNIE-4.5's markers for thinking, answers and tool calls, single tokens of its vocabulary: vLLM's ernie45 tool parser
# finds `<tool_call>` in a stream only when it arrives whole, as one token. Ordinary (not special) tokens, as decoding
# skips special ones and the parser must see them in the text.
MARKER_TOKENS = ["<think>", "</think>", "<response>", "</response>", "<tool_call>", "</tool_call>"]
TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "ernie45.jinja"
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")

CORPUS = """\
The gateway sits between the chat bots and the inference engine. Every request that
arrives from a messaging platform is checked, counted and forwarded to the engine,
and every answer is streamed back token by token. When the engine is busy, requests
wait in a queue; when it is down, the gateway says so quickly instead of hanging.
Operators watch the metrics page to see how many requests are running, how long the
first token takes, and how full the key-value cache is.

A small model is useful for testing. It answers in a fraction of a second, it fits in
a few megabytes, and it behaves like the large model from the point of view of the
server: the same architecture, the same chat template, the same special tokens. Its
answers make no sense at all, but the shape of every response is exactly right, and
that is what the tests need to check.

Mixture-of-experts models route each token to a few experts out of many. A router
scores the experts, the top ones are chosen, and their outputs are mixed with the
weights the router gave them. Shared experts see every token. Expert parallelism
spreads the experts over several devices, and a load balancer moves hot experts so
that no device waits for another one. The balancedness of a step is the average load
divided by the maximum load.

On Monday morning the weather was cold and windy, so we stayed inside, made tea and
read the news. By the afternoon the sun came out, the children went to the park, and
the dog chased a ball across the wet grass until it was too tired to walk home. In the
evening we cooked rice, fried some vegetables with garlic and ginger, and talked about
the trip we want to take next summer to the mountains and the sea.

Numbers, dates and codes appear in real conversations too: order 12345 shipped on
2025-06-30 at 14:05; the meeting moved from room 3B to room 7A; version 0.32.0 fixed
the bug reported in issue #4096. Please reply with yes or no. Thank you very much!
What time is it? How are you today? Can you help me write a short poem about rain?

网关位于聊天机器人和推理引擎之间。每一个来自消息平台的请求都会被检查、计数，然后转发给引擎，
每一个回答都会一个词元一个词元地流式返回。当引擎繁忙时，请求会在队列中等待；当引擎停止工作时，
网关会迅速告知用户，而不是一直挂起。运维人员通过监控页面查看正在运行的请求数量、首个词元的延迟，
以及键值缓存的使用情况。

混合专家模型会把每个词元路由给众多专家中的少数几个。路由器为每个专家打分，选出得分最高的专家，
再按照路由器给出的权重把它们的输出混合起来。共享专家会处理每一个词元。专家并行把专家分布到多个设备上，
负载均衡器会移动热门专家，使得没有设备需要等待其他设备。

今天早上天气很冷，风也很大，我们待在家里喝茶、看新闻。下午太阳出来了，孩子们去公园玩，
小狗在湿漉漉的草地上追着球跑，直到累得走不动路。晚上我们煮了米饭，用大蒜和生姜炒了一些蔬菜，
一起讨论明年夏天想去山里和海边旅行的计划。

A good support bot keeps its answers short and polite. It greets the customer, asks
for the order number, looks up the parcel, and explains where it is and when it will
arrive. If it does not know something, it says so and offers to pass the question to a
human colleague. Customers often write in a hurry, with typos, emoji and half sentences,
so the bot must be patient and read carefully before it answers.

Rate limits protect the engine from bursts of traffic. Each user gets a budget of
tokens per minute; a request that would exceed it is rejected with a clear message and
a hint about when to try again. Timeouts, retries and circuit breakers keep one slow
component from dragging the whole system down. Logs record who asked what and how long
it took, without storing private data longer than necessary.

客服机器人应该简短而礼貌地回答问题。它先问候顾客，询问订单号，查询包裹的位置，然后说明包裹现在在哪里、
什么时候能送到。如果它不知道答案，就坦白地说出来，并把问题转交给人工客服。顾客常常匆忙地打字，
有错别字和表情符号，所以机器人必须耐心、仔细地阅读之后再回答。

限流可以保护引擎免受突发流量的冲击。每个用户每分钟都有一定的词元预算；超出预算的请求会被拒绝，
并提示稍后再试。超时、重试和熔断机制可以防止一个缓慢的组件拖垮整个系统。日志会记录请求的内容和耗时，
但不会长期保存用户的隐私数据。春天来了，花开了，鸟儿在树上唱歌，农民在田里忙着播种。

你好！请问你是谁？我是一个聊天助手，可以回答问题、写诗、翻译文章，也可以陪你聊天。
请用一句话介绍一下北京。北京是中国的首都，有着悠久的历史和丰富的文化。谢谢你的帮助，再见！
"""


def _sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _weight_files(model_dir: Path) -> list[Path]:
    """Safetensors weight files in a model directory."""
    return sorted(model_dir.glob("*.safetensors"))


def is_complete(model_dir: Path) -> bool:
    """True if ``model_dir`` holds a finished build of the current recipe."""
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (
        meta.get("recipe") == RECIPE
        and all((model_dir / name).is_file() for name in REQUIRED_FILES)
        and bool(_weight_files(model_dir))
    )


def build_tokenizer(chat_template: str):
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, f"special token {name!r} is not id {i}"
    tok.add_tokens([AddedToken(name, normalized=False, special=False) for name in MARKER_TOKENS])

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=chat_template,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def build_model(vocab_size: int):
    """The tiny ``Ernie4_5_MoeForCausalLM`` in bf16, with fixed-seed random weights."""
    import torch
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    cfg = Ernie4_5_MoeConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention only takes 32/64/80/.../256
        moe_num_experts=4,
        moe_k=2,
        moe_intermediate_size=64,
        moe_layer_start_index=0,  # every layer is an MoE layer
        moe_num_shared_experts=1,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        use_bias=False,
        # With the default 0.02 the tied embedding dominates the residual stream and
        # greedy decoding just repeats the last prompt token ("   ..."); 0.2 gives
        # varied (still meaningless) text, which makes output comparisons meaningful.
        initializer_range=0.2,
    )
    torch.manual_seed(SEED)
    model = Ernie4_5_MoeForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    return model


def build(out: Path, *, force: bool = False) -> Path:
    """Build the tiny model into ``out`` (atomically, replacing it if ``force``); return ``out``."""
    out = out.expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    chat_template = TEMPLATE_PATH.read_text(encoding="utf-8")

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer = build_tokenizer(chat_template)
        tokenizer.save_pretrained(tmp)

        model = build_model(len(tokenizer))
        model.save_pretrained(tmp)
        # Only token ids: vLLM is started with --generation-config vllm anyway, and
        # sampling defaults in here would silently change its behaviour under "auto".
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, indent=2) + "\n"
        )

        weights = _weight_files(tmp)
        if not weights:
            raise RuntimeError("save_pretrained wrote no .safetensors file")
        from safetensors import safe_open

        names: list[str] = []
        for wf in weights:
            with safe_open(str(wf), framework="pt") as fh:
                names.extend(fh.keys())
        if not any(".mlp.experts.0." in n for n in names):
            raise RuntimeError(f"no MoE expert tensors (mlp.experts.0) in saved weights: {sorted(names)[:20]}")
        for name in REQUIRED_FILES:
            if not (tmp / name).is_file():
                raise RuntimeError(f"build is missing {name}")

        meta = {
            "recipe": RECIPE,
            "seed": SEED,
            "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "weights": {wf.name: _sha256(wf) for wf in weights},
        }
        (tmp / MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")  # last

        if out.exists():
            if is_complete(out) and not force:  # somebody else finished first
                shutil.rmtree(tmp)
                return out
            stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, stale / out.name)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            f.chmod(0o644)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _looks_replaceable(out: Path) -> bool:
    """An existing incomplete ``out`` may be replaced only if empty or one of our builds."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    entries = list(out.iterdir())
    return not entries or (out / MARKER).exists()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``python -m engine.tiny --out DIR [--force]``."""
    parser = argparse.ArgumentParser(prog="python -m engine.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="target model directory")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser().resolve()

    if is_complete(out) and not args.force:
        print(f"tiny model already complete at {out}; nothing to do")
        return 0
    if not args.force and not _looks_replaceable(out):
        print(f"error: {out} exists, is not empty and is not a tiny-model build; "
              "pass --force to replace it", file=sys.stderr)
        return 2
    build(out, force=args.force)
    meta = json.loads((out / MARKER).read_text())
    print(f"built tiny ERNIE-4.5 MoE at {out} "
          f"({meta['parameters']} parameters, vocab {meta['vocab_size']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
