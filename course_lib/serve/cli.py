"""`python -m course_lib serve`: the engine behind an OpenAI-compatible API, with a live dashboard.

    python -m course_lib serve                         # the tiny model on http://127.0.0.1:8000
    python -m course_lib serve --open-dashboard        # ... and the lecture dashboard in a browser

Every EngineConfig knob is a flag (page size, pool, seats, token budget, admission, prefix
caching, ...). `--model PATH` serves a local Hugging Face checkpoint (Llama, Qwen2, Mistral)
through `course_lib.from_hf`; nothing is ever downloaded.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import urllib.parse
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16", "float64")
# The control token may come from the environment: a command line is readable by every local user (ps).
CONTROL_TOKEN_ENV = "COURSE_SERVE_CONTROL_TOKEN"


class ServedModelNames(argparse.Action):
    """`--served-model-name a b` or `--served-model-name a --served-model-name b`: every name goes to
    `served_model_names` (in order, once each), the first to `served_model_name`, which the engine
    process reads (its metrics' label)."""

    def __call__(self, parser, namespace, values, option_string=None):
        for name in values:
            if not name.strip():
                parser.error(f"{option_string} needs non-empty names, got {name!r}")
        names = list(dict.fromkeys([*(getattr(namespace, "served_model_names", None) or []), *values]))
        namespace.served_model_names = names
        setattr(namespace, self.dest, names[0])


def build_parser() -> argparse.ArgumentParser:
    from ..engine_config import OPTIONS, EngineConfig  # the one list of each knob's names, and its default

    p = argparse.ArgumentParser(prog="python -m course_lib serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s = p.add_argument_group("server")
    s.add_argument("--model", default="tiny", help="'tiny' (shipped) or a local Hugging Face checkpoint folder")
    s.add_argument("--served-model-name", nargs="+", action=ServedModelNames, default=None, metavar="NAME",
                   help="the name(s) clients may send as 'model', as vLLM's flag: one or more, or the flag again; "
                        "/v1/models lists them all and answers carry the first (default: tiny, or the folder's name)")
    s.add_argument("--host", default="127.0.0.1", help="0.0.0.0 lets students in the room connect")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-waiting", type=int, default=None,
                   help="refuse new requests with 429 + Retry-After while this many wait (default: no limit)")
    s.add_argument("--no-dashboard", action="store_true", help="do not serve /dashboard")
    s.add_argument("--open-dashboard", action="store_true", help="open /dashboard in a browser once up")
    s.add_argument("--control-token", default=os.environ.get(CONTROL_TOKEN_ENV), metavar="TOKEN",
                   help="the token the dashboard's controls (pause, step, admission, burst) need, as "
                        "'Authorization: Bearer TOKEN' or /dashboard?token=TOKEN (default: $" + CONTROL_TOKEN_ENV +
                        " if set, else a random one, printed at start, when --host lets others in; none on loopback)")
    s.add_argument("--stream-interval-ms", type=float, default=5.0,
                   help="a stream's chunks go out at most this often; tokens in between share a chunk (0: each alone)")
    s.add_argument("--stream-min-tokens", type=int, default=1,
                   help="after its first chunk, a stream's chunks carry at least this many tokens (or its last ones)")
    s.add_argument("--stream-chunks-per-s", type=float, default=4000.0,
                   help="all streams together get at most this many chunks a second: with many streams open, "
                        "each chunk carries more tokens (0: no cap)")
    s.add_argument("--burst-max-tokens", type=int, default=48, help="max_tokens of the dashboard's burst requests")
    s.add_argument("--parent-pid", type=int, default=None, metavar="PID",
                   help="stop when process PID stops being this server's parent (it died): what a notebook sets")
    s.add_argument("--engine-thread", action="store_true",
                   help="step the engine in a thread of the HTTP server's process instead of a process of its "
                        "own (they then share one interpreter lock: slower under many streams; always so on "
                        "Windows)")
    s.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    m = p.add_argument_group("model")
    m.add_argument("--dtype", choices=DTYPES, default="float32")
    m.add_argument("--device", default="cpu", help="cpu or cuda")
    m.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 suits the tiny model)")
    e = p.add_argument_group("engine (EngineConfig)")
    e.add_argument("--page-size", type=int, default=16)
    e.add_argument("--num-pages", type=int, default=None, help="KV pool pages (default: max-num-seqs requests "
                                                               "at half of max-model-len)")
    e.add_argument("--max-num-seqs", type=int, default=64, help="batch seats")
    e.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step")
    e.add_argument("--scheduler", choices=OPTIONS["scheduler"], default=EngineConfig.scheduler)
    e.add_argument("--kv-layout", choices=OPTIONS["kv_layout"], default=EngineConfig.kv_layout)
    e.add_argument("--admission", choices=OPTIONS["admission"], default=EngineConfig.admission)
    e.add_argument("--watermark", type=float, default=0.05)
    e.add_argument("--preemption", choices=OPTIONS["preemption"], default=EngineConfig.preemption)
    e.add_argument("--no-chunked-prefill", action="store_true")
    e.add_argument("--prefix-caching", action="store_true")
    e.add_argument("--attention-backend", choices=OPTIONS["attention_backend"], default=EngineConfig.attention_backend)
    e.add_argument("--forward", choices=OPTIONS["forward"], default=EngineConfig.forward)
    e.add_argument("--max-model-len", type=int, default=None, help="default: the model's context")
    e.add_argument("--seed", type=int, default=0, help="for unseeded sampled requests")
    e.add_argument("--record-page-owners", action="store_true", help="keep a page map per step in step_stats")
    e.add_argument("--speculative", choices=OPTIONS["speculative"], default=EngineConfig.speculative,
                   help="speculative decoding: who drafts the next tokens of a decoding request (ngram: prompt "
                        "lookup; draft: the model's first --draft-layers layers); none: off")
    e.add_argument("--num-speculative-tokens", type=int, default=EngineConfig.num_speculative_tokens, metavar="K",
                   help="at most this many draft tokens per request and step (with --speculative)")
    e.add_argument("--draft-layers", type=int, default=EngineConfig.draft_layers, metavar="L",
                   help="with --speculative draft: the draft model is the model's first L layers (fewer than it has)")
    p.set_defaults(served_model_names=[])
    return p


