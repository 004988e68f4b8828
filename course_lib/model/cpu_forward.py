"""The "cpu" forward: a whole engine step of the model in one C call (cpu_forward.c).

`transformer.py` is the model you read; this is the same arithmetic for serving small models
on a CPU, where a step's ~200 PyTorch ops cost more to dispatch than to compute (about 2 ms per
step with a handful of requests running, against ~0.1 ms of arithmetic for the tiny model).
The matrix products still run in PyTorch's own BLAS (its MKL's `sgemm_`/`dgemm_`, called from
C), attention is the "cpu" backend's kernel, and the rest are plain loops. The engine uses it
when `EngineConfig.forward` is "cpu", or "auto" with the "cpu" attention backend; the outputs
equal the PyTorch model's to float rounding (tests/test_cpu_forward.py).

Not covered, so served by the PyTorch model instead: a GPU, dtypes other than float32/float64,
a custom attention function (the course's injection point), a PyTorch whose BLAS does not
export the Fortran gemm symbols (then `available()` says why).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ..attention import cpu_decode
from ..native import DTYPES, Kernel
from .rope import rope_cos_sin

SOURCE = Path(__file__).with_name("cpu_forward.c")
LAYER_WEIGHTS = ("input_norm", "qkv_proj", "qkv_bias", "o_proj", "post_attention_norm", "gate_up_proj", "down_proj")
# forward_step's return codes (cpu_forward.c's enum), as the error each one means
NO_MEMORY, BAD_POSITION = 1, 3
ERRORS = {2: "token id outside the vocabulary", 3: "position beyond the rotary table",
          4: "slot outside the KV cache", 5: "page id outside the pool where a sequence reads",
          6: "query rows / sequence lengths inconsistent",
          7: "logits row outside the batch, or more logits rows than tokens"}


def _declare(lib: ctypes.CDLL, c_scalar) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.forward_step.restype = ctypes.c_int
    lib.forward_step.argtypes = [ptr, ptr, ptr, i64, ptr, i64, ptr, ptr, i64, ptr, i64, ptr,  # the batch
                                 ptr, ptr, ptr, ptr, i64, ptr, ptr, i64,  # weights, caches, rotary tables
                                 i64, i64, i64, i64, i64, i64, i64, i64, ctypes.c_float, c_scalar, ptr, i64, i64]


BATCH = ("ids", "positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc", "logits_rows")
BATCH_DTYPES = (torch.int64, torch.int64, torch.int64, torch.int32, torch.int32, torch.int32, torch.int64)
KERNEL = Kernel(SOURCE, "the cpu forward", _declare, includes=(cpu_decode.SOURCE,))
_GEMM = {torch.float32: "sgemm_", torch.float64: "dgemm_"}


@functools.cache
def blas_gemm(dtype: torch.dtype) -> int:
    """Address of the Fortran gemm (sgemm_ / dgemm_) in PyTorch's own library; RuntimeError if
    this PyTorch build does not export it."""
    lib_dir = Path(torch.__file__).parent / "lib"
    for path in sorted(lib_dir.glob("libtorch_cpu.*")):
        try:
            return ctypes.cast(getattr(ctypes.CDLL(str(path)), _GEMM[dtype]), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    raise RuntimeError(f"this PyTorch's libtorch_cpu does not export {_GEMM[dtype]} (no MKL BLAS to call from C)")


def available(dtype: torch.dtype = torch.float32) -> tuple[bool, str]:
    """(True, "") when the C forward can run models of `dtype` here; else (False, the reason)."""
    if dtype not in DTYPES:
        return False, f"the cpu forward supports float32 and float64, not {str(dtype).removeprefix('torch.')}"
    try:
        blas_gemm(dtype)
    except RuntimeError as err:
        return False, str(err)
    return KERNEL.available(dtype)


class CpuForward:
    """`forward(batch tensors) -> logits` for one engine step, computed by cpu_forward.c.

    Same inputs as the PyTorch model plus what `runner.PagedAttend` gets: it embeds the tokens,
    writes each layer's new keys and values into `k_caches`/`v_caches` at `slot_mapping`, attends
    through the block tables, and returns logits for `logits_rows` only."""

    def __init__(self, model, k_caches, v_caches):
        dtype, cfg = model.dtype, model.config
        if model.device.type != "cpu":
            raise ValueError(f"the cpu forward needs the model on the CPU, not {model.device}")
        ok, why = available(dtype)
        if not ok:
            raise RuntimeError(why if why.startswith("the cpu forward") else f"the cpu forward is unavailable: {why}")
        if any(c.dtype != dtype or c.device.type != "cpu" for c in (*k_caches, *v_caches)):
            raise ValueError(f"the cpu forward needs {dtype} KV caches on the CPU, like the model")
        self.model, self.k_caches, self.v_caches = model, k_caches, v_caches
        self.lib, self.gemm, self.dtype = KERNEL.load(dtype), blas_gemm(dtype), dtype
        self.num_pages, self.page_size = k_caches[0].shape[:2]
        self.scale = 1.0 / cfg.head_dim**0.5
        self._rope_table(cfg.max_position_embeddings)
        # What C will read at each address: checked every step (~10 us), because a weight swapped
        # for another dtype, shape or device since the engine was built would be read out of bounds.
        hidden, qkv = cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.shapes = dict(input_norm=(hidden,), qkv_proj=(qkv, hidden), qkv_bias=(qkv,),
                           o_proj=(hidden, cfg.num_heads * cfg.head_dim), post_attention_norm=(hidden,),
                           gate_up_proj=(2 * cfg.intermediate_size, hidden), down_proj=(hidden, cfg.intermediate_size),
                           embed_tokens=(cfg.vocab_size, hidden), norm=(hidden,), lm_head=(cfg.vocab_size, hidden),
                           cache=tuple(k_caches[0].shape))

    def _rope_table(self, length: int) -> None:
        # The same values the PyTorch model computes per step, for every position at once.
        cos, sin = rope_cos_sin(torch.arange(length), self.model.inv_freq, self.dtype)
        self.cos, self.sin = cos[:, 0].contiguous(), sin[:, 0].contiguous()

    def _layer_table(self) -> torch.Tensor:
        """Every layer's weight and cache addresses, read now: weights replaced since the engine
        was built (load_state_dict, a training step) are used as they are."""
        rows, address = [], self._address
        for layer, kc, vc in zip(self.model.layers, self.k_caches, self.v_caches):
            p = layer._parameters
            rows.append([0 if p[name] is None else address(p[name], name) for name in LAYER_WEIGHTS]
                        + [address(kc, "cache"), address(vc, "cache")])
        return torch.tensor(rows, dtype=torch.int64)

    def _address(self, t: torch.Tensor, name: str) -> int:
        if t.dtype != self.dtype or t.device.type != "cpu" or t.shape != self.shapes[name] or not t.is_contiguous():
            raise ValueError(f"the cpu forward needs {name} as a contiguous CPU {self.dtype} tensor of shape "
                             f"{list(self.shapes[name])}, got {t.dtype} on {t.device}, shape {list(t.shape)}, "
                             f"strides {t.stride()}")
        return t.data_ptr()

    def __call__(self, ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_rows):
        batch = (ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_rows)
        for name, t, dtype in zip(BATCH, batch, BATCH_DTYPES):
            if t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError(f"cpu forward: {name} must be a contiguous CPU {dtype} tensor, "
                                 f"got {t.dtype} on {t.device}")
        T, S = ids.shape[0], block_tables.shape[0]
        if positions.shape != (T,) or slot_mapping.shape != (T,) or seq_lens.shape != (S,) \
                or query_start_loc.shape != (S + 1,) or block_tables.dim() != 2 or logits_rows.dim() != 1:
            raise ValueError(f"cpu forward: for {T} tokens of {S} sequences, positions and slot_mapping must be "
                             f"[{T}], seq_lens [{S}], query_start_loc [{S + 1}], block_tables [{S}, pages]")
        status, logits = self._run(batch)
        if status == BAD_POSITION and int(positions.min()) >= 0:  # max_model_len beyond the model's own
            self._rope_table(int(positions.max()) + 1)
            status, logits = self._run(batch)
        if status == NO_MEMORY:
            raise MemoryError(f"the cpu forward could not allocate activations for {ids.shape[0]} tokens")
        if status:
            raise ValueError(f"cpu forward: {ERRORS[status]} (nothing was computed or written)")
        return logits

    def _run(self, batch) -> tuple[int, torch.Tensor]:
        ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_rows = batch
        cfg, m = self.model.config, self.model
        logits = torch.empty(logits_rows.shape[0], cfg.vocab_size, dtype=self.dtype)
        layers = self._layer_table()
        status = self.lib.forward_step(
            ids.data_ptr(), positions.data_ptr(), slot_mapping.data_ptr(), ids.shape[0],
            block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(), query_start_loc.data_ptr(),
            block_tables.shape[0], logits_rows.data_ptr(), logits_rows.shape[0], logits.data_ptr(),
            self._address(m.embed_tokens.weight, "embed_tokens"), self._address(m.norm.weight, "norm"),
            self._address(m.lm_head.weight, "lm_head"),
            layers.data_ptr(), len(m.layers), self.cos.data_ptr(), self.sin.data_ptr(), self.cos.shape[0],
            cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size,
            self.num_pages, self.page_size, cfg.rms_norm_eps, self.scale, self.gemm, torch.get_num_threads(),
            cpu_decode.PARALLEL_MIN_WORK)
        return status, logits

