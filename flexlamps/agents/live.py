"""Live tool calls for the augmented engine (`engine.augmented.calls.Calls`): the model's own text
ends a segment, the task names the tool call, the call runs in a worker thread while other
requests decode, and its result joins the context as a new chat turn."""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass, field

from flexlamps.agents.chat import ChatTurns
from flexlamps.agents.task import AgentTask, ToolCall
from flexlamps.engine.augmented.calls import FINISHED
from flexlamps.sched.request import Request

MIN_TURN_TOKENS = 48  # a tool turn needs at least this much room, else the task ends


@dataclass
class _State:
    task: AgentTask
    segment: list[int] = field(default_factory=list)  # ids sampled since the last turn
    context: int = 0  # context length when the segment ended
    call: ToolCall | None = None
    future: cf.Future | None = None
    seconds: float = 0.0  # measured tool time, all calls
    calls: int = 0


class LiveCalls:
    """`tasks` by request id; each segment is at most `max_new_tokens` tokens, each request's
    context at most `max_context`; tools run on `pool`."""

    def __init__(self, tasks: dict[str, AgentTask], turns: ChatTurns, *, max_new_tokens: int, max_context: int,
                 pool: cf.Executor):
        self.turns, self.pool = turns, pool
        self.max_new_tokens, self.max_context = max_new_tokens, max_context
        self._state = {rid: _State(task) for rid, task in tasks.items()}
        self._eos = set(turns.tokenizer.eos_token_ids)
        self._running: dict[cf.Future, str] = {}

    def max_tokens(self, rid: str) -> int:
        return self.max_context

    def on_token(self, req: Request, tokens: list[int]) -> object:
        st = self._state[req.request_id]
        st.segment.append(tokens[-1])
        ended = (tokens[-1] in self._eos or len(st.segment) >= self.max_new_tokens
                 or len(tokens) + 1 >= self.max_context)
        text = self.turns.tokenizer.decode(st.segment)
        if not (ended or st.task.segment_done(text)):
            return None
        st.call, st.context = st.task.end_segment(text), len(tokens)
        return FINISHED if st.call is None else st.call.name

    def start(self, req: Request, api_type: str, now: float) -> None:
        st = self._state[req.request_id]
        st.future = self.pool.submit(st.call.run)
        self._running[st.future] = req.request_id

    def poll(self, now: float) -> list[tuple[str, list[int] | None]]:
        done = [f for f in self._running if f.done()]
        return [self._returned(self._running.pop(f)) for f in done]

    def _returned(self, rid: str) -> tuple[str, list[int] | None]:
        st = self._state[rid]
        result = st.future.result()  # a sandbox that itself broke raises here and stops the run
        st.seconds += result.seconds
        st.calls += 1
        room = self.max_context - st.context - self.max_new_tokens - 1
        turn = st.task.tool_turn(st.call, result, room >= MIN_TURN_TOKENS)
        last = st.segment[-1] if st.segment else None
        st.segment, st.call, st.future = [], None, None
        if turn is None or room < MIN_TURN_TOKENS:  # no room for another turn: the task ends here
            return rid, None
        return rid, self.turns.turn_ids(*turn, after_token=last, max_tokens=room)

    @property
    def pending(self) -> int:
        return len(self._running)

    def wait(self, until: float | None, clock) -> None:
        timeout = None if until is None else max(0.0, until - clock.now())
        cf.wait(list(self._running), timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def api_seconds(self, rid: str) -> float:
        return self._state[rid].seconds

    def num_calls(self, rid: str) -> int:
        return self._state[rid].calls
