"""Decode onnxruntime-genai-style models with their KV cache resident where the model runs, appended in place.

    dec = InPlaceDecoder("qwen-d4a", device="cuda")      # a genai folder (original or rewritten)
    dec.reset(batch=1, max_length=4096)
    logits = dec.prefill(prompt_ids, chunk=2048)          # [B, S] int64 -> last-position logits [B, vocab]
    logits = dec.step(next_ids)                           # [B, 1]
    logits = dec.step(None)                               # greedy: the argmax of the last step, on the device
    ids = dec.greedy_step()                               # greedy, only the next ids [B] back to the host
    dec.reset(batch=16, max_length=32768 + 64)
    dec.prompt_copied(prompt_ids[:1], chunk=16384)        # one sequence prefilled, copied to all 16 rows

The model takes input_ids and attention_mask and owns its cache the way genai's builder models do: per layer
past_key_values.N.key / .value in, present.N.key / .value out, written in place when both are the same buffer
(GroupQueryAttention and Dot4GroupQueryAttention both do). Each cache tensor is allocated once per reset as an
OrtValue on the device, [B, kv_heads, max_length, last] (last: head size for float caches, the packed row bytes
for dot4attn's), and bound as both the past input and the present output. A step moves only the new token ids,
the attention mask and the last position's logits between host and device: no cache byte crosses, whatever the
context. Unlike onnxruntime-genai it also runs folders whose K and V caches differ in width (--v-format q4_0 or q6_0
with --for-inplace-runner).

On CUDA the decode step is a CUDA graph (cuda_graph, on by default there): ONNX Runtime captures the step's kernels
once and replays them, so a step costs the GPU's time instead of a few microseconds of host work per kernel
(hundreds of kernels per step for a 28-layer model). A replay needs every bound buffer at the address it was
captured with and launches that do not depend on the context: decode steps bind a mask as long as the cache,
[B, max_length], zeros past each row's length and updated in place one column per step (total_sequence_length is
then max_length and seqlens_k, the rows' lengths, is computed from the mask on the device), the ids and the logits
in fixed buffers. Dot4GroupQueryAttention reads the lengths on the device at decode, and ONNX Runtime's
GroupQueryAttention does too, so both the rewritten and the original folders replay. Prompts run uncaptured.

A one-token step's logits stay on the device until asked for. A second, small ONNX Runtime InferenceSession on the
same device (the "head": Cast to float32 and ArgMax) runs over them only when something needs it: float32 host
logits (host_logits="float32": no [B, vocab] half floats converted in numpy, 0.8 ms for one row of a 152k vocabulary,
11 ms for 16, on a 2-core x86 host), or a greedy step, whose next ids it writes straight into the step's input
buffer, so step(None) moves no token through the host. A teacher-forced step with host_logits="model" runs no head:
it costs the model's run and the logits' copy, as og.Generator's append_tokens + get_output does (the head's
session run, launched from the host, was 0.1-0.2 ms of a 5 ms step on an H200). On CUDA the head replays as a CUDA
graph of its own (its buffers are fixed per reset).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..formats import cache_input_bytes
from ..model_io import PAST_RE, context_length
from .decoder import prefill_in_chunks

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8,
       "tensor(int8)": np.int8}


class InPlaceDecoder:
    def __init__(self, folder: str | Path, device: str = "cpu", threads: int | None = None,
                 profile_prefix: str | None = None, cuda_graph: bool | None = None, host_logits: str = "float32"):
        import onnxruntime as ort

        folder = Path(folder)
        if host_logits not in ("float32", "model"):
            raise ValueError(f"host_logits: expected 'float32' or 'model' (the model's logits dtype), got "
                             f"{host_logits!r}")
        self.host_logits = host_logits
        if cuda_graph and device != "cuda":
            raise ValueError(f"cuda_graph needs device='cuda', got device={device!r}")
        self.cuda_graph = device == "cuda" if cuda_graph is None else bool(cuda_graph)
        cfg = json.loads((folder / "genai_config.json").read_text())
        dec = cfg["model"]["decoder"]
        self.head_size = int(dec["head_size"])
        self.context_length = context_length(cfg) or 4096
        self.device = device
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        if profile_prefix:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        lib = dec.get("session_options", {}).get("custom_ops_library")
        if lib:
            so.register_custom_ops_library(str(folder / lib))
        providers = self._providers()
        if device == "cuda":
            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls()
        self.sess = ort.InferenceSession(str(folder / dec["filename"]), so, providers=providers)
        if device == "cuda" and "CUDAExecutionProvider" not in self.sess.get_providers():
            raise RuntimeError("the CUDA execution provider is not available in this onnxruntime")
        names = {i.name: i for i in self.sess.get_inputs()}
        for need in ("input_ids", "attention_mask"):
            if need not in names:
                raise ValueError(f"{folder}: the model has no {need!r} input (not a genai builder decoder)")
        self.caches: dict[str, tuple] = {}  # past name -> (present name, dtype, heads, last)
        for name, i in names.items():
            m = PAST_RE.match(name)
            if not m:
                continue
            present = f"present.{m.group(1)}.{m.group(2)}"
            heads, last = i.shape[1], i.shape[3]
            last = last if isinstance(last, int) else self.head_size
            if not isinstance(heads, int):
                raise ValueError(f"{folder}: cache input {name} needs static kv heads, got shape {i.shape}")
            self.caches[name] = (present, _NP[i.type], heads, last)
        if not self.caches:
            raise ValueError(f"{folder}: no past_key_values.N.key / .value inputs")
        self.ids_dtype = np.int64 if names["input_ids"].type == "tensor(int64)" else np.int32
        self.mask_dtype = np.int64 if names["attention_mask"].type == "tensor(int64)" else np.int32
        self.logits_name = "logits"
        out = {o.name: o for o in self.sess.get_outputs()}
        if self.logits_name not in out:
            raise ValueError(f"{folder}: the model has no 'logits' output (not a genai builder decoder)")
        vocab = out[self.logits_name].shape[-1]
        self.vocab = vocab if isinstance(vocab, int) else None  # static: decode steps write a preallocated buffer
        self.logits_dtype = _NP.get(out[self.logits_name].type, np.float32)
        if self.cuda_graph and self.vocab is None:
            raise ValueError(f"{folder}: cuda_graph needs a static vocabulary size in the logits output, got "
                             f"{out[self.logits_name].shape}")
        self._run_options = {}
        for name, graph_id in (("prompt", "-1"), ("decode", "1")):  # -1: a run ONNX Runtime does not capture
            ro = ort.RunOptions()
            if self.cuda_graph:
                ro.add_run_config_entry("gpu_graph_id", graph_id)
            self._run_options[name] = ro
        self._copy_column = _column_writer() if self.cuda_graph else None
        self._head_session = None
        self.values: dict[str, object] = {}
        self.batch = 0
        self.length = 0

    def _providers(self) -> list:
        """The execution providers of the model's session and the head's: CUDA (capturing CUDA graphs when
        cuda_graph) with the CPU beside it, or the CPU alone."""
        if self.device != "cuda":
            return ["CPUExecutionProvider"]
        cuda = ("CUDAExecutionProvider", {"enable_cuda_graph": "1"}) if self.cuda_graph else "CUDAExecutionProvider"
        return [cuda, "CPUExecutionProvider"]

    def end_profiling(self) -> str:
        """Stops ORT's profiler (when profile_prefix was given); returns the JSON file's path."""
        return self.sess.end_profiling()

    def cache_bytes(self) -> int:
        """Bytes of the allocated cache buffers."""
        total = 0
        for name, (_, dt, h, last) in self.caches.items():
            total += self.batch * h * self.max_length * last * np.dtype(dt).itemsize
        return total

    def cache_bytes_per_token(self) -> int:
        return cache_input_bytes((name, (None, h, None, last), np.dtype(dt).itemsize)
                                 for name, (_, dt, h, last) in self.caches.items())

    def reset(self, batch: int, max_length: int) -> None:
        """Allocates the caches on the device: [batch, heads, max_length, last] each, zeroed (a runtime that reads
        past a row's valid length, such as a masked key's V, then reads zeros, never a reused buffer's NaN)."""
        import onnxruntime as ort

        if max_length > self.context_length:
            raise ValueError(f"max_length {max_length} exceeds the model's context length {self.context_length}")
        self.values = {}
        self.batch, self.max_length, self.length = batch, max_length, 0
        for name, (_, dt, h, last) in self.caches.items():
            self.values[name] = ort.OrtValue.ortvalue_from_shape_and_type([batch, h, max_length, last], dt,
                                                                          self.device, 0)
            _zero_value(self.values[name], batch * h * max_length * last * np.dtype(dt).itemsize, self.device)
        # Per-step inputs and outputs that live on the device for the whole run, so that a decode step allocates
        # nothing and moves only the token ids in and the logits out: an all-ones attention mask as long as the
        # cache (a step binds its first batch x length values: all ones, whatever their row layout), the ids of a
        # one-token step and that step's logits.
        self._ones_host = np.ones((batch, max_length), self.mask_dtype)  # the CPU OrtValue aliases it: kept alive
        self._ones = ort.OrtValue.ortvalue_from_numpy(self._ones_host, self.device, 0)
        self._ids1 = ort.OrtValue.ortvalue_from_shape_and_type([batch, 1], self.ids_dtype, self.device, 0)
        self._logits1 = (None if self.vocab is None else
                         ort.OrtValue.ortvalue_from_shape_and_type([batch, 1, self.vocab], self.logits_dtype,
                                                                   self.device, 0))
        self._head_binding = None
        if self._logits1 is not None:
            self._logits32 = ort.OrtValue.ortvalue_from_shape_and_type([batch, 1, self.vocab], np.float32,
                                                                       self.device, 0)
            hb = self._head().io_binding()
            hb.bind_ortvalue_input("logits", self._logits1)
            hb.bind_ortvalue_output("logits32", self._logits32)
            hb.bind_ortvalue_output("next_ids", self._ids1)  # the next greedy step's input, where it is read
            self._head_binding = hb
            self._head_run = ort.RunOptions()
            if self.cuda_graph:  # a new binding is a new capture, as for the decode step
                self._head_graph_id = getattr(self, "_head_graph_id", 0) + 1
                self._head_run.add_run_config_entry("gpu_graph_id", str(self._head_graph_id))
        # Where the next greedy step's ids come from: "host" (_last_logits, the last step's host logits, after a
        # prompt), "device" (_logits1 holds a one-token step's logits, the head not run yet) or "ids" (the head ran:
        # _ids1 holds their argmax).
        self._last_logits = None
        self._next = "host"
        # cuda_graph: the decode steps' mask, [batch, max_length], zeros past each row's length (its host mirror
        # says what the device holds). A new binding (reset) is a new capture: ONNX Runtime replays a graph only
        # with the buffers it was captured with.
        if self.cuda_graph:
            self._mask_host = np.zeros((batch, max_length), self.mask_dtype)
            self._mask = ort.OrtValue.ortvalue_from_numpy(self._mask_host, self.device, 0)
            self._graph_id = getattr(self, "_graph_id", 0) + 1
            self._run_options["decode"] = ort.RunOptions()
            self._run_options["decode"].add_run_config_entry("gpu_graph_id", str(self._graph_id))
        self.binding = self.sess.io_binding()
        self.binding.bind_output(self.logits_name, self.device)  # first: get_outputs() keeps the binding order
        for name, (present, _, _, _) in self.caches.items():
            self.binding.bind_ortvalue_input(name, self.values[name])
            self.binding.bind_ortvalue_output(present, self.values[name])

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
        """The prompt ids [B, S] in calls of at most `chunk` tokens (None: one call); the last logits as step()."""
        return prefill_in_chunks(self, ids, mask, chunk)

    def release(self) -> None:
        """Frees the cache buffers (reset allocates them again)."""
        self.values = {}
        self.binding = None
        self._head_binding = None

    def close(self) -> None:
        self.release()
        self.sess = self._head_session = None

    def step(self, ids: np.ndarray | None, mask: np.ndarray | None = None) -> np.ndarray:
        """Feeds ids [B, S] (the next S tokens of every row; mask [B, length + S] defaults to all ones) and returns
        the logits of the last position [B, vocab] on the host (float32, or the model's dtype with
        host_logits="model": half the bytes to copy from a float16 model). ids None: one greedy step, each row's
        token the argmax of the previous step's logits (after a one-token step it never leaves the device)."""
        return self._step(ids, mask, fetch=True)

    def step_all(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """step() returning every fed position's logits [B, S, vocab] as float32 on the host (a model whose builder
        pruned its LM head to the last position gives that one alone, [B, 1, vocab])."""
        last = self.step(ids, mask)
        if np.shape(ids)[1] == 1:
            return np.asarray(last, np.float32)[:, None]
        return self.binding.get_outputs()[0].numpy().astype(np.float32)

    def greedy_step(self, mask: np.ndarray | None = None) -> np.ndarray:
        """One greedy step that hands the host only token ids, as og.Generator's generate_next_token +
        get_next_tokens: feeds each row the argmax of the previous step's logits (as step(None)), leaves this step's
        logits on the device and returns their argmax [B] (int64), the tokens the next greedy step feeds. At batch
        16 with a 152k vocabulary a step's logits are 4.9 MB (float16) that step() copies to the host and this does
        not. mask as for step()."""
        logits = self._step(None, mask, fetch=False)
        if logits is None:  # a one-token step's logits on the device: the head picks the ids there
            self._run_head()
            return self._ids1.numpy()[:, 0].astype(np.int64)  # a copy: the buffer is the next step's input
        return logits.argmax(-1).astype(np.int64)

    def _step(self, ids: np.ndarray | None, mask: np.ndarray | None, fetch: bool) -> np.ndarray | None:
        """step(); fetch False: a one-token step whose head can take its logits returns None and copies nothing."""
        import onnxruntime as ort

        if ids is None:
            if self.length == 0:
                raise ValueError("step(None) feeds the argmax of the previous step's logits: run a prompt first")
            if self._next == "host":
                if self._last_logits is None:
                    raise ValueError("step(None) feeds the argmax of the previous step's logits: none since fill() "
                                     "(feed ids)")
                self._ids1.update_inplace(np.ascontiguousarray(self._last_logits.argmax(-1)[:, None],
                                                               self.ids_dtype))
            elif self._next == "device":
                self._run_head()
            shape = (self.batch, 1)
        else:
            ids = np.ascontiguousarray(ids, self.ids_dtype)
            shape = ids.shape
        if len(shape) != 2 or shape[0] != self.batch:
            raise ValueError(f"ids: expected [batch={self.batch}, S], got shape {shape}")
        total = self.length + shape[1]
        if total > self.max_length:
            raise ValueError(f"{total} tokens exceed the cache's max_length {self.max_length}")
        b = self.binding
        one = shape[1] == 1
        if mask is not None:
            mask = np.ascontiguousarray(mask, self.mask_dtype)
            if mask.shape != (self.batch, total):
                raise ValueError(f"mask: expected shape [batch={self.batch}, {total}], got {mask.shape}")
        if one:
            if ids is not None:
                self._ids1.update_inplace(ids)
            b.bind_ortvalue_input("input_ids", self._ids1)
        else:
            b.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(ids, self.device, 0))
        graph = one and self.cuda_graph
        if graph:
            self._set_mask(self.length, total, mask)
            b.bind_ortvalue_input("attention_mask", self._mask)
        elif mask is None:
            b.bind_input("attention_mask", self.device, 0, self.mask_dtype, [self.batch, total], self._ones.data_ptr())
        else:
            b.bind_ortvalue_input("attention_mask", ort.OrtValue.ortvalue_from_numpy(mask, self.device, 0))
        if one and self._logits1 is not None:
            b.bind_ortvalue_output(self.logits_name, self._logits1)
        else:
            b.bind_output(self.logits_name, self.device)  # ORT allocates it (S changes)
        self.sess.run_with_iobinding(b, self._run_options["decode" if graph else "prompt"])
        if self.cuda_graph and not one:
            self._set_mask(self.length, total, mask)
        self.length = total
        if one and self._head_binding is not None:  # the logits stay in _logits1 for a later greedy step's head
            self._last_logits = None
            self._next = "device"
            if not fetch:
                return None
            if self.host_logits == "float32":  # float32 logits and the next ids, computed on the device
                self._run_head()
            on_device = self._logits1 if self.host_logits == "model" else self._logits32
            logits = on_device.numpy()[:, -1]  # a CPU OrtValue's numpy() is a view of the bound buffer
            return logits.copy() if self.device == "cpu" else logits
        # [B, S, vocab]: the builder's graph may return every position's logits
        logits = self._logits1.numpy() if one and self._logits1 is not None else b.get_outputs()[0].numpy()
        self._last_logits = self._host(logits[:, -1])
        self._next = "host"
        return self._last_logits

    def _run_head(self) -> None:
        """_logits1 -> _logits32 and the argmax ids in _ids1, on the device."""
        self._head_session.run_with_iobinding(self._head_binding, self._head_run)
        self._next = "ids"

    def _host(self, logits: np.ndarray) -> np.ndarray:
        return logits.astype(np.float32) if self.host_logits == "float32" else logits.copy()

    def prompt_copied(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        """Prefills one sequence, ids [1, S] (in calls of at most `chunk` tokens), into batch row 0 of every cache
        and copies that row to the others: after reset(batch=B) the decoder holds B identical sequences of S
        tokens for the cost of one sequence's prefill, and decode steps run at batch B. For timing batch decode at
        a context whose batch prompt does not fit in memory (a prompt's activations grow with B x S, and ORT's
        GroupQueryAttention takes a batch > 1 prompt only in one call). Returns the last logits [B, vocab] (row 0's
        in every row) on the host, as step() does."""
        import onnxruntime as ort

        ids = np.ascontiguousarray(ids, self.ids_dtype)
        if self.length:
            raise ValueError(f"prompt_copied starts a sequence: {self.length} tokens are already in the cache "
                             "(reset first)")
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
            raise ValueError(f"ids: expected one sequence [1, S >= 1], got shape {ids.shape}")
        if ids.shape[1] > self.max_length:
            raise ValueError(f"{ids.shape[1]} tokens exceed the cache's max_length {self.max_length}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        one = self.sess.io_binding()  # batch row 0 of every cache, bound as a [1, heads, max_length, last] tensor
        one.bind_output(self.logits_name, self.device)  # first: get_outputs() keeps the binding order
        for name, (present, dt, h, last) in self.caches.items():
            ptr = self.values[name].data_ptr()
            one.bind_input(name, self.device, 0, dt, [1, h, self.max_length, last], ptr)
            one.bind_output(present, self.device, 0, dt, [1, h, self.max_length, last], ptr)
        total = 0
        for s in range(0, ids.shape[1], chunk):
            part = ids[:, s:s + chunk]
            total += part.shape[1]
            one.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(part, self.device, 0))
            one.bind_input("attention_mask", self.device, 0, self.mask_dtype, [1, total], self._ones.data_ptr())
            one.bind_output(self.logits_name, self.device)  # ORT allocates it (S changes)
            self.sess.run_with_iobinding(one, self._run_options["prompt"])
        logits = self._host(one.get_outputs()[0].numpy()[:, -1])
        for name, (_, dt, h, last) in self.caches.items():
            _copy_row_to_batch(self.values[name], self.batch, h * self.max_length * last * np.dtype(dt).itemsize,
                               self.device)
        if self.cuda_graph:
            self._set_mask(0, total, None)
        self.length = total
        self._last_logits = np.repeat(logits, self.batch, axis=0)
        self._next = "host"
        return self._last_logits

    def _head(self):
        """The InferenceSession computing, from a one-token step's logits [B, 1, vocab] on the device, their float32
        copy and their argmax as the next input ids (built once, on the model's device)."""
        import onnxruntime as ort
        from onnx import TensorProto, helper

        if self._head_session is None:
            elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}[self.logits_dtype]
            ids_elem = TensorProto.INT64 if self.ids_dtype == np.int64 else TensorProto.INT32
            nodes = [helper.make_node("Cast", ["logits"], ["logits32"], to=TensorProto.FLOAT),
                     helper.make_node("ArgMax", ["logits32"], ["argmax"], axis=-1, keepdims=0),
                     helper.make_node("Cast", ["argmax"], ["next_ids"], to=ids_elem)]
            graph = helper.make_graph(
                nodes, "dot4attn_inplace_head",
                [helper.make_tensor_value_info("logits", elem, ["batch", 1, self.vocab])],
                [helper.make_tensor_value_info("logits32", TensorProto.FLOAT, ["batch", 1, self.vocab]),
                 helper.make_tensor_value_info("next_ids", ids_elem, ["batch", 1])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            # one thread: a Cast and an ArgMax over [B, vocab]; a pool of its own beside the decoder's spinning one
            # made CPU greedy steps at batch 2 take 46-48 ms instead of 27-29 (2-core VM, the 0.5B e2e shape)
            so.intra_op_num_threads = 1
            self._head_session = ort.InferenceSession(model.SerializeToString(), so, providers=self._providers())
        return self._head_session

    def _set_mask(self, start: int, total: int, mask: np.ndarray | None) -> None:
        """cuda_graph: columns [start, total) of the device mask become mask's (default ones), the rest stay."""
        new = np.ones((self.batch, total - start), self.mask_dtype) if mask is None else mask[:, start:total]
        old = self._mask_host[:, :start]
        if mask is not None and not np.array_equal(mask[:, :start], old):
            raise ValueError("mask: with cuda_graph a step's mask extends the previous one (its first columns "
                             "cannot change)")
        self._mask_host[:, start:total] = new
        if total - start == 1 and self._copy_column is not None:
            self._copy_column(self._mask.data_ptr(), self._mask_host, start)
        else:
            self._mask.update_inplace(self._mask_host)

    def fill(self, length: int) -> None:
        """Declares the first `length` cache rows valid without computing them (their contents are whatever the
        buffers hold): to time decode steps at a long context without a prompt's prefill."""
        if length > self.max_length:
            raise ValueError(f"length {length} exceeds max_length {self.max_length}")
        if self.cuda_graph:
            self._mask_host[:, :length] = 1
            self._mask_host[:, length:] = 0
            self._mask.update_inplace(self._mask_host)
        self.length = length
        self._last_logits = None
        self._next = "host"


def _cudart():
    """The CUDA runtime library through ctypes, with the signatures of the calls used here declared, or None where
    none can be loaded (ONNX Runtime's CUDA EP has loaded libcudart into the process by the time a session runs, or
    torch has)."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        for fn, args in ((lib.cudaMemset, [ptr, ctypes.c_int, size]),
                         (lib.cudaMemcpy, [ptr, ptr, size, ctypes.c_int]),
                         (lib.cudaMemcpy2D, [ptr, size, ptr, size, size, size, ctypes.c_int]),
                         (lib.cudaDeviceSynchronize, [])):
            fn.argtypes, fn.restype = args, ctypes.c_int
        return lib
    return None


def _required_cudart(what: str):
    """_cudart(), or a RuntimeError saying that `what` needs it."""
    lib = _cudart()
    if lib is None:
        raise RuntimeError(f"{what} on the device needs the CUDA runtime library (libcudart)")
    return lib


def _zero_value(value, nbytes: int, device: str) -> None:
    """Fills an OrtValue's nbytes with zeros, on its device (ONNX Runtime's allocators hand out reused memory)."""
    if device == "cpu":
        value.numpy().fill(0)  # a CPU OrtValue's numpy() is a view of its buffer
        return
    lib = _required_cudart("zeroing a cache")
    err = lib.cudaMemset(value.data_ptr(), 0, nbytes) or lib.cudaDeviceSynchronize()
    if err != 0:
        raise RuntimeError(f"zeroing a cache of {nbytes} bytes on the device failed (CUDA error {err})")


def _copy_row_to_batch(value, batch: int, row_bytes: int, device: str) -> None:
    """Copies batch row 0 of a [batch, ...] OrtValue (row_bytes each) over rows 1 .. batch - 1, on its device."""
    if batch < 2:
        return
    if device == "cpu":
        arr = value.numpy()  # a CPU OrtValue's numpy() is a view of its buffer
        arr[1:] = arr[:1]
        return
    lib = _required_cudart("copying a cache row")
    ptr = value.data_ptr()
    err = lib.cudaDeviceSynchronize()  # ONNX Runtime's stream is not the legacy one the copies go on
    for b in range(1, batch):
        err = err or lib.cudaMemcpy(ptr + b * row_bytes, ptr, row_bytes, 3)  # 3: device to device
    err = err or lib.cudaDeviceSynchronize()
    if err != 0:
        raise RuntimeError(f"copying a cache's batch row 0 to rows 1..{batch - 1} failed (CUDA error {err})")


def _column_writer():
    """A function writing column `col` of a host [B, N] array into the same-shaped device buffer at `ptr` (one
    cudaMemcpy2D of B elements), or None where no CUDA runtime library can be loaded (the caller then copies the
    whole mask)."""
    lib = _cudart()
    if lib is None:
        return None
    fn, sync = lib.cudaMemcpy2D, lib.cudaDeviceSynchronize

    def write(ptr: int, host: np.ndarray, col: int) -> None:
        item, pitch = host.itemsize, host.strides[0]
        err = fn(ptr + col * item, pitch, host.ctypes.data + col * item, pitch, item, host.shape[0], 1)  # 1: H2D
        # From pageable memory the copy may return before its DMA lands, and ONNX Runtime's stream need not wait
        # for the legacy stream it went on: the device finishes it before the next step is launched.
        err = err or sync()
        if err != 0:
            raise RuntimeError(f"cudaMemcpy2D of the attention mask's column {col} failed (CUDA error {err})")

    return write
