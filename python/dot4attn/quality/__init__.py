"""How close a rewritten model stays to its original: `compare` (a seeded prompt and teacher-forced steps, top-1
and KL against the project's bars per V format) and `eval` (perplexity, KL and top-1 over a text, prompt and
decode positions apart)."""
