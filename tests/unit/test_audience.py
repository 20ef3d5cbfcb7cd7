"""bots/audience.py: the allow and deny lists, and a group prefix taken off what is answered."""

from bots.audience import admit, restricts
from bots.base import BotSettings, InboundMessage
from bots.buttons import ButtonTap


def message(sender: str = "alice", group: str = "", text: str = "你好") -> InboundMessage:
    return InboundMessage(
        platform="wecom", bot_id="b", msg_id="1", conversation_id="c", sender_id=sender, text=text, group_id=group
    )


def settings(**lists: object) -> BotSettings:
    return BotSettings(id="b", platform="wecom", **lists)  # type: ignore[arg-type]


def test_everyone_is_answered_by_default() -> None:
    assert not restricts(settings())
    sent = message()
    assert admit(settings(), sent) == (sent, "")


def test_deny_wins_over_allow() -> None:
    rules = settings(allow_users=["alice", "bob"], deny_users=["bob"])
    assert admit(rules, message("alice"))[0] is not None
    assert admit(rules, message("bob")) == (None, "denied_user")
    assert admit(rules, message("carol")) == (None, "not_allowed_user")


def test_groups_and_prefix() -> None:
    rules = settings(allow_groups=["g1"], group_prefix="#ai")
    assert admit(rules, message(group="g2", text="#ai hi")) == (None, "not_allowed_group")
    assert admit(rules, message(group="g1", text="hi")) == (None, "no_prefix")
    admitted, _ = admit(rules, message(group="g1", text="  #ai 报销怎么走？"))
    assert admitted is not None and admitted.text == "报销怎么走？"
    assert admit(rules, message(text="hi"))[0] is not None, "one-to-one needs no prefix"


def test_a_leading_mention_does_not_hide_the_prefix() -> None:
    admitted, _ = admit(settings(group_prefix="/ai"), message(group="g", text="@RobotA /ai 几点开会"))
    assert admitted is not None and admitted.text == "几点开会"


def test_a_tap_on_botgws_question_needs_no_prefix_but_obeys_the_lists() -> None:
    pressed = ButtonTap(question_id="a" * 16, choice="confirmed")
    tap = message(group="g1", text="确认").model_copy(update={"tap": pressed})
    admitted, _ = admit(settings(group_prefix="#ai"), tap)
    assert admitted is not None and admitted.text == "确认", "the question was asked there: its buttons answer it"
    assert admit(settings(group_prefix="#ai", deny_groups=["g1"]), tap) == (None, "denied_group")
