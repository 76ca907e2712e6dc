"""Fixed-size KV blocks on two tiers: `gpu` (where attention runs) and `cpu` (swap space).

Deals only in block ids and counts, like vLLM's BlockSpaceManager / nano-vllm's BlockManager,
so the simulator and the real engine share it. The real engine maps block ids to slices of
its cache tensors and performs the copies listed in SchedulerOutput: all its swap-outs, then all
its swap-ins. So a gpu block a swap-out vacates may go to a swap-in of the same output, but a
cpu block a swap-in reads may not go to a swap-out before those copies are done (the swap-out
would overwrite it first): swap-ins hold their cpu blocks until `copies_done`.

A hybrid model's request also holds a fixed-size recurrent state (engine.caches.paged_state): it
takes `state_blocks` blocks of the same pools from its first cached token on, at the head of its
table, so a preserve keeps it, a swap moves it and a discard frees it with the request's KV blocks.

A model whose layers all slide keeps a ring of at most `max_blocks` KV blocks per request, however
long it grows (engine.caches.paged).
"""

from __future__ import annotations

from collections import deque


class OutOfBlocks(RuntimeError):
    pass


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int = 16, state_blocks: int = 0,
                 max_blocks: int | None = None):
        if num_gpu_blocks <= 0 or block_size <= 0 or num_cpu_blocks < 0 or state_blocks < 0 or (
                max_blocks is not None and max_blocks < 1):
            raise ValueError(
                f"BlockManager needs num_gpu_blocks > 0, num_cpu_blocks >= 0, block_size > 0, state_blocks >= 0 and "
                f"max_blocks >= 1; got {num_gpu_blocks}, {num_cpu_blocks}, {block_size}, {state_blocks}, {max_blocks}"
            )
        self.block_size = block_size
        self.state_blocks = state_blocks
        self.max_blocks = max_blocks  # KV blocks a request holds at most (a ring); None: no cap
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self._free_gpu = deque(range(num_gpu_blocks))
        self._free_cpu = deque(range(num_cpu_blocks))
        self.gpu_tables: dict[str, list[int]] = {}  # request id -> gpu block ids
        self.cpu_tables: dict[str, list[int]] = {}  # request id -> cpu block ids (swapped out)
        self._cpu_being_read: list[int] = []  # cpu blocks of planned swap-ins, until `copies_done`

    # -- queries -------------------------------------------------------------------------
    @property
    def free_gpu_blocks(self) -> int:
        return len(self._free_gpu)

    @property
    def free_cpu_blocks(self) -> int:
        return len(self._free_cpu)

    @property
    def used_gpu_blocks(self) -> int:
        return self.num_gpu_blocks - len(self._free_gpu)

    @property
    def used_cpu_blocks(self) -> int:
        return self.num_cpu_blocks - len(self._free_cpu)

    @property
    def cpu_blocks_being_read(self) -> int:
        """cpu blocks no request owns that swap-ins not yet performed still read."""
        return len(self._cpu_being_read)

    def num_gpu_blocks_of(self, rid: str) -> int:
        return len(self.gpu_tables.get(rid, ()))

    def num_cpu_blocks_of(self, rid: str) -> int:
        return len(self.cpu_tables.get(rid, ()))

    def kv_blocks(self, num_tokens: int) -> int:
        """KV blocks a request with `num_tokens` cached tokens holds (a ring's `max_blocks` at most)."""
        need = blocks_for(num_tokens, self.block_size)
        return need if self.max_blocks is None else min(need, self.max_blocks)

    def blocks_held(self, num_tokens: int) -> int:
        """Blocks a request with `num_tokens` cached tokens holds: its KV blocks and, from its
        first token on, its state's."""
        return self.kv_blocks(num_tokens) + (self.state_blocks if num_tokens > 0 else 0)

    def extra_blocks_needed(self, rid: str, num_tokens: int) -> int:
        """gpu blocks to add so `rid` can hold `num_tokens` cached tokens."""
        return max(0, self.blocks_held(num_tokens) - self.num_gpu_blocks_of(rid))

    # -- gpu -----------------------------------------------------------------------------
    def grow(self, rid: str, num_tokens: int) -> list[int]:
        """Make `rid`'s gpu table large enough for `num_tokens`; returns the new block ids."""
        need = self.extra_blocks_needed(rid, num_tokens)
        if need > len(self._free_gpu):
            raise OutOfBlocks(f"{rid} needs {need} gpu blocks, {len(self._free_gpu)} free")
        new = [self._free_gpu.popleft() for _ in range(need)]
        self.gpu_tables.setdefault(rid, []).extend(new)
        return new

    def free(self, rid: str) -> None:
        """Drop every block of `rid` on both tiers (finished or discarded)."""
        self._free_gpu.extend(self.gpu_tables.pop(rid, ()))
        self._free_cpu.extend(self.cpu_tables.pop(rid, ()))

    # -- swapping ------------------------------------------------------------------------
    def can_swap_out(self, rid: str) -> bool:
        return self.num_gpu_blocks_of(rid) <= len(self._free_cpu)

    def swap_out(self, rid: str) -> list[tuple[int, int]]:
        """Move `rid`'s blocks gpu -> cpu; returns (gpu block, cpu block) copies to perform."""
        return self._move(rid, (self.gpu_tables, self._free_gpu), (self.cpu_tables, self._free_cpu), "cpu")

    def can_swap_in(self, rid: str) -> bool:
        return self.num_cpu_blocks_of(rid) <= len(self._free_gpu)

    def swap_in(self, rid: str) -> list[tuple[int, int]]:
        """Move `rid`'s blocks cpu -> gpu; returns (cpu block, gpu block) copies to perform. The
        cpu blocks are free again only after `copies_done`."""
        return self._move(rid, (self.cpu_tables, self._free_cpu), (self.gpu_tables, self._free_gpu), "gpu",
                          release=self._cpu_being_read)

    def copies_done(self) -> None:
        """The copies returned so far were performed: the cpu blocks swap-ins read are free."""
        self._free_cpu.extend(self._cpu_being_read)
        self._cpu_being_read.clear()

    def _move(self, rid: str, source, target, target_tier: str, release: list[int] | None = None
              ) -> list[tuple[int, int]]:
        """Give `rid` as many target blocks as it holds source blocks and release the source ones
        (to the source's free blocks, or to `release`); (source, target) block pairs to copy.
        Each side is (tables, free blocks)."""
        (source_tables, source_free), (target_tables, target_free) = source, target
        blocks = source_tables.pop(rid, [])
        if len(blocks) > len(target_free):
            source_tables[rid] = blocks
            raise OutOfBlocks(f"{rid} needs {len(blocks)} {target_tier} blocks, {len(target_free)} free")
        moved = [target_free.popleft() for _ in blocks]
        target_tables[rid] = moved
        (source_free if release is None else release).extend(blocks)
        return list(zip(blocks, moved))