def engine_config_from_args(args):
    from course_lib import EngineConfig

    return EngineConfig(
        page_size=args.page_size, num_pages=args.num_pages, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, scheduler=args.scheduler, kv_layout=args.kv_layout,
        admission=args.admission, watermark=args.watermark, preemption=args.preemption,
        enable_chunked_prefill=not args.no_chunked_prefill, enable_prefix_caching=args.prefix_caching,
        attention_backend=args.attention_backend, forward=args.forward, max_model_len=args.max_model_len,
        seed=args.seed, record_page_owners=args.record_page_owners, speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens, draft_layers=args.draft_layers)


def config_flags(config) -> list[str]:
    """The flags that make `serve` build `config` (an EngineConfig): what a notebook hands to
    ServerProcess so that the server and the simulator's prediction serve with the same knobs."""
    flags = ["--page-size", str(config.page_size), "--max-num-seqs", str(config.max_num_seqs),
             "--max-num-batched-tokens", str(config.max_num_batched_tokens), "--scheduler", config.scheduler,
             "--kv-layout", config.kv_layout, "--admission", config.admission, "--watermark", str(config.watermark),
             "--preemption", config.preemption, "--attention-backend", config.attention_backend,
             "--forward", config.forward, "--seed", str(config.seed), "--speculative", config.speculative,
             "--num-speculative-tokens", str(config.num_speculative_tokens),
             "--draft-layers", str(config.draft_layers)]
    for flag, value in (("--num-pages", config.num_pages), ("--max-model-len", config.max_model_len)):
        if value is not None:
            flags += [flag, str(value)]
    for flag, on in (("--no-chunked-prefill", not config.enable_chunked_prefill),
                     ("--prefix-caching", config.enable_prefix_caching),
                     ("--record-page-owners", config.record_page_owners)):
        if on:
            flags.append(flag)
    return flags


