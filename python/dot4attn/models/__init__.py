"""Models to run the ops on: exports of Qwen2 / Qwen3 decoders (`export`, the seeded presets of `recipes`) and
onnxruntime-genai builder folders (`genai_builder`). Used by the CLI's export / demo / e2e and by the tests; the
library core does not import them (they need torch and transformers, the [models] extra)."""
