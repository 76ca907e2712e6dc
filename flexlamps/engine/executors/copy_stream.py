"""Weight loads that overlap compute on CUDA: host-to-device copies on a stream of their own.

The offload executor loads layer j+1's weights on an I/O thread while layer j computes. On
CUDA the copies must leave the compute stream for that to overlap: the I/O thread issues them
on a copy stream (from pinned host buffers, so they are truly asynchronous), records an event
after them, and the compute stream waits on that event before the layer uses the weights.
Each copied tensor is marked as used by the compute stream, so the caching allocator does not
hand its memory to the next load while a kernel may still read it. Off CUDA every call here
is a no-op: copies are plain and complete when they return.
"""

from __future__ import annotations

import contextlib

import torch

from quant.int4_weight import Int4Weight


class CopyStream:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def issuing(self):
        """Context for the I/O thread: copies made inside run on the copy stream."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def finished(self) -> torch.cuda.Event | None:
        """An event after every copy issued so far, waited for here: the I/O thread's load
        time then covers the transfer itself, not just its launch."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        event.synchronize()
        return event

    def hand_over(self, event: torch.cuda.Event | None, tensors) -> None:
        """Make the compute stream wait for the copies, and keep their memory until it is done."""
        if event is None:
            return
        compute = torch.cuda.current_stream()
        compute.wait_event(event)
        for t in tensors:
            for part in _tensors_of(t):
                if part.is_cuda:
                    part.record_stream(compute)


def _tensors_of(value) -> list[torch.Tensor]:
    """The tensors a fetched weight is made of (a QTensor stores several)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Int4Weight):  # the layouts it holds (never a CUDA weight's codes rebuilt)
        return list(value.to_tensors(with_kernel=True).values())
    if hasattr(value, "to_tensors"):
        return list(value.to_tensors().values())
    return []
