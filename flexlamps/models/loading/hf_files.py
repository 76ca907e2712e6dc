"""Which safetensors file of a Hugging Face folder holds each tensor, read from the files' headers
(and `model.safetensors.index.json` when the checkpoint is sharded) with no tensor data read.

Every file is opened here, before any weight is read, so a truncated or damaged file, an index
that is not one, a shard it names that is missing or lacks a tensor the index places in it, is a
`CheckpointError` naming the file and the fix, not a failure halfway through a load."""

from __future__ import annotations

from pathlib import Path

from flexlamps.models.loading.errors import CheckpointError, json_file

INDEX_NAME = "model.safetensors.index.json"
_REFETCH = "copy or download it again"


def tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of `folder` that holds it."""
    index = folder / INDEX_NAME
    if index.exists():
        return _indexed_files(index)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors weights (pytorch_model.bin is not read)")
    return {name: f for f in files for name in tensor_names(f)}


def _indexed_files(index: Path) -> dict[str, Path]:
    """The index's `weight_map`, each shard opened and checked to hold the tensors it is given."""
    data = json_file(index, "safetensors index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index} has no \"weight_map\" object (tensor name -> shard file); the index is "
                              f"damaged: {_REFETCH}, or remove it to read every *.safetensors file of the folder")
    by_shard: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, set()).add(name)
    for shard, names in sorted(by_shard.items()):
        path = index.parent / shard
        if not path.is_file():
            raise CheckpointError(f"{index} names the shard {shard}, which is not in {index.parent}: {_REFETCH}")
        missing = sorted(names - set(tensor_names(path)))
        if missing:
            raise CheckpointError(f"{path} lacks {len(missing)} tensors the index places in it (e.g. {missing[0]}); "
                                  f"the shard or the index is from another download: {_REFETCH}")
    return {name: index.parent / shard for name, shard in weight_map.items()}


def tensor_names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header, checked against the file's size."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as e:
        why = "truncated (shorter than its header says)" if _cut_short(path) else "damaged"
        raise CheckpointError(f"{path} is {why}: not a readable safetensors file ({e}); {_REFETCH}") from None


_MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header's length


def _cut_short(path: Path) -> bool:
    """Whether the file ends before the bytes its header (8-byte length, JSON) says it holds."""
    import json

    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little")
            if len(head) < 8 or (length <= _MAX_HEADER_BYTES and size < 8 + length):
                return True
            header = json.loads(handle.read(length))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        return size < 8 + length + max(ends, default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
