"""Tiny random Hugging Face models, built offline by transformers (the oracle), saved as real
model folders (config.json, model.safetensors, tokenizer.json) for the engine to load."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "import os\nprint(os.getcwd())\n# tool schemas and system rules\n",
    "Agents share a trunk of tokens; their suffixes differ.\n",
]

VARIANTS = {
    "llama": dict(family="llama"),
    "llama-tied": dict(family="llama", tie_word_embeddings=True),
    "llama3-rope": dict(family="llama", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, max_position_embeddings=512),
    "llama-1kv": dict(family="llama", num_key_value_heads=1),
    "qwen2": dict(family="qwen2"),
    "qwen3": dict(family="qwen3", head_dim=24),
    "mistral": dict(family="mistral", sliding_window=None),
}

# Qwen3.5 hybrids (Gated DeltaNet and gated attention), apart from VARIANTS: those are also checked sharing
# prefixes, which a hybrid does not do yet
HYBRID_VARIANTS = {
    # every 4th layer full attention, value heads sharing key heads, a quarter of each head rotated
    "qwen3_5": dict(family="qwen3_5", num_hidden_layers=4, full_attention_interval=4, head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8),
    # odd head counts everywhere, every 2nd layer full attention, half of each head rotated, tied embeddings
    "qwen3_5-odd-tied": dict(family="qwen3_5", num_hidden_layers=4, full_attention_interval=2, num_attention_heads=3,
                             num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.5, linear_num_key_heads=1,
                             linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=12,
                             tie_word_embeddings=True),
    # layer_types given, a linear layer last, whole heads rotated
    "qwen3_5-linear-last": dict(family="qwen3_5", num_hidden_layers=3,
                                layer_types=["full_attention", "linear_attention", "linear_attention"],
                                num_attention_heads=5, num_key_value_heads=5, head_dim=8, partial_rotary_factor=1.0,
                                linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=4,
                                linear_value_head_dim=8),
}

_BASE = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
             rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def build_tokenizer(vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def make_tiny_model(folder: Path, variant: str = "llama", seed: int = 0) -> Path:
    import transformers

    options = dict(_BASE)
    options.update(VARIANTS[variant] if variant in VARIANTS else HYBRID_VARIANTS[variant])
    family = options.pop("family")
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig,
                    "qwen3_5": transformers.Qwen3_5TextConfig}[family]
    config = config_class(**options)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    for param in model.parameters():
        if param.dim() == 1:
            torch.nn.init.normal_(param, *_spread_of(family, _name_of(model, param)))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    build_tokenizer(config.vocab_size).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}))
    return folder


def load_reference(folder: Path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    return model.eval()


def _spread_of(family: str, name: str) -> tuple[float, float]:
    """The mean and deviation of a 1-d parameter's random values: a norm's weight around 1, or, for Qwen3.5's
    zero-centred norms (x·(1 + w)), around 0 (the Gated DeltaNet's own norm is a plain one); its decay
    (A_log, dt_bias) slow, about 2% a token, so a state carried wrongly shows in the tokens long after."""
    if name.endswith(("A_log", "dt_bias")):
        return -2.0, 0.5
    if "norm" not in name:
        return 0.0, 0.1
    return (1.0 if family != "qwen3_5" or "linear_attn" in name else 0.0), 0.1


def _name_of(model, param) -> str:
    for name, candidate in model.named_parameters():
        if candidate is param:
            return name
    return ""


def reference_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """transformers' own forward pass, argmax each step, no logits processors in between."""
    tokens, past = [], None
    inputs = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            out = model(inputs, cache=past, use_cache=True)
            past = out.cache if "cache" in out else out.past_key_values   # transformers 5 renames it for some models
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            inputs = torch.tensor([[token]])
    return tokens
