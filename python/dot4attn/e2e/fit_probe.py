"""One try of the fit search, in a process of its own: loads a row's model, allocates the cache of `batch`
sequences of `max_length` tokens, prefills 16 tokens and decodes 2 steps; prints one JSON line
{"fits": bool, "free": bytes free after the model load, "total": bytes, "error": str}. A process per try because a
failed allocation leaves onnxruntime's arena holding what it grew, for every later model of the process.

    python -m dot4attn.e2e.fit_probe og|inplace FOLDER cuda BATCH MAX_LENGTH     # BATCH 0: the model only
"""
from __future__ import annotations

import json
import sys

import numpy as np


def main(argv: list[str]) -> int:
    kind, folder, device, batch, max_length = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    from .harness import error_line, memory_used
    from .runners import make_runner, start

    runner = make_runner(kind, folder, device)
    used, total = memory_used(device)
    out = dict(fits=True, free=None if used is None else total - used, total=total, error="")
    if batch > 0:
        try:
            start(runner, np.zeros((batch, 16), np.int64), max_length, 16)
            for _ in range(2):
                runner.greedy_step()
        except Exception as e:  # noqa: BLE001 - what did not fit is the answer
            out.update(fits=False, error=error_line(e, 200))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
