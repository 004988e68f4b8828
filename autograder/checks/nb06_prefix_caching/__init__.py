"""Checks for notebook 06 (prefix caching): keys that name whole prefixes, and the prefix cache.

`page_keys` is held to what a key is *for*, not to one formula: one key per full page (a partly
filled page gets none), each key a function of the whole prefix up to its page (equal prefixes,
equal keys; a different token anywhere before or in the page, a different key), checked at every
position of a chain, with repeated, swapped and equal-sum pages, across every call of the check; and to
linear work: the tokens read from a counting sequence, each key's size, and the data the student's code
hashes (through `hash`, `hashlib`, `zlib`) on 4x the pages.

The cache is checked on its own (lookup, the stop at the first miss, max_pages, the partial last
page, duplicates, eviction through the pool's hooks, re-registering an evicted prefix, exact
counters), under forced hash collisions at every position of a chain (the builtin `hash` is
swapped, while the cache runs, for one that makes the probe's page collide with the registered
one: on its tokens, or on its parent; looked up and registered, in both orders), and inside the
real engine: a float64 model serves prompts
that share prefixes from a pool small enough that cached pages are evicted and registered again;
greedy tokens must not change, and the counters must equal those of course_lib's cache serving
the same requests.
"""
from __future__ import annotations

from .page_keys import CountedTokens, check_page_keys
from .student_prefix_cache import check_StudentPrefixCache
