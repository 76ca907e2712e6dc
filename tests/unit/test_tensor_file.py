"""flexlamps.models.loading.tensor_file: a safetensors file written one tensor at a time reads back equal
through safetensors itself, holds each tensor only while it is written, and is never left half-written."""

import pytest
import torch
from safetensors import safe_open

from flexlamps.models.loading.tensor_file import write_tensors


def test_written_tensors_read_back_equal(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"b.bf16": torch.randn(3, 5, generator=g).bfloat16(), "a.u8": torch.arange(7, dtype=torch.uint8),
               "c.i32": torch.tensor([1, -2, 3], dtype=torch.int32), "d.f32": torch.randn(2, 2, 2, generator=g),
               "e.i8": torch.tensor([[-128, 127]], dtype=torch.int8), "f.scalar": torch.tensor(2.5)}
    made = []

    def make(name):
        made.append(name)
        return tensors[name]

    path = tmp_path / "t.safetensors"
    write_tensors(path, {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}, make, {"format": "2"})
    assert sorted(made) == sorted(tensors)  # each made once
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "2"} and set(f.keys()) == set(tensors)
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and torch.equal(got, want), name


def test_a_wrong_tensor_leaves_no_file(tmp_path):
    path = tmp_path / "t.safetensors"
    with pytest.raises(ValueError, match="header says"):
        write_tensors(path, {"x": ((2, 2), torch.float32)}, lambda name: torch.zeros(3))
    assert list(tmp_path.iterdir()) == []
