"""Conventions of the exported decoders that the exporter, the graph passes and the decoder runner share.

Cache I/O names: per layer N, inputs `past_key_values.N.<part>` and outputs `present.N.<part>`, where <part> is
key / value (float cache, as exported) or key_payload / key_scales / value_payload / value_scales (packed, after
`dot4attn rewrite`).
"""
from __future__ import annotations

import re

PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(\w+)$")  # group 1: the layer, group 2: the part
FLOAT_PARTS = ("key", "value")

# A model whose initializers hold more bytes than this is saved with its tensors as external data (`<OUT>.data`):
# one ONNX protobuf file cannot pass 2 GiB, and the graph itself needs some room under that.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
