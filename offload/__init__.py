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
The names load on first use, so the torch-free commands may check their folders and locks
(`offload.folders`, `offload.lock`) without importing torch.
"""

import importlib

_HOMES = {
    "BudgetExceededError": "offload.budget", "TierBudget": "offload.budget",
    "DiskFolder": "offload.disk", "OffloadFolderError": "offload.disk", "StaleOffloadFolderError": "offload.disk",
    "UnusablePathError": "offload.folders", "make_writable_folder": "offload.folders",
    "PathInUseError": "offload.lock", "PathLock": "offload.lock",
    "TIERS": "offload.store", "TieredStore": "offload.store", "compute_device": "offload.store",
    "tensor_bytes": "offload.store",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'offload' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
