"""Train the tiny model that course_lib ships, from a seed, on a laptop CPU.

    python scripts/train_tiny.py     # writes course_lib/model/tiny/; 13.5-17 min measured on a shared 2-core CPU

Reproducible: the data come from `random.Random(seed)` and the weights from
`torch.manual_seed(seed)`; with the same torch build and thread count the run is the same.
The loss covers only the answer tokens and the final <eos> (the prompt is given, not learned).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

# Threads that sleep instead of spinning while they wait: on a CPU shared with other jobs,
# spinning OpenMP threads made a 2-thread step up to 5x slower than a 1-thread one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.model.config import ModelConfig  # noqa: E402
from course_lib.model.tasks import TASK_KINDS, answer_length_stats, evaluate, sample_task  # noqa: E402
from course_lib.model.tokenizer import CharTokenizer  # noqa: E402
from course_lib.model.transformer import Transformer  # noqa: E402
from course_lib.model.weights import to_hf_names  # noqa: E402

# Harder tasks get more of the data; long answers already weigh more in a per-token loss.
TASK_WEIGHTS = {"max": 0.2, "reverse": 1.6, "sort": 0.4, "spell": 1.6, "repeat": 0.4, "countdown": 0.3}


class PaddedCausalAttention:
    """Attention for a right-padded [B, L] batch flattened to B*L tokens: causal within each row.
    Padding sits after every real token of its row, so a causal mask alone keeps it out."""

    def __init__(self, batch: int, length: int):
        self.batch, self.length = batch, length

    def __call__(self, layer, q, k, v):
        B, L = self.batch, self.length
        q, k, v = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(B * L, o.shape[1], o.shape[3])


def make_example(tok: CharTokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(inputs, targets) for next-token prediction; targets are -100 over the prompt."""
    p = tok.encode_prompt(prompt)
    ids = p + tok.encode(answer) + [tok.eos_token_id]
    targets = [-100] * (len(p) - 1) + ids[len(p) :]
    return ids[:-1], targets


def batches(tok: CharTokenizer, seed: int, batch_size: int, task_weights: dict[str, float], group: int = 16):
    """Endless padded batches. Each group of `group` batches is drawn at once and sorted by
    length, so a batch holds similar lengths and little padding; the group is then shuffled."""
    rng = random.Random(seed)
    kinds, weights = list(task_weights), list(task_weights.values())
    while True:
        exs = [
            make_example(tok, *sample_task(rng, rng.choices(kinds, weights)[0], split="train"))
            for _ in range(batch_size * group)
        ]
        exs.sort(key=lambda e: len(e[0]))
        chunks = [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            L = max(len(x) for x, _ in chunk)
            x = torch.full((len(chunk), L), tok.pad_token_id, dtype=torch.long)
            y = torch.full((len(chunk), L), -100, dtype=torch.long)
            for i, (xi, yi) in enumerate(chunk):
                x[i, : len(xi)] = torch.tensor(xi)
                y[i, : len(yi)] = torch.tensor(yi)
            yield x, y


def init_weights(model: Transformer, num_layers: int, std: float = 0.02) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 2:
            # GPT-2 style: residual projections shrink with depth so the stream starts calm.
            s = std / math.sqrt(2 * num_layers) if name.endswith(("o_proj", "down_proj")) else std
            torch.nn.init.normal_(p, 0.0, s)


def lr_at(step: int, steps: int, lr: float, warmup: int, min_frac: float = 0.05) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3600)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=None, help="default: 3 x hidden")
    ap.add_argument("--eos-weight", type=float, default=3.0, help="loss weight of the <eos> targets")
    ap.add_argument("--tasks", default="", help="comma-separated task kinds to train on (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-n", type=int, default=200, help="held-out prompts per task for the final report")
    ap.add_argument("--eval-every", type=int, default=400, help="quick held-out check every N steps (0: never)")
    ap.add_argument("--out", type=Path, default=ROOT / "course_lib" / "model" / "tiny")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()

    tok = CharTokenizer()
    cfg = ModelConfig(
        vocab_size=tok.vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or 3 * args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Transformer(cfg)
    init_weights(model, cfg.num_layers)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, config {json.dumps(cfg.to_dict())}")

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )

    kinds = args.tasks.split(",") if args.tasks else list(TASK_KINDS)
    data = batches(tok, args.seed, args.batch_size, {k: TASK_WEIGHTS[k] for k in kinds})
    model.train()
    ema, n_tokens = None, 0
    bar = tqdm(range(args.steps), desc="train", mininterval=2.0)
    for step in bar:
        x, y = next(data)
        B, L = x.shape
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        logits = model(x.reshape(-1), torch.arange(L).repeat(B), PaddedCausalAttention(B, L))
        target = y.reshape(-1)
        ce = F.cross_entropy(logits, target, ignore_index=-100, reduction="none")
        # Where an answer stops is one token among many, yet it decides exact match: weigh it more.
        weight = (target != -100).float() + (args.eos_weight - 1.0) * (target == tok.eos_token_id).float()
        loss = (ce * weight).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        n_tokens += B * L
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}", tok_s=f"{n_tokens / (time.time() - t0):.0f}")
        if args.eval_every and (step + 1) % args.eval_every == 0:
            model.eval()
            acc = evaluate(model, tok, n_per_task=50, seed=1, kinds=kinds)
            model.train()
            tqdm.write(f"step {step + 1}: loss {ema:.4f} held-out " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()))
    train_s = time.time() - t0
    model.eval()

    args.out.mkdir(parents=True, exist_ok=True)
    cfg.save(args.out / "config.json")
    tok.save(args.out / "tokenizer.json")
    # Saved in Hugging Face's names (separate q/k/v, gate/up): any Llama tooling can read it.
    state = {k: v.detach().contiguous() for k, v in to_hf_names(model.state_dict(), cfg).items()}
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "model.safetensors").chmod(0o644)  # safetensors writes it owner-only
    size_mb = (args.out / "model.safetensors").stat().st_size / 1e6
    print(f"trained {args.steps} steps in {train_s:.0f} s ({train_s / 60:.1f} min); wrote {args.out} ({size_mb:.2f} MB weights)")

    t1 = time.time()
    acc = evaluate(model, tok, n_per_task=args.eval_n, seed=0)
    overall = sum(acc.values()) / len(acc)
    print(f"\nheld-out exact match ({args.eval_n} prompts per task, seed 0, greedy), {time.time() - t1:.0f} s:")
    for k in TASK_KINDS:
        print(f"  {k:9s} {acc[k] * 100:6.1f}%")
    print(f"  {'overall':9s} {overall * 100:6.1f}%")
    rng = random.Random(0)
    stats = answer_length_stats([(k, *sample_task(rng, k)) for k in TASK_KINDS for _ in range(5000)])
    print("\nanswer length in tokens (characters, without <eos>), 5000 sample_task draws per task:")
    print(f"  {'task':9s} {'min':>4s} {'p50':>4s} {'p90':>4s} {'max':>4s}")
    for k in TASK_KINDS:
        s = stats[k]
        print(f"  {k:9s} {s['min']:4d} {s['p50']:4d} {s['p90']:4d} {s['max']:4d}")
    print(f"\ntotal wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
