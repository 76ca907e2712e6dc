"""`--max-rss` in memory sizes a GGUF's kept matrices from their descriptions (`CodedMatrix`, nothing
of the matrix built: `run_plan.build.held_bytes`): the described bytes, the twin rule's answer and
the bytes held with the twin are what building the matrix from its blocks gives, in every block type
the engine keeps, for row counts that fill the kernel's tiles and ones that do not, widths that take
AVX-512's 5-bit form and ones that do not, in each dtype kept so, with our kernels (the codes run both phases: no twin) and without (bf16 twins)."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flexlamps.kernels import loader
from flexlamps.models.blocks import linear
from flexlamps.models.blocks.weight_kind import kind_of
from flexlamps.models.loading import in_place
from flexlamps.models.loading.gguf_codes import INT4_BLOCK_TYPES, INT8_BLOCK_TYPES
from flexlamps.models.weight_specs import WeightSpec
from flexlamps.run_plan import build

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
random_gguf = importlib.import_module("random_gguf")

_K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")  # 256 inputs a super-block


class _Typed:
    """A reader of one block type (what `coded_matrix` asks of it)."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def in_place_type(self, spec) -> str:
        return self.type_name


def built(type_name: str, shape: tuple[int, int], dtype: torch.dtype):
    """The matrix as the in-memory executor keeps it (`in_place_form`), from random blocks."""
    raw = random_gguf._stored(np.random.default_rng(0), "m", shape, type_name, random_gguf.SMALL_NORMAL)
    w = in_place.blocks_matrix(lambda start, stop: raw[start:stop], type_name, shape, dtype)
    return w.kernel_only() if type_name in INT4_BLOCK_TYPES else w


@pytest.mark.parametrize("kernels", ["native", "none"])  # none: a CPU without our kernels (torch's int4 one)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("type_name", INT4_BLOCK_TYPES + INT8_BLOCK_TYPES)
@pytest.mark.parametrize("rows, cols", [(448, 512), (421, 512), (448, 544), (130, 768)])  # 544: no 5-bit form
def test_described_bytes_and_twin_are_the_built_matrix(type_name, rows, cols, dtype, kernels, monkeypatch):
    if type_name in _K_QUANTS and cols % 256:
        pytest.skip("K-quants hold whole super-blocks of 256 inputs")
    if kernels == "none":
        monkeypatch.setattr(loader, "chosen", dict)  # as $FLEXLAMPS_NATIVE_KERNELS=0: no kernel found
    w = built(type_name, (rows, cols), dtype)
    coded = in_place.coded_matrix(_Typed(type_name), WeightSpec("m", (rows, cols), "linear", 0), dtype)
    assert coded.nbytes == kind_of(w).stored_bytes(w)
    twinned = build._twinned(w)
    assert build._twinned(coded.form_tile()) == twinned
    copies = linear.with_dense_twin(w, plain=lambda: None).nbytes - w.nbytes if twinned else 0  # `Int4Twin`'s
    assert build.held_bytes(coded) == kind_of(w).stored_bytes(w) + copies
    assert twinned == (kernels == "none" and dtype == torch.bfloat16)  # (twins: fp32 or bf16) the rule's answers
