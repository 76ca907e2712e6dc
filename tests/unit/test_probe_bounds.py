"""The quick machine profile's sweeps are bounded: a GEMM-by-rows or int8 probe computes at most one
set of the matrices or `sweep_flops` per sweep, once per pass (plus one warm-up set where that is
cheap), whatever the row count (an unbounded quick profile took 70-440 s on tiny models)."""

import torch

from flexlamps.hardware import int4_probes, probes
from flexlamps.hardware.probes import GEMM_ROWS, ProbeSizes


def _counting(monkeypatch, module, name):
    """Replace module.name (a product of x (rows, in) by w (out, in)) by one that counts its FLOPs."""
    done = []

    def product(x, w, **kw):
        done.append(2.0 * x.shape[0] * w.shape[0] * w.shape[1])
        return x.new_zeros(x.shape[0], w.shape[0])

    monkeypatch.setattr(module, name, product)
    return done


def test_a_quick_gemm_by_rows_computes_within_its_bound(monkeypatch):
    done = _counting(monkeypatch, probes, "linear")
    quick = ProbeSizes.for_mode(True)
    shapes = ((256, 128), (128, 256))
    probes.measure_gemm_by_rows(torch.device("cpu"), 4 << 20, 0.0, ("fp32",), shapes,
                                sweep_flops=quick.sweep_flops, passes=quick.passes)
    one_set = {rows: sum(2.0 * rows * o * i for o, i in shapes) for rows in GEMM_ROWS}
    bound = sum(max(quick.sweep_flops, s) * (quick.passes + 1) for s in one_set.values())
    assert sum(done) <= bound
    # the full profile's bound (8 GFLOP in 3 passes) would have let it compute far more
    assert sum(done) < sum(min(8e9, s * 128) for s in one_set.values())


def test_a_quick_int8_prompt_probe_computes_within_its_bound(monkeypatch):
    class Kernel:
        pack = staticmethod(lambda w: w)
        matmul = staticmethod(lambda x, w: None)

    done = _counting(monkeypatch, Kernel, "matmul")
    monkeypatch.setattr(int4_probes, "int8_kernel", lambda: Kernel)
    quick = ProbeSizes.for_mode(True)
    shapes = ((256, 128),)
    table = int4_probes.measure_int8_prompts(shapes, 8 << 20, 0.0, quick.sweep_flops, quick.passes)
    assert set(table["bf16"]) == {str(rows) for rows in int4_probes.PROMPT_ROWS}
    per_rows = [max(quick.sweep_flops, 2.0 * rows * 256 * 128) for rows in int4_probes.PROMPT_ROWS]
    assert sum(done) <= quick.passes * sum(per_rows)
