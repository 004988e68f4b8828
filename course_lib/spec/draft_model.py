"""A draft model: the target's own first layers, then its final norm and LM head (an "early exit").
Nothing to train or ship, the same vocabulary by construction, and a fraction of the target's cost
per token; it agrees with the target less often than a separately trained small model would.

It keeps a KV cache of its own (`draft_cache.py`): a drafting step runs the tokens kept since the
last step (normally the target's own token; the guesses the target kept are already cached), whose
last row gives the first guess, then one row per further guess, each attending to the cache. The
simulated clock prices exactly that work (`take_work`), at the draft model's share of the layers.
"""
from __future__ import annotations

import torch

from ..model.rope import rope_cos_sin
from ..sampler import target_probs
from .draft_cache import CachedAttention, SequenceCache


class DraftModelDrafter:
    kind = "draft"

    def __init__(self, model, num_speculative_tokens: int, num_layers: int = 1, seed: int = 0):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if not 1 <= num_layers < model.config.num_layers:
            raise ValueError(f"draft_layers must be between 1 and {model.config.num_layers - 1} (the target has "
                             f"{model.config.num_layers} layers), got {num_layers}")
        self.model, self.k, self.num_layers = model, num_speculative_tokens, num_layers
        # The share of the target's layers the draft model runs: the roofline prices a draft row at that
        # share of a target row (course_lib.sim.roofline).
        self.layer_fraction = num_layers / model.config.num_layers
        self._work = [0, 0, 0]  # rows, context tokens, passes since the engine last took them
        # Drafts of sampled requests are draws: seeded requests from generators of their own (so a seed
        # gives the same answer whoever shares the batch), the others from this one.
        self.generator = torch.Generator(device="cpu").manual_seed(seed + 7919)
        self.generators: dict[str, torch.Generator] = {}
        self.caches: dict[str, SequenceCache] = {}  # request id -> the draft layers' keys and values

    @torch.inference_mode()
    def propose(self, requests, limits) -> dict:
        """{request id: (draft tokens, their q distributions [k, vocab], or None for a greedy request)}."""
        todo = [(r, min(limit, self.k)) for r, limit in zip(requests, limits) if min(limit, self.k) > 0]
        if not todo:
            return {}
        caches, new = [], []
        for r, _ in todo:
            cache = self.caches.get(r.request_id)
            if cache is None:
                cache = self.caches[r.request_id] = SequenceCache(self.num_layers)
            new.append(cache.catch_up(r.prompt_token_ids + r.output_token_ids))
            caches.append(cache)
        # Pass 0: the kept tokens the cache lacks; the last row of each gives the first guess.
        positions = [len(c) + j for c, rows in zip(caches, new) for j in range(len(rows))]
        logits = self._logits([t for rows in new for t in rows], positions, caches, [len(rows) for rows in new])
        self._note_work([(len(c), len(rows), k) for c, rows, (_, k) in zip(caches, new, todo)])
        for cache, rows in zip(caches, new):
            cache.tokens += rows
        drafts, probs = [[] for _ in todo], [[] for _ in todo]
        for step in range(max(k for _, k in todo)):
            live = [i for i, (_, k) in enumerate(todo) if step < k]
            if step:  # one row per request: its latest guess, whose row gives the next guess
                guesses = [drafts[i][-1] for i in live]
                logits = self._logits(guesses, [len(caches[i]) + step - 1 for i in live], [caches[i] for i in live],
                                      [1] * len(live))
                for i, guess in zip(live, guesses):
                    caches[i].guesses.append(guess)
            for row, i in enumerate(live):
                params = todo[i][0].sampling_params
                if params.greedy:
                    drafts[i].append(int(logits[row].argmax()))
                    continue
                q = target_probs(logits[row: row + 1], params)[0]
                drafts[i].append(int(torch.multinomial(q, 1, generator=self._generator(todo[i][0]))))
                probs[i].append(q)
        return {r.request_id: (drafts[i], torch.stack(probs[i]) if probs[i] else None)
                for i, (r, _) in enumerate(todo)}

    def _note_work(self, drafted: list[tuple[int, int, int]]) -> None:
        """Count the work of a step, for requests of (tokens cached before it, kept tokens computed, k):
        pass 0 runs the kept tokens (row j at position cached + j attends to cached + j + 1 keys), each
        pass j >= 1 one guess per request (at position length - 1 + j, attending to length + j keys); the
        passes run one after another."""
        rows, context, passes = self._work
        for cached, fresh, k in drafted:
            length = cached + fresh
            rows += fresh + k - 1
            context += fresh * cached + fresh * (fresh + 1) // 2 + sum(length + j for j in range(1, k))
            passes = max(passes, k)
        self._work = [rows, context, passes]

    def take_work(self) -> tuple[int, int, int]:
        """(rows, context tokens, passes) counted since the last call (the engine takes them once a step)."""
        work, self._work = tuple(self._work), [0, 0, 0]
        return work

    def _logits(self, ids: list[int], positions: list[int], caches: list[SequenceCache],
                num_rows: list[int]) -> torch.Tensor:
        """The draft model's logits after the last of each sequence's `num_rows` new rows: [len(caches), vocab]."""
        m = self.model
        x = m.embed_tokens(torch.tensor(ids, dtype=torch.long, device=m.device))
        cos, sin = rope_cos_sin(torch.tensor(positions, device=m.device), m.inv_freq, x.dtype)
        attend = CachedAttention(caches, num_rows)
        for layer in m.layers[: self.num_layers]:
            x = layer.forward(x, cos, sin, attend)
        last = torch.tensor(num_rows, device=m.device).cumsum(0) - 1
        return m.lm_head(m.norm(x[last]))

    def _generator(self, request) -> torch.Generator:
        seed = request.sampling_params.seed
        if seed is None:
            return self.generator
        gen = self.generators.get(request.request_id)
        if gen is None:
            gen = self.generators[request.request_id] = torch.Generator(device="cpu").manual_seed(seed + 7919)
        return gen

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self.generators.pop(rid, None)
            self.caches.pop(rid, None)
