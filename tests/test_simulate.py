"""simulate(): deterministic, nothing lost, time charged once, the model runner serves real tokens."""
import pytest

from course_lib.sim import simulate as sim_mod
from course_lib.sim.simulate import make_engine_config, simulate
from course_lib.sim.workload import ClosedLoopUsers, LengthDist, RequestSpec, open_loop

SMALL = dict(kv_tokens=4096, max_num_seqs=64, max_num_batched_tokens=512)


def _users(n=12, requests=36, **kw):
    return ClosedLoopUsers(n, requests, seed=3, **kw)


def _strip(summary):
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


def _ended_properly(result, n):
    assert len(result.requests) == n, "every issued request must have a record"
    for r in result.requests:
        assert r.finished and r.finish_time is not None, f"{r.request_id} never ended"
        if r.finish_reason == "error":
            assert r.error, f"{r.request_id} failed without a reason"
        else:
            assert r.finish_reason in ("eos", "length", "stop"), r.finish_reason


def test_same_seed_same_metrics():
    a = simulate(make_engine_config(**SMALL), _users(), progress=False)
    b = simulate(make_engine_config(**SMALL), _users(), progress=False)
    assert _strip(a.summary) == _strip(b.summary)
    assert [(r.request_id, r.first_token_time, r.finish_time) for r in a.requests] == \
           [(r.request_id, r.first_token_time, r.finish_time) for r in b.requests]
    c = simulate(make_engine_config(**SMALL), ClosedLoopUsers(12, 36, seed=4), progress=False)
    assert _strip(c.summary) != _strip(a.summary), "a different seed should change the run"


def test_closed_loop_serves_every_request_and_never_exceeds_its_users():
    result = simulate(make_engine_config(**SMALL), _users(5, 30), progress=False)
    s = result.summary
    assert s["requests_completed"] == s["requests_total"] == 30
    assert s["requests_failed"] == s["requests_unfinished"] == s["requests_not_issued"] == 0
    assert s["peak_running"] <= 5
    _ended_properly(result, 30)
    # Scripted runner: each request produced exactly its scripted length.
    lengths = {spec.request_id: spec.output_len for spec in result.specs}
    assert all(len(r.token_ids) == lengths[r.request_id] for r in result.requests)


def test_open_loop_respects_arrival_times():
    specs = open_loop(20, rate=50.0, seed=1)
    result = simulate(make_engine_config(**SMALL), specs, progress=False)
    assert result.summary["requests_completed"] == 20
    for spec, r in zip(specs, result.requests):
        assert r.arrival_time == pytest.approx(spec.arrival_time)
        assert r.first_scheduled_time >= r.arrival_time
        assert r.first_token_time > r.arrival_time


def test_each_step_is_charged_once():
    result = simulate(make_engine_config(**SMALL), _users(), progress=False)
    clock = result.engine.clock
    assert clock.busy_s == pytest.approx(sum(s.end_time - s.start_time for s in result.steps))
    # Closed loop, think time 0, everyone starts at 0: the clock never idles.
    assert result.summary["sim_time_s"] == pytest.approx(clock.busy_s)


def test_nothing_is_lost_when_the_pool_overflows_and_preemption_is_off():
    config = make_engine_config(kv_tokens=1024, admission="none", preemption="fail", max_num_seqs=64)
    result = simulate(config, ClosedLoopUsers(24, 60, seed=0), progress=False)
    s = result.summary
    assert s["requests_failed"] > 0, "this setup was meant to overflow the pool"
    assert s["requests_completed"] + s["requests_failed"] == s["requests_total"] == 60
    _ended_properly(result, 60)


@pytest.mark.parametrize("admission", ["watermark", "reserve"])
def test_admission_control_fails_nothing(admission):
    config = make_engine_config(kv_tokens=1024, admission=admission, preemption="fail", max_num_seqs=64)
    # A cap of 512 keeps every worst case (prompt + max_tokens) inside this 1,024-token pool, so
    # `reserve` can admit them all (a request whose worst case exceeds the pool is refused).
    result = simulate(config, ClosedLoopUsers(24, 60, seed=0), max_tokens=512, progress=False)
    if admission == "reserve":  # reserve never preempts, so nothing can fail
        assert result.summary["requests_failed"] == 0
    _ended_properly(result, 60)


