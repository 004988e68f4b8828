"""A contiguous KV cache for a left-padded batch: the cache a static batcher decodes over.

Every layer keeps one key buffer and one value buffer of shape `[B, max_len, num_kv_heads,
head_dim]`, reserved up front for the whole ride (row `b`, column `j` is the j-th column of the
padded batch), plus one bool per column saying whether it holds a real token. A forward pass
brings `n` new columns for every row (the whole padded prompt for the prefill, one column per
decode step): their keys and values are written into the next `n` free columns, and their
queries attend, causally, to every real column of their own row written so far.

    cache = ContiguousKVCache(model, batch_size=B, max_len=L + max_tokens)
    logits = cache.forward(model, ids, mask, positions)   # ids, mask, positions: [B, n]
    cache.length                                           # columns written so far

This is the chapter's `naive_step(model, batch)` with the cache made explicit: the model itself
never owns a cache (see transformer.py's `attend` seam), this object does. Memory is what a
contiguous server pays: `B x max_len` token slots whatever the answers' real lengths
(`num_bytes`), which is what paged KV (notebook 3) fixes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class ContiguousKVCache:
    """Per-layer K/V buffers `[batch_size, max_len, num_kv_heads, head_dim]` for one padded batch."""

    def __init__(self, model, batch_size: int, max_len: int):
        cfg = model.config
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be an int >= 1 (columns reserved per row), got {max_len!r}")
        shape = (batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
        kw = dict(dtype=model.dtype, device=model.device)
        self.keys = [torch.zeros(shape, **kw) for _ in range(cfg.num_layers)]
        self.values = [torch.zeros(shape, **kw) for _ in range(cfg.num_layers)]
        self.real = torch.zeros(batch_size, max_len, dtype=torch.bool, device=model.device)
        self.batch_size, self.max_len = batch_size, max_len
        self.length = 0  # columns written so far (the same for every row: the batch is a rectangle)

    @property
    def num_bytes(self) -> int:
        """Bytes reserved for K and V, every layer: all `batch_size x max_len` slots, used or not."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def forward(self, model, input_ids, attention_mask, positions) -> torch.Tensor:
        """Run `model` over `n` new columns of the batch and cache their keys and values.

        `input_ids` (long), `attention_mask` (bool, True on real tokens) and `positions` (long,
        each token's position in its own sequence: padding does not count) are all `[B, n]`.
        Returns the logits of the new columns, `[B, n, vocab]`."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=model.device)
        mask = torch.as_tensor(attention_mask, dtype=torch.bool, device=model.device)
        pos = torch.as_tensor(positions, dtype=torch.long, device=model.device)
        if ids.dim() != 2 or ids.shape != mask.shape or ids.shape != pos.shape:
            raise ValueError(f"input_ids, attention_mask and positions must all be [B, n], got "
                             f"{tuple(ids.shape)}, {tuple(mask.shape)} and {tuple(pos.shape)}")
        B, n = ids.shape
        if B != self.batch_size:
            raise ValueError(f"this cache holds {self.batch_size} rows, the pass brings {B}: a static batch "
                             "keeps every row (finished ones as padding) until the batch is done")
        start, end = self.length, self.length + n
        if end > self.max_len:
            raise ValueError(f"the cache reserves {self.max_len} columns per row; {start} are written and this "
                             f"pass brings {n} more: reserve longest prompt + max_tokens")
        self.real[:, start:end] = mask
        # visible[b, i, j]: new query i of row b may read column j (causal, real columns only). A
        # padding query sees only its own column, so its softmax has something to normalise.
        causal = torch.arange(end, device=ids.device)[None, :] <= torch.arange(start, end, device=ids.device)[:, None]
        visible = causal[None] & self.real[:, None, :end]
        visible[:, torch.arange(n), torch.arange(start, end)] |= ~mask

        def attend(layer, q, k, v):
            self.keys[layer][:, start:end] = k.view(B, n, *k.shape[1:])
            self.values[layer][:, start:end] = v.view(B, n, *v.shape[1:])
            q = q.view(B, n, *q.shape[1:]).transpose(1, 2)  # [B, heads, n, D]
            keys = self.keys[layer][:, :end].transpose(1, 2)  # [B, kv_heads, end, D]
            values = self.values[layer][:, :end].transpose(1, 2)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None], enable_gqa=True)
            return o.transpose(1, 2).reshape(B * n, o.shape[1], o.shape[3])

        with torch.inference_mode():
            logits = model(ids.reshape(-1), pos.reshape(-1), attend)
        self.length = end
        return logits.view(B, n, -1)
