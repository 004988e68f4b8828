"""Small helpers the course notebooks import: where am I running, and keep going when an
exercise is not finished yet.

    on_colab()            True inside Google Colab
    has_cuda()            True when torch sees a CUDA GPU
    fast_mode()           True when the notebooks should shrink their real-model runs (CPU)
    setup_torch(seed)     fixed seeds, and one CPU thread for the tiny model
    environment_report()  versions, CPU / GPU, Colab: printed, and returned as a dict
    use_or_reference(...) the student's piece if it is finished, course_lib's otherwise
    padded_forward(...)   the model over a padded [B, L] batch with an attention mask

Nothing here is needed by the engine itself; it exists so that every notebook opens with the
same two lines and never dies because an earlier exercise is still `raise NotImplementedError()`.
"""
from __future__ import annotations

import inspect
import os
import platform
import sys
import textwrap

# OpenMP threads that spin while waiting make the tiny model's small matrix products many times
# slower on a CPU shared with other work. Sleeping instead costs nothing here. This only takes
# effect if it runs before torch is imported, which is why notebooks import this module first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The GitHub repository the notebooks' "Open in Colab" badges and install cells point at.
# A placeholder: replace "OWNER/REPO" everywhere (solutions/, notebooks/ and here) when the
# course is published, then run `python scripts/generate_notebooks.py`.
COURSE_REPO = "OWNER/REPO"


# --------------------------------------------------------------------------------- where am I
def on_colab() -> bool:
    """True inside Google Colab (its runtime imports `google.colab` and sets COLAB_* variables)."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def fast_mode() -> bool:
    """Shrink the real-model runs? `COURSE_FAST=1` / `COURSE_FAST=0` decide; otherwise fast on a
    machine without a GPU. Simulations (scripted runner, simulated clock) are cheap and are
    never shrunk much; what shrinks is how many real forward passes a notebook makes."""
    flag = os.environ.get("COURSE_FAST")
    if flag is not None and flag.strip() != "":
        return flag.strip().lower() not in ("0", "false", "no", "off")
    return not has_cuda()


def setup_torch(seed: int = 0, cpu_threads: int | None = 1) -> None:
    """Fix the seeds (torch, random, numpy) and, on a CPU, the number of torch threads. The tiny
    model's matrices are too small to be worth splitting across threads: one thread is as fast
    and does not fight with other programs for the cores. `cpu_threads=None` leaves torch's choice."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if cpu_threads is not None and not torch.cuda.is_available():
        torch.set_num_threads(cpu_threads)


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:  # not installed, or broken: either way, not usable
        return None
    return getattr(module, "__version__", "installed")


def environment_report(show: bool = True) -> dict:
    """What this notebook is running on. Prints a short table (unless `show=False`) and returns it."""
    import torch

    report = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_memory_gib": (round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                           if torch.cuda.is_available() else None),
        "triton": _version("triton"),
        "ipywidgets": _version("ipywidgets"),
        "matplotlib": _version("matplotlib"),
        "course_lib": _version("course_lib"),
        "colab": on_colab(),
        "fast_mode": fast_mode(),
        "tiny_model": _tiny_model_present(),
    }
    if show:
        width = max(len(k) for k in report)
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
    return report


def _tiny_model_present() -> bool:
    try:
        from course_lib.model import tiny
    except Exception:
        return False
    return all((tiny.TINY_DIR / f).is_file() for f in ("config.json", "tokenizer.json", "model.safetensors"))


# ------------------------------------------------------------------ keep going past an exercise
def _source(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):  # no source available (built-in, or defined somewhere odd)
        return ""


def _sources(impl) -> list[str]:
    """The source of a function, or of every method and property of a class. (A class defined in a
    notebook cell has no findable source of its own, but its methods do.)"""
    if not isinstance(impl, type):
        return [_source(impl)]
    parts = []
    for value in vars(impl).values():
        if isinstance(value, property):
            value = value.fget
        value = getattr(value, "__func__", value)  # staticmethod / classmethod
        if inspect.isfunction(value):
            parts.append(_source(value))
    return parts


def is_unfinished(impl) -> bool:
    """True if `impl` (a function or class) is missing or still contains the exercise's
    `raise NotImplementedError()` placeholder (in the function, or in any method of the class)."""
    if impl is None:
        return True
    return any("raise NotImplementedError" in text for text in _sources(impl))


def use_or_reference(name: str, student_impl, reference_impl, probe=None, quiet: bool = False):
    """The student's implementation if it is finished, otherwise `reference_impl`.

    "Finished" means: the code no longer contains the `raise NotImplementedError()` placeholder,
    and, when a `probe` is given, `probe(student_impl)` runs without raising (pass a cheap
    check, e.g. one of the autograder's checks). Either way the cell that calls this keeps
    working, and it says which implementation it is using, so a student can go on with the
    notebook and come back to the exercise later.
    """
    reason = None
    if is_unfinished(student_impl):
        reason = f"your {name} is not finished yet"
    elif probe is not None:
        try:
            probe(student_impl)
        except NotImplementedError:
            reason = f"your {name} is not finished yet"
        except Exception as err:  # a failed check, or a crash: both mean "not ready to plug in"
            first_line = (str(err).strip().splitlines() or [""])[0]
            reason = f"your {name} does not pass its checks yet ({type(err).__name__}: {first_line[:200]})"
    if reason is None:
        if not quiet:
            print(f"using your {name}")
        return student_impl
    if not quiet:
        print(f"{reason}: using course_lib's reference so you can keep going")
    return reference_impl


# ------------------------------------------------------------------ a padded batch through the model
def padded_forward(model, input_ids, attention_mask):
    """Logits `[B, L, vocab]` of `model` over a LEFT-padded batch, with no KV cache.

    `input_ids`: LongTensor `[B, L]`; `attention_mask`: BoolTensor `[B, L]`, True on real tokens.
    Each row's real tokens get positions 0, 1, 2, ... (padding does not shift them) and attend
    causally to the real tokens of their own row only. Padding rows are still computed (that is
    the waste static batching pays) but never seen by a real token.
    """
    import torch
    import torch.nn.functional as F

    ids = torch.as_tensor(input_ids, dtype=torch.long, device=model.device)
    mask = torch.as_tensor(attention_mask, dtype=torch.bool, device=model.device)
    if ids.dim() != 2 or ids.shape != mask.shape:
        raise ValueError(f"input_ids and attention_mask must both be [B, L], got {tuple(ids.shape)} "
                         f"and {tuple(mask.shape)}")
    B, L = ids.shape
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    causal = torch.ones(L, L, dtype=torch.bool, device=ids.device).tril()
    # visible[b, i, j]: query i of row b may look at key j. A padding query sees only itself,
    # so its softmax has something to normalise (its output is thrown away anyway).
    visible = causal[None] & mask[:, None, :]
    visible |= torch.eye(L, dtype=torch.bool, device=ids.device)[None] & ~mask[:, :, None]

    def attend(layer, q, k, v):
        q, k, v = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], enable_gqa=True)
        return o.transpose(1, 2).reshape(B * L, o.shape[1], o.shape[3])

    with torch.inference_mode():
        logits = model(ids.reshape(-1), positions.reshape(-1), attend)
    return logits.view(B, L, -1)
