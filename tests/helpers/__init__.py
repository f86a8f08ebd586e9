"""Plain helpers the test files share, one module per subject. Fixtures live in the conftest.py files and call
these; test files import from here, never from a conftest or from another test file.

- `models`: tiny random source models of every registered architecture, saved like hub checkpoints; greedy decoding
- `data`: a character and a word-level tokenizer, sample sentences, JSON-lines writers
- `recipes`: a small corpus and tiny finetuning recipes; what a run leaves behind
- `ops`: the op tests' numerics: relative errors, realistic gates, forward + backward runs, op inputs
- `triton`: whether the Triton kernel tests can run here, and on which device
"""
