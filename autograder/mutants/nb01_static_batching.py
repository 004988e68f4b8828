"""Realistic wrong answers for notebook 01 (static batching). Self-contained: no autograder imports."""
import torch
import torch.nn.functional as F

from course_lib.model.contiguous_cache import ContiguousKVCache


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


def pad_batch_mask_from_ids(prompts, pad_id):
    """Marks as padding every position whose id equals pad_id (a real token may equal it)."""
    ids, _ = _pad(prompts, pad_id)
    return ids, ids != pad_id


def pad_batch_accepts_empty(prompts, pad_id):
    """No check for bad input: an empty prompt becomes a row of padding, no prompts a [0, 0] batch."""
    if not prompts:
        return torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0), dtype=torch.bool)
    return _pad(prompts, pad_id)


def pad_batch_no_checks(prompts, pad_id):
    """No check of its own: `max()` of no lengths happens to raise a ValueError, but an empty prompt
    becomes a row of nothing but padding."""
    return _pad(prompts, pad_id)


def pad_batch_pads_in_place(prompts, pad_id):
    """Pads the prompt lists it was handed in place (no copy): right ids and mask, but the caller's
    prompts now start with padding."""
    if not prompts or not all(prompts):
        raise ValueError("pad_batch needs at least one prompt, and no empty one")
    lengths = [len(p) for p in prompts]
    longest = max(lengths)
    for prompt in prompts:
        prompt[:0] = [pad_id] * (longest - len(prompt))
    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.tensor([[False] * (longest - n) + [True] * n for n in lengths], dtype=torch.bool)
    return ids, mask


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


def padding_waste_useful_fraction(prompt_lens, output_lens):
    """Returns the useful fraction instead of the padding fraction."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    return (sum(prompt_lens) + sum(n - 1 for n in output_lens)) / total


def padding_waste_counts_last_token(prompt_lens, output_lens):
    """Counts every output token as a real slot, the last one too (it is produced, never fed)."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    return (total - sum(prompt_lens) - sum(output_lens)) / total


def padding_waste_rounded(prompt_lens, output_lens):
    """Right formula, rounded to 4 decimals "for readability": not the exact fraction."""
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    return round((total - sum(prompt_lens) - sum(n - 1 for n in output_lens)) / total, 4)


def padding_waste_no_validation(prompt_lens, output_lens):
    """Right formula, but pairs the lists with zip: mismatched lengths are silently truncated."""
    pairs = list(zip(prompt_lens, output_lens))
    if not pairs:
        return 0.0
    b = len(pairs)
    total = b * max(p for p, _ in pairs) + b * (max(o for _, o in pairs) - 1)
    return (total - sum(p + o - 1 for p, o in pairs)) / total


def padding_waste_validates_outputs_only(prompt_lens, output_lens):
    """Right formula; validates what a first draft thinks of: too many prompt lengths, an output of 0.
    Fewer prompt lengths than output lengths, or a prompt of 0 tokens, pass silently."""
    if not prompt_lens or len(prompt_lens) > len(output_lens) or min(output_lens) < 1:
        raise ValueError(f"bad lengths: {prompt_lens}, {output_lens}")
    b = len(prompt_lens)
    total = b * max(prompt_lens) + b * (max(output_lens) - 1)
    return (total - sum(prompt_lens) - sum(n - 1 for n in output_lens)) / total


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
            keep_eos=True, stop_on_first=False, stop_when_done=True, drop_finished=False, eos_by_identity=False,
            extra_step=False):
    """The no-cache loop, right but for the one bug its flag turns on: the rectangle keeps every row and
    grows by one column per step (a finished row's new column is masked padding)."""
    is_eos = (lambda token: token is eos_id) if eos_by_identity else (lambda token: token == eos_id)
    if drop_finished:
        return _static_dropping_finished_rows(model, prompts, max_tokens, eos_id)
    ids, mask = _pad(prompts, 0, left=left)
    B = len(prompts)
    outs = [[] for _ in prompts]
    done = [False] * B
    for _ in range(max_tokens + (1 if extra_step else 0)):
        n = ids.shape[1]
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        last = torch.arange(B) * n + n - 1  # the last column: with right padding, a pad for short rows
        logits = model(ids.flatten(), positions.flatten(), _PaddedCausal(mask, use_mask), logits_indices=last)
        column, column_mask = [], []
        for row, token in enumerate(logits.argmax(-1).tolist()):
            if (done[row] and cut_after_eos) or (is_eos(token) and not keep_eos):
                done[row] = True
                column.append(0)
                column_mask.append(False)
                continue
            outs[row].append(token)
            column.append(token)
            column_mask.append(True)
            if is_eos(token):
                done[row] = True
        if stop_on_first and any(done):
            break
        if stop_when_done and all(done):
            break
        ids = torch.cat([ids, torch.tensor(column)[:, None]], dim=1)
        mask = torch.cat([mask, torch.tensor(column_mask)[:, None]], dim=1)
    return outs


