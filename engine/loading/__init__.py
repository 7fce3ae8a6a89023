"""Finding and reading a model: named models, Hugging Face folders and GGUF files; their config, weights and quantized
blocks, and the tokenizer with its chat template."""
