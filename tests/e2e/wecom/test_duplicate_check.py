"""WeCom's duplicate check on from the first attempt, without ever dropping an answer that merely repeats one."""

from __future__ import annotations

from gateway.delivery.presenters import UNIQUE_MARKS
from testkit.stacks import Stack


def test_every_piece_is_flagged_and_a_repeated_answer_still_arrives(stack: Stack, user: str) -> None:
    dropped_before = stack.sim_stats()["duplicates_dropped"]
    for count in (1, 2, 3):
        assert stack.post_callback(stack.signer().text(user, "/help")).status_code == 200
        stack.wait_delivered(user, count, settle=0.2)
    delivered = stack.wait_delivered(user, 3)

    assert len(delivered) == 3, "an identical answer to the same person was dropped as a duplicate"
    assert all(item["duplicate_check"] for item in delivered), "a first attempt went without the duplicate check"
    # The same visible text each time; only invisible marks tell them apart (WeCom matches on content).
    assert len({item["content"].rstrip(UNIQUE_MARKS) for item in delivered}) == 1
    assert len({item["content"] for item in delivered}) == 3
    assert delivered[0]["content"] == delivered[0]["content"].rstrip(UNIQUE_MARKS), "the first send is unmarked"
    assert stack.sim_stats()["duplicates_dropped"] == dropped_before
