"""Small helpers the course notebooks import: where am I running, and keep going when an
exercise is not finished yet.

    on_colab()            True inside Google Colab
    has_cuda()            True when torch sees a CUDA GPU
    fast_mode()           True when the notebooks should shrink their real-model runs (CPU)
    setup_torch(seed)     fixed seeds, and one CPU thread for the tiny model
    environment_report()  versions, CPU / GPU, Colab: printed, and returned as a dict
    checking(exercise)    first line of an exercise's test cell: remembers whether the cell passed
    use_or_reference(...) the student's piece if it is finished and passed its check, course_lib's otherwise
    whose(name)           "your budget_sweep" or "course_lib's budget_sweep": a label for the numbers it produced
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

# The GitHub repository the notebooks' "Open in Colab" badges and install cells point at: None
# until the course is published. One setting, in course_lib/publish_settings.py; set it with
# `python scripts/publish.py --repo OWNER/NAME` (which also rewrites every badge and install cell).
from course_lib.publish_settings import COURSE_REPO  # noqa: E402


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


# What each exercise's test cell did last time it ran: {exercise: CheckResult}. A test cell opens
# with `checking("name")`; when the cell ends, an IPython hook records whether it raised. Later
# cells ask `use_or_reference`, which falls back when the check failed (not only when the code is
# unfinished), so the numbers after a wrong answer come from course_lib, and say so.
class CheckResult:
    def __init__(self, exercise: str):
        self.exercise = exercise
        self.status = "running"  # "running" (the cell has not ended), "passed", "failed"
        self.error = ""  # "AssertionError: first line of the message" when failed

    def finish(self, error: BaseException | None) -> None:
        if error is None:
            self.status, self.error = "passed", ""
        else:
            first_line = (str(error).strip().splitlines() or [""])[0]
            self.status, self.error = "failed", f"{type(error).__name__}: {first_line[:200]}".rstrip(": ")

    # `with checking("name"): ...` records the block's outcome where there is no IPython.
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.finish(exc)
        _RUNNING.discard(self.exercise)
        return False


CHECKS: dict[str, CheckResult] = {}
_RUNNING: set[str] = set()  # exercises whose test cell is executing now
# Whose piece the last use_or_reference(name, ...) handed out: {name: "student" | "reference"}, so that
# a later label says whose code produced a number (`whose(name)`), never "your" where course_lib stood in.
USED: dict[str, str] = {}


def _record_cell_outcome(result) -> None:
    """IPython post_run_cell hook: the outcome of the cell that called `checking`."""
    error = result.error_in_exec or result.error_before_exec
    for exercise in list(_RUNNING):
        CHECKS[exercise].finish(error)
        if error is None:  # a failure shows its own traceback; a pass would otherwise show nothing
            print(f"passed: {exercise}'s visible check (the hidden tests run when it is graded)")
    _RUNNING.clear()


def _install_hook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    if _record_cell_outcome not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _record_cell_outcome)
    return True


def checking(exercise: str) -> CheckResult:
    """Call first in an exercise's test cell: `checking("pad_batch")`. When the cell ends, whether
    it raised is remembered, and `use_or_reference("pad_batch", ...)` in a later cell uses course_lib's
    piece if it did. (Outside IPython use it as `with checking("pad_batch"): ...`.)"""
    if not isinstance(exercise, str) or not exercise:
        raise ValueError(f"checking() needs the exercise's name (a non-empty str), got {exercise!r}")
    result = CHECKS[exercise] = CheckResult(exercise)
    if _install_hook():
        _RUNNING.add(exercise)
    return result


def use_or_reference(name: str, student_impl, reference_impl, probe=None, quiet: bool = False,
                     exercise: str | None = None):
    """The student's implementation if it is finished and passes its check, otherwise `reference_impl`.

    - unfinished (still `raise NotImplementedError()`): the reference;
    - its test cell ran and failed (`checking(exercise)`, `exercise` defaults to `name`): the
      reference, with a one-line note naming the exercise and the check's first line;
    - its test cell passed: the student's;
    - its test cell has not run: the student's if `probe(student_impl)` (when given) runs cleanly.

    Either way the cell that calls this keeps working and says which implementation it uses, so a
    student can go on with the notebook and come back to the exercise later. `reference_impl`
    should be course_lib's piece (the autograder's answer key does not ship to students).
    """
    exercise = exercise or name
    recorded = CHECKS.get(exercise)
    reason = None
    if is_unfinished(student_impl):
        reason = f"your {name} is not finished yet"
    elif recorded is not None and recorded.status == "failed":
        reason = f"your {name} failed its check above ({recorded.error})"
    elif recorded is not None and recorded.status == "passed":
        pass
    elif probe is not None:
        try:
            probe(student_impl)
        except NotImplementedError:
            reason = f"your {name} is not finished yet"
        except Exception as err:  # a failed check, or a crash: both mean "not ready to plug in"
            first_line = (str(err).strip().splitlines() or [""])[0]
            reason = f"your {name} does not pass its checks yet ({type(err).__name__}: {first_line[:200]})"
    if reason is None:
        USED[name] = "student"
        if not quiet:
            print(f"using your {name}")
        return student_impl
    USED[name] = "reference"
    if not quiet:
        print(f"{reason}: using course_lib's reference so you can keep going ({stand_in_name(reference_impl)} "
              f"stands in for your {name}: the numbers below that come from it are course_lib's, not yours)")
    return reference_impl


def stand_in_name(impl) -> str:
    """The dotted name of the piece that stands in (`course_lib.sim.token_budget.budget_sweep`), never its
    source: a fallback names what it used without handing the answer over."""
    module = getattr(impl, "__module__", None) or ""
    qualname = getattr(impl, "__qualname__", None) or getattr(impl, "__name__", None) or type(impl).__name__
    if "<" in qualname:  # a lambda or a function defined inside another: no importable name
        return "a stand-in defined in this notebook"
    return f"{module}.{qualname}" if module and module != "__main__" else qualname


def whose(name: str) -> str:
    """A label for a number a piece produced: "your <name>" when the student's piece was used,
    "course_lib's <name>" when course_lib's stood in (see use_or_reference), "<name>" if neither is known."""
    used = USED.get(name)
    if used == "student":
        return f"your {name}"
    if used == "reference":
        return f"course_lib's {name} (standing in for yours)"
    return name


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
