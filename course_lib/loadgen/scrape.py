"""What only the server knows (seats in use, preemptions, prefix-cache hits), read from its
Prometheus `/metrics` while the load runs. Ours, vLLM's and SGLang's names are understood;
an endpoint without `/metrics` simply leaves those numbers out (null in the JSON)."""
from __future__ import annotations

import asyncio

# Our name first, then vLLM's, then SGLang's.
RUNNING = ("course_lib_num_requests_running", "vllm:num_requests_running", "sglang:num_running_reqs")
PREEMPTIONS = ("course_lib_preemptions_total", "vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_QUERIED = ("course_lib_prefix_cache_queried_tokens", "vllm:prefix_cache_queries_total")
PREFIX_HITS = ("course_lib_prefix_cache_hit_tokens", "vllm:prefix_cache_hits_total")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets (enough for the gauges and counters above)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, rest = line.rpartition(" ") if "}" not in line else line.partition("} ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        values[name] = values.get(name, 0.0) + value
    return values


def first(values: dict, names) -> float | None:
    for n in names:
        if n in values:
            return values[n]
    return None


class MetricsSampler:
    """Scrape `metrics_url` every `interval` seconds until stopped; keep the first and last
    samples and the peak of running requests."""

    def __init__(self, client, metrics_url: str, interval: float = 0.1, headers=None):
        self.client, self.url, self.interval, self.headers = client, metrics_url, interval, headers
        self.first: dict | None = None
        self.last: dict | None = None
        self.peak_running: float | None = None
        self._task = None

    async def _sample(self) -> None:
        try:
            async with self.client.get(self.url, headers=self.headers) as r:
                if r.status != 200:
                    return
                text = await r.text()
        except Exception:  # no /metrics there: those numbers stay unknown
            return
        values = parse_prometheus(text)
        self.first = self.first or values
        self.last = values
        running = first(values, RUNNING)
        if running is not None:
            self.peak_running = max(self.peak_running or 0.0, running)

    async def _run(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> dict:
        if self._task is not None:
            self._task.cancel()
        await self._sample()
        return self.summary()

    def summary(self) -> dict:
        if self.first is None or self.last is None:
            return {"peak_running": None, "preemptions": None, "prefix_hit_rate": None}

        def delta(names):
            a, b = first(self.first, names), first(self.last, names)
            return None if a is None or b is None else b - a

        queried, hits = delta(PREFIX_QUERIED), delta(PREFIX_HITS)
        pre = delta(PREEMPTIONS)
        return {"peak_running": None if self.peak_running is None else int(self.peak_running),
                "preemptions": None if pre is None else int(pre),
                "prefix_hit_rate": (hits / queried if queried else 0.0) if queried is not None and hits is not None
                else None}
