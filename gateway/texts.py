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
TEXT_ONLY_TEXT = "I can only read text messages for now. 目前只支持文字消息。"
ENGINE_STARTING_TEXT = (
    "The assistant is starting up; your answer is coming in a moment. 助手正在启动，稍后为你回答。"
)
TOO_MANY_STREAMS_TEXT = (
    "I am still answering your earlier questions; please wait for them to finish. 请等待前面的问题回答完毕。"
)
STREAM_TIMEOUT_TEXT = "Sorry, this answer took too long and was cut off. 抱歉，回答超时，已中断。"
ANSWER_CUT_TEXT = (
    "\n\n（回答太长，后面的部分无法在这里显示，请把问题问得更具体些。）"
    "(The answer was cut here: it is longer than this chat can show. Please ask a narrower question.)"
)
EMPTY_ANSWER_TEXT = "(The assistant returned an empty answer; please rephrase.) 助手没有给出回答，请换个说法。"

ENGINE_UNAVAILABLE_TEXT = (
    "Sorry, the assistant is unavailable right now. Please try again later. 助手暂时不可用，请稍后再试。"
)
