"""No product file (Python or C source or header) is over 500 lines: a longer one holds several
jobs, and gets split along a seam (a module per job; a kernel's per-instruction-set loops into a
header beside it, the way tile_gemv.c includes tile_gemv_avx512.h)."""

from tests.conftest import REPO

MAX_LINES = 500
ROOTS = ("flexlamps", "placement", "offload", "quant")  # the product, as test_function_length reads it
SUFFIXES = {".py", ".c", ".h"}


def long_files(roots=ROOTS) -> list[str]:
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                lines = len(path.read_text().splitlines())
                if lines > MAX_LINES:
                    found.append(f"{path.relative_to(REPO)} ({lines} lines)")
    return found


def test_product_files_exist():
    """The walk sees the product (a moved root would make the length test pass on nothing)."""
    assert (REPO / "flexlamps" / "kernels" / "attention.c").is_file()
    assert all((REPO / root).is_dir() for root in ROOTS)


def test_no_product_file_is_over_500_lines():
    offenders = long_files()
    assert not offenders, f"over {MAX_LINES} lines (split along a seam): " + ", ".join(offenders)
