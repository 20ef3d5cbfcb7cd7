"""Every text botgw itself says to a user (help, notices, apologies), in one place to review and translate."""

from __future__ import annotations

HELP_TEXT = (
    "I am the team assistant. Ask me anything in plain words; I remember our conversation.\n"
    "Commands:\n"
    "/reset  forget our conversation and start over\n"
    "/help   show this help\n"
    "我是团队助手，直接提问即可；我会记住我们的对话。发送 /reset 清空对话记忆，/help 查看帮助。"
)
RESET_TEXT = "Done: I have forgotten our conversation. 已清空对话记忆。"
UNSUPPORTED_TEXT = (
    "I can read text, voice messages, pictures (when my model can see) and files (txt, md, pdf, docx, xlsx), "
    "but not this kind of message. "
    "我能读文字、语音、图片（模型支持时）和文件（txt、md、pdf、docx、xlsx），暂不支持这类消息。"
)
TEXT_ONLY_TEXT = UNSUPPORTED_TEXT  # its name before messages had parts
VOICE_NOT_READ_TEXT = "I could not turn your voice message into text; please type it. 没能识别这条语音，请打字发给我。"
IMAGE_NEEDS_VISION_TEXT = (
    "My model cannot see pictures; please describe it in words. 当前模型看不了图片，请用文字描述。"
)
TOO_MANY_PARTS_TEXT = "I read only the first {count} attachments. 只读取了前 {count} 个附件。"
TOO_MANY_IMAGES_TEXT = "Please send at most {count} pictures at a time. 一次最多发 {count} 张图片。"
FILE_TYPE_TEXT = "I can read {kinds} files; 《{name}》 is not one of them. 只能读取 {kinds} 文件，《{name}》不在其中。"
FILE_UNREADABLE_TEXT = "I could not read 《{name}》: {why}. 无法读取《{name}》：{why}。"
FILE_TOO_LONG_TEXT = (
    "Your files are too long for me to read together with your question; please send a shorter part. "
    "文件太长，放不进这次对话，请发送较短的部分。"
)
FILE_TRIMMED_NOTE = "（Note: the file was long; I read only its first {percent}%. 文件较长，只读了前 {percent}%。）"
QUOTED = "（引用：「{quoted}」）\n{question}"
IMAGE_QUESTION = "请看这张图片。"
IMAGE_MARK = "[图片]"
ATTACHMENT = "【我发来的文件《{name}》，内容如下】\n{text}\n【文件《{name}》结束】"
MEDIA_ERROR_TEXTS = {
    "expired": "That attachment has expired on the platform; please send it again. 附件已过期，请重新发送。",
    "too_large": "That attachment is too large: the limit is {mb} MB. 附件太大，上限 {mb} MB。",
    "unsupported": "I cannot open that attachment. 无法打开这个附件。",
}
MEDIA_UNAVAILABLE_TEXT = "I could not fetch that attachment; please send it again. 附件获取失败，请重新发送。"


def media_error_text(reason: str, max_bytes: int) -> str:
    """The reply to an attachment that could not be had, by MediaError's reason."""
    text = MEDIA_ERROR_TEXTS.get(reason, MEDIA_UNAVAILABLE_TEXT)
    return text.format(mb=round(max_bytes / (1024 * 1024), 1))


def file_received_text(files: list) -> str:  # type: ignore[type-arg]
    """A file alone: what it holds, and an invitation to ask."""
    described = "；".join(f"《{file.name}》（{len(file.text)} 字：{_opening(file.text)}）" for file in files)
    return f"Got it. 已收到 {described}。Ask me anything about it. 请就它提问。"


def _opening(text: str, chars: int = 40) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else f"{flat[:chars]}…"
ENGINE_STARTING_TEXT = (
    "The assistant is starting up; your answer is coming in a moment. 助手正在启动，稍后为你回答。"
)
TOO_MANY_STREAMS_TEXT = (
    "I am still answering your earlier questions; please wait for them to finish. 请等待前面的问题回答完毕。"
)
# The stream closes at WeCom's time limit; the answer, when it comes, goes as one post through response_url
# (gateway/delivery/stream.py `_post_late`), which holds for an hour.
STREAM_TIMEOUT_TEXT = (
    "Sorry, this answer is taking too long to show here; it will come as a separate message when it is ready. "
    "抱歉，回答超时，答案生成后会另发一条消息。"
)
# What gateways before the `timed_out` mark closed streams with: a worker still knows such a stream during a rolling
# upgrade (gateway/delivery/stream.py).
STREAM_TIMEOUT_TEXTS_BEFORE = ("Sorry, this answer took too long and was cut off. 抱歉，回答超时，已中断。",)
ANSWER_CUT_TEXT = (
    "\n\n（回答太长，后面的部分无法在这里显示，请把问题问得更具体些。）"
    "(The answer was cut here: it is longer than this chat can show. Please ask a narrower question.)"
)
EMPTY_ANSWER_TEXT = "(The assistant returned an empty answer; please rephrase.) 助手没有给出回答，请换个说法。"

ENGINE_UNAVAILABLE_TEXT = (
    "Sorry, the assistant is unavailable right now. Please try again later. 助手暂时不可用，请稍后再试。"
)

# Tools (issue 24)
TOOL_CONFIRM_TEXT = (
    "将要执行「{tool}」：\n{arguments}\n\n回复「确认」执行，回复「取消」放弃（{minutes} 分钟内有效）。\n"
    "About to run {tool} with the above. Reply 确认 to confirm or 取消 to cancel (valid {minutes} min)."
)
TOOL_CONFIRM_TITLE = "确认执行「{tool}」？"
TOOL_CARD_LABELS = {"confirmed": "已确认", "cancelled": "已取消", "expired": "已过期"}  # a tapped card's last button
TOOL_BUTTON_STALE_TEXT = (
    "这个确认已失效（已过期，或已有更新的请求），没有执行任何操作。"
    "This confirmation is no longer current (expired or replaced); nothing was done."
)
TOOL_CANCELLED_TEXT = "已取消，「{tool}」没有执行。Cancelled: {tool} was not run."
TOOL_SUPERSEDED_NOTE = (
    "（之前等待确认的「{tool}」已取消，没有执行；如仍需要，请重新提出。"
    "The earlier request to run {tool} was cancelled, not run; ask again if you still need it.）"
)
TOOL_CONFIRM_EXPIRED_TEXT = (
    "这次确认已过期，「{tool}」没有执行；如仍需要，请重新提出。The confirmation expired: {tool} was not run."
)
TOOL_ALREADY_CONFIRMED_TEXT = "「{tool}」已经确认过，不会重复执行。{tool} was confirmed already; it is not run twice."
TOOL_OUTCOME_UNKNOWN_TEXT = (
    "执行「{tool}」时处理中断，结果未知：它可能已经完成。为避免重复，我没有再次执行，请先核实，需要时再让我重试。\n"
    "{tool} was interrupted and may have been done; it was not run again. Please check, then ask again if needed."
)
TOOL_LIMIT_TEXT = (
    "这个问题需要的工具调用超过了上限（{count} 次），我先停在这里。"
    "This question needed more than {count} tool calls; I stopped there."
)
TOOL_RUNNING_TEXT = "正在调用 {tool}…"
TOOL_UNAVAILABLE_NOTE = "（工具暂时不可用：{servers}。Tools unavailable now: {servers}.）"
TOOL_RESULT_CUT = "\n…（结果过长，已截断 / result cut to fit）"
