"""dot4attn: int8-dot4 FlashAttention custom ops for ONNX Runtime, with a packed (int8 + fp16 scale) KV cache.

    import onnxruntime as ort, dot4attn
    so = ort.SessionOptions()
    dot4attn.register(so)              # loads libdot4attn_ops.so (CPU; CUDA/ROCm kernels when built)
    sess = ort.InferenceSession("model.onnx", so)
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from ._version import package_version as _package_version

__version__ = _package_version("dot4attn")  # written once, in pyproject.toml (the library reports the same)
DOMAIN = "dot4attn"
_LIB_NAME = "libdot4attn_ops.so"


def get_library_path() -> str:
    """Path of the op library: $DOT4ATTN_LIBRARY if set, else the one installed with this package."""
    env = os.environ.get("DOT4ATTN_LIBRARY")
    if env:
        if not Path(env).is_file():
            raise FileNotFoundError(f"DOT4ATTN_LIBRARY={env} does not exist")
        return env
    here = Path(__file__).resolve().parent
    for cand in (here / "lib" / _LIB_NAME, here / _LIB_NAME):
        if cand.is_file():
            return str(cand)
    raise FileNotFoundError(
        f"{_LIB_NAME} not found next to {here}: install the package with `pip install .` "
        "(it builds the library) or point DOT4ATTN_LIBRARY at a build of it")


@functools.lru_cache(maxsize=None)
def library_digest() -> str | None:
    """The op library's sha256, first 12 hex digits (None where no library is found): names the build that
    measured a result (`dot4attn e2e` keeps it with every case of a dot4attn row) and `dot4attn info` prints it."""
    try:
        path = get_library_path()
    except FileNotFoundError:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def register(session_options) -> None:
    """Registers the dot4attn ops (domain 'dot4attn') on an onnxruntime.SessionOptions."""
    session_options.register_custom_ops_library(get_library_path())


def build_info() -> dict[str, str]:
    """Facts the library reports about itself: version, chosen CPU ISA, supported ISAs, GPU backend."""
    from .native import _lib

    raw = _lib().dot4attn_build_info().decode()
    return dict(kv.split("=", 1) for kv in raw.split(";"))
