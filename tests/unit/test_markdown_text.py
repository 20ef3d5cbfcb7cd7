"""Markdown as readable plain text (bots/markdown.py): the meaning stays, the marks go."""

from bots.markdown import to_text


def test_marks_go_and_structure_stays() -> None:
    answer = "# 报销流程\n\n**注意**：先提交*申请*。\n\n1. 填写表单\n2. 主管审批\n\n- 发票\n- 行程单\n"
    text = to_text(answer)
    assert "**" not in text and "#" not in text and "*" not in text
    assert "报销流程" in text.splitlines()[0]
    assert "1. 填写表单" in text and "2. 主管审批" in text
    assert "• 发票" in text and "• 行程单" in text
    assert "注意：先提交申请。" in text


def test_links_keep_their_address() -> None:
    assert to_text("见 [员工手册](https://example.com/hb)。") == "见 员工手册 (https://example.com/hb)。"
    assert to_text("<https://example.com>") == "https://example.com"


def test_code_and_tables_stay_readable() -> None:
    text = to_text("```\npip install botgw\n```\n\n| 项目 | 金额 |\n|---|---|\n| 餐费 | 30 |\n")
    assert "pip install botgw" in text and "```" not in text
    assert "项目 | 金额" in text and "餐费 | 30" in text and "---" not in text


def test_plain_text_is_unchanged() -> None:
    for plain in ("answer to: hello", "你好，有什么可以帮你？", "answer to: sleep=0.5 user_1"):
        assert to_text(plain) == plain


def test_nested_lists_are_indented() -> None:
    text = to_text("1. 第一步\n   - 细节甲\n   - 细节乙\n2. 第二步\n")
    lines = text.splitlines()
    assert lines[0] == "1. 第一步" and lines[1] == "  • 细节甲" and lines[-1] == "2. 第二步"


def test_odd_answers_keep_their_content() -> None:
    assert to_text("0. zero\n1. one") == "0. zero\n1. one"
    assert to_text("#") == "#" and to_text("*") == "*", "never an empty piece"
    assert "• paragraph" not in to_text("- a\n-\n\nparagraph")


def test_numbers_and_dashes_inside_a_line_are_not_markup_but_a_numbered_line_is() -> None:
    plain = "产品 A 的价格为 299 元，保修期 12 个月，客服电话 400-800-1234，a - b = c + 1 3) 项"
    assert to_text(plain) == plain
    assert to_text("  2) 第二项\n3) 第三项") == "2. 第二项\n3. 第三项"
    assert to_text("标题\n===") == "标题"
    assert to_text("价格 &lt; 100 元，AT&amp;T 5G") == "价格 < 100 元，AT&T 5G"
    assert to_text("1\\. 不是列表，价格\\$100") == "1. 不是列表，价格$100"
    assert to_text("上文\r- 一\r- 二") == "上文\n\n• 一\n• 二"
    assert to_text("上文\n\n- 一\n+ 二") == "上文\n\n• 一\n\n• 二"
