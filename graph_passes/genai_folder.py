"""onnxruntime-genai model folders: rewrite one onto the packed cache (dot4attn.runtime.og runs one).

    dot4attn rewrite GENAI_DIR OUT_DIR        # folder in, folder out (IN is never touched)
    dot4attn generate OUT_DIR --token-ids 1,2,3

A genai folder (what `python -m onnxruntime_genai.models.builder` writes) holds genai_config.json, the decoder
(model.onnx and its external data) and tokenizer files. The rewrite replaces every GroupQueryAttention by
Dot4GroupQueryAttention (dot4attn.passes.genai_gqa), copies the op library into OUT and names it in
genai_config.json (model.decoder.session_options.custom_ops_library, resolved by genai in the model folder),
copies every other file, and records the cache layout in dot4attn.json. Everything is written into a temporary
folder next to OUT and renamed into place at the end: on any error nothing is left behind.

Every folder written runs under plain `og.Generator`, or the rewrite refuses with the reason: genai_config.json
must describe the graph (head size, heads, KV heads, layers), and a config that makes genai size the cache to a
sliding window is refused, or, where no node attends through a window (the builder's Mistral), rewritten without
the window and with the context capped to it (_sliding_window says why). A q4_0 or q6_0 V folder holds its cache in
the op's "pair" layout (K and V both head_size bytes wide, as genai allocates them). The one exception is asked for
by name: `inplace_runner=True` (`--for-inplace-runner`) writes q4_0 / q6_0 V in the "rows" layout (V narrower than
K, 224 / 256 instead of 256 bytes per token and head at head size 128), which only dot4attn's in-place runner
(dot4attn.runtime.inplace, `dot4attn generate`) can run. On the GPU execution providers q6_0 V needs a head size that
is a multiple of 64. `cache_layout="tight"` (`--cache-layout tight`) writes the op's cache without the rows' 16-byte
padding, on every execution provider: q8_0 V runs under og.Generator (K and V tensors of one width, 136 instead of
160 bytes per token and KV head at head size 64), q4_0 / q6_0 V (narrower than K) only with `inplace_runner=True`;
its tokens' bytes are not in their rows, so a folder whose genai_config.json turns past_present_share_buffer off is
refused."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, get_library_path
from ..model_io import CONFIG, FACTS, GenaiError, context_length, read_config

LIBRARY = "libdot4attn_ops.so"  # the op library's name in a rewritten folder (genai_config.json names it)

@dataclass
class GenaiRewriteReport:
    layers: int
    head_size: int
    kv_heads: int
    v_format: str
    bytes_per_token_before: int
    bytes_per_token_after: int
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        r = self.bytes_per_token_before / max(1, self.bytes_per_token_after)
        return [f"{self.layers} GroupQueryAttention layers -> Dot4GroupQueryAttention (K q8_0, V {self.v_format}; "
                f"{self.kv_heads} KV heads, head size {self.head_size})",
                f"KV-cache bytes per token (batch 1, all layers): {self.bytes_per_token_before} -> "
                f"{self.bytes_per_token_after} ({r:.2f}x smaller)"] + [f"note: {n}" for n in self.notes]


def _external_files(model_path: Path) -> set[str]:
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    names = set()
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return names


INPLACE_RUNNER_HINT = ("run it with `dot4attn generate OUT_DIR --token-ids ...` or dot4attn.runtime.InPlaceDecoder "
                       "(docs/genai.md)")


def choose_cache_layout(v_format: str, inplace_runner: bool, cache_layout: str | None,
                        head_size: int | None = None) -> str:
    """The op's cache_layout for a folder: the one asked for, checked against the V format and the runner, or (None)
    the default: "pair" for q4_0 / q6_0 V (og.Generator's one width), "rows" for q8_0 V and for the in-place
    runner. Raises GenaiError saying why a combination cannot run."""
    from ..formats import CACHE_LAYOUTS, PAIR_V_FORMATS, cache_row_widths

    if inplace_runner and v_format not in PAIR_V_FORMATS:
        # the folder would be barred from og.Generator (its model type says so) for nothing: K and V rows of one
        # width run under og.Generator and under the in-place runner alike
        raise GenaiError(f"--for-inplace-runner (inplace_runner=True) is for --v-format q4_0 or q6_0; a {v_format} "
                         "V folder runs under og.Generator and under dot4attn's in-place runner as it is")
    if cache_layout is None:
        return "pair" if v_format in PAIR_V_FORMATS and not inplace_runner else "rows"
    if cache_layout not in CACHE_LAYOUTS:
        raise GenaiError(f"--cache-layout (cache_layout): expected {', '.join(CACHE_LAYOUTS)}, got {cache_layout!r}")
    if cache_layout == "pair":
        if v_format not in PAIR_V_FORMATS:
            raise GenaiError(f"--cache-layout pair is for --v-format q4_0 or q6_0 (V's values and both scale runs in a "
                             f"row of head-size bytes); a {v_format} V cache has K's row width already (the rows "
                             "layout, or tight)")
        if inplace_runner:
            raise GenaiError("--cache-layout pair with --for-inplace-runner: the pair layout runs under og.Generator "
                             "and dot4attn's in-place runner as it is; --for-inplace-runner writes V rows narrower "
                             "than K's (--cache-layout rows, the default there, or tight)")
        return cache_layout
    if v_format in PAIR_V_FORMATS and not inplace_runner:
        widths = ""
        if isinstance(head_size, int) and head_size > 0 and head_size % 32 == 0:
            k_row, v_row = cache_row_widths(head_size, v_format, cache_layout)
            widths = f" ({v_row} vs {k_row} bytes per token and KV head at head size {head_size})"
        raise GenaiError(f"--cache-layout {cache_layout} with --v-format {v_format} makes V rows narrower than K's"
                         f"{widths}, which og.Generator cannot allocate (onnxruntime-genai gives V the K cache's "
                         "width): add --for-inplace-runner for a folder dot4attn's in-place runner runs, or leave "
                         "--cache-layout out for the pair layout, which og.Generator runs")
    return cache_layout


def _refuse_tight_without_shared_buffers(cfg_path: Path, cfg: dict) -> None:
    """cache_layout 'tight' keeps a token's bytes in two runs of the tensor, not in its rows, so it needs a cache whose
    past and present share one buffer (the op refuses others when it runs): a folder whose genai_config.json turns
    past_present_share_buffer off (genai would then copy rows and batches itself) is refused first."""
    if cfg.get("search", {}).get("past_present_share_buffer") is False:
        raise GenaiError(f"{cfg_path}: --cache-layout tight needs search.past_present_share_buffer (the builder's "
                         "default), which this folder turns off: the tight layout keeps a token's bytes in two runs "
                         "of the cache, not in its rows, so genai's copies of an unshared cache (rewind, beam "
                         "reorder) would mix tokens. Leave --cache-layout out, or turn the shared buffer back on")


def rewrite_folder(src: str | os.PathLike, dst: str | os.PathLike, v_format: str = "q8_0", *,
                   inplace_runner: bool = False, split_k_min_keys: int | None = None,
                   rotate_v: bool = False, cache_layout: str | None = None) -> GenaiRewriteReport:
    """Rewrites the genai folder `src` into the new folder `dst` (which must not exist, or be empty).

    inplace_runner: q4_0 / q6_0 V only: a folder for dot4attn's in-place runner only, its V rows narrower than K's
    (genai gives V the K tensor's width, so og.Generator cannot run it); without it such a folder takes the "pair"
    layout,
    which runs under og.Generator and the in-place runner. split_k_min_keys: the op's rule for decode
    steps (split_k from this many keys on; None keeps the op's default, 2048). rotate_v: fold a per-head Hadamard
    rotation of V into the V projection and o_proj weights (passes.rotate_v: the same model, a cache whose V
    quantizes better; float weights and a power-of-2 head size only). cache_layout: the op's layout (None: "pair" for
    q4_0 / q6_0 V, else "rows"); "tight" drops the rows' padding (every execution provider; a cache that shares its
    past and present buffer only): a q8_0 V folder runs under og.Generator, a q4_0 / q6_0 one needs inplace_runner
    (choose_cache_layout)."""
    from . import RewriteError, load_checked, save_atomic
    from ..formats import cache_row_widths
    from .genai_gqa import GenaiRewriteError, float_mask_sum, rewrite_gqa

    src, dst = Path(src).resolve(), Path(dst).resolve()
    if not src.is_dir():
        raise GenaiError(f"{src}: no such folder")
    if dst == src or src in dst.parents:
        raise GenaiError(f"OUT ({dst}) must be a new folder outside IN ({src})")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise GenaiError(f"{dst}: exists and is not an empty folder (nothing is overwritten)")
    cfg = read_config(src)
    if (src / FACTS).exists():
        raise GenaiError(f"{src}: already rewritten by dot4attn ({FACTS} is there)")
    decoder = cfg["model"]["decoder"]
    cache_layout = choose_cache_layout(v_format, inplace_runner, cache_layout, decoder.get("head_size"))
    if cache_layout == "tight":
        _refuse_tight_without_shared_buffers(src / CONFIG, cfg)
    if split_k_min_keys is not None and split_k_min_keys < 1:
        raise GenaiError(f"split_k_min_keys must be >= 1, got {split_k_min_keys}")
    drop_window, window_cap = _sliding_window(src, cfg)
    context_before = context_length(cfg)
    if window_cap is not None:  # applied to OUT's config (written below); context_length() reads the cap from here
        cfg["model"]["context_length"] = window_cap
        search = cfg.setdefault("search", {})
        search["max_length"] = min(search.get("max_length") or window_cap, window_cap)
    model_name = decoder["filename"]
    model_path = src / model_name
    if not model_path.is_file():
        raise GenaiError(f"{model_path}: the decoder named in {CONFIG} is missing")
    lib = Path(get_library_path())
    parent = dst.parent
    if not parent.is_dir():
        raise GenaiError(f"{parent}: the folder that would hold OUT does not exist")
    if not os.access(parent, os.W_OK):
        raise GenaiError(f"{parent}: not writable (OUT cannot be created)")

    try:
        model = load_checked(model_path)
        _refuse_multi_head_attention(model, model_path)
        _check_head_size_against_graph(src / CONFIG, decoder, model)
        before = _kv_bytes(model, decoder.get("head_size"))
        layers = rewrite_gqa(model, v_format, decoder.get("head_size"), cache_layout)
        _check_config_against_graph(src / CONFIG, decoder, layers)
        if rotate_v:
            from .rotate_v import RotateVError, rotate_v as fold_rotation

            try:
                fold_rotation(model)
            except RotateVError as e:
                raise GenaiRewriteError(f"--rotate-v: {e}") from None
        if split_k_min_keys is not None:
            for n in model.graph:
                if n.op_type == "Dot4GroupQueryAttention":
                    n.attributes["split_k_min_keys"] = ir_attr_int("split_k_min_keys", split_k_min_keys)
        after = _kv_bytes(model, None)
        positions = context_length(cfg)
        float_sums = float_mask_sum(model.graph, positions) if positions else 0
    except (RewriteError, GenaiRewriteError) as e:
        raise GenaiError(f"{model_path}: {e}") from None
    report = GenaiRewriteReport(len(layers), layers[0].head_size, layers[0].kv_heads, v_format, before, after)
    if drop_window:
        window = decoder["sliding_window"]["window_size"]
        capped = (f"; model.context_length {context_before} -> {window}: the original stops just past the window "
                  "under og (genai sizes its caches to it), and up to it whole-context attention is the window's"
                  if window_cap is not None else f" (the window, {window}, is no shorter than the context)")
        report.notes.append(f"{CONFIG}: model.decoder.sliding_window removed: genai would give the op present "
                            f"views of a window-sized cache it does not write; every node attends to the whole "
                            f"cache{capped}")
    if cache_layout == "tight":
        k_row, v_row = cache_row_widths(report.head_size, v_format, "tight")
        r_k, r_v = cache_row_widths(report.head_size, v_format, "rows")
        report.notes.append(f"cache layout tight (the rows without their 16-byte padding: K {k_row} + V {v_row} bytes "
                            f"per token and KV head instead of {r_k} + {r_v}): the CPU execution provider only, a GPU "
                            "one refuses the folder when its session is created")
    if inplace_runner:
        report.notes.append(f"written for dot4attn's in-place runner, not og.Generator: {INPLACE_RUNNER_HINT}")
    elif cache_layout == "pair":
        report.notes.append(f"{v_format} V in the pair cache layout (K and V rows of head-size bytes, as genai "
                            "allocates them): runs under og.Generator; --for-inplace-runner writes narrower V rows for "
                            "dot4attn's in-place runner")
    if float_sums:
        report.notes.append("the sequence lengths (ReduceSum of attention_mask) are summed in float32, exact up to "
                            "2^24 positions: ONNX Runtime's CUDA ReduceSum of integers walks the mask in one block "
                            "per row")

    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=parent))
    try:
        try:
            save_atomic(model, tmp / model_name, check=False, share_external=True)
        except RewriteError as e:  # a write error (full disk, ...): it names the temp copy inside OUT's folder
            raise GenaiError(f"writing {dst}: {e}") from None
        skip = {model_name, CONFIG} | _external_files(model_path)
        for item in src.iterdir():
            if item.name in skip:
                continue
            if item.is_dir():
                shutil.copytree(item, tmp / item.name, symlinks=False)
            else:
                shutil.copy2(item, tmp / item.name)
        shutil.copy2(lib, tmp / LIBRARY)
        opts = decoder.setdefault("session_options", {})
        opts["custom_ops_library"] = LIBRARY
        if drop_window:
            del decoder["sliding_window"]
        model_type = cfg["model"].get("type")
        if inplace_runner:
            # genai refuses a model type it does not know when the model loads ("Unsupported model_type in
            # config.json: <type>"): the type carries the reason, so plain og code stops at og.Model with it instead
            # of at its first step with 'invalid dimensions'. dot4attn's runners read dot4attn.json, not the type.
            cfg["model"]["type"] = (f"{model_type} rewritten by dot4attn for its in-place runner only (V {v_format}, "
                                    "narrower than K: og.Generator cannot allocate it); " + INPLACE_RUNNER_HINT)
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=4) + "\n")
        widths = cache_row_widths(report.head_size, v_format, cache_layout)
        facts = {"dot4attn_version": __version__, "op": "Dot4GroupQueryAttention", "source": src.name,
                 "layers": report.layers, "kv_heads": report.kv_heads, "head_size": report.head_size,
                 "k_format": "q8_0", "v_format": v_format,
                 "cache_layout": cache_layout,
                 "k_row_bytes": widths[0], "v_row_bytes": widths[1],
                 "kv_bytes_per_token_before": before, "kv_bytes_per_token_after": after,
                 "mask_sum_float32": bool(float_sums), "runner": "inplace" if inplace_runner else "og",
                 "model_type": model_type}
        if split_k_min_keys is not None:
            facts["split_k_min_keys"] = split_k_min_keys
        if rotate_v:
            facts["v_rotation"] = "hadamard"  # folded into the weights: the runners need nothing
        (tmp / FACTS).write_text(json.dumps(facts, indent=2) + "\n")
        # mkdtemp made the folder 0700; OUT gets the mode a new folder gets (0777 less the umask), as mkdir gives
        os.chmod(tmp, 0o777 & ~_umask())
        if dst.exists():
            dst.rmdir()  # empty (checked above)
        os.rename(tmp, dst)
    except OSError as e:
        raise GenaiError(f"writing {dst}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ir_attr_int(name: str, value: int):
    import onnx_ir as ir

    return ir.AttrInt64(name, int(value))


def _sliding_window(src: Path, cfg: dict) -> tuple[bool, int | None]:
    """What OUT's config does with genai_config's model.decoder.sliding_window: (drop the entry, the context OUT is
    capped to or None).

    onnxruntime-genai (0.18) reads an entry whose `layers` list is empty (or absent) as one window for every layer:
    it allocates every cache with window_size + slack positions (16 on the CPU EP when cache_slack is 0) and hands
    the model present tensors sized to the run's logical length, views the op does not write (og fails with
    'present.0.key has shape {1,2,0,...}'). The builder writes such an entry for Mistral (`layers: []`) while every
    node attends to the whole cache (local_window_size -1; check_node refuses any other): the original then runs
    exactly as without the entry up to window + slack positions and fails after. OUT drops the entry and, where the
    window is shorter than the context, caps model.context_length (and search.max_length) to the window: up to
    window_size positions whole-context attention is the window's, so OUT computes what the original and a sliding
    window compute at every length it runs, and genai refuses a longer max_length before it starts. An entry that
    names layers (their nodes attend through a window) or slides the cache itself is refused."""
    decoder = cfg["model"]["decoder"]
    sw = decoder.get("sliding_window")
    if sw is None:
        return False, None
    where = f"{src / CONFIG}: model.decoder.sliding_window"
    if not isinstance(sw, dict):
        raise GenaiError(f"{where} must be an object or null, got {sw!r}")
    window, layers = sw.get("window_size"), sw.get("layers") or []
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise GenaiError(f"{where}.window_size must be a positive integer, got {window!r}")
    if layers:
        raise GenaiError(f"{where} (window_size {window}) puts layers {layers} on a sliding-window cache: "
                         "onnxruntime-genai sizes those caches to the window, and Dot4GroupQueryAttention keeps a "
                         "whole-context cache and computes no sliding-window attention (docs/ops.md). Not supported")
    for key in ("slide_key_value_cache", "slide_inputs"):
        if sw.get(key):
            raise GenaiError(f"{where}.{key} is {sw[key]!r}: onnxruntime-genai slides the cache or the inputs of "
                             "such a model itself (a static-shape windowed model), which the packed cache does not "
                             "follow. Not supported")
    positions = context_length(cfg)
    return True, (window if positions is None or window < positions else None)


def _refuse_multi_head_attention(model, model_path: Path) -> None:
    """The builder writes com.microsoft.MultiHeadAttention (not GroupQueryAttention) for fp16 on the CPU EP."""
    if any(n.op_type == "GroupQueryAttention" for n in model.graph):
        return
    mha = [n for n in model.graph if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]
    if mha:
        raise GenaiError(f"{model_path}: its attention is com.microsoft.MultiHeadAttention ({len(mha)} nodes), which "
                         "the model builder writes for -p fp16 -e cpu; the rewrite replaces GroupQueryAttention. "
                         "Build the folder with -p fp32 or -p int4 for the CPU, or -e cuda for fp16")


def _output_width(value) -> int | None:
    """The width (num_heads * head_size) of an attention output, read off the projection that takes it: the weight's
    first dimension of a MatMul, the K attribute of an int4 MatMulNBits. None when no such user says it."""
    for user, _ in value.uses():
        if user.op_type == "MatMulNBits" and "K" in user.attributes:
            return int(user.attributes["K"].value)
        if user.op_type == "MatMul" and len(user.inputs) > 1 and user.inputs[1] is not None:
            sh = user.inputs[1].shape
            if sh is not None and len(sh) == 2 and isinstance(sh[0], int):
                return sh[0]
    return None


def _check_head_size_against_graph(cfg_path: Path, decoder: dict, model) -> None:
    """The builder leaves the caches' last dimension symbolic, so the rewrite sizes the packed rows from
    genai_config's head_size; a wrong one would write rows of the wrong width. The graph says the head size
    through the output projection: width = num_heads * head_size."""
    d = decoder.get("head_size")
    if d is None:
        return
    for n in model.graph:
        if n.op_type != "GroupQueryAttention" or "num_heads" not in n.attributes:
            continue
        heads, width = int(n.attributes["num_heads"].value), _output_width(n.outputs[0])
        if width is not None and heads > 0 and width != heads * d:
            raise GenaiError(f"{cfg_path}: model.decoder.head_size is {d!r} but the graph has {width / heads:g} "
                             f"(node {n.name!r}: its output projection takes {width} = num_heads {heads} x head "
                             "size); genai sizes the cache from the config: they must agree")


def _check_config_against_graph(cfg_path: Path, decoder: dict, layers) -> None:
    """genai sizes its cache buffers and runs its loops from genai_config.json, not from the graph: every number it
    reads must be the graph's, or og fails at run time (or the rewrite would trust a wrong head_size)."""
    num_heads = {int(L.node.attributes["num_heads"].value) for L in layers if "num_heads" in L.node.attributes}
    graph = {"head_size": {L.head_size for L in layers}, "num_key_value_heads": {L.kv_heads for L in layers},
             "num_attention_heads": num_heads, "num_hidden_layers": {len(layers)}}
    for key, values in graph.items():
        if key not in decoder or not values:
            continue
        if len(values) > 1:
            raise GenaiError(f"{cfg_path}: the graph's attention nodes differ in {key} ({sorted(values)}); genai "
                             "sizes every layer's cache alike")
        (got,) = values
        if decoder[key] != got:
            what = "GroupQueryAttention layers" if key == "num_hidden_layers" else "on its GroupQueryAttention nodes"
            raise GenaiError(f"{cfg_path}: model.decoder.{key} is {decoder[key]!r} but the graph has {got} ({what}); "
                             "genai sizes the cache and its loops from the config: they must agree")


def _kv_bytes(model, head_size: int | None) -> int:
    from ..formats import cache_input_bytes

    return cache_input_bytes(((v.name or "", v.shape, v.dtype.itemsize) for v in model.graph.inputs),
                             head_size=head_size)


