"""Rewrite a whole model: find attention blocks, apply the rules, rename the cache I/O, validate, write atomically.

    report = rewrite_file("model.onnx", "model.d4a.onnx", RewriteOptions(v_format="q8_0"))

Cache I/O after the rewrite, per layer N (packed on the sequence axis 2, same layout as the float cache):
    past_key_values.N.key_payload int8 [B, Hkv, P, D]   past_key_values.N.key_scales float16 [B, Hkv, P, D/32]
    present.N.key_payload         int8 [B, Hkv, T, D]   present.N.key_scales         float16 [B, Hkv, T, D/32]
    V: float32 past_key_values.N.value / present.N.value as before (v_format float), or
       past_key_values.N.value_payload (int8 [.., D] for q8_0, uint8 [.., D/2] for q4_0) + value_scales.
Every other input, output and name is kept.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass, TopologicalSortPass
from onnxscript.rewriter import pattern

from . import _common, ms_mha, onnx_attention, unfused_dynamo, unfused_torchscript
from ..model_io import (EXTERNAL_DATA_THRESHOLD, FLOAT_PARTS, PAST_RE, BadModelError, check_model_file,
                        folders_removed_on_failure)
from ..formats import BLOCK, V_FORMATS, payload_bytes
from ._common import DOMAIN, LayerIO, PassState, RewriteOptions, payload_ir_type

RULE_MODULES = (unfused_dynamo, unfused_torchscript, onnx_attention, ms_mha)
ATTENTION_OPS = {("", "Attention"), ("ai.onnx", "Attention"), ("com.microsoft", "MultiHeadAttention"),
                 ("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "Attention")}


class RewriteError(Exception):
    """A model the passes refuse; the message says why. Nothing is written."""


@dataclass
class LayerReport:
    index: int
    rule: str | None
    mask: str | None = None
    gqa: str | None = None


@dataclass
class RewriteReport:
    layers: list[LayerReport] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    bytes_per_token_before: int = 0
    bytes_per_token_after: int = 0
    v_format: str = "float"
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for L in self.layers:
            if L.rule:
                out.append(f"layer {L.index}: {L.rule} (mask: {L.mask}; GQA repeat: {L.gqa} -> removed)")
            else:
                out.append(f"layer {L.index}: NOT MATCHED (kept float)")
        out.append(f"KV-cache bytes per token (batch 1, all layers): {self.bytes_per_token_before} -> "
                   f"{self.bytes_per_token_after} ({self.bytes_per_token_before / max(1, self.bytes_per_token_after):.2f}x smaller)")
        out += [f"note: {n}" for n in self.notes]
        return out


def kv_bytes_per_token(model: onnx.ModelProto | ir.Model) -> int:
    """Bytes one token adds to the cache inputs (batch 1): dot4attn.formats.cache_input_bytes of the inputs."""
    from ..formats import cache_input_bytes

    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    try:
        return cache_input_bytes((v.name or "", v.shape, v.dtype.itemsize) for v in model.graph.inputs)
    except ValueError as e:
        raise RewriteError(str(e)) from None


def _static(d) -> int | None:
    if isinstance(d, int):
        return d
    try:
        return int(str(d.value if hasattr(d, "value") else d))
    except (TypeError, ValueError):
        return None


def _layers(graph: ir.Graph) -> dict[int, dict[str, ir.Value]]:
    found: dict[int, dict[str, ir.Value]] = {}
    for v in graph.inputs:
        m = PAST_RE.match(v.name or "")
        if m and m.group(2) in FLOAT_PARTS:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return found


def _new_input(graph: ir.Graph, name: str, dtype: ir.DataType, like: ir.Value, last_dim) -> ir.Value:
    sh = like.shape
    shape = ir.Shape([_static(sh[0]) or sh[0], _static(sh[1]) or sh[1], sh[2], last_dim]) if sh is not None and len(sh) == 4 else None
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=shape)


def _count_attention_candidates(graph: ir.Graph) -> int:
    n = 0
    for node in graph:
        if (node.domain, node.op_type) in ATTENTION_OPS or (node.domain in ("", "ai.onnx") and node.op_type == "Softmax"):
            n += 1
    return n


def rewrite_model(model: ir.Model, options: RewriteOptions | None = None, allow_partial: bool = False) -> RewriteReport:
    """Rewrite `model` in place. Raises RewriteError (the model is then in an undefined state: discard it)."""
    options = options or RewriteOptions()
    if options.v_format not in V_FORMATS:
        raise RewriteError(f"--v-format must be {', '.join(V_FORMATS)}, got {options.v_format!r}")
    if options.route not in ("auto", "prefill", "decode", "split_k"):
        raise RewriteError(f"--route must be auto, prefill, decode or split_k, got {options.route!r}")
    graph = model.graph
    report = RewriteReport(v_format=options.v_format)
    found = _layers(graph)
    n_candidates = _count_attention_candidates(graph)
    ours = sorted({n.op_type for n in graph if n.domain == DOMAIN})
    if ours:  # checked first: a float-V rewrite still has past_key_values.N.value inputs
        raise RewriteError(f"the model is already rewritten (it has dot4attn ops: {', '.join(ours)}); expected an "
                           "exported decoder with float past_key_values.N.key/value: rewrite the original export")
    if not found:
        raise RewriteError("no past_key_values.N.key/value inputs: export the model with a KV cache "
                           "(past_key_values.N.key/value in, present.N.key/value out)")
    if n_candidates == 0:
        raise RewriteError("no attention found in the model (no Softmax, Attention or MultiHeadAttention node)")
    report.bytes_per_token_before = kv_bytes_per_token(model)
    existing = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}

    layers: dict[int, LayerIO] = {}
    for idx, kv in sorted(found.items()):
        if "key" not in kv or "value" not in kv:
            raise RewriteError(f"layer {idx}: has only past_key_values.{idx}.{next(iter(kv))}")
        k, v = kv["key"], kv["value"]
        d = _static(k.shape[3]) if k.shape is not None and len(k.shape) == 4 else None
        if d is None:
            raise RewriteError(f"past_key_values.{idx}.key: head dim must be static, got shape {k.shape}")
        ds = d // BLOCK
        lio = LayerIO(idx, k, v,
                      _new_input(graph, f"past_key_values.{idx}.key_payload", ir.DataType.INT8, k, d),
                      _new_input(graph, f"past_key_values.{idx}.key_scales", ir.DataType.FLOAT16, k, ds))
        if options.v_format != "float":
            lio.value_payload_in = _new_input(graph, f"past_key_values.{idx}.value_payload",
                                              payload_ir_type(options.v_format), v,
                                              payload_bytes(d, options.v_format))
            lio.value_scales_in = _new_input(graph, f"past_key_values.{idx}.value_scales", ir.DataType.FLOAT16, v, ds)
        for nv in (lio.key_payload_in, lio.key_scales_in, lio.value_payload_in, lio.value_scales_in):
            if nv is not None and nv.name in existing:
                raise RewriteError(f"the model already has an input/output named {nv.name}")
        layers[idx] = lio

    # Constant-node outputs carry their value (TorchScript/optimum graphs use Constant nodes, not initializers).
    from onnxscript import optimizer

    optimizer.basic_constant_propagation([n for n in graph if n.op_type == "Constant" and n.domain in ("", "ai.onnx")])
    state = PassState(layers, options)
    rules = []
    for mod in RULE_MODULES:
        rules += mod.rules(state)
    ruleset = pattern.RewriteRuleSet(rules, commute=True)
    ruleset.apply_to_model(model)

    matched = [L for L in layers.values() if L.rule]
    unmatched = [L for L in layers.values() if not L.rule]
    for L in sorted(layers.values(), key=lambda x: x.index):
        report.layers.append(LayerReport(L.index, L.rule, L.mask_kind, L.gqa))
    if not matched:
        raise RewriteError(
            f"no attention block matched any rule ({n_candidates} attention candidates, {len(layers)} cache "
            f"layers; rules: {', '.join(r.name for r in rules)}). Supported forms: unfused MatMul/Softmax/MatMul "
            "(dynamo, TorchScript, optimum, transformers exporters), ai.onnx Attention (opset 23), "
            "com.microsoft MultiHeadAttention")
    if unmatched:
        report.unmatched = [f"layer {L.index}" for L in unmatched]
        if not allow_partial:
            raise RewriteError(
                f"only {len(matched)} of {len(layers)} attention layers matched; not matched: "
                f"{', '.join(report.unmatched)} (pass --allow-partial to rewrite the others and keep these float)")

    _fix_io(model, [L for L in layers.values() if L.rule], options)
    model.opset_imports[DOMAIN] = 1
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)
    RemoveUnusedOpsetsPass()(model)
    report.bytes_per_token_after = kv_bytes_per_token(model)
    return report


def _replace_output(graph: ir.Graph, old: ir.Value, new: list[tuple[str, ir.Value]]) -> None:
    outs = list(graph.outputs)
    i = outs.index(old)
    for name, v in new:
        v.name = name
        if old.shape is not None and len(old.shape) == 4:
            last = v.shape[3] if v.shape is not None and len(v.shape) == 4 else None
            v.shape = ir.Shape([_static(old.shape[0]) or old.shape[0], _static(old.shape[1]) or old.shape[1],
                                old.shape[2], last])
    outs[i:i + 1] = [v for _, v in new]
    graph.outputs.clear()
    graph.outputs.extend(outs)


def _replace_input(graph: ir.Graph, old: ir.Value, new: list[ir.Value]) -> None:
    ins = list(graph.inputs)
    i = ins.index(old)
    ins[i:i + 1] = new
    graph.inputs.clear()
    graph.inputs.extend(ins)


def _redirect_shape_uses(old: ir.Value, new: ir.Value, what: str) -> None:
    """Shape/Size of the float cache equals Shape/Size of the int8 K payload: move them; anything else refuses."""
    for user, idx in list(old.uses()):
        if user.op_type in ("Shape", "Size") and user.domain in ("", "ai.onnx"):
            user.replace_input_with(idx, new)
        elif user.domain in ("", "ai.onnx") and (user.op_type == "Identity" or
                                                  (user.op_type == "Concat" and len(user.inputs) == 1)):
            _redirect_shape_uses(user.outputs[0], new, what)  # pass-through (TorchScript's 1-input Concat)
            if user.outputs[0].is_graph_output():
                raise RewriteError(f"{what} is passed through to graph output {user.outputs[0].name}")
        else:
            raise RewriteError(f"{what} is still used by {user.op_type} node {user.name!r} after the rewrite")


def _fix_io(model: ir.Model, layers: list[LayerIO], options: RewriteOptions) -> None:
    graph = model.graph
    for L in layers:
        i = L.index
        kp, ks = L.new["key_payload"], L.new["key_scales"]
        pres_k = _find_output(graph, f"present.{i}.key")
        if pres_k is None:
            raise RewriteError(f"layer {i}: no present.{i}.key output")
        _replace_output(graph, pres_k, [(f"present.{i}.key_payload", kp), (f"present.{i}.key_scales", ks)])
        quant_v = options.v_format != "float"
        pres_v = _find_output(graph, f"present.{i}.value")
        if quant_v:
            if pres_v is None:
                raise RewriteError(f"layer {i}: no present.{i}.value output")
            _replace_output(graph, pres_v, [(f"present.{i}.value_payload", L.new["value_payload"]),
                                            (f"present.{i}.value_scales", L.new["value_scales"])])
        _replace_input(graph, L.past_key, [L.key_payload_in, L.key_scales_in])
        if quant_v:
            _replace_input(graph, L.past_value, [L.value_payload_in, L.value_scales_in])
        L.present_key, L.present_value = pres_k, pres_v
    RemoveUnusedNodesPass()(model)
    quant_v = options.v_format != "float"
    for L in layers:
        for pres in (L.present_key, L.present_value if quant_v else None):
            if pres is not None:
                _redirect_repeat_shapes(graph, pres, L.attn_out, L.new["key_payload"], pres is L.present_key)
    RemoveUnusedNodesPass()(model)
    for L in layers:  # the old float present Concats: only shape uses may remain
        _redirect_shape_uses(L.present_key, L.new["key_payload"], f"present.{L.index}.key (float)")
        if quant_v and L.present_value is not None:
            _redirect_shape_uses(L.present_value, L.new["key_payload"], f"present.{L.index}.value (float)")
    RemoveUnusedNodesPass()(model)
    for L in layers:
        _redirect_shape_uses(L.past_key, L.key_payload_in, f"past_key_values.{L.index}.key")
        if quant_v:
            _redirect_shape_uses(L.past_value, L.key_payload_in, f"past_key_values.{L.index}.value")
        L.past_key.name = f"{L.past_key.name}.__removed"
        if quant_v:
            L.past_value.name = f"{L.past_value.name}.__removed"


def _redirect_repeat_shapes(graph: ir.Graph, pres: ir.Value, attn_out: ir.Value, k_payload: ir.Value,
                            is_key: bool) -> None:
    """Exporters read dims of the GQA-repeated K/V [B, Hq, Sk, D] (TorchScript: D to reshape the output; optimum:
    Sk to slice the mask). Shape(repeated)[i] becomes Shape(present key payload)[i] for i = 0, 2 (and 3 for K),
    Shape(attention output)[i] for i = 1 (Hq) and 3 (Dv for V)."""
    for u, _ in list(pres.uses()):
        if u.op_type != "Unsqueeze":
            continue
        for e, _ in list(u.outputs[0].uses()):
            if e.op_type != "Expand":
                continue
            for r, _ in list(e.outputs[0].uses()):
                if r.op_type != "Reshape":
                    continue
                for sh, _ in list(r.outputs[0].uses()):
                    if sh.op_type != "Shape" or "start" in sh.attributes or "end" in sh.attributes:
                        continue
                    for g, gidx in list(sh.outputs[0].uses()):
                        gi = _common._ir_utils.get_numpy_value(g.inputs[1]) if g.op_type == "Gather" else None
                        if gi is None or gi.size != 1 or gidx != 0:
                            continue
                        i = int(gi.reshape(-1)[0]) % 4
                        src = k_payload if (i in (0, 2) or (i == 3 and is_key)) else attn_out
                        new = ir.node("Shape", [src])
                        new.outputs[0].dtype = ir.DataType.INT64
                        new.outputs[0].shape = ir.Shape([4])
                        graph.insert_before(g, new)
                        g.replace_input_with(0, new.outputs[0])


def _find_output(graph: ir.Graph, name: str) -> ir.Value | None:
    for v in graph.outputs:
        if v.name == name:
            return v
    return None


# ---------------------------------------------------------------------------------------------- files


def load_checked(path: str | os.PathLike) -> ir.Model:
    """Load an ONNX file with its external data referenced lazily; refuse what model_io.check_model_file refuses
    (missing, empty, truncated or non-ONNX files, missing or short external data, unknown opsets, a value name
    with two producers)."""
    path = Path(path)
    try:
        proto = check_model_file(path)
    except BadModelError as e:
        raise RewriteError(str(e)) from None
    base = path.parent
    model = ir.serde.deserialize_model(proto)
    # Resolve external tensors relative to the model's folder.
    for init in model.graph.initializers.values():
        tv = init.const_value
        if isinstance(tv, ir.ExternalTensor):
            tv.base_dir = str(base)
    return model


def save_atomic(model: ir.Model, out: str | os.PathLike, external_threshold: int = EXTERNAL_DATA_THRESHOLD,
                check: bool = True, share_external: bool = False) -> None:
    """Write to a temp folder next to OUT, run onnx.checker (full), then move into place. On any failure (the
    checker, a full disk, a folder that is not writable) nothing is left behind: not the temp folder, not the
    folders made for OUT, not half a file; the error is a RewriteError naming OUT.

    share_external: the source's external data files are reused as they are (hard-linked next to OUT, or copied
    byte for byte across file systems) instead of re-serialized, when every external tensor comes from one folder
    and the tensors made in memory are small (external_data_shared says when). A rewrite changes the graph, not
    the weights: a 15 GB genai folder is then rewritten in seconds and, linked, with no second copy on disk."""
    out = Path(out).resolve()
    tmpdir = None
    with folders_removed_on_failure(out.parent):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            size = sum((v.const_value.nbytes if v.const_value is not None else 0)
                       for v in model.graph.initializers.values())
            tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
            tmp = tmpdir / out.name
            data_name = out.name + ".data"
            shared = external_data_shared(model) if share_external else None
            if shared is not None:
                base, locations = shared
                for location in locations:
                    _link_or_copy(base / location, tmpdir / location)
                ir.save(model, str(tmp))  # external tensors keep their location (relative), offset and length
            elif size > external_threshold:
                ir.save(model, str(tmp), external_data=data_name, size_threshold_bytes=1024)
            else:
                proto = ir.serde.serialize_model(model)
                _load_external_into(proto, model)
                onnx.save(proto, str(tmp))
            if check:
                try:
                    onnx.checker.check_model(str(tmp), full_check=True)
                except Exception as e:
                    raise RewriteError(f"the rewritten model fails onnx.checker: {e}") from None
            for item in tmpdir.iterdir():  # the data first: OUT never names data that is not there yet
                if item.name != out.name:
                    os.replace(item, out.parent / item.name)
            os.replace(tmp, out)
        except OSError as e:  # ENOSPC, EFBIG (a file size limit), EACCES, EROFS, ...
            raise RewriteError(f"{out}: cannot write the rewritten model: {e.strerror or e} "
                               f"({type(e).__name__}, errno {e.errno})") from None
        finally:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)


# Tensors made in memory by a rewrite stay inside the model file when the data is shared: their total is kept far
# below protobuf's 2 GB limit.
INLINE_LIMIT = 256 << 20


def external_data_shared(model: ir.Model) -> tuple[Path, list[str]] | None:
    """(folder, [data file names]) when every external tensor of model lives in files of one folder, under plain
    relative names, and the in-memory initializers add up to less than INLINE_LIMIT; else None."""
    bases, locations, inline = set(), set(), 0
    for v in model.graph.initializers.values():
        tv = v.const_value
        if isinstance(tv, ir.ExternalTensor):
            bases.add(Path(tv.base_dir).resolve())
            locations.add(str(tv.location))
        elif tv is not None:
            inline += tv.nbytes
    if len(bases) != 1 or inline >= INLINE_LIMIT:
        return None
    if any(Path(loc).is_absolute() or Path(loc).name != loc for loc in locations):
        return None  # a location in a sub-folder or outside: not worth the special case
    return bases.pop(), sorted(locations)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed there
        shutil.copyfile(src, dst)


def _load_external_into(proto: onnx.ModelProto, model: ir.Model) -> None:
    from onnx.external_data_helper import load_external_data_for_model

    bases = {init.const_value.base_dir for init in model.graph.initializers.values()
             if isinstance(init.const_value, ir.ExternalTensor)}
    for b in bases:
        load_external_data_for_model(proto, b)


def rewrite_file(src: str | os.PathLike, dst: str | os.PathLike, options: RewriteOptions | None = None,
                 allow_partial: bool = False) -> RewriteReport:
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise RewriteError("OUT must differ from IN (IN is never changed)")
    model = load_checked(src)
    # A model that already fails the full check (e.g. ORT-fused graphs with contrib ops in the ONNX domain, which
    # onnx.checker does not know) cannot pass it after the rewrite either: then the check is skipped and reported.
    try:
        onnx.checker.check_model(str(src), full_check=True)
        src_ok, src_err = True, ""
    except Exception as e:
        src_ok, src_err = False, str(e).splitlines()[0]
    try:
        report = rewrite_model(model, options, allow_partial=allow_partial)
    except RewriteError as e:
        raise RewriteError(f"{src}: {e}") from None
    if not src_ok:
        report.notes.append(f"onnx.checker skipped: the input model itself fails it ({src_err})")
    save_atomic(model, dst, check=src_ok)
    return report
