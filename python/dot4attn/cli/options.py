"""Which pip extra a `dot4attn` verb needs, to say so when one of its packages is missing."""
from __future__ import annotations

# pyproject.toml's [project.optional-dependencies] by import name, smallest extra first (tests/cli/test_cli.py
# checks them against pyproject.toml).
# genai holds the passes too: a genai folder is rewritten by them.
EXTRAS = {"passes": ("onnxscript", "onnx_ir"), "genai": ("onnxscript", "onnx_ir", "onnxruntime_genai"),
          "models": ("onnxscript", "onnx_ir", "torch", "transformers"),
          "eval": ("onnxscript", "onnx_ir", "onnxruntime_genai", "torch", "transformers", "gguf", "accelerate")}
# The extra a command is meant to run with: rewrite needs the passes; export and demo export models; generate needs
# transformers for --tokenizer only.
COMMAND_EXTRA = {"rewrite": "passes", "export": "models", "demo": "models", "generate": "models", "e2e": "models",
                 "eval": "eval"}


def missing_extra_message(command: str, module: str) -> str | None:
    """What to install when `command` failed to import `module`; None when no extra of dot4attn provides it."""
    top = module.partition(".")[0]
    extras = [name for name, modules in EXTRAS.items() if top in modules]
    if not extras:
        return None
    extra = COMMAND_EXTRA.get(command) if COMMAND_EXTRA.get(command) in extras else extras[0]
    note = "; install torch first (e.g. its CPU build), then the extra" if "torch" in EXTRAS[extra] else ""
    return (f"dot4attn {command}: needs {top}, which the [{extra}] extra installs: "
            f"pip install 'dot4attn[{extra}]' (from a checkout: pip install '.[{extra}]'){note}")
