"""`TieredStore`: named tensors on the gpu / cpu / disk tiers, fetched to the compute device.

A fetch of a tensor that lives off the gpu tier makes a staged copy on the compute device,
charged to the gpu budget until `release` (on a CPU-only machine a cpu-tier tensor is charged
but not copied: both tiers are the same memory, and a copy would only cost time and RSS; the
charge keeps the plan's gpu peak, as the dry run counts it, but holds no bytes, so the expert
cache does not give way to it: `TierBudget.allocate(holds=False)`); fetches run on worker threads
so the next layer's weights load while this one computes. Compressed tensors (`quant.QTensor`,
`quant.int4_weight.Int4Weight`) are stored and moved compressed, as their component tensors
(`to_tensors`), and rebuilt from them after a load (`from_tensors`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
import torch

from offload.budget import TierBudget
from offload.disk import DiskFolder, aligned_empty
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight

TIERS = ("gpu", "cpu", "disk")
_SEP = "::"
DISK_READS_IN_FLIGHT = 3  # a fetch's disk reads issued together (the calling thread's and helpers')


def compute_device() -> torch.device:
    """The device of the `gpu` tier: CUDA when present, else the CPU (budget still enforced)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes the tensors' elements take (what a tier budget is charged for them)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def stored_parts(value, prefix: str) -> dict[str, torch.Tensor]:
    """A compressed tensor's component tensors; an Int4Weight's or Int8Weight's with the code
    layouts it holds (its kernel layout too: not rebuilt on every fetch)."""
    if isinstance(value, (Int4Weight, Int8Weight)):
        return value.to_tensors(prefix, with_kernel=True)
    return value.to_tensors(prefix=prefix)


