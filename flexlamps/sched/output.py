"""What crosses the scheduler <-> executor boundary, as plain data (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerOutput:
    """One iteration's plan, for an executor that owns the KV tensors. Order matters:
    1. copy `swap_out` (gpu -> cpu; the gpu blocks they vacate are already free in the
       BlockManager and may be reused below), then `swap_in` (cpu -> gpu; the cpu blocks they
       read are not a swap-out's target before the next output);
    2. run one forward over the listed tokens (or `num_steps` identical decode forwards); a
       request's new tokens start at `Scheduler.requests[rid].num_computed`, which
       `update_from_output` advances;
    3. sample for `sampling`, and report calls / ends through `Scheduler.update_from_output`."""

    iteration: int = 0
    # `num_steps` > 1 only when every scheduled request is decoding and nothing else can change
    # for that many iterations (the simulator fast-forwards; the real engine always gets 1).
    num_steps: int = 1
    prefill: dict[str, int] = field(default_factory=dict)  # new prompt / returned API tokens
    recompute: dict[str, int] = field(default_factory=dict)  # tokens of a discarded cache
    decode: list[str] = field(default_factory=list)  # one token each
    sampling: list[str] = field(default_factory=list)  # requests that sample a token this step
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, gpu block)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu block, cpu block)
    discarded: list[str] = field(default_factory=list)  # caches freed since the last output
    preserved: list[str] = field(default_factory=list)  # caches kept on gpu through a call
    swapped_out: list[str] = field(default_factory=list)  # caches moved to cpu for a call
    preempted: list[str] = field(default_factory=list)  # running requests sent back to waiting
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # of computing requests
    context_tokens: int = 0  # cached tokens attention reads this step (cost model input)
    swap_tokens: int = 0  # tokens moved across PCIe this step (both directions)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill.values()) + sum(self.recompute.values())

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.recompute or self.decode or self.swap_in or self.swap_out)

    def scheduled_tokens(self, rid: str) -> int:
        if rid in self.prefill or rid in self.recompute:
            return self.prefill.get(rid, 0) + self.recompute.get(rid, 0)
        return 1


@dataclass
class RunnerOutput:
    """What the executor (or the simulator) observed after running a SchedulerOutput."""

    intercepted: dict[str, str] = field(default_factory=dict)  # request id -> API type called
    finished: set[str] = field(default_factory=set)  # requests that ended (EOS, length)
