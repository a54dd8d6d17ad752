"""workers.jsonc: comments and trailing commas out, strings untouched, positions kept."""

from __future__ import annotations

import json

import pytest

from workers.jsonc import jsonc_to_json


def loads(text: str) -> object:
    converted = jsonc_to_json(text)
    assert len(converted) == len(text) and converted.count("\n") == text.count("\n")
    return json.loads(converted)


def test_comments_and_trailing_commas_go_and_strings_stay_as_written() -> None:
    text = """\ufeff{
      // a note on its own line
      "url": "http://host//path", /* a block
         over two lines */ "args": ["a,]", "/* not a comment */", "b",],
      "quote": "say \\"//\\" here", // after a value
      "nested": {"k": [1, 2, ], },
    }
    // the end"""
    assert loads(text) == {
        "url": "http://host//path",
        "args": ["a,]", "/* not a comment */", "b"],
        "quote": 'say "//" here',
        "nested": {"k": [1, 2]},
    }


def test_plain_json_is_unchanged() -> None:
    text = json.dumps({"mcpServers": {"a": {"command": "x", "args": ["//", ",]", "/*"]}}})
    assert jsonc_to_json(text) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[,]", "Expecting value: line 1 column 2"),  # a comma with no value before it stays
        ('{"a": 1,,}', "Expecting property name enclosed in double quotes: line 1 column 9"),
        ('{"a": ,}', "Expecting value: line 1 column 7"),
        (
            "{\n  // fine\n  'single': 1\n}",
            "Expecting property name enclosed in double quotes: line 3 column 3",
        ),
        ('{"a": "no end\n}', "Invalid control character at: line 1 column 14"),
    ],
)
def test_what_is_not_jsonc_is_left_for_json_to_report_where_it_is(text: str, message: str) -> None:
    with pytest.raises(json.JSONDecodeError) as info:
        loads(text)
    assert message in str(info.value)


def test_an_unterminated_block_comment_is_reported_where_it_opens() -> None:
    with pytest.raises(json.JSONDecodeError) as info:
        jsonc_to_json('{\n  "a": 1 /* never closed\n}')
    assert (info.value.msg, info.value.lineno, info.value.colno) == ("unterminated /* comment", 2, 10)
