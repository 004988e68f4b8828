"""The boundary between a check and the student's code, recorded as plain data and replayed.

The code lives in the package `autograder.recording` (its docstring tells the whole story, one
module per idea: proxies, the codec, the event machine, exceptions as data, the active membrane);
this module keeps the names code and tests import from `autograder.membrane`.
"""
from __future__ import annotations

__all__ = ["MAX_DIGESTS", "MAX_EVENTS", "MAX_TENSOR_BYTES", "CallableProxy", "Divergence", "Membrane", "Proxy",
           "RecordLimit", "Refused", "callback_refusal", "crossing", "digest", "exception_info", "is_proxy",
           "proxy_target", "rebuild_exception"]

from .recording.codec import MAX_DIGESTS, MAX_TENSOR_BYTES, digest  # noqa: F401
from .recording.errors import MAX_EVENTS, Divergence, RecordLimit, Refused  # noqa: F401
from .recording.exceptions_as_data import exception_info, rebuild_exception  # noqa: F401
from .recording.machine import Membrane  # noqa: F401
from .recording.operations import callback_refusal, crossing  # noqa: F401
from .recording.proxy import CallableProxy, Proxy, is_proxy, proxy_target  # noqa: F401
