"""Finding, reading and building a model: named models, Hugging Face folders and GGUF files; their config, weights and
quantized blocks, the tokenizer with its chat template, and load_model (build), which makes the CausalLM of them."""
