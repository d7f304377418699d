"""The cache formats, defined once: names, row bytes and bytes per token (docs/ops.md is the contract;
custom_ops/common/formats.h and custom_ops/cache/cache_layout.h are the C++ side, and tests/ops/test_formats.py
checks the two agree through the op library).

K is always packed16 ("q8_0": int8 payload + one float16 scale per 32 values). V is "float" (as the model's
dtype), "q8_0", "q4_0" (two 4-bit values per byte, one float16 scale per 32 values) or "q6_0" (6-bit values, 24
bytes per 32-value block, one float16 scale per block; the GPU kernels take it at D a multiple of 64: gpu_takes).
Four layouts hold them:

  split  an exported model rewritten by `dot4attn rewrite` (Dot4Attention): per layer a payload tensor
         [B, Hkv, S, D, D/2 or 3D/4] and a scales tensor [B, Hkv, S, D/32] (float16), nothing padded;
  rows   Dot4GroupQueryAttention's cache (genai folders): one uint8 tensor per K and per V, [B, Hkv, L, row_bytes],
         each token's row its payload, then its scales, then zeros to a multiple of 16 bytes (aligned loads).
  pair   Dot4GroupQueryAttention's cache with q4_0 or q6_0 V (attribute cache_layout="pair"): K and V tensors both
         D bytes wide, as onnxruntime-genai allocates them (V as wide as K): the K row is K's int8 payload, the V row
         V's payload, V's scales, K's scales, then zeros ([D/2 or 3D/4 | D/16 | D/16 | 0...]).
  tight  Dot4GroupQueryAttention's cache, any packed V (attribute cache_layout="tight"): no padding. The tensors
         have the width of a token's payload + scales (K D + D/16 bytes, V payload + D/16: at D = 64 K 68, q8_0 V 68,
         q4_0 V 36, q6_0 V 52) and hold every token row's payload in one run, then every token row's scales
         (reference.tight_tensor / tight_rows): each run is laid out as dense K / V, so the CPU and GPU kernels read
         it as they read those. Only for caches whose past and present share one buffer (the op refuses others). K
         and q8_0 V rows have one width (onnxruntime-genai runs them); q4_0 / q6_0 V rows are narrower than K's.
"""
from __future__ import annotations

from collections.abc import Iterable

BLOCK = 32  # values per float16 scale along the head dimension D
K_FORMAT = "q8_0"
V_FORMATS = ("float", "q8_0", "q4_0", "q6_0")
V_FORMAT_CODES = {"float": 0, "q8_0": 1, "q4_0": 2, "q6_0": 3}  # the C entries' VFormat enum (common/formats.h)
PACKED_FORMATS = ("q8_0", "q4_0", "q6_0")
# q6_0 V on the GPU: D a multiple of 64 (rows of 3D/4 bytes move in 16-byte pieces); the CPU EP takes every D
GPU_Q6_D_MULTIPLE = 64
CACHE_LAYOUTS = ("rows", "pair", "tight")  # Dot4GroupQueryAttention's attribute cache_layout
PAIR_V_FORMATS = ("q4_0", "q6_0")  # the V formats the pair layout holds (payload and both scale runs fit D bytes)
Q6_BLOCK_BYTES = 24  # a q6_0 block: 16 bytes of low nibbles (as q4_0's payload), 8 bytes of high 2-bit pairs
FLOAT_BYTES = {"float32": 4, "float16": 2}
ROW_ALIGN = 16


def check_v_format(v_format: str, what: str = "v_format") -> str:
    if v_format not in V_FORMATS:
        raise ValueError(f"{what}: expected one of {', '.join(V_FORMATS)}, got {v_format!r}")
    return v_format


def gpu_takes(v_format: str, d: int) -> bool:
    """Whether the GPU kernels (CUDA, ROCm) take V of this format at head size d: float, q8_0 and q4_0 at every D,
    q6_0 at D a multiple of 64 (elsewhere the GPU planner fails the call, docs/ops.md; the CPU EP takes every D)."""
    return check_v_format(v_format) != "q6_0" or d % GPU_Q6_D_MULTIPLE == 0