def test_static_and_contiguous_runs_complete():
    for scheduler, kv in [("static", "contiguous"), ("static", "paged"), ("continuous", "contiguous")]:
        config = make_engine_config(scheduler=scheduler, kv=kv, max_model_len=1024, **SMALL)
        result = simulate(config, _users(8, 20), progress=False)
        assert result.summary["requests_completed"] == 20, (scheduler, kv)
        assert result.summary["peak_running"] <= (4 if kv == "contiguous" else 8)


def test_too_long_requests_are_clipped_and_unservable_ones_fail_with_a_reason():
    long_prompt = RequestSpec("long", prompt_len=5000, output_len=50, arrival_time=0.0, user=None)
    fine = RequestSpec("fine", prompt_len=10, output_len=5, arrival_time=0.0, user=None)
    result = simulate(make_engine_config(**SMALL, max_model_len=512), [long_prompt, fine], progress=False)
    by_id = {r.request_id: r for r in result.requests}
    assert result.summary["requests_clipped"] == 1
    assert len(by_id["long"].prompt_token_ids) == 511 and len(by_id["long"].token_ids) == 1
    # A pool of 256 tokens cannot hold a request that may grow to 300 + 16: it fails at once, with the reason.
    big = RequestSpec("big", prompt_len=300, output_len=5, arrival_time=0.0, user=None)
    result = simulate(make_engine_config(kv_tokens=256, max_model_len=512), [big, fine], max_tokens=16,
                      progress=False)
    by_id = {r.request_id: r for r in result.requests}
    assert by_id["big"].finish_reason == "error" and "pool" in by_id["big"].error
    assert by_id["fine"].finish_reason in ("eos", "length")
    assert result.summary["requests_failed"] == 1 and result.summary["requests_completed"] == 1


def test_prefix_caching_hits_and_cuts_ttft():
    def run(caching):
        config = make_engine_config(prefix_caching=caching, **SMALL)
        return simulate(config, ClosedLoopUsers(16, 48, seed=0, shared_prefix=128), progress=False).summary

    off, on = run(False), run(True)
    assert off["prefix_hit_rate"] == 0.0 and on["prefix_hit_rate"] > 0.3
    assert on["ttft_s"]["p50"] < off["ttft_s"]["p50"]
    assert on["requests_completed"] == off["requests_completed"] == 48


def test_max_steps_aborts_the_rest_but_keeps_their_records():
    result = simulate(make_engine_config(**SMALL), _users(6, 30), progress=False, max_steps=20)
    s = result.summary
    assert s["requests_aborted"] > 0
    assert s["requests_completed"] + s["requests_aborted"] + s["requests_failed"] == s["requests_total"]


def test_a_strict_policy_still_admits_into_an_empty_engine(monkeypatch):
    # Watermark admission would refuse a first chunk that leaves < 5% of this pool free; an empty
    # engine admits anyway (the request fits the pool), so the simulation finishes, never stalls.
    monkeypatch.setattr(sim_mod, "STALL_STEPS", 50)
    spec = RequestSpec("big", prompt_len=60, output_len=2, arrival_time=0.0, user=None)
    result = simulate(make_engine_config(kv_tokens=64, admission="watermark"), [spec], max_tokens=4, progress=False)
    assert result.summary["requests_completed"] == 1


