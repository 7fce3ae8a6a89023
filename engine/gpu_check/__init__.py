"""`python -m engine.gpu_check`: the one command that checks the GPU path on a card, in at most 8 minutes.

It prints one JSON document with a report per part: the Triton tests compiled natively, the engine's
equivalence suite on the card, decode graphs on and off, prefill and decode timings of a
Qwen3-8B-shaped model with random weights (bf16 and Q4_K, N=1 and N=8 over a 4,096-token trunk), the
fraction of the card's memory bandwidth a decode step reaches, and the device itself. Each part runs
in its own process under its own time box, so one that fails, crashes or hangs never stops the others
(parts.py lists them; part_main.py runs one).

    python -m engine.gpu_check --quick --out first.json     # a first run on a new card: about a minute
    python -m engine.gpu_check --out gpu_check.json         # everything, at most 8 minutes
    python -m engine.gpu_check --allow-cpu --quick          # the script itself, on a machine with no GPU

Run it from a checkout's root (the pytest parts run tests/); the card's Python needs what the engine
imports beside torch and triton (gguf, tokenizers, jinja2, safetensors) and, for the tests, pytest,
hypothesis and transformers. SWARM_GPU_CHECK_FAIL and SWARM_GPU_CHECK_HANG (parts.py) make named
parts fail or hang, to check the check.
"""
