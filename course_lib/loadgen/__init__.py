"""`python -m course_lib load`: the simulator's workloads against any OpenAI-compatible endpoint.

- `client.py`: one streaming request, timed as a client sees it.
- `drive.py`: closed-loop users or open-loop (Poisson / gamma) arrivals, clipped to the server.
- `scrape.py`: what only the server knows, from its /metrics (ours, vLLM's or SGLang's names).
- `report.py`: the `simulate` JSON keys from the client's records, plus ITL and goodput.
- `bench_names.py`: the same numbers under `vllm bench serve`'s JSON keys, and its printed block.
- `predict.py`: the simulator's prediction for the same workload, on a clock fitted to this machine.
- `cli.py`: the command line.
"""
from .drive import LoadTarget, run_load, run_load_async  # noqa: F401
from .report import summarize_load  # noqa: F401