@pytest.fixture
def one_thread():
    # A tiny model on a shared 2-core CPU: spinning OpenMP threads make each matmul ~20x slower.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_model_runner_with_wall_clock_serves_the_models_greedy_tokens(small_model, one_thread):
    specs = open_loop(4, rate=float("inf"), prompt_dist=LengthDist.uniform(3, 20), seed=0)
    config = make_engine_config(kv_tokens=1024, page_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    result = simulate(config, specs, runner="model", clock="wall", model=small_model, max_tokens=6, progress=False)
    assert result.summary["requests_completed"] == 4
    for r in result.requests:
        assert r.token_ids == small_model.generate(r.prompt_token_ids, 6, stop_token_ids=[])
        assert r.finish_reason == "length"
    assert result.config["clock"] == "wall" and result.summary["throughput_tok_s"] > 0


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="runner"):
        simulate(make_engine_config(), [], runner="gpu", progress=False)
    with pytest.raises(ValueError, match="clock"):
        simulate(make_engine_config(), [], clock="sundial", progress=False)
    with pytest.raises(ValueError, match="no page of 16"):
        make_engine_config(kv_tokens=8, page_size=16)


def test_to_json_has_the_contract_keys():
    out = simulate(make_engine_config(**SMALL), _users(4, 8), progress=False).to_json(include_requests=True)
    for key in ("requests_completed", "requests_failed", "output_tokens", "throughput_tok_s", "kv_waste_frac",
                "peak_running", "preemptions", "prefix_hit_rate"):
        assert key in out
    for key in ("ttft_s", "tpot_s", "latency_s"):
        assert set(out[key]) >= {"p50", "p99"}
    assert len(out["requests"]) == 8 and out["config"]["workload"]["users"] == 4


def test_model_runner_with_a_tokenizer_serves_task_prompts(one_thread):
    from conftest import random_model

    from course_lib.model.tokenizer import CharTokenizer

    tokenizer = CharTokenizer()
    model = random_model(5, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                         max_position_embeddings=64)
    config = make_engine_config(kv_tokens=1024, page_size=8, max_num_seqs=8, max_num_batched_tokens=128)
    result = simulate(config, ClosedLoopUsers(2, 4, seed=0), runner="model", clock="wall", model=model,
                      tokenizer=tokenizer, max_tokens=8, progress=False)
    _ended_properly(result, 4)
    for r in result.requests:
        text = result.prompt_texts[r.request_id]
        assert r.prompt_token_ids == tokenizer.encode_prompt(text)
        assert text.split(":")[0] in ("max", "reverse", "sort", "spell", "repeat", "count")
        assert 1 <= len(r.token_ids) <= 8


# --------------------------------------------------------------------------- speculative decoding
PROMPT, OUTPUT = 64, 128  # fixed lengths: B users are B requests decoding together, round after round


def _speculation_run(users, speculative):
    spec = dict(speculative="ngram", num_speculative_tokens=3, spec_acceptance_rate=0.7) if speculative else {}
    config = make_engine_config(kv_tokens=users * (PROMPT + OUTPUT + 64) + 4096, max_num_seqs=users,
                                max_num_batched_tokens=8192, **spec)
    workload = ClosedLoopUsers(users, 2 * users, LengthDist.fixed(PROMPT), LengthDist.fixed(OUTPUT), seed=0)
    return simulate(config, workload, progress=False, max_tokens=OUTPUT)  # the default clock: H100, Llama-3-8B


def test_speculation_reports_its_acceptance_and_tokens_per_step():
    result = _speculation_run(4, speculative=True)
    s = result.summary
    _ended_properly(result, 8)
    assert all(len(r.token_ids) == OUTPUT for r in result.requests)  # drafts never change what is produced
    assert s["spec_draft_tokens"] > 0 and s["spec_num_drafts"] > 0
    # Each draft kept with probability 0.7 until the first miss: (0.7 + 0.49 + 0.343) / 3 = 51% of the
    # drafts, 2.53 tokens per drafted step (the scripted runner's draws are seeded: same every run).
    assert s["spec_acceptance_rate"] == pytest.approx(0.511, abs=0.04)
    assert s["tokens_per_drafted_step"] == pytest.approx(2.533, abs=0.12)
    assert 1.0 < s["tokens_per_decode_step"] <= s["tokens_per_drafted_step"]
    plain = _speculation_run(4, speculative=False).summary
    assert plain["spec_draft_tokens"] == plain["spec_num_drafts"] == 0
    assert plain["tokens_per_decode_step"] == 1.0 and plain["tokens_per_drafted_step"] == 0.0
    assert s["num_steps"] < plain["num_steps"]


