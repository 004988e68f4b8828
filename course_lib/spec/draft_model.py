"""A draft model: the target's own first layers, then its final norm and LM head (an "early exit").
Nothing to train or ship, the same vocabulary by construction, and a fraction of the target's cost
per token; it agrees with the target less often than a separately trained small model would.

It keeps no KV cache: each of the k draft tokens reruns the drafted requests' whole sequences
through those layers in one batch (dense causal attention). The tiny model's sequences are short,
so this stays cheap next to the target's step; a real deployment gives the draft model a paged
cache of its own. The simulated clock prices the work such a drafter would do (`take_work`): k
passes of one row per drafted request, each through `draft_layers` of the target's layers.
"""
from __future__ import annotations

import torch

from ..model.rope import rope_cos_sin
from ..model.transformer import DenseCausalAttention
from ..sampler import target_probs


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

    @torch.inference_mode()
    def propose(self, requests, limits) -> dict:
        """{request id: (draft tokens, their q distributions [k, vocab], or None for a greedy request)}."""
        todo = [(r, min(limit, self.k)) for r, limit in zip(requests, limits) if min(limit, self.k) > 0]
        if not todo:
            return {}
        seqs = [r.prompt_token_ids + r.output_token_ids for r, _ in todo]
        self._note_work([(len(seq), k) for seq, (_, k) in zip(seqs, todo)])
        drafts, probs = [[] for _ in todo], [[] for _ in todo]
        for step in range(max(k for _, k in todo)):
            live = [i for i, (_, k) in enumerate(todo) if step < k]
            logits = self._next_logits([seqs[i] + drafts[i] for i in live])
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

    def _note_work(self, drafted: list[tuple[int, int]]) -> None:
        """Count what a draft model with a cache of its own computes for requests of (length, k drafts):
        pass j (0 <= j < k) runs one row per request, at position length - 1 + j (the last kept token,
        then each guess), attending to length + j keys; the passes run one after another."""
        rows, context, passes = self._work
        for length, k in drafted:
            rows += k
            context += k * length + k * (k - 1) // 2
            passes = max(passes, k)
        self._work = [rows, context, passes]

    def take_work(self) -> tuple[int, int, int]:
        """(rows, context tokens, passes) counted since the last call (the engine takes them once a step)."""
        work, self._work = tuple(self._work), [0, 0, 0]
        return work

    def _next_logits(self, seqs: list[list[int]]) -> torch.Tensor:
        """The draft model's logits after the last token of each sequence: [len(seqs), vocab]."""
        m = self.model
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=m.device)
        positions = torch.cat([torch.arange(n, device=m.device) for n in lens])
        x = m.embed_tokens(ids)
        cos, sin = rope_cos_sin(positions, m.inv_freq, x.dtype)
        attend = DenseCausalAttention(lens)
        for layer in m.layers[: self.num_layers]:
            x = layer.forward(x, cos, sin, attend)
        last = torch.tensor(lens, device=m.device).cumsum(0) - 1
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
