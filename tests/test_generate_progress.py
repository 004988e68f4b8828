"""generate(use_tqdm=True): the bar's rate is requests finished / time elapsed.

In a notebook (tqdm.notebook) a moving-average rate froze at the first update's value when the
other requests finished in one burst: 2.7 req/s shown for 64 requests done in 0.4 s. The bar here
refreshes on every update (mininterval=0), which makes any moving average visible at once."""
import re

import pytest

import course_lib
from course_lib import EngineConfig, LLMEngine, SamplingParams

tqdm_notebook = pytest.importorskip("tqdm.notebook")


def _shown_rate(bar) -> float:
    text = bar.container.children[2].value  # "64/64 [00:00<00:00, 171.92req/s]"
    match = re.search(r"([\d.]+)req/s", text)
    assert match, f"no rate in the bar's text {text!r}"
    return float(match.group(1))


def test_generate_bar_shows_requests_per_elapsed_second(monkeypatch):
    bars = []

    class RecordingBar(tqdm_notebook.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["mininterval"] = 0
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr("tqdm.auto.tqdm", RecordingBar)
    model, tokenizer = course_lib.load_tiny()
    prompts = [tokenizer.encode_prompt("countdown: 20")] * 16  # all finish in the same step
    LLMEngine(model, EngineConfig(max_num_seqs=16)).generate(prompts, SamplingParams(max_tokens=64),
                                                             use_tqdm=True)
    (bar,) = bars
    true_rate = bar.n / bar.format_dict["elapsed"]
    assert bar.n == 16
    assert _shown_rate(bar) == pytest.approx(true_rate, rel=0.05), bar.container.children[2].value
