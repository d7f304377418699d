"""Graph passes that rewrite exported Qwen-style decoders onto the dot4attn ops with a packed KV cache.

One module per source form (unfused_dynamo, unfused_torchscript, onnx_attention, ms_mha); `driver` applies
them to a whole model. See docs/passes.md. onnxruntime-genai builder models (com.microsoft.GroupQueryAttention)
go through `genai_gqa` instead, applied to a whole model folder by `genai_folder.rewrite_folder` (docs/genai.md).
"""
from ._common import RewriteOptions
from .driver import (RewriteError, RewriteReport, kv_bytes_per_token, load_checked, rewrite_file, rewrite_model,
                     save_atomic)
from .genai_folder import GenaiRewriteReport, rewrite_folder

__all__ = ["RewriteOptions", "RewriteError", "RewriteReport", "kv_bytes_per_token", "load_checked", "rewrite_file",
           "rewrite_model", "save_atomic", "GenaiRewriteReport", "rewrite_folder"]