def payload_bytes(d: int, fmt: str = K_FORMAT) -> int:
    """Bytes of one packed row's payload: D (q8_0), D/2 (q4_0) or 3D/4 (q6_0)."""
    return {"q4_0": d // 2, "q6_0": 3 * d // 4}.get(fmt, d)


def payload_dtype(fmt: str) -> str:
    """numpy dtype name of a packed payload: int8 (q8_0, the values themselves) or uint8 (q4_0, q6_0: bit fields)."""
    return "int8" if fmt == "q8_0" else "uint8"


def scale_bytes(d: int) -> int:
    """Bytes of one packed row's float16 scales: D/32 of them."""
    return 2 * (d // BLOCK)


def packed_bytes(d: int, fmt: str = K_FORMAT) -> int:
    """Bytes of one token's packed head, payload + scales, nothing padded: what the "tight" layout's tensors and the
    "split" layout's two tensors hold per token."""
    return payload_bytes(d, fmt) + scale_bytes(d)


def row_bytes(d: int, fmt: str = K_FORMAT) -> int:
    """Bytes of one Dot4GroupQueryAttention cache row (layout "rows"): payload + scales, rounded up to 16."""
    return -(-packed_bytes(d, fmt) // ROW_ALIGN) * ROW_ALIGN


def tight_row_bytes(d: int, fmt: str = K_FORMAT) -> int:
    """Row bytes (last dimension) of a Dot4GroupQueryAttention cache tensor in the "tight" layout: payload +
    scales, not padded."""
    return packed_bytes(d, fmt)


def check_cache_layout(cache_layout: str, v_format: str) -> str:
    """Raises ValueError unless Dot4GroupQueryAttention takes this cache_layout with this V format ("rows" and
    "tight": every packed V format; "pair": q4_0 or q6_0)."""
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache_layout: expected one of {', '.join(CACHE_LAYOUTS)}, got {cache_layout!r}")
    if cache_layout == "pair" and v_format not in PAIR_V_FORMATS:
        raise ValueError(f"cache_layout 'pair' needs v_format {' or '.join(PAIR_V_FORMATS)}, got {v_format!r}")
    return cache_layout


def pair_v_row_parts(d: int, v_format: str = "q4_0") -> tuple[slice, slice, slice]:
    """Byte ranges of the pair layout's V row: (V's q4_0 / q6_0 payload, V's float16 scales, K's float16 scales);
    zeros follow to D (the K row is K's int8 payload alone)."""
    check_cache_layout("pair", v_format)
    pb, sb = payload_bytes(d, v_format), scale_bytes(d)
    return slice(0, pb), slice(pb, pb + sb), slice(pb + sb, pb + 2 * sb)


def cache_row_widths(d: int, v_format: str, cache_layout: str = "rows") -> tuple[int, int]:
    """(K row bytes, V row bytes) of Dot4GroupQueryAttention's cache tensors: the last dims of past/present."""
    layout = check_cache_layout(cache_layout, v_format)
    if layout == "pair":
        return d, d
    if layout == "tight":
        return tight_row_bytes(d, K_FORMAT), tight_row_bytes(d, v_format)
    return row_bytes(d, K_FORMAT), row_bytes(d, v_format)


def head_token_bytes(d: int, fmt: str, layout: str = "rows", dtype: str = "float16") -> int:
    """Bytes one token adds to one head of one K or V cache. fmt: a packed format, or "float" (dtype's bytes)."""
    if fmt == "float" or fmt in FLOAT_BYTES:
        return d * FLOAT_BYTES[dtype if fmt == "float" else fmt]
    if layout == "rows":
        return row_bytes(d, fmt)
    if layout in ("split", "tight"):  # payload + scales, nothing padded
        return packed_bytes(d, fmt)
    if layout == "pair":  # K and q4_0 / q6_0 V in two rows of D bytes each
        return d
    raise ValueError(f"layout: expected rows, split, pair or tight, got {layout!r}")


def bytes_per_token(layers: int, kv_heads: int, d: int, k: str = K_FORMAT, v: str = "q8_0", layout: str = "rows",
                    dtype: str = "float16") -> int:
    """KV-cache bytes one token adds to one sequence, all layers. k / v: a packed format, "float" (dtype) or a
    dtype name for an unpacked cache (k="float16", v="float16": the original model's)."""
    return layers * kv_heads * (head_token_bytes(d, k, layout, dtype) + head_token_bytes(d, v, layout, dtype))


def cache_input_bytes(inputs: Iterable[tuple[str, tuple, int]], head_size: int | None = None) -> int:
    """Bytes one token adds to a decoder's cache inputs, batch 1: the sum over its `past_key_values.*` inputs of
    heads x last dim x itemsize. inputs: (name, shape [B, heads, past, last], itemsize); a symbolic last dim
    (the builder's float caches) is `head_size`. Raises ValueError for a cache input without static sizes."""
    total = 0
    for name, shape, itemsize in inputs:
        if not name.startswith("past_key_values."):
            continue
        shape = tuple(shape or ())
        heads, last = (_static(shape[1]), _static(shape[3])) if len(shape) == 4 else (None, None)
        last = last if last is not None else head_size
        if heads is None or last is None:
            raise ValueError(f"cache input {name} needs static heads and last dim, got shape {list(shape)}")
        total += heads * last * int(itemsize)
    return total


def _static(dim) -> int | None:
    if isinstance(dim, int):
        return dim
    try:
        return int(str(getattr(dim, "value", dim)))
    except (TypeError, ValueError):
        return None


def folder_cache_bytes_per_token(folder) -> int:
    """cache_input_bytes of a genai folder's decoder (genai_config.json's head_size for symbolic dims)."""
    from pathlib import Path

    import onnx

    from .model_io import read_config

    folder = Path(folder)
    decoder = read_config(folder)["model"]["decoder"]
    proto = onnx.load(str(folder / decoder["filename"]), load_external_data=False)
    inputs = [(i.name, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in
                        i.type.tensor_type.shape.dim],
               onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).itemsize)
              for i in proto.graph.input]
    return cache_input_bytes(inputs, head_size=decoder.get("head_size"))