class TieredStore:
    def __init__(self, budgets: dict[str, TierBudget], disk: DiskFolder | None = None,
                 device: torch.device | None = None, io_workers: int = 2):
        self.budgets = budgets
        self.disk = disk
        self.device = device or compute_device()
        self._pinned = self.device.type == "cuda"  # disk reads land in pinned host buffers on CUDA
        self._tier: dict[str, str] = {}
        self._resident: dict[str, torch.Tensor] = {}
        self._qparts: dict[str, list[str]] = {}  # compressed tensor -> its component names
        self._qtypes: dict[str, type] = {}  # compressed tensor -> its class (rebuilt by from_tensors)
        self._gpu_qtensors: dict = {}  # compressed tensors on the gpu tier, built once (no copy)
        self._pool = ThreadPoolExecutor(max_workers=io_workers, thread_name_prefix="flexlamps-io")
        # one fetch's disk tensors read at once (`_read_all`): a direct read at a time drew 0.76-0.95 GB/s
        # off the Xeon's disk, two or three in flight 1.2-1.4 (3 MiB expert matrices)
        self._disk_pool = ThreadPoolExecutor(max_workers=DISK_READS_IN_FLIGHT - 1, thread_name_prefix="flexlamps-disk")

    # -- placement ---------------------------------------------------------------------------
    def put(self, name: str, value, tier: str, *, write_disk: bool = True) -> None:
        """Place `value` (a tensor, a QTensor or an Int4Weight) on `tier`. `write_disk=False`
        adopts a disk copy already present in a reused offload folder."""
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; tiers are {', '.join(TIERS)}")
        if hasattr(value, "to_tensors"):  # a quant.QTensor or Int4Weight: store its parts
            parts = stored_parts(value, name + _SEP)
            self._qparts[name] = list(parts)
            self._qtypes[name] = type(value)
            for part, t in parts.items():
                self._put_plain(part, t, tier, write_disk)
            self._tier[name] = tier
            if tier == "gpu":  # rebuilt on every fetch it would cost Python time on the I/O thread
                self._gpu_qtensors[name] = type(value).from_tensors(
                    {part: self._resident[part] for part in parts}, prefix=name + _SEP)
            return
        if not isinstance(value, torch.Tensor):  # another compressed form (bitsandbytes): memory tiers only
            if tier == "disk":
                raise ValueError(f"{name}: {type(value).__name__} weights cannot go to disk; use groupwise "
                                 "compression or give the weights gpu/cpu memory")
            self.budgets[tier].allocate(value.nbytes, f"{name} ({tier} resident)")
            self._tier[name] = tier
            self._resident[name] = value.to(self.device if tier == "gpu" else torch.device("cpu"))
            return
        self._put_plain(name, value, tier, write_disk)

    def _put_plain(self, name: str, t: torch.Tensor, tier: str, write_disk: bool) -> None:
        self._tier[name] = tier
        if tier == "disk":
            if self.disk is None:
                raise ValueError(f"{name} is placed on disk but no offload folder was given (--offload-dir)")
            if write_disk:
                self.disk.write(name, t)
            return
        self.budgets[tier].allocate(tensor_bytes(t), f"{name} ({tier} resident)")
        dev = self.device if tier == "gpu" else torch.device("cpu")
        t = t.to(dev)
        if tier == "cpu" and self.device.type == "cuda":
            t = t.pin_memory()  # pinned host memory: async, full-bandwidth H2D copies
        self._resident[name] = t

    def adopt_disk(self, name: str, compressed_as: type | None = None) -> None:
        """Register a tensor already in the (reused) offload folder without rewriting it;
        `compressed_as`: the class it was stored as (its parts are in the folder)."""
        if compressed_as is not None:
            self._qparts[name] = sorted(p for p in self.disk.index if p.startswith(name + _SEP))
            self._qtypes[name] = compressed_as
            for p in self._qparts[name]:
                self._tier[p] = "disk"
        self._tier[name] = "disk"

    def tier_of(self, name: str) -> str:
        return self._tier[name]

    def is_plain(self, name: str) -> bool:
        """Whether `name` is stored as one plain tensor (not compressed parts, not bitsandbytes)."""
        return name not in self._qparts and isinstance(self._resident.get(name, torch.empty(0)), torch.Tensor)

    # -- fetching ----------------------------------------------------------------------------
    def fetch(self, names: list[str]) -> tuple[dict[str, object], int]:
        """Tensors for `names` on the compute device, and the staged bytes charged to the gpu
        budget (to hand back with `release`)."""
        out, staged, reads = {}, 0, []
        try:
            for name in names:
                if name in self._gpu_qtensors:
                    out[name] = self._gpu_qtensors[name]
                elif name in self._qparts:
                    parts = {}
                    for part in self._qparts[name]:
                        parts[part], b = self._fetch_plain(part)
                        staged += b
                    out[name] = self._qtypes[name].from_tensors(parts, prefix=name + _SEP)
                elif self._tier[name] == "disk":  # read below, with the fetch's other disk tensors
                    buf = self._read_buffer(*self.disk.spec(name))
                    self.budgets["gpu"].allocate(tensor_bytes(buf), f"staging {name}")
                    staged += tensor_bytes(buf)
                    out[name] = None
                    reads.append((name, buf))
                else:
                    out[name], b = self._fetch_plain(name)
                    staged += b
            self._read_all(reads)
        except BaseException:
            self.release(staged)
            raise
        for name, buf in reads:
            out[name] = buf.to(self.device, non_blocking=True)
        return out, staged

    def _read_all(self, reads: list[tuple[str, torch.Tensor]]) -> None:
        """Read each (name, buffer) off disk, up to `DISK_READS_IN_FLIGHT` at once (this thread reads
        the first of each round)."""
        for start in range(0, len(reads), DISK_READS_IN_FLIGHT):
            (first, buf), *rest = reads[start:start + DISK_READS_IN_FLIGHT]
            helpers = [self._disk_pool.submit(self.disk.read_into, name, b) for name, b in rest]
            try:
                self.disk.read_into(first, buf)
            finally:
                for helper in helpers:
                    helper.exception()  # every read ends before its buffer can be released
            for helper in helpers:
                helper.result()

    def _fetch_plain(self, name: str) -> tuple[torch.Tensor, int]:
        tier = self._tier[name]
        if tier == "gpu":
            return self._resident[name], 0
        if tier == "cpu" and not isinstance(self._resident[name], torch.Tensor):
            src = self._resident[name]
            self.budgets["gpu"].allocate(src.nbytes, f"staging {name}")
            return src.to(self.device), src.nbytes
        if tier == "cpu":
            src = self._resident[name]
            n = tensor_bytes(src)
            copies = self.device.type != "cpu"  # the tiers share one memory: charge the staging, skip the copy
            self.budgets["gpu"].allocate(n, f"staging {name}", holds=copies)
            return (src.to(self.device, non_blocking=True) if copies else src), n
        shape, dtype = self.disk.spec(name)
        buf = self._read_buffer(shape, dtype)
        n = tensor_bytes(buf)
        self.budgets["gpu"].allocate(n, f"staging {name}")
        self.disk.read_into(name, buf)
        return buf.to(self.device, non_blocking=True), n

    def _read_buffer(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A host buffer for a disk read: pinned on CUDA (async H2D copies), else aligned for a
        direct read (`offload.disk`)."""
        if self._pinned:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        return aligned_empty(shape, dtype)

    def resident(self, names: list[str]) -> dict[str, object]:
        """The gpu- and cpu-tier tensors for `names` where they live, neither copied nor charged:
        for computing them in place (a cpu-tier MoE expert run on the CPU, `expert_weights`)."""
        out = {}
        for name in names:
            tier = self._tier[name]
            if tier == "disk":
                raise ValueError(f"{name} is on the disk tier: fetch it (it has no resident copy to compute on)")
            if name in self._gpu_qtensors:
                out[name] = self._gpu_qtensors[name]
            elif name in self._qparts:
                out[name] = self._qtypes[name].from_tensors({p: self._resident[p] for p in self._qparts[name]},
                                                           prefix=name + _SEP)
            else:
                out[name] = self._resident[name]
        return out

    def fetch_rows(self, name: str, start: int, stop: int) -> tuple[torch.Tensor, int]:
        """Rows start:stop of a plain tensor on the compute device, and the staged bytes."""
        tier = self._tier[name]
        if tier == "gpu":
            return self._resident[name][start:stop], 0
        if tier == "cpu":
            src = self._resident[name][start:stop]
            n = tensor_bytes(src)
            copies = self.device.type != "cpu"
            self.budgets["gpu"].allocate(n, f"staging rows of {name}", holds=copies)
            return (src.to(self.device) if copies else src), n
        shape, dtype = self.disk.spec(name)
        buf = self._read_buffer((stop - start, *shape[1:]), dtype)
        n = tensor_bytes(buf)
        self.budgets["gpu"].allocate(n, f"staging rows of {name}")
        self.disk.read_rows_into(name, start, buf)
        return buf.to(self.device), n

    def gather_rows(self, name: str, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Selected rows (an embedding lookup) on the compute device: only those rows move."""
        tier = self._tier[name]
        if tier in ("gpu", "cpu"):
            src = self._resident[name]
            out = src.index_select(0, rows.to(src.device)).to(self.device)
            n = 0 if tier == "gpu" else tensor_bytes(out)
        else:
            shape, dtype = self.disk.spec(name)
            out = torch.empty((len(rows), *shape[1:]), dtype=dtype)
            for i, r in enumerate(rows.tolist()):
                self.disk.read_rows_into(name, r, out[i:i + 1])
            out = out.to(self.device)
            n = tensor_bytes(out)
        if n:
            self.budgets["gpu"].allocate(n, f"rows of {name}")
        return out, n

    def submit(self, fn) -> Future:
        """Run `fn` on the store's I/O threads (callers time or chain their own loads)."""
        return self._pool.submit(fn)

    def release(self, staged_bytes: int) -> None:
        if staged_bytes:
            self.budgets["gpu"].free(staged_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._disk_pool.shutdown(wait=True)
        if self.disk is not None:
            self.disk.release()
