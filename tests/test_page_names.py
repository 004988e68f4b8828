"""One word for the KV cache's unit: course_lib's own names say "page". "block" stays only where it
is a contract (DESIGN.md, the notebooks and the checks use it: vLLM's names) or means something
else (a GPU kernel's tile, blocking I/O, transformers' API); docs/architecture.md's glossary says so.
A new name with "block" in it must be one of these, or be called a page."""
from __future__ import annotations

import ast
from pathlib import Path

import course_lib
from course_lib.kv.manager import KVCacheManager

PACKAGE = Path(course_lib.__file__).resolve().parent

# name -> why it keeps "block"
KEPT = {
    # contracts: DESIGN.md, the notebooks, the checks and the students' own code use these names
    "BlockPool": "course_lib.kv.block_pool.BlockPool: notebooks 3 and 6 and the nb03/06/07 checks import it",
    "block_pool": "LLMEngine(block_pool=...): an injection point in DESIGN.md and docs/architecture.md",
    "block_tables": "paged_decode(..., block_tables, ...) in DESIGN.md; FlatBatch.block_tables the checks build",
    "block_table": "slot_mapping(block_table, ...) is notebook 3's exercise; KVCacheManager.block_table "
                   "(an alias of page_ids) is what notebook 6 calls; a row of block_tables in the kernels",
    "block_tables_ptr": "the Triton kernels' pointer to block_tables",
    # another meaning: a GPU kernel's tile of tokens or queries, not a page
    "BLOCK_M": "Triton tile", "BLOCK_N": "Triton tile", "BLOCK_Q": "Triton tile", "block_m": "Triton tile",
    "block_n": "Triton tile", "block_q": "Triton tile", "default_block_n": "Triton tile",
    "block_start": "Triton tile", "q_block": "Triton tile",
    # another meaning: I/O that waits, and transformers' own API
    "BlockingIOError": "I/O", "set_blocking": "I/O",
    "allow_block_sharing": "transformers' ContinuousBatchingConfig", "num_blocks": "transformers' "
                                                                                   "ContinuousBatchingConfig",
    "block": "bench engine: manager.stop(block=True), transformers' API",
}


def _names(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.rsplit(".", 1)[-1]


def test_course_lib_names_pages_pages():
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _names(ast.parse(path.read_text(), str(path))):
            if "block" in name.lower() and name not in KEPT:
                found.setdefault(name, set()).add(path.relative_to(PACKAGE.parent).as_posix())
    assert not found, (f"names that say 'block' for what course_lib calls a page: {found}; call it a page "
                       "(or, for a contract name, add it to KEPT with the reason)")


def test_the_kv_manager_says_page_ids_and_keeps_vllms_name_as_an_alias():
    assert KVCacheManager.block_table is KVCacheManager.page_ids
