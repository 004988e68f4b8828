"""Notebook 00 setup: reference solutions. GENERATED from solutions/00_setup/00_setup.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


from course_lib import EngineConfig, LLMEngine, SamplingParams


def kv_bytes_per_token(config, bytes_per_elem: int) -> int:
    """Bytes of K and V cached for one token, across all layers and KV heads."""
    # one key + one value (2), per layer, per KV head, head_dim numbers each
    return int(2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem)


def answer(model, tokenizer, prompt: str, max_tokens: int = 64) -> str:
    """The model's greedy answer to `prompt`, served by LLMEngine."""
    engine = LLMEngine(model, EngineConfig())
    (result,) = engine.generate([tokenizer.encode_prompt(prompt)], SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(result.token_ids)
