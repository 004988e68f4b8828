"""`python -m course_lib generate --prompt TEXT`: the tiny model answers through the engine."""
from __future__ import annotations

import argparse


def answer(model, tokenizer, prompt: str, max_tokens: int = 64) -> str:
    """The model's greedy answer to `prompt` (text in, text out), served by an LLMEngine."""
    from course_lib import EngineConfig, LLMEngine, SamplingParams

    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(prompt)],
                                                        SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(out.token_ids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib generate", description=__doc__)
    parser.add_argument("--prompt", required=True, help='e.g. "reverse: 58213" or "countdown: 12"')
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny

    model, tokenizer = load_tiny()
    try:
        prompt_ids = tokenizer.encode_prompt(args.prompt)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        (out,) = LLMEngine(model, EngineConfig()).generate([prompt_ids], params)
    except ValueError as err:
        parser.error(str(err))
    print(tokenizer.decode(out.token_ids))
    return 0
