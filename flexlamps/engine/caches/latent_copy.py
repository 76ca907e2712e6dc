"""One step's missing latent records, brought from the cpu tier while attention runs over the hits.

`MissCopy.start(table, slots, positions)` begins the copy and returns at once; `wait(handle)`
returns the records on the compute device. In between the caller attends over the records its
gpu pool already holds.

- On CUDA (ESS's and FlashMLA/vLLM's arrangement): a worker thread gathers the records from the
  cpu table into a pinned staging buffer, issues one host-to-device copy of them on a copy
  stream of its own and records an event; `wait` makes the compute stream wait on that event
  (the copy then overlaps the kernels of the hit attention) and marks the copy as used by it.
  The staging buffer is reused: the next gather first waits for the previous copy to finish.
- On the CPU both tiers are one memory: the gather is the whole copy, and it runs on the
  worker thread (torch ops release the GIL) while the main thread attends over the hits.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch


class MissCopy:
    def __init__(self, device: torch.device, max_records: int, record_len: int, storage_dtype: torch.dtype):
        """`max_records`: the most records one step copies (every row missing its whole top-k);
        on CUDA the pinned staging buffer holds that many (`staging_bytes`, the cpu tier's)."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._staging = (torch.empty((max_records, record_len), dtype=storage_dtype, pin_memory=True)
                         if self.cuda else None)
        self._last_copy: torch.cuda.Event | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="latent-miss-copy")

    @staticmethod
    def staging_bytes(device: torch.device, max_records: int, record_bytes: int) -> int:
        return max_records * record_bytes if device.type == "cuda" else 0

    def start(self, table: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> Future:
        """Begin copying table[slots, positions] (1-D index tensors on the CPU) to the device."""
        return self._worker.submit(self._copy, table, slots, positions)

    def wait(self, handle: Future) -> torch.Tensor:
        """The records (m, record) on the compute device, usable by the current stream."""
        records, event = handle.result()
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            records.record_stream(compute)
        return records

    def close(self) -> None:
        self._worker.shutdown(wait=True)

    def _copy(self, table: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor):
        flat = table.view(-1, table.shape[-1])  # (slots * capacity, record)
        rows = slots * table.shape[1] + positions
        if not self.cuda:
            return torch.index_select(flat, 0, rows), None
        if self._last_copy is not None:  # the staging buffer is free once the last copy is done
            self._last_copy.synchronize()
        staging = self._staging[:rows.numel()]
        torch.index_select(flat, 0, rows, out=staging)
        with torch.cuda.stream(self.stream):
            records = staging.to(self.device, non_blocking=True)
            self._last_copy = torch.cuda.Event()
            self._last_copy.record(self.stream)
        return records, self._last_copy
