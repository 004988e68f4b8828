"""The one table of the course's graded exercises: everything else about an exercise is derived
from its row (the checks' map, the tests' parametrisation, docs/exercises.md's table).

A row says where the exercise lives (notebook module and nbgrader assignment), what the student
writes (the adapter: the name their solution cell defines, also the solution cell's grade_id),
which check grades it (`autograder.checks.<module>.check_<adapter>`), which graded test cell
carries its points, and which piece of course_lib does the same job (the fallback later cells
use while the student's piece is unfinished or failing, and what a test holds the generated
reference solution to).

`scripts/build_exercises_doc.py` writes docs/exercises.md from `markdown_table()` and docs/exercises/*.md;
`scripts/build_grading_tables.py` writes docs/grading.md's check table and definitions list from the rows
(`python scripts/regenerate.py` runs every generator). Adding an exercise, step by step:
docs/adding_an_exercise.md.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    module: str  # e.g. "nb03_paged_kv": the checks / mutants / reference module
    adapter: str  # what the student defines; also the solution cell's nbgrader grade_id
    points: float  # the graded test cell's points (tests hold the notebook's metadata to it)
    counterpart: str | None = None  # "course_lib.pkg.module:Name" doing the same job, if any
    interface: str = ""  # one line: the signature the student implements
    cell: str | None = None  # the graded test cell's grade_id, when it is not "<adapter>_tests"
    visible_seed: int = 0  # the seed the released test cell calls the check with
    # A convention the check pins down that a student could reasonably choose otherwise (what counts as
    # waste, which requests a percentile covers, ...): one markdown paragraph starting with the adapter in
    # backticks. The notebook must state it; docs/grading.md lists every one (scripts/build_grading_tables.py).
    definition: str = ""

    # The hidden tests' seeds are not in this table (it ships with the package): they live only in the
    # instructor's solution notebooks (autograder/hidden_seeds.py), read from there on demand.
    @property
    def graded_seeds(self) -> tuple[int, ...]:
        """Every seed a grading calls the check with: the visible one, then the hidden ones, as the
        solution notebook's test cell writes them (instructor side only: `hidden_seeds.NoSolutions`
        where there is no solutions/). Every mutant must fail on each of them (no seed luck), every
        control pass on each."""
        from .solution_seeds import graded_seeds

        return graded_seeds(self)

    @property
    def hidden_seeds(self) -> tuple[int, ...]:
        """The graded seeds other than the visible one (instructor side only, as `graded_seeds`)."""
        return tuple(s for s in self.graded_seeds if s != self.visible_seed)

    @property
    def assignment(self) -> str:
        """The nbgrader assignment (folder under solutions/): the module name without "nb"."""
        return self.module[2:]

    @property
    def check_name(self) -> str:
        return f"check_{self.adapter}"

    @property
    def test_cell(self) -> str:
        """grade_id of the graded test cell that calls the check (several adapters may share one;
        their points add up to the cell's)."""
        return self.cell or f"{self.adapter}_tests"


E = Exercise
EXERCISES: list[Exercise] = [
    E("nb00_setup", "kv_bytes_per_token", 1, "course_lib.model.kv_footprint:kv_bytes_per_token",
      "kv_bytes_per_token(config, bytes_per_elem) -> int"),
    E("nb00_setup", "answer", 2, "course_lib.cli.generate:answer", "answer(model, tokenizer, prompt, max_tokens=64) -> str"),
    E("nb01_static_batching", "pad_batch", 2, "course_lib.static_batching:pad_batch",
      "pad_batch(prompts, pad_id) -> (ids [B, L], mask [B, L])"),
    E("nb01_static_batching", "static_generate", 3, "course_lib.static_batching:static_generate",
      "static_generate(model, prompts, max_tokens, eos_id) -> list[list[int]]",
      definition=("`static_generate`: each list ends with its EOS (included); the batch stops when every row is done. "
                  "It must run the whole batch in each forward pass (the check counts forward passes).")),
    E("nb01_static_batching", "static_generate_cached", 3, "course_lib.static_batching:static_generate_cached",
      "static_generate_cached(model, prompts, max_tokens, eos_id) -> list[list[int]]"),
    E("nb01_static_batching", "padding_waste", 2, "course_lib.static_batching:padding_waste",
      "padding_waste(prompt_lens, output_lens) -> float",
      definition=("`padding_waste(prompt_lens, output_lens)`: the prefill computes `B x max(prompt_lens)` slots and "
                  "samples each row's first token; then `max(output_lens) - 1` decode steps of `B` slots. Row `i` "
                  "needs `prompt_lens[i] + output_lens[i] - 1` of them; waste = padding / all computed slots.")),
    E("nb02_continuous_batching", "StudentScheduler", 4, "course_lib.scheduler.continuous:ContinuousScheduler",
      "class StudentScheduler(SchedulerBase): schedule() -> SchedulerOutput"),
    E("nb02_continuous_batching", "mean_batch_occupancy", 2, "course_lib.sim.occupancy:mean_batch_occupancy",
      "mean_batch_occupancy(step_stats, max_num_seqs) -> float",
      definition=("`mean_batch_occupancy(step_stats, max_num_seqs)`: mean of `num_running / max_num_seqs`, each "
                  "step weighted by `end_time - start_time`; equal weights if no step has a duration; `0.0` for "
                  "no steps.")),
    E("nb02_continuous_batching", "budget_sweep", 3, "course_lib.sim.token_budget:budget_sweep",
      "budget_sweep(budgets, specs, make_engine, submit) -> list[dict]"),
    E("nb03_paged_kv", "StudentBlockPool", 4, "course_lib.kv.block_pool:BlockPool",
      "class StudentBlockPool(num_pages, page_size): allocate / free / share / num_free_pages / ref_counts / is_free",
      definition=("`StudentBlockPool`: `allocate(n)` raises `course_lib.kv.block_pool.OutOfPages` and changes "
                  "nothing when fewer than `n` pages are free; `free(pages)` raises (any error) and changes nothing when a "
                  "page in the list has fewer owners than the times it is listed (a double free); `share(page)` "
                  "of a free page takes it off the free list; attributes `num_pages`, `page_size`, `ref_counts`, "
                  "hooks `on_evict = None`, `is_cached = lambda page: False`.")),
    E("nb03_paged_kv", "slot_mapping", 2, "course_lib.kv.slots:slot_mapping",
      "slot_mapping(block_table, page_size, start, count) -> list[int]"),
    E("nb03_paged_kv", "paged_waste", 1, "course_lib.kv.waste:paged_waste", "paged_waste(lens, page_size) -> int",
      cell="kv_waste_tests"),
    E("nb03_paged_kv", "contiguous_waste", 1, "course_lib.kv.waste:contiguous_waste",
      "contiguous_waste(lens, max_len) -> int", cell="kv_waste_tests"),
    E("nb03_paged_kv", "build_flat_batch", 4, "course_lib.runner_batch:build_flat_batch",
      "build_flat_batch(output, page_size, device, pad_slot) -> FlatBatch"),
    E("nb04_paged_attention", "paged_attention_loops", 3, "course_lib.attention.reference:paged_decode_reference",
      "paged_attention_loops(q, k_cache, v_cache, block_tables, seq_lens, scale) -> out"),
    E("nb04_paged_attention", "paged_attention_vectorized", 3, "course_lib.attention.torch_paged:paged_decode_torch",
      "paged_attention_vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale) -> out"),
    E("nb04_paged_attention", "paged_attention_triton", 4, "course_lib.attention.triton_decode:paged_decode_triton",
      "paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale) -> out (launches your paged_decode_kernel)"),
    E("nb05_hundred_users", "latency_summary", 2, "course_lib.sim.closed_loop:latency_summary",
      "latency_summary(records) -> dict",
      definition=("`latency_summary`: completed requests only (finish reason not `error`/`aborted`); TPOT over "
                  "`n - 1` gaps for `n >= 2` tokens; percentiles are `numpy.percentile`'s linear interpolation, "
                  "`None` when there are no values; throughput = completed output tokens / (last finish - first "
                  "arrival).")),
    E("nb05_hundred_users", "run_closed_loop", 3, "course_lib.sim.closed_loop:run_closed_loop",
      "run_closed_loop(make_engine, num_users, num_requests, make_prompt, seed) -> list[RequestOutput]",
      definition=("`run_closed_loop(make_engine, num_users, num_requests, make_prompt, seed)`: `make_engine()` "
                  "once; `rng = random.Random(seed)` once; `make_prompt(rng)` returns `(prompt_token_ids, "
                  "SamplingParams)` for each request sent; a user sends its next request as soon as its last one "
                  "finishes; returns the finished `RequestOutput`s in the order the requests were sent.")),
    E("nb06_prefix_caching", "page_keys", 2, "course_lib.kv.prefix_cache:PrefixCache",
      "page_keys(token_ids, page_size) -> list of hashable keys, one per full page"),
    E("nb06_prefix_caching", "StudentPrefixCache", 4, "course_lib.kv.prefix_cache:PrefixCache",
      "class StudentPrefixCache(pool): lookup / register / evict / is_cached / counters",
      definition=("`StudentPrefixCache(pool)` installs `pool.is_cached` / `pool.on_evict`, starts "
                  "`queried_tokens` / `hit_tokens` at 0, confirms every hit against the stored tokens and parent "
                  "serial, stops a lookup at the first miss, and returns the last hit's serial (`0` if none).")),
    E("nb07_admission_control", "StudentRecompute", 3, "course_lib.scheduler.continuous:ContinuousScheduler",
      "class StudentRecompute(ContinuousScheduler): choose_victim() -> Request, preempt(request) -> None"),
    E("nb07_admission_control", "StudentWatermark", 3, "course_lib.scheduler.admission:WatermarkAdmission",
      "class StudentWatermark(watermark): can_admit(request, num_new_tokens, cached_pages, kv, running) -> bool",
      definition=("`StudentWatermark(w)`: `ValueError` unless `0 <= w < 1`; admits iff `kv.num_free_pages - "
                  "kv.num_pages_needed(request, num_new_tokens, cached_pages) >= w * kv.num_pages`.")),
    E("nb07_admission_control", "preemption_report", 2, "course_lib.sim.preemption:preemption_report",
      "preemption_report(engine) -> dict",
      definition=("`preemption_report(engine)`: from `engine.requests`: total `num_preemptions`, requests with "
                  "at least one, and the largest count (all `int`s).")),
    E("nb07_admission_control", "break_it_config", 3, None,
      "break_it_config() -> dict(users, kv_tokens, max_tokens, watermark)"),
    E("nb09_speculative_decoding", "target_tokens", 4, "course_lib.spec.verify:target_tokens",
      "target_tokens(logits, drafts, draft_probs, params, generator) -> list of 1 + k token ids",
      definition=("`target_tokens(logits, drafts, draft_probs, params, generator)`: greedy: the argmax at every "
                  "position; sampled, with `p = target_probs(logits, params)` and `q = draft_probs` (`None`: "
                  "q(d) = 1): draft i kept with probability `min(1, p_i(d) / q_i(d))`, the first rejected "
                  "position drawn from `max(0, p_i - q_i)` renormalised (0 at the draft), all kept: position "
                  "k drawn from `p_k`; positions after the first rejection hold any token id.")),
    E("nb09_speculative_decoding", "StudentRollback", 4, "course_lib.scheduler.continuous:ContinuousScheduler",
      "class StudentRollback(ContinuousScheduler): accept_drafts(request, entry, targets) -> FinishReason | None",
      definition=("`StudentRollback.accept_drafts(request, entry, targets)`: appends the drafts up to the first "
                  "one unlike the target's token and then that token (all agree: `targets[k]`), one at a time, "
                  "stopping after the first that ends the request (returns its `FinishReason`, else `None`); "
                  "`num_computed_tokens = entry.start + tokens appended`; pages past those the progress needs "
                  "go back through `self.kv.truncate`.")),
]
del E

BY_ADAPTER: dict[str, Exercise] = {e.adapter: e for e in EXERCISES}


def of_module(module: str) -> list[Exercise]:
    return [e for e in EXERCISES if e.module == module]


def markdown_table() -> str:
    """The table as markdown: notebook, adapter (interface), check, course_lib counterpart, points."""
    rows = ["| nb | exercise | interface | check | course_lib counterpart | points |",
            "|---|---|---|---|---|---:|"]
    for e in EXERCISES:
        counterpart = f"`{e.counterpart}`" if e.counterpart else "-"
        rows.append(f"| {e.module[2:4]} | `{e.adapter}` | `{e.interface}` | `{e.module}.{e.check_name}` | "
                    f"{counterpart} | {e.points:g} |")
    return "\n".join(rows)
