"""The server's streaming text filters give the same result however the text is split."""

from __future__ import annotations

import json

import pytest

from engine.tool_calls import StopFilter, ToolCall, ToolCallFilter, ToolSyntax


def run(text: str, size: int, stops: list[str], syntax: ToolSyntax | None):
    stop, calls = StopFilter(stops), ToolCallFilter(syntax)
    out: list = []
    for i in range(0, len(text), size):
        out += calls.feed(stop.feed(text[i:i + size]))
        if stop.stopped:
            break
    out += calls.feed(stop.flush()) + calls.flush()
    merged: list = []  # adjacent text pieces joined, as a client would
    for piece in out:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        elif piece != "":
            merged.append(piece)
    return merged


CASES = [
    ("plain <tool_ text with a < and </tool_call>", [], None,
     ["plain <tool_ text with a < and </tool_call>"]),
    ('a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>b', [], ToolSyntax(),
     ["a", ToolCall("f", '{"x": 1}'), "b"]),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>', [], ToolSyntax(),
     [ToolCall("f", '{"x": 2}')]),
    ('<tool_call>{"name": "f", "arguments": {"x": </tool_call> tail', [], ToolSyntax(),
     ['<tool_call>{"name": "f", "arguments": {"x": </tool_call> tail']),
    ('<tool_call>{"arguments": {}}</tool_call>', [], ToolSyntax(),
     ['<tool_call>{"arguments": {}}</tool_call>']),  # no name: not a call
    ('text <tool_call>{"name": "f", "arguments": {}}', [], ToolSyntax(),
     ["text ", ToolCall("f", "{}")]),  # cut at max_tokens before the end tag, JSON whole
    ("Hello world. Goodbye.", ["world", "Good"], None, ["Hello "]),
    ("abcabd", ["abd"], None, ["abc"]),
    ('x<tool_call>{"name": "f", "arguments": {}}</tool_call>STOP more', ["STOP"], ToolSyntax(),
     ["x", ToolCall("f", "{}")]),
]


@pytest.mark.parametrize("text,stops,syntax,want", CASES)
def test_filters_do_not_depend_on_how_the_text_is_split(text, stops, syntax, want):
    for size in range(1, len(text) + 1):
        assert run(text, size, stops, syntax) == want, size


def test_a_tokenizers_own_parser_is_used():
    class Wrapper:  # what mlx-lm's TokenizerWrapper exposes for a tool-calling template
        tool_call_start, tool_call_end = "[CALL]", "[/CALL]"

        @staticmethod
        def tool_parser(text, tools):
            name, _, args = text.partition(":")
            return {"name": name, "arguments": json.loads(args)}

    syntax = ToolSyntax.of(Wrapper())
    assert run('ok [CALL]f:{"a": [1]}[/CALL]', 2, [], syntax) == [
        "ok ", ToolCall("f", '{"a": [1]}')]
    assert ToolSyntax.of(object()) == ToolSyntax()
