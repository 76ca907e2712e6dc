"""Tiered tensor storage for the offload engine: `gpu`, `cpu` and `disk`, each with a byte budget.

- `TierBudget`: capacity, bytes in use and peak for one tier; an allocation past the
  capacity raises `BudgetExceededError` naming the tier, what asked and the shortfall.
- `DiskFolder`: tensors as raw files plus an `index.json` (Accelerate's offload-folder
  layout), read with `os.pread` and the page cache dropped so reads are real disk reads,
  written through a temp file and a rename, checked (size, checksum, owner fingerprint)
  before reuse; it lives in a subfolder flexlamps creates, marks and locks, and deletes only
  what its index lists.
- `PathLock`: an OS file lock on a path a run writes, the refusal naming the holder;
  `make_writable_folder`: a folder made and checked, the refusal naming the option.
- `TieredStore`: puts each named tensor on a tier and loads it onto the compute device on
  worker threads, so I/O overlaps compute. Without a GPU the `gpu` tier is the CPU device,
  its budget still enforced.

Knows nothing of models or scheduling; compressed tensors come from `quant` (`QTensor`).
"""

from offload.budget import BudgetExceededError, TierBudget
from offload.disk import DiskFolder, OffloadFolderError, StaleOffloadFolderError
from offload.folders import UnusablePathError, make_writable_folder
from offload.lock import PathInUseError, PathLock
from offload.store import TIERS, TieredStore, compute_device, tensor_bytes

__all__ = ["BudgetExceededError", "DiskFolder", "OffloadFolderError", "PathInUseError", "PathLock",
           "StaleOffloadFolderError", "TIERS", "TierBudget", "UnusablePathError", "make_writable_folder",
           "TieredStore", "compute_device", "tensor_bytes"]
