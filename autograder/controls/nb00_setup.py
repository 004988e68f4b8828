"""Correct answers for notebook 00 written differently from the reference: each must pass every graded
seed (a check that fails them is a false alarm). Self-contained: no autograder imports."""
import math

from course_lib import EngineConfig, LLMEngine, SamplingParams


def kv_bytes_per_token_as_a_product(config, bytes_per_elem):
    """One product over a tuple of factors (K and V, layers, KV heads, head_dim, bytes)."""
    return math.prod((2, config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_elem))


def kv_bytes_per_token_layer_by_layer(config, bytes_per_elem):
    """Adds up one layer's keys and values at a time."""
    total = 0
    for _ in range(config.num_layers):
        total += config.num_kv_heads * config.head_dim * bytes_per_elem  # keys
        total += config.num_kv_heads * config.head_dim * bytes_per_elem  # values
    return total


def answer_by_stepping(model, tokenizer, prompt, max_tokens=64):
    """add_request, then step the engine until the request is done, collecting its tokens."""
    engine = LLMEngine(model, EngineConfig())
    engine.add_request(tokenizer.encode_prompt(prompt), SamplingParams(max_tokens=max_tokens), request_id="q")
    tokens = []
    while engine.has_unfinished_requests:
        for out in engine.step():
            tokens += list(out.new_token_ids)
    return tokenizer.decode(tokens)


CONTROLS = {
    "kv_bytes_per_token": [kv_bytes_per_token_as_a_product, kv_bytes_per_token_layer_by_layer],
    "answer": [answer_by_stepping],
}
