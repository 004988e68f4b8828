"""Checks for notebook 00 (setup): KV bytes per token, and a first answer through the engine."""
from __future__ import annotations

from .answer import check_answer
from .kv_bytes_per_token import check_kv_bytes_per_token
