"""One timed case of `dot4attn e2e --case-processes` in a process of its own: an untimed warm-up case on the row's
model, then the case (harness._measure); writes the case's logits (when it keeps any) to the spec's `logits` path and
prints one JSON line {"result": dict or null, "failed": str or null}. A process per case because onnxruntime's arena
keeps what every prompt of the process grew.

    python -m dot4attn.e2e.case_process SPEC.json     # {row, folder, settings, context, batch, vocab, cuda_graph,
                                                      #  copied, logits}
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    from .harness import Settings, _measure, _warm_up

    settings = Settings(**spec["settings"])
    folder = Path(spec["folder"])
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731 - stdout carries the answer
    _warm_up(spec["row"], folder, settings, spec["vocab"], log)
    r, failed = _measure(spec["row"], folder, settings, spec["context"], spec["batch"], spec["vocab"],
                         spec["cuda_graph"], spec["copied"])
    if r is not None:
        logits = r.pop("logits")
        if logits is not None:
            np.save(spec["logits"], logits)
    print(json.dumps(dict(result=r, failed=failed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