def _static_dropping_finished_rows(model, prompts, max_tokens, eos_id):
    """Serves only the rows still running at each step (right tokens, wrong batch shape)."""
    seqs = [list(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        live = [i for i in range(len(seqs)) if not done[i]]
        ids, mask = _pad([seqs[i] for i in live], 0)
        n = ids.shape[1]
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        last = torch.arange(len(live)) * n + n - 1
        logits = model(ids.flatten(), positions.flatten(), _PaddedCausal(mask), logits_indices=last)
        for i, token in zip(live, logits.argmax(-1).tolist()):
            outs[i].append(token)
            seqs[i].append(token)
            done[i] = token == eos_id
        if all(done):
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


def static_generate_drops_finished_rows(model, prompts, max_tokens, eos_id):
    """Takes finished rows out of the batch: right tokens, but not a static batch any more."""
    return _static(model, prompts, max_tokens, eos_id, drop_finished=True)


def static_generate_one_token_too_many(model, prompts, max_tokens, eos_id):
    """Loops max_tokens + 1 times (the prefill's token "does not count"): rows without EOS get one too many."""
    return _static(model, prompts, max_tokens, eos_id, extra_step=True)


def static_generate_extends_the_prompts(model, prompts, max_tokens, eos_id):
    """Right tokens and passes, but it keeps each row's sequence in the prompt list it was handed (no
    copy): the caller's prompts grow by the answers."""
    outs = _static(model, prompts, max_tokens, eos_id)
    for prompt, out in zip(prompts, outs):
        prompt.extend(out)
    return outs


def static_generate_uses_a_cache(model, prompts, max_tokens, eos_id):
    """Decodes over a KV cache (the next exercise), so it is no no-cache baseline to time against."""
    return _cached(model, prompts, max_tokens, eos_id)


# ---------------------------------------------------------------------------------------------
# static_generate_cached
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def _cached(model, prompts, max_tokens, eos_id, decode_positions_from_columns=False, decode_position_shift=0,
            mask_prompt_pads=True, stop_when_done=True, extra_step=False, prefill_by_columns=False,
            keep_eos=True, feed_last_prompt_token=False, eos_by_identity=False):
    is_eos = (lambda token: token is eos_id) if eos_by_identity else (lambda token: token == eos_id)
    ids, mask = _pad(prompts, 0)
    B, L = ids.shape
    cache = ContiguousKVCache(model, B, L + max_tokens + 1)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    prefill_mask = mask if mask_prompt_pads else torch.ones_like(mask)
    if prefill_by_columns:
        for col in range(L):
            logits = cache.forward(model, ids[:, col:col + 1], prefill_mask[:, col:col + 1], positions[:, col:col + 1])
    else:
        logits = cache.forward(model, ids, prefill_mask, positions)
    next_pos = mask.sum(1)
    outs = [[] for _ in prompts]
    done = [False] * B
    last_prompt = ids[:, -1:].clone()
    for step in range(max_tokens + (1 if extra_step else 0)):
        tokens = logits[:, -1].argmax(-1).tolist()
        live = [not d for d in done]
        for row, token in enumerate(tokens):
            if not live[row]:
                continue
            if is_eos(token) and not keep_eos:
                done[row] = True
                continue
            outs[row].append(token)
            done[row] = is_eos(token)
        if stop_when_done and all(done):
            break
        if step == max_tokens - 1 + (1 if extra_step else 0):
            break
        column = last_prompt if feed_last_prompt_token else torch.tensor([[t] for t in tokens])
        new_mask = torch.tensor(live)[:, None]
        position = torch.full((B,), cache.length) if decode_positions_from_columns else next_pos + decode_position_shift
        logits = cache.forward(model, column, new_mask, position[:, None])
        next_pos = next_pos + new_mask[:, 0].long()
    return outs


def cached_extends_the_prompts(model, prompts, max_tokens, eos_id):
    """Right tokens and passes, but each generated token is appended to the prompt list it was handed."""
    outs = _cached(model, prompts, max_tokens, eos_id)
    for prompt, out in zip(prompts, outs):
        prompt.extend(out)
    return outs


def cached_recomputes_everything(model, prompts, max_tokens, eos_id):
    """No cache at all: the whole padded rectangle again every step (right tokens, B x width per pass)."""
    return _static(model, prompts, max_tokens, eos_id)


def cached_decode_positions_are_columns(model, prompts, max_tokens, eos_id):
    """Prefill positions skip padding, but each decode token gets its column index (the cache's
    length): a padded row's new token jumps ahead of its prompt by the padding's width. (Column
    positions for the prefill TOO would be harmless: rotary attention only sees position differences.)"""
    return _cached(model, prompts, max_tokens, eos_id, decode_positions_from_columns=True)


def cached_decode_position_off_by_one(model, prompts, max_tokens, eos_id):
    """The decode token gets the position of the token before it (length - 1, not length)."""
    return _cached(model, prompts, max_tokens, eos_id, decode_position_shift=-1)


def cached_attends_to_prompt_padding(model, prompts, max_tokens, eos_id):
    """Prefills with an all-True mask: the padding columns' keys are cached as real tokens."""
    return _cached(model, prompts, max_tokens, eos_id, mask_prompt_pads=False)


def cached_runs_max_tokens(model, prompts, max_tokens, eos_id):
    """Never stops early: decodes max_tokens steps even when every row has finished."""
    return _cached(model, prompts, max_tokens, eos_id, stop_when_done=False)


def cached_one_token_too_many(model, prompts, max_tokens, eos_id):
    """The prefill's token plus max_tokens decode steps: rows without EOS get max_tokens + 1 tokens."""
    return _cached(model, prompts, max_tokens, eos_id, extra_step=True)


def cached_prefills_column_by_column(model, prompts, max_tokens, eos_id):
    """Feeds the prompt through the cache one column per pass (right tokens, L passes for one prefill)."""
    return _cached(model, prompts, max_tokens, eos_id, prefill_by_columns=True)


def cached_drops_eos(model, prompts, max_tokens, eos_id):
    """Stops a row at its EOS but leaves the EOS out of its list."""
    return _cached(model, prompts, max_tokens, eos_id, keep_eos=False)


def cached_feeds_stale_token(model, prompts, max_tokens, eos_id):
    """Every decode step feeds the prompt's last token again instead of the token just generated."""
    return _cached(model, prompts, max_tokens, eos_id, feed_last_prompt_token=True)


def static_generate_eos_by_identity(model, prompts, max_tokens, eos_id):
    """Compares token ids with `is`: right while ids are below 257 (ints Python shares), a row never
    stops at a larger EOS id (every real vocabulary's)."""
    return _static(model, prompts, max_tokens, eos_id, eos_by_identity=True)


def cached_eos_by_identity(model, prompts, max_tokens, eos_id):
    """The cached loop comparing token ids with `is` (a row never stops at an EOS id above 256)."""
    return _cached(model, prompts, max_tokens, eos_id, eos_by_identity=True)


MUTANTS = {
    "pad_batch": [pad_batch_right, pad_batch_inverted_mask, pad_batch_int_mask, pad_batch_ignores_pad_id,
                  pad_batch_mask_from_ids, pad_batch_accepts_empty, pad_batch_no_checks, pad_batch_pads_in_place],
    "padding_waste": [padding_waste_decodes_max_steps, padding_waste_prefill_only, padding_waste_over_useful,
                      padding_waste_useful_fraction, padding_waste_no_validation,
                      padding_waste_validates_outputs_only, padding_waste_counts_last_token, padding_waste_rounded],
    "static_generate": [static_generate_right_padding, static_generate_attends_to_padding, static_generate_no_eos_cut,
                        static_generate_drops_eos, static_generate_stops_at_first_eos, static_generate_runs_max_tokens,
                        static_generate_one_at_a_time, static_generate_drops_finished_rows,
                        static_generate_uses_a_cache, static_generate_eos_by_identity,
                        static_generate_one_token_too_many, static_generate_extends_the_prompts],
    "static_generate_cached": [cached_recomputes_everything, cached_decode_positions_are_columns,
                               cached_decode_position_off_by_one, cached_attends_to_prompt_padding,
                               cached_runs_max_tokens, cached_one_token_too_many, cached_prefills_column_by_column,
                               cached_drops_eos, cached_feeds_stale_token, cached_eos_by_identity,
                               cached_extends_the_prompts],
}
