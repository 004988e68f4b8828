"""Notebook 00 (setup): how big is the KV cache, and a first request through the engine."""
from course_lib import EngineConfig, LLMEngine, SamplingParams


def kv_bytes_per_token(config, bytes_per_elem):
    """Bytes of KV cache one token occupies: a key and a value vector for every KV head of every
    layer. With GQA there are fewer KV heads than query heads: use num_kv_heads."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem


def answer(model, tokenizer, prompt: str, max_tokens=64) -> str:
    """The model's greedy answer to `prompt`, served by the engine."""
    engine = LLMEngine(model, EngineConfig())
    (out,) = engine.generate([tokenizer.encode_prompt(prompt)], SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(out.token_ids)
