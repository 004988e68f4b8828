"""What both of notebook 06's checks use: course_lib's module to refuse, and a short token list."""
from __future__ import annotations


def _prefix_cache_module():
    import course_lib.kv.prefix_cache as prefix_cache

    return [prefix_cache]


def _short(tokens, limit=24):
    tokens = list(tokens)
    return str(tokens) if len(tokens) <= limit else f"[{', '.join(map(str, tokens[:limit]))}, ... ({len(tokens)} tokens)]"
