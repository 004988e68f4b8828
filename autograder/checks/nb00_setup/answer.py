"""Notebook 00, `answer`: a first answer through the engine, held to the tiny model's own greedy text
for each prompt."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import REFERENCE_MESSAGE, broke, call, check, expect, fail, kind_of, show, watch_calls

_WORDS = ["reverse: serving", "sort: 3,1,2", "add: 12,30", "copy: paged", "count: aaa", "upper: kv cache",
          "echo: turnstile", "len: batching", "reverse: gpu", "sum: 1,2,3,4"]


def _answer_cases(seed: int):
    """Three (prompt, max_tokens or None for the default, expected text) cases: one that stops on EOS,
    one cut by an explicit max_tokens, one that needs the default max_tokens=64 (longer than 16)."""
    model, tok = fixtures.char_model(seed)
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    prompts = rng.sample(_WORDS, len(_WORDS)) + [
        f"{rng.choice(['reverse', 'copy', 'sort'])}: " + "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 9)))
        for _ in range(6)]
    eos = tok.eos_token_id
    # A short look at every prompt picks the cases; only the long one is generated to the end.
    runs = fixtures.greedy(model, [tok.encode_prompt(p) for p in prompts], 24, [eos])
    eos_case = next((i for i, r in enumerate(runs) if r[-1] == eos and len(r) > 1), None)
    long_cases = [i for i, r in enumerate(runs) if len(r) == 24 and eos not in r and len(tok.decode(r)) > 20]
    cases = []
    if eos_case is not None:
        cases.append((prompts[eos_case], None, tok.decode(runs[eos_case])))
    if long_cases:
        i = long_cases[0]
        cut = rng.randint(5, 12)
        cases.append((prompts[i], cut, tok.decode(runs[i][:cut])))
        j = long_cases[-1]
        (full,) = fixtures.greedy(model, [tok.encode_prompt(prompts[j])], 64, [eos])
        cases.append((prompts[j], None, tok.decode(full)))
        cases.append((prompts[i], 1, tok.decode(runs[i][:1])))  # max_tokens=1: the prefill's token alone
    cases = [(model, tok) + case for case in cases]
    # The same prompt to ANOTHER model: an answer that keeps the first engine (or model) it saw fails here.
    other, _ = fixtures.char_model(seed + 100)
    prompt = prompts[long_cases[0]] if long_cases else prompts[0]
    (run,) = fixtures.greedy(other, [tok.encode_prompt(prompt)], 12, [eos])
    cases.append((other, tok, prompt, 12, tok.decode(run)))
    return cases


@check("answer")
def check_answer(impl, seed, allow_reference):
    cases = _answer_cases(seed)
    expect(len(cases) >= 3, "internal: no usable answer cases for this seed")
    import course_lib.cli.generate as generate_module
    import course_lib.engine as engine_module

    first_model = cases[0][0]
    for model, tok, prompt, max_tokens, want in cases:
        args = (model, tok, prompt) if max_tokens is None else (model, tok, prompt, max_tokens)
        which = "model" if model is first_model else "another_model"
        shown = (f"answer({which}, tokenizer, {prompt!r}" + ("" if max_tokens is None else f", max_tokens={max_tokens}")
                 + ")")
        with watch_calls([engine_module, generate_module]) as calls:
            got = call(shown, impl, *args)
        if not allow_reference and any(module == generate_module.__name__ for module, _ in calls):
            fail(f"answer {REFERENCE_MESSAGE} (it calls {generate_module.__name__})")
        expect(type(got) is str, lambda: f"{shown} must return the decoded text (a str), got {kind_of(got)}: "
                                         f"{show(got)}", rule="the answer alone")
        expect(any(func == "step" for _, func in calls),
               f"{shown} must serve the prompt through the engine: an LLMEngine of the model, its generate(...) "
               "(the engine's step() was never called)", rule="through the engine")
        if got != want:
            rule, hint = _answer_broken_rule(model, tok, prompt, max_tokens, want, got, model is not first_model)
            broke(rule, f"{shown} returned {got!r}, expected the model's greedy answer {want!r}.{hint}")


def _answer_broken_rule(model, tok, prompt, max_tokens, want, got, second_model) -> tuple[str, str]:
    """The rule a wrong answer broke, from what it looks like (the bare-text run only when nothing else fits)."""
    if got.startswith(prompt) or got.endswith(want) and len(got) > len(want):
        return "the answer alone", " It looks like the prompt is included: decode only the generated token_ids."
    if max_tokens is None and len(want) > 16 and len(got) == 16 and want.startswith(got):
        return "max_tokens", " It stopped after 16 tokens: the default max_tokens is 64."
    if max_tokens is not None and len(got) > len(want) and got.startswith(want):
        return "max_tokens", f" It is longer than max_tokens={max_tokens}."
    if "<" in got and got.replace("<eos>", "").replace("<bos>", "") == want:
        return "the answer alone", " It contains special tokens: the answer is the text alone."
    if second_model:
        return "the model given", (" This is a second model: serve the model you are given, not one kept from "
                                   "an earlier call or the notebook's global model.")
    limit = 64 if max_tokens is None else max_tokens
    (bare,) = fixtures.greedy(model, [tok.encode(prompt)], limit, [tok.eos_token_id])
    if got == tok.decode(bare) or not got:
        return "as trained", " It is the answer to the bare text: the model was trained to read a framed prompt."
    return "greedy answer", " The model's greedy continuation is what the check expects (temperature 0)."
