"""Realistic wrong answers for notebook 01 (static batching). Self-contained: no autograder imports."""
import torch
import torch.nn.functional as F


def _pad(prompts, pad_id, left=True):
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            cols = slice(longest - len(prompt), None) if left else slice(0, len(prompt))
            ids[row, cols] = torch.as_tensor(list(prompt), dtype=torch.long)
            mask[row, cols] = True
    return ids, mask


def pad_batch_right(prompts, pad_id):
    """Pads on the right."""
    return _pad(prompts, pad_id, left=False)


def pad_batch_inverted_mask(prompts, pad_id):
    """The mask marks the padding instead of the real tokens."""
    ids, mask = _pad(prompts, pad_id)
    return ids, ~mask


def pad_batch_int_mask(prompts, pad_id):
    """The mask is a LongTensor of 0/1."""
    ids, mask = _pad(prompts, pad_id)
    return ids, mask.long()


def pad_batch_ignores_pad_id(prompts, pad_id):
    """Always pads with 0."""
    return _pad(prompts, 0)


def padding_waste_decodes_max_steps(prompt_lens, output_lens):
    """Counts max(output_lens) decode steps (the prefill already samples the first token)."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * max(output_lens)
    return (total - sum(prompt_lens) - sum(output_lens)) / total


def padding_waste_prefill_only(prompt_lens, output_lens):
    """Only the prompt padding counts; finished rows decoding on is forgotten."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    return (b * max(prompt_lens) - sum(prompt_lens)) / total


def padding_waste_over_useful(prompt_lens, output_lens):
    """Divides the padding by the useful slots instead of all computed slots."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    useful = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    return (total - useful) / useful


class _PaddedCausal:
    def __init__(self, mask, use_mask=True):
        self.mask, self.use_mask = mask, use_mask

    def __call__(self, layer, q, k, v):
        b, n = self.mask.shape
        q = q.view(b, n, q.shape[1], q.shape[2]).transpose(1, 2)
        k = k.view(b, n, k.shape[1], k.shape[2]).transpose(1, 2)
        v = v.view(b, n, v.shape[1], v.shape[2]).transpose(1, 2)
        allowed = torch.ones(n, n, dtype=torch.bool).tril()[None].expand(b, n, n).clone()
        if self.use_mask:
            allowed &= self.mask[:, None, :]
            allowed |= torch.eye(n, dtype=torch.bool)[None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], enable_gqa=True)
        return out.transpose(1, 2).reshape(b * n, -1, out.shape[-1])


@torch.inference_mode()
def _static(model, prompts, max_tokens, eos_id, left=True, use_mask=True, cut_after_eos=True,
            keep_eos=True, stop_on_first=False, stop_when_done=True):
    seqs = [list(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        ids, mask = _pad(seqs, 0, left=left)
        n = ids.shape[1]
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        if left:
            last = torch.arange(len(seqs)) * n + n - 1
        else:
            last = torch.arange(len(seqs)) * n + n - 1  # reads the last column: a pad for short rows
        logits = model(ids.flatten(), positions.flatten(), _PaddedCausal(mask, use_mask), logits_indices=last)
        for row, token in enumerate(logits.argmax(-1).tolist()):
            if done[row] and cut_after_eos:
                continue
            if token == eos_id and not keep_eos:
                done[row] = True
                continue
            outs[row].append(token)
            seqs[row].append(token)
            if token == eos_id:
                done[row] = True
        if stop_on_first and any(done):
            break
        if stop_when_done and all(done):
            break
    return outs


def static_generate_right_padding(model, prompts, max_tokens, eos_id):
    """Pads on the right and reads the last column, which is padding for the shorter prompts."""
    return _static(model, prompts, max_tokens, eos_id, left=False)


def static_generate_attends_to_padding(model, prompts, max_tokens, eos_id):
    """Left pads, but the attention does not mask the pads out."""
    return _static(model, prompts, max_tokens, eos_id, use_mask=False)


def static_generate_no_eos_cut(model, prompts, max_tokens, eos_id):
    """Rows keep generating after their EOS."""
    return _static(model, prompts, max_tokens, eos_id, cut_after_eos=False, stop_when_done=False)


def static_generate_drops_eos(model, prompts, max_tokens, eos_id):
    """Cuts BEFORE the EOS: the EOS token is missing from the lists."""
    return _static(model, prompts, max_tokens, eos_id, keep_eos=False)


def static_generate_stops_at_first_eos(model, prompts, max_tokens, eos_id):
    """Stops the whole batch as soon as one row produced EOS."""
    return _static(model, prompts, max_tokens, eos_id, stop_on_first=True)


def static_generate_runs_max_tokens(model, prompts, max_tokens, eos_id):
    """Never checks whether every row is done: always runs max_tokens steps."""
    return _static(model, prompts, max_tokens, eos_id, stop_when_done=False)


def static_generate_one_at_a_time(model, prompts, max_tokens, eos_id):
    """Serves the prompts one after the other (no batch at all)."""
    return [model.generate(list(p), max_tokens, stop_token_ids=[eos_id]) for p in prompts]


MUTANTS = {
    "pad_batch": [pad_batch_right, pad_batch_inverted_mask, pad_batch_int_mask, pad_batch_ignores_pad_id],
    "padding_waste": [padding_waste_decodes_max_steps, padding_waste_prefill_only, padding_waste_over_useful],
    "static_generate": [static_generate_right_padding, static_generate_attends_to_padding, static_generate_no_eos_cut,
                        static_generate_drops_eos, static_generate_stops_at_first_eos, static_generate_runs_max_tokens,
                        static_generate_one_at_a_time],
}
