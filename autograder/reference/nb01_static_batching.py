"""Notebook 01 (static batching): pad a batch, measure the padding, run the naive batched loop."""
import torch
import torch.nn.functional as F


def pad_batch(prompts, pad_id):
    """LEFT-pad token-id lists into one [B, L] LongTensor (L = longest prompt) plus a [B, L]
    BoolTensor that is True on real tokens. Left padding puts every prompt's last token in the
    last column, which is where the next token is read from."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            ids[row, longest - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            mask[row, longest - len(prompt):] = True
    return ids, mask


def padding_waste(prompt_lens, output_lens):
    """Fraction of the token slots one static batch computes that are padding.

    The prefill computes B x max(prompt_lens) slots (rows padded to the longest prompt) and
    samples every row's first output token. Each decode step then computes one slot per row, and
    the batch keeps decoding until the longest output is done: max(output_lens) - 1 steps. Row i
    needs its prompt_lens[i] prefill slots and output_lens[i] - 1 decode slots; the rest is padding.
    """
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("need one output length per prompt length, and at least one request")
    batch = len(prompt_lens)
    total = batch * max(prompt_lens) + batch * (max(output_lens) - 1)
    useful = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    return (total - useful) / total


class _LeftPaddedCausal:
    """The model's `attend` for a left-padded [B, L] batch: causal, and pads are never attended."""

    def __init__(self, mask):
        self.mask = mask

    def __call__(self, layer, q, k, v):
        batch, length = self.mask.shape
        q = q.view(batch, length, q.shape[1], q.shape[2]).transpose(1, 2)
        k = k.view(batch, length, k.shape[1], k.shape[2]).transpose(1, 2)
        v = v.view(batch, length, v.shape[1], v.shape[2]).transpose(1, 2)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = causal[None] & self.mask[:, None, :]
        allowed |= torch.eye(length, dtype=torch.bool)[None]  # a pad row sees itself: no empty softmax
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], enable_gqa=True)
        return out.transpose(1, 2).reshape(batch * length, -1, out.shape[-1])


@torch.inference_mode()
def static_generate(model, prompts, max_tokens, eos_id):
    """Greedy decoding of the whole batch at once, the naive way: every step re-runs the padded
    batch (no KV cache) and reads each row's next token from the last column. A row that has
    produced `eos_id` is finished (its list ends with the EOS) but keeps its seat: the batch runs
    until every row is finished or max_tokens steps are done."""
    seqs = [list(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        ids, mask = pad_batch(seqs, 0)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        length = ids.shape[1]
        last = torch.arange(len(seqs)) * length + length - 1
        logits = model(ids.flatten(), positions.flatten(), _LeftPaddedCausal(mask), logits_indices=last)
        for row, token in enumerate(logits.argmax(-1).tolist()):
            if done[row]:
                continue  # a finished passenger: computed, ignored
            outs[row].append(token)
            seqs[row].append(token)
            done[row] = token == eos_id
        if all(done):
            break
    return outs
