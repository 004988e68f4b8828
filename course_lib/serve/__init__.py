"""`python -m course_lib serve`: the engine behind an OpenAI-compatible HTTP API, with a live dashboard.

    HTTP process (uvicorn, asyncio)                              engine process
      handlers ──add / abort / ask──▶ EngineClient ══ pipes ══▶ PipedEngineLoop ──step()──▶ LLMEngine
          ▲                               │                          │
          └──── token deltas (asyncio queues) ◀══ one message a step ┘

The engine steps in a process of its own (engine_process.py explains why: the interpreter lock).
`serve --engine-thread` and `ServerThread` (tests, the engine at hand) run the same EngineLoop in a
thread of the HTTP process instead; app.py and dashboard.py serve either one unchanged.

- `protocol.py`: OpenAI request bodies -> (prompt ids, SamplingParams); error bodies.
- `request_fields.py`: which fields are honoured, which only at their neutral value; the rest refused by name.
- `request_body.py`: the body's size limit, enforced while reading; strict JSON (depth, finite numbers).
- `errors.py`: `APIError`, the OpenAI error shape.
- `stop_strings.py`: stop strings on the decoded text; a stream holds back what may begin one.
- `choices.py`: answers with several choices (n / best_of), logprobs or echo, streamed or whole.
- `logprobs.py`: log-probabilities in OpenAI's completions and chat shapes.
- `engine_loop.py`: the one loop that owns the engine; commands in, token deltas out (in a thread).
- `engine_process.py`: that loop in a process of its own, and the HTTP side's handle on it.
- `app.py`: the Starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.
- `sse.py`: a streaming response that notices a client leaving at once (and aborts its request).
- `metrics.py`: Prometheus gauges, counters and histograms.
- `snapshot.py`: the ONLY module that reads (or switches) engine internals: seats, queue, page owners.
- `dashboard.py` + `static/`: the live page for lectures and its controls.
- `launch.py`: start a server on a free loopback port (thread or subprocess) and stop it (tests, notebook).
- `cli.py`: the command line.

Needs the `serve` extra: `pip install -e ".[serve]"` (starlette, uvicorn, prometheus-client).
"""
