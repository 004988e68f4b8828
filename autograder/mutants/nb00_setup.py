"""Realistic wrong answers for notebook 00 (setup). Self-contained: no autograder imports."""
from course_lib import EngineConfig, LLMEngine, SamplingParams


def kv_uses_num_heads(config, bytes_per_elem):
    """Counts every query head: with GQA only the KV heads are cached."""
    return 2 * config.num_layers * config.num_heads * config.head_dim * bytes_per_elem


def kv_forgets_values(config, bytes_per_elem):
    """Counts the keys only, not the values."""
    return config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem


def kv_forgets_layers(config, bytes_per_elem):
    """One layer's worth of cache."""
    return 2 * config.num_kv_heads * config.head_dim * bytes_per_elem


def kv_uses_hidden_size(config, bytes_per_elem):
    """hidden_size instead of num_kv_heads * head_dim."""
    return 2 * config.num_layers * config.hidden_size * bytes_per_elem


def kv_returns_float(config, bytes_per_elem):
    """Right number, but a float (computed through a division)."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem / 1


def kv_head_dim_from_hidden(config, bytes_per_elem):
    """Derives head_dim as hidden_size // num_heads (not true of every model) instead of reading it."""
    return 2 * config.num_layers * config.num_kv_heads * (config.hidden_size // config.num_heads) * bytes_per_elem


def kv_forgets_bytes(config, bytes_per_elem):
    """Counts the numbers stored, not their bytes."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim


def kv_counts_bits_through_a_float(config, bytes_per_elem):
    """Counts bits, then divides by 8 with `/`: an int again, but the count went through a float
    (53 bits of precision), so a big enough shape comes back off by a few bytes."""
    bits = 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem * 8
    return int(bits / 8)


def kv_notes_the_count_on_the_config(config, bytes_per_elem):
    """The right count, kept on the config for later (`config.kv_bytes = ...`): the config it was handed
    comes back with a new attribute."""
    config.kv_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
    return config.kv_bytes


def answer_without_prompt_format(model, tokenizer, prompt, max_tokens=64):
    """Encodes the bare text: no <bos>, no separator."""
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode(prompt)], SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(out.token_ids)


def answer_echoes_prompt(model, tokenizer, prompt, max_tokens=64):
    """Decodes the prompt together with the answer."""
    ids = tokenizer.encode_prompt(prompt)
    (out,) = LLMEngine(model, EngineConfig()).generate([ids], SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(ids + out.token_ids)


def answer_ignores_max_tokens(model, tokenizer, prompt, max_tokens=64):
    """Uses SamplingParams' default max_tokens (16)."""
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(prompt)], SamplingParams())
    return tokenizer.decode(out.token_ids)


def answer_skips_engine(model, tokenizer, prompt, max_tokens=64):
    """Calls model.generate directly instead of serving through the engine."""
    return tokenizer.decode(model.generate(tokenizer.encode_prompt(prompt), max_tokens))


def answer_returns_ids(model, tokenizer, prompt, max_tokens=64):
    """Returns the token ids instead of the text."""
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(prompt)],
                                                        SamplingParams(max_tokens=max_tokens))
    return out.token_ids


def answer_samples(model, tokenizer, prompt, max_tokens=64):
    """Samples at temperature 1 (seeded, so it is reproducible) instead of decoding greedily."""
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(prompt)], params)
    return tokenizer.decode(out.token_ids)


_FIRST_ENGINE = {}


def answer_reuses_first_engine(model, tokenizer, prompt, max_tokens=64):
    """Builds the engine once and keeps it: later calls with another model are served by the first."""
    if "engine" not in _FIRST_ENGINE:
        _FIRST_ENGINE["engine"] = LLMEngine(model, EngineConfig())
    (out,) = _FIRST_ENGINE["engine"].generate([tokenizer.encode_prompt(prompt)], SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(out.token_ids)


def answer_keeps_special_tokens(model, tokenizer, prompt, max_tokens=64):
    """Decodes with the special tokens: the answer ends in '<eos>' when the model stopped by itself."""
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(prompt)],
                                                        SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(out.token_ids, skip_special=False)


MUTANTS = {
    "kv_bytes_per_token": [kv_uses_num_heads, kv_forgets_values, kv_forgets_layers, kv_uses_hidden_size,
                           kv_returns_float, kv_head_dim_from_hidden, kv_forgets_bytes, kv_counts_bits_through_a_float,
                           kv_notes_the_count_on_the_config],
    "answer": [answer_without_prompt_format, answer_echoes_prompt, answer_ignores_max_tokens, answer_skips_engine,
               answer_returns_ids, answer_reuses_first_engine, answer_keeps_special_tokens, answer_samples],
}
