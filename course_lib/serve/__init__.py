"""`python -m course_lib serve`: the engine behind an OpenAI-compatible HTTP API, with a live dashboard.

    handlers (asyncio)  ──add / abort──▶  EngineLoop (one thread)  ──step()──▶  LLMEngine
          ▲                                      │
          └────── token deltas (asyncio queues) ─┘

- `protocol.py`: OpenAI request bodies -> (prompt ids, SamplingParams); error bodies.
- `engine_loop.py`: the one thread that owns the engine; commands in, token deltas out.
- `app.py`: the Starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.
- `sse.py`: a streaming response that notices a client leaving at once (and aborts its request).
- `metrics.py`: Prometheus gauges, counters and histograms.
- `snapshot.py`: the ONLY module that reads (or switches) engine internals: seats, queue, page owners.
- `dashboard.py` + `static/`: the live page for lectures and its controls.
- `launch.py`: start a server on a free loopback port (thread or subprocess) and stop it (tests, notebook).
- `cli.py`: the command line.

Needs the `serve` extra: `pip install -e ".[serve]"` (starlette, uvicorn, prometheus-client).
"""
