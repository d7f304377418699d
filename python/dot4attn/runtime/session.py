"""Run an exported decoder (.onnx, original or rewritten) step by step with its KV cache fed back as numpy arrays.

`DecoderSession` finds the cache I/O by name: per layer N, inputs `past_key_values.N.<part>` and outputs
`present.N.<part>`, where <part> is key/value (float) or key_payload/key_scales/value_payload/value_scales
(dot4attn packed). It works for the original and the rewritten model alike: `run` is one model call (every
position's logits), and the runtime's Decoder interface (reset / prefill / step / greedy_step) is built on it.
"""
from __future__ import annotations

import time

import numpy as np

from ..formats import cache_input_bytes
from ..model_io import PAST_RE, check_model_file
from .decoder import prefill_in_chunks, providers_for

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
       "tensor(uint8)": np.uint8, "tensor(int64)": np.int64, "tensor(bool)": np.bool_, "tensor(int32)": np.int32}


def make_session(path: str, providers=None, threads: int | None = None, session_options=None):
    """An InferenceSession of `path` with the dot4attn ops registered when the model uses them. `session_options`
    lets a caller add its own settings (e.g. profiling); it is modified here."""
    import onnxruntime as ort

    so = session_options or ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    # A bad file (truncated, not ONNX, short external data, ...) gets an error naming it and what was expected,
    # before ONNX Runtime sees it.
    m = check_model_file(path)
    needs_ops = any(o.domain == "dot4attn" for o in m.opset_import)
    if needs_ops:
        from .. import register

        register(so)
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])


class DecoderSession:
    def __init__(self, path: str, providers=None, threads: int | None = None, session_options=None):
        self.path = str(path)
        self.sess = make_session(path, providers, threads, session_options)
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.output_names = [o.name for o in self.sess.get_outputs()]
        self.cache_specs = {}
        for name, i in self.inputs.items():
            if PAST_RE.match(name):
                shape = [_int(x) for x in i.shape]
                self.cache_specs[name] = (_NP[i.type], shape)
        self.packed = any(n.endswith("key_payload") for n in self.cache_specs)
        self.cache: dict[str, np.ndarray] = {}
        self.has_position_ids = "position_ids" in self.inputs

    # ---- the runtime's Decoder interface (dot4attn.runtime): last-position logits, the mask kept here ----------

    def reset(self, batch: int, max_length: int | None = None) -> None:
        """Empties the cache for `batch` sequences (the cache grows with every call: max_length is not needed)."""
        self.cache = {}
        for name, (dt, shape) in self.cache_specs.items():
            h, d = shape[1], shape[3]
            if not isinstance(h, int) or not isinstance(d, int):
                raise ValueError(f"{self.path}: cache input {name} needs static heads and last dim, got {shape}")
            self.cache[name] = np.zeros((batch, h, 0, d), dt)
        self.batch, self.length = batch, 0
        self._mask = np.zeros((batch, 0), np.int64)
        self._last_logits = None

    def step(self, ids: np.ndarray | None, mask: np.ndarray | None = None) -> np.ndarray:
        """Feeds ids [B, S] (None: each row's argmax of the last logits) with mask [B, length + S] (default: the
        previous mask and ones for the new tokens); returns the last position's logits [B, vocab]."""
        if ids is None:
            if self._last_logits is None:
                raise ValueError("step(None) feeds the argmax of the previous step's logits: run a prompt first")
            ids = self._last_logits.argmax(-1)[:, None]
        return self.step_all(ids, mask)[:, -1]

    def step_all(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """step() returning every fed position's logits [B, S, vocab] (float32)."""
        ids = np.asarray(ids, np.int64)
        if ids.ndim != 2 or ids.shape[0] != self.batch:
            raise ValueError(f"ids: expected [batch={self.batch}, S], got shape {ids.shape}")
        total = self.length + ids.shape[1]
        if mask is None:
            mask = np.concatenate([self._mask, np.ones(ids.shape, np.int64)], axis=1)
        mask = np.asarray(mask, np.int64)
        if mask.shape != (self.batch, total):
            raise ValueError(f"mask: expected shape [batch={self.batch}, {total}], got {mask.shape}")
        return self._feed(ids, mask)

    def _feed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        logits = self.run(ids, mask, positions(mask)[:, self.length:]).astype(np.float32)
        self._mask, self.length = mask, self.length + ids.shape[1]
        self._last_logits = logits[:, -1]
        return logits

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
        """The prompt ids [B, S] in calls of at most `chunk` tokens (None: one call); the last logits [B, vocab]."""
        return prefill_in_chunks(self, ids, mask, chunk)

    def greedy_step(self, mask: np.ndarray | None = None) -> np.ndarray:
        """Feeds each row the argmax of the last logits; returns this step's argmax [B] (int64)."""
        return self.step(None, mask).argmax(-1).astype(np.int64)

    def release(self) -> None:
        self.cache = {}

    def close(self) -> None:
        self.cache, self.sess = {}, None

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """One model call over the cache: the logits of every fed position [B, S, vocab]; the cache grows by S.
        attention_mask covers the cache and the new tokens, [B, length + S]."""
        feeds = {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)}
        if self.has_position_ids:
            feeds["position_ids"] = position_ids.astype(np.int64)
        feeds.update(self.cache)
        outs = self.sess.run(None, feeds)
        res = dict(zip(self.output_names, outs))
        for name in self.cache_specs:
            self.cache[name] = res["present." + name[len("past_key_values."):]]
        return res["logits"]

    def cache_bytes(self) -> int:
        return int(sum(a.nbytes for a in self.cache.values()))

    def cache_bytes_per_token(self) -> int:
        """Bytes one token adds to the cache, batch 1 (from the input layouts)."""
        return cache_input_bytes((name, shape, np.dtype(dt).itemsize) for name, (dt, shape) in self.cache_specs.items())


def _int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return x


def positions(mask: np.ndarray) -> np.ndarray:
    """position_ids for a (left-padded) attention mask: cumsum - 1, pads at 0."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)


def generate(model: str, token_ids: list[int], max_new_tokens: int, device: str = "cpu", eos: int | None = None,
             progress=None, session: DecoderSession | None = None, threads: int | None = None) -> dict:
    """Greedy generation with an exported decoder: the new tokens, prefill and decode times and speeds, the cache's
    bytes. progress(i, token) is called after each new token."""
    s = session or DecoderSession(model, providers=providers_for(device), threads=threads)
    ids = np.asarray(token_ids, np.int64)[None]
    s.reset(1)
    t0 = time.perf_counter()
    logits = s.prefill(ids)
    t_prefill = time.perf_counter() - t0
    out: list[int] = []
    t1 = time.perf_counter()
    for i in range(max_new_tokens):
        nxt = int(logits[0].argmax())
        out.append(nxt)
        if progress:
            progress(i + 1, nxt)
        if eos is not None and nxt == eos or i == max_new_tokens - 1:
            break
        logits = s.step(np.array([[nxt]]))
    t_decode = time.perf_counter() - t1
    n_dec = max(len(out) - 1, 0)
    return dict(tokens=out, prefill_s=t_prefill, decode_s=t_decode,
                prefill_tok_s=ids.shape[1] / max(t_prefill, 1e-9), decode_tok_s=n_dec / max(t_decode, 1e-9),
                cache_bytes=s.cache_bytes(), cache_bytes_per_token=s.cache_bytes_per_token(), context=s.length)
