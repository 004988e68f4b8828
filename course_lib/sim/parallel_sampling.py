"""What sharing saves under parallel sampling: the vLLM paper's figure, measured on the engine.

One prompt, n samples of the same length, served twice by the engine with the scripted runner
(the KV bookkeeping is the engine's own, step by step; no model runs):

- **shared**: one request with `SamplingParams(n=n)`: the samples fork after the prompt and hold
  its pages by reference; the partly filled last page is copied on the first write (copy on write);
- **not shared**: n separate requests of the same prompt (prefix caching off), each computing and
  holding the prompt's K/V itself, as a server without block sharing would.

The number compared is the peak of KV pages in use. The saving grows with n and with the share of
the prompt in a sequence: (n - 1) copies of the prompt's full pages. (The vLLM paper, Fig. 15:
6.1% - 9.8% on Alpaca, whose prompts are short next to their answers, and more for longer prompts.)
"""
from __future__ import annotations

from course_lib.engine import LLMEngine
from course_lib.engine_config import EngineConfig
from course_lib.kv.block_pool import BlockPool
from course_lib.model.config import ModelConfig
from course_lib.scheduler.sampling import SamplingParams

NS = (1, 2, 4, 8)


class PeakPool(BlockPool):
    """A block pool that remembers the most pages it ever had in use (inside a step too: a request's
    last page may be taken and given back in the step that finishes it)."""

    def __init__(self, num_pages: int, page_size: int):
        super().__init__(num_pages, page_size)
        self.peak_used_pages = 0

    def allocate(self, n: int = 1) -> list[int]:
        pages = super().allocate(n)
        self.peak_used_pages = max(self.peak_used_pages, self.num_used_pages)
        return pages


def _peak_pages(engine: LLMEngine) -> int:
    while engine.has_unfinished_requests:
        engine.step()
    if engine.pool.num_used_pages:
        raise RuntimeError("pages still held after every request finished (a leak)")
    return engine.pool.peak_used_pages


def parallel_sampling_memory(ns=NS, prompt_len: int = 200, output_len: int = 100, page_size: int = 16) -> list[dict]:
    """For each n: peak KV pages with sharing and without, and the fraction sharing saves.
    Rows: {"n", "shared_pages", "unshared_pages", "saved_pages", "saved_frac", "page_size"}."""
    max_n = max(ns)
    model = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                        num_kv_heads=4, max_position_embeddings=prompt_len + output_len + 1, eos_token_id=2)
    pages_each = -(-(prompt_len + output_len) // page_size)
    config = EngineConfig(page_size=page_size, num_pages=max_n * pages_each + 1, max_num_seqs=max_n,
                          max_num_batched_tokens=max_n * prompt_len, admission="none")  # all prompts in one step
    prompt = [5] * prompt_len
    params = SamplingParams(max_tokens=output_len)
    rows = []
    for n in ns:
        shared = LLMEngine(model, config, block_pool=PeakPool(config.num_pages, page_size))
        shared.add_request(prompt, SamplingParams(max_tokens=output_len, n=n))
        alone = LLMEngine(model, config, block_pool=PeakPool(config.num_pages, page_size))
        for _ in range(n):
            alone.add_request(prompt, params)
        with_sharing, without = _peak_pages(shared), _peak_pages(alone)
        rows.append({"n": n, "shared_pages": with_sharing, "unshared_pages": without,
                     "saved_pages": without - with_sharing, "saved_frac": 1 - with_sharing / without,
                     "page_size": page_size})
    return rows
