"""Streaming text filters for the server: stop strings, and tool-call markup -> tool calls.

The model writes a tool call as markup in its text, e.g. Qwen's
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. The tokenizer wrapper mlx-lm loads
names the markup and the parser for the model's template; without one, the Qwen/Hermes JSON
form above is read. Markup whose JSON does not parse stays plain text: a model's mistake is
the client's content, never a server error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_START, DEFAULT_END = "<tool_call>", "</tool_call>"


def _json_call(text: str, tools: Any = None) -> dict:
    return json.loads(text.strip())  # mlx_lm.tool_parsers.json_tools, without the import


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


@dataclass
class ToolSyntax:
    start: str = DEFAULT_START
    end: str = DEFAULT_END
    parse: Callable[[str, Any], Any] = _json_call

    @classmethod
    def of(cls, tokenizer: Any) -> ToolSyntax:
        """The markup and parser mlx-lm found for this tokenizer's template, else Qwen's."""
        parser = getattr(tokenizer, "tool_parser", None)
        start = getattr(tokenizer, "tool_call_start", None)
        end = getattr(tokenizer, "tool_call_end", None)
        if parser is not None and start and end:
            return cls(start, end, parser)
        return cls()

    def call(self, body: str, tools: Any) -> ToolCall | None:
        """The markup's inside -> a ToolCall; None when it is not a well-formed call."""
        try:
            parsed = self.parse(body, tools)
        except Exception:  # noqa: BLE001 - any parser failure means "not a tool call"
            return None
        if isinstance(parsed, list) and len(parsed) == 1:
            parsed = parsed[0]
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            return None
        args = parsed.get("arguments", {})
        if isinstance(args, str):
            try:
                json.loads(args)
            except json.JSONDecodeError:
                return None
        else:
            args = json.dumps(args, ensure_ascii=False)
        return ToolCall(parsed["name"], args)


def _held(text: str, marks: list[str]) -> int:
    """How many trailing characters of `text` could begin one of `marks` (to hold back)."""
    longest = 0
    for mark in marks:
        for n in range(min(len(mark) - 1, len(text)), longest, -1):
            if text.endswith(mark[:n]):
                longest = n
                break
    return longest


class StopFilter:
    """Cuts the text at the first stop string; holds back what may begin one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[:min(hits)], "", True
            return out
        keep = _held(self.pending, self.stops)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class ToolCallFilter:
    """Splits streamed text into content and ToolCalls. With `syntax` None it passes text on."""

    def __init__(self, syntax: ToolSyntax | None, tools: Any = None):
        self.syntax, self.tools = syntax, tools
        self.pending = ""
        self.inside = False
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        if self.syntax is None:
            return [text] if text else []
        s = self.syntax
        self.pending += text
        out: list[str | ToolCall] = []
        while True:
            if not self.inside:
                at = self.pending.find(s.start)
                if at < 0:
                    keep = _held(self.pending, [s.start])
                    cut = len(self.pending) - keep
                    if cut:
                        out.append(self.pending[:cut])
                    self.pending = self.pending[cut:]
                    return out
                if at:
                    out.append(self.pending[:at])
                self.pending, self.inside = self.pending[at + len(s.start):], True
            else:
                at = self.pending.find(s.end)
                if at < 0:
                    return out
                body, self.pending = self.pending[:at], self.pending[at + len(s.end):]
                self.inside = False
                out.append(self._resolve(body, closed=True))

    def flush(self) -> list[str | ToolCall]:
        """The end of the text: an unclosed call is tried as-is (a reply cut at max_tokens
        or by a stop string leaves one), else returned as text."""
        if self.syntax is None or not self.pending and not self.inside:
            rest, self.pending = self.pending, ""
            return [rest] if rest else []
        body, self.pending = self.pending, ""
        if self.inside:
            self.inside = False
            return [self._resolve(body, closed=False)]
        return [body]

    def _resolve(self, body: str, closed: bool) -> str | ToolCall:
        call = self.syntax.call(body, self.tools)
        if call is None:
            return self.syntax.start + body + (self.syntax.end if closed else "")
        self.calls += 1
        return call
