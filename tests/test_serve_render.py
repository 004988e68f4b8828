"""The streamed chunk's JSON: the hand-built fast path for the common completion chunk (text, no
finish reason, no token ids) writes the same bytes as the general path, for any text."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")

from course_lib.serve.app import Renderer  # noqa: E402
from course_lib.serve.sse import frame  # noqa: E402

TEXTS = ["", "7", 'a "quoted" word', "back\\slash", "line\nbreak\ttab", "caf\u00e9 \u2603 \U0001f600", "\x00\x1f", None]


@pytest.mark.parametrize("text", TEXTS)
def test_the_common_completion_chunk_equals_the_general_one(text):
    render = Renderer(SimpleNamespace(model_name='tiny "v1"'), "cmpl-x0", "completion", parsed=None)
    general = frame(render.head + json.dumps({"index": 0, "text": text or "", "logprobs": None,
                                              "finish_reason": None}, separators=(",", ":")) + "]}")
    fast = render.chunk(text, None)
    assert fast == general
    body = json.loads(fast.decode().removeprefix("data: "))
    assert body["choices"] == [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": None}]
    assert body["model"] == 'tiny "v1"' and body["object"] == "text_completion"


def test_chunks_off_the_fast_path_keep_their_fields():
    render = Renderer(SimpleNamespace(model_name="tiny"), "cmpl-x1", "completion", parsed=None)
    last = json.loads(render.chunk("end", "length").decode().removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length"
    with_ids = json.loads(render.chunk("ab", None, [5, 6]).decode().removeprefix("data: "))
    assert with_ids["choices"][0]["token_ids"] == [5, 6]


@pytest.mark.parametrize("config", [
    dict(),
    dict(page_size=8, num_pages=40, max_num_seqs=5, max_num_batched_tokens=64, scheduler="static",
         kv_layout="contiguous", admission="reserve", watermark=0.1, preemption="fail", enable_chunked_prefill=False,
         enable_prefix_caching=True, attention_backend="torch", forward="eager", max_model_len=128, seed=7,
         record_page_owners=True),
])
def test_config_flags_rebuild_the_same_engine_config(config):
    from course_lib import EngineConfig
    from course_lib.serve.cli import build_parser, config_flags, engine_config_from_args

    wanted = EngineConfig(**config)
    assert engine_config_from_args(build_parser().parse_args(config_flags(wanted))) == wanted