def load_model(name: str, dtype: str, device: str, max_model_len=None):
    """(model, tokenizer, served name). A path must be a local folder: serving never downloads."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if name == "tiny":
        from course_lib import load_tiny

        model, tokenizer = load_tiny(dtype=torch_dtype, device=device)
        return model, tokenizer, "tiny"
    path = Path(name)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ValueError(f"--model must be 'tiny' or a local Hugging Face checkpoint folder with a config.json; "
                         f"{name!r} is not one (nothing is downloaded)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from course_lib import load_hf

    model, tokenizer = load_hf(str(path), dtype=torch_dtype, device=device, max_model_len=max_model_len)
    return model, tokenizer, path.name


def tokenizer_folder(model: str) -> str:
    """Where a Hugging Face tokenizer of the served model lies, for /v1/models' `root` (vLLM reports
    the model's path there): the tiny model's shipped folder, or the checkpoint folder itself."""
    if model == "tiny":
        from course_lib.model.hf_tokenizer import HF_TOKENIZER_DIR

        return str(HF_TOKENIZER_DIR)
    return str(Path(model).resolve())


def name_model(state, args) -> None:
    """The names clients may send as `model` (the first is the one the engine process was given) and
    the tokenizer folder /v1/models shows as `root`."""
    state.served_names = tuple(args.served_model_names) or (state.model_name,)
    state.root = tokenizer_folder(args.model)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("stream_interval_ms", "stream_chunks_per_s"):
        if not getattr(args, flag) >= 0:  # NaN too
            parser.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    # (--draft-layers: the engine checks it against the model's layers, and names both limits)
    for flag in ("port", "threads", "burst_max_tokens", "stream_min_tokens", "num_speculative_tokens"):
        low = 0 if flag == "port" else 1
        if getattr(args, flag) < low:
            parser.error(f"--{flag.replace('_', '-')} must be >= {low}, got {getattr(args, flag)}")
    try:
        import uvicorn  # noqa: F401
        import starlette  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as err:
        parser.error(f"serving needs the 'serve' extra ({err.name} is missing): pip install -e \".[serve]\"")
    from .app import ServeState, build_server_state
    from .dashboard import control_token_for
    from .launch import WILDCARD_HOSTS, local_host, room_host, serve_forever, watch_parent

    try:
        control_token = None if args.no_dashboard else control_token_for(args.host, args.control_token)
    except ValueError as err:
        parser.error(str(err))

    if args.parent_pid is not None:
        watch_parent(args.parent_pid)
    try:
        if args.engine_thread or sys.platform == "win32":  # Windows' event loop cannot watch a pipe
            from .engine_process import build_engine

            engine, tokenizer, name = build_engine(args)
            state = build_server_state(engine, tokenizer, name, max_waiting=args.max_waiting)
        else:
            from .engine_process import EngineClient

            client = EngineClient(args)  # builds the engine in its own process
            state = ServeState(client, client.tokenizer, client.model_name, client.max_model_len)
    except (ValueError, FileNotFoundError, ImportError) as err:
        parser.error(str(err))
    except RuntimeError as err:  # the engine process died or hung while starting
        print(f"serve: {err}", file=sys.stderr)
        return 1
    name_model(state, args)
    state.burst_max_tokens = args.burst_max_tokens
    state.stream_interval_s = args.stream_interval_ms / 1000.0
    state.stream_min_tokens = args.stream_min_tokens
    state.stream_chunks_per_s = args.stream_chunks_per_s
    state.control_token = control_token
    name = " or ".join(repr(n) for n in state.served_names)
    print(f"serving {name} on http://{args.host}:{args.port}  (dashboard: http://{args.host}:{args.port}/dashboard"
          f"{', off' if args.no_dashboard else ''}; OpenAI base_url: http://{args.host}:{args.port}/v1)", flush=True)
    print(f"tokenizer (for GuideLLM's --processor, AIPerf's --tokenizer): {state.root}", flush=True)
    if args.host in WILDCARD_HOSTS:
        print(f"others on this network: http://{room_host(args.host)}:{args.port} (the API has no authentication: a "
              f"network you trust only)", flush=True)
    dashboard_url = f"http://{local_host(args.host)}:{args.port}/dashboard"
    if control_token is not None:
        dashboard_url += "?token=" + urllib.parse.quote(control_token, safe="")
        print(f"control token: {control_token}  (the dashboard's buttons need it: open {dashboard_url} here, the "
              f"page then drops it from the address bar; or send 'Authorization: Bearer TOKEN')", flush=True)
    if args.open_dashboard and not args.no_dashboard:  # with the token, so that the instructor's page has buttons
        import webbrowser

        threading.Timer(1.5, webbrowser.open, [dashboard_url]).start()
    serve_forever(state, host=args.host, port=args.port, dashboard=not args.no_dashboard, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
