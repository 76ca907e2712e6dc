"""What an agent task is to the live engine: its first messages, when its generated text ends a
segment, which tool call that text makes, and the turn a tool's result becomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from flexlamps.tools.sandbox import ToolResult


@dataclass(frozen=True)
class ToolCall:
    name: str  # the tool: the scheduler learns call durations per name
    run: Callable[[], ToolResult]  # runs in a worker thread; measures its own time


class AgentTask(Protocol):
    task_id: str
    kind: str  # the workload (the scheduler's predictor keys requests by it)

    def messages(self) -> list[dict]:
        """The conversation the request starts from (the model answers as the assistant)."""

    def segment_done(self, text: str) -> bool:
        """Whether the text generated since the last turn already ends the segment (a stop
        string: a closed code block, `</tool_call>`); the end of the turn and the per-turn
        token cap end it too."""

    def end_segment(self, text: str) -> ToolCall | None:
        """The segment's text is final: the call it makes, or None when the task is done."""

    def tool_turn(self, call: ToolCall, result: ToolResult, can_continue: bool) -> tuple[str, str] | None:
        """The call returned `result`: the (role, content) turn the model reads next, or None
        when the task ends here (also when not `can_continue`: no room left in the context)."""

    def record(self) -> dict:
        """Everything the task did, as JSON (written per task and policy)."""