def test_speculation_stops_paying_once_the_batch_is_compute_bound():
    """The chapter's lesson on the simulated H100: drafting 3 tokens cuts TPOT at 1-4 users (decode is
    memory-bound, the extra rows are nearly free), and there is a batch size from which it costs
    throughput (1 + k rows per request make the step compute-bound). Where it lies is not fixed
    here; that it exists, that the steps there are compute-bound, and that the steady-state roofline
    (sim/speculative.crossing_batch) puts it in the same bracket are."""
    from course_lib.sim.roofline import cost_of_step
    from course_lib.sim.speculative import crossing_batch

    gains, crossing = {}, None
    for users in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        plain, spec = _speculation_run(users, False), _speculation_run(users, True)
        if users <= 4:
            assert spec.summary["tpot_s"]["p50"] < 0.5 * plain.summary["tpot_s"]["p50"], users
        gains[users] = spec.summary["throughput_tok_s"] / plain.summary["throughput_tok_s"]
        if gains[users] <= 1.0:
            crossing = users
            break
    assert crossing is not None, f"speculation still paid at every batch size: {gains}"
    assert crossing > 4 and all(g > 1.0 for u, g in gains.items() if u < crossing), gains
    decode_steps = [s for s in spec.steps if s.num_draft_tokens and not s.num_prefill_tokens]
    costs = [cost_of_step(s, "H100", "llama-3-8b") for s in decode_steps]
    compute_s = sum(c.total_s for c in costs if c.bound == "compute")
    assert compute_s > 0.5 * sum(c.total_s for c in costs)
    # The steady-state model at the mean decode context (prompt + half the answer) crosses in the same
    # bracket of the sweep.
    previous = max(u for u in gains if u < crossing)
    assert previous < crossing_batch(PROMPT + OUTPUT // 2) <= crossing


def test_speculation_stats_by_hand_and_in_the_table():
    from course_lib.scheduler.output import StepStats
    from course_lib.sim.metrics import format_table, speculation_stats, summarize

    def step(decode, drafts, accepted):
        return StepStats(step=0, start_time=0.0, end_time=1.0, num_running=1, num_waiting=0, num_prefill_tokens=0,
                         num_decode_tokens=decode, num_padded_tokens=0, context_tokens_read=0,
                         attention_context_tokens=0, kv_tokens_written=decode, kv_used_slots=1, kv_allocated_slots=1,
                         kv_total_slots=16, num_preemptions=0, num_draft_tokens=drafts, num_accepted_tokens=accepted)

    # Step 1: two drafted rows of 1 + 3 tokens (kept 3 and 0) and a plain decode; step 2: one row, 1 + 2, kept 1.
    steps = [step(4 + 4 + 1, 6, 3), step(3, 2, 1)]
    s = speculation_stats(steps, num_drafts=3)
    assert s == {"spec_num_drafts": 3, "spec_draft_tokens": 8, "spec_accepted_tokens": 4,
                 "spec_acceptance_rate": 0.5, "tokens_per_drafted_step": 1 + 4 / 3,
                 "tokens_per_decode_step": (4 + 4) / 4}  # 4 decode rows gave 4 + 4 tokens
    assert speculation_stats([step(5, 0, 0)]) == {"spec_num_drafts": 0, "spec_draft_tokens": 0,
                                                  "spec_accepted_tokens": 0, "spec_acceptance_rate": 0.0,
                                                  "tokens_per_drafted_step": 0.0, "tokens_per_decode_step": 1.0}
    plain, drafted = summarize([], [step(5, 0, 0)]), summarize([], steps, num_drafts=3)
    assert "draft acceptance" not in format_table({"plain": plain})  # no speculation, no rows about it
    rows = {line.split("  ")[0].strip(): line.split()[-2:]
            for line in format_table({"plain": plain, "drafted": drafted}).splitlines()}
    assert rows["draft acceptance"] == ["-", "50.0%"]
    assert rows["tokens / drafted step"] == ["-", "2.33"]
    assert rows["tokens / decode step"] == ["1.00", "2.00"]
