"""Trip wires notice every way of reaching a module's code, cost nothing after, and nest.

`forbid_calls` learns from them whether a student's function ran the exercise's reference; they
replaced a profile hook that doubled the recorded checks (autograder/call_tripwire.py).
"""
from __future__ import annotations

import functools
import importlib.util
import sys
import threading

import pytest

from autograder.call_tripwire import tripwires

SOURCE = '''
import functools

def plain(x):
    return x + 1

def recursive(n):
    return 0 if n == 0 else 1 + recursive(n - 1)

def factory(k):
    def made(x):
        return x * k
    return made

def decorated_inner(x):
    return -x

decorated = functools.lru_cache(maxsize=None)(decorated_inner)

class Base:
    def hello(self):
        return "base"

class Pool(Base):
    def __init__(self, n):
        self.n = n

    def hello(self):
        return "pool+" + super().hello()

    @staticmethod
    def static(x):
        return x

    @classmethod
    def build(cls, n):
        return cls(n)

    @property
    def size(self):
        return self.n

    class Inner:
        def deep(self):
            return 7

def gen(n):
    yield from range(n)

def keywords(a, *, b=2):
    return a + b
'''


@pytest.fixture()
def reference(tmp_path):
    path = tmp_path / "reference_mod.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("reference_mod", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_mod"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["reference_mod"]


def names(hits):
    return [name for _, name in hits]


def test_every_way_of_reaching_the_code_trips_a_wire(reference):
    plain = reference.plain  # a name taken before the block
    made_before = reference.factory(3)  # a closure made before the block
    pool = reference.Pool(4)  # an instance made before
    bound, partial = pool.hello, functools.partial(reference.plain, 1)
    with tripwires([reference], []) as hits:
        assert plain(1) == 2 and partial() == 2
        assert made_before(2) == 6
        assert bound() == "pool+base"  # super() without arguments: the __class__ cell kept
        assert reference.Pool.static(5) == 5 and reference.Pool.build(2).size == 2
        assert reference.Pool.Inner().deep() == 7
        assert list(reference.gen(3)) == [0, 1, 2]
        assert reference.keywords(1) == 3 and reference.keywords(1, b=5) == 6
        assert reference.recursive(3) == 3
        assert reference.decorated(4) == -4
    called = names(hits)
    for name in ("plain", "made", "hello", "static", "build", "__init__", "size", "deep", "gen", "keywords",
                 "decorated_inner"):
        assert name in called, (name, called)
    assert called.count("recursive") == 4 and called.count("plain") == 2
    assert all(module == "reference_mod" for module, _ in hits)


def test_after_the_block_nothing_is_noted_and_the_code_is_the_original(reference):
    codes = (reference.plain.__code__, reference.Pool.hello.__code__)
    with tripwires([reference], []) as hits:
        assert reference.plain.__code__ is not codes[0]
    assert (reference.plain.__code__, reference.Pool.hello.__code__) == codes
    assert not [k for k in vars(reference) if k.startswith("__ag_tripwire")], "a trampoline's name was left behind"
    reference.plain(1)
    assert hits == []


def test_a_raising_block_and_a_raising_function_leave_no_wire(reference):
    code = reference.plain.__code__
    with pytest.raises(TypeError):
        with tripwires([reference], []) as hits:
            reference.plain("x")  # "x" + 1 raises inside the original
    assert names(hits) == ["plain"] and reference.plain.__code__ is code


def test_blocks_nest_and_other_code_is_not_noted(reference):
    with tripwires([reference], []) as outer:
        reference.plain(1)
        with tripwires([reference], []) as inner:
            reference.Pool(1).hello()
        reference.plain(2)
        len([1, 2])  # not the module's code
    assert names(outer) == ["plain", "__init__", "hello", "hello", "plain"]  # Pool.hello, then Base.hello
    assert names(inner) == ["__init__", "hello", "hello"]
    assert reference.plain.__code__.co_filename.endswith("reference_mod.py")


def test_calls_from_other_threads_are_noted(reference):
    with tripwires([reference], []) as hits:
        t = threading.Thread(target=reference.plain, args=(1,))
        t.start()
        t.join()
    assert names(hits) == ["plain"]


def test_hits_are_capped(reference):
    with tripwires([reference], []) as hits:
        for i in range(1500):
            reference.plain(i)
    assert len(hits) == 1000


def test_a_single_function_is_watched_without_the_rest_of_its_module(reference):
    with tripwires([reference.Pool.hello], []) as hits:
        pool = reference.Pool(2)
        assert pool.hello() == "pool+base" and reference.plain(1) == 2
    assert hits == [("reference_mod", "hello")]  # Pool.hello only: not __init__, Base.hello or plain


def test_a_wired_function_looks_like_the_original_to_introspection(reference):
    import inspect

    before = {name: (inspect.signature(getattr(reference, name)), inspect.getsource(getattr(reference, name)))
              for name in ("plain", "keywords", "recursive")}
    with tripwires([reference], []) as hits:
        for name, seen in before.items():
            fn = getattr(reference, name)
            assert (inspect.signature(fn), inspect.getsource(fn)) == seen, name
        assert reference.keywords(1, b=3) == 4 and reference.keywords(a=2) == 4
        with pytest.raises(TypeError):
            reference.keywords(1, 2)  # b is keyword-only, as in the original
    assert names(hits) == ["keywords", "keywords"]  # the refused call never got past its arguments


def test_a_copy_of_the_module_made_before_the_block_trips_a_wire_even_when_frozen(reference):
    """`runpy.run_path` of the module's file makes new function objects that no import path names; the
    recording freezes the heap (gc.freeze) before the check runs, which hides them from a heap scan."""
    import gc
    import runpy

    with tripwires([reference], []):  # a first block: the module's functions are looked up (and cached)
        pass
    copy = runpy.run_path(reference.__file__)  # the module's code runs a second time
    gc.freeze()
    try:
        with tripwires([reference], []) as hits:
            assert copy["plain"](1) == 2
    finally:
        gc.unfreeze()
    assert names(hits) == ["plain"], hits


def test_the_module_run_again_inside_the_block_is_noted(reference):
    """(`importlib.reload`, `runpy.run_path`, `exec` of its code: each runs the module's code.)"""
    import runpy

    with tripwires([reference], []) as hits:
        fresh = runpy.run_path(reference.__file__)
    assert ("reference_mod", "<its module code, run again>") in hits, hits
    assert fresh["plain"](1) == 2


def test_another_module_run_inside_the_block_is_not_noted(reference, tmp_path):
    import runpy

    other = tmp_path / "other_mod.py"
    other.write_text("def f():\n    return 1\n")
    with tripwires([reference], []) as hits:
        assert runpy.run_path(str(other))["f"]() == 1
    assert hits == []


def test_a_function_made_by_hand_from_the_code_trips_a_wire(reference):
    """`types.FunctionType` of a function's code, the same object, a `.replace()`d one under another file
    name, or one through `marshal`: new function objects no import names (the seventh red team)."""
    import marshal
    import types

    code = reference.plain.__code__
    same = types.FunctionType(code, {})
    renamed = types.FunctionType(code.replace(co_filename="mine.py"), {})
    thawed = types.FunctionType(marshal.loads(marshal.dumps(code)), {})
    with tripwires([reference], []) as hits:
        assert same(1) == 2 and renamed(1) == 2 and thawed(1) == 2
    assert names(hits) == ["plain", "plain", "plain"] and {m for m, _ in hits} == {"reference_mod"}, hits


def test_the_wires_stand_in_taken_by_code_notes_every_call(reference):
    """The stand-in the wire calls sits in the module's globals while the block is open: code that takes
    it (once, or afresh at every call) still calls something that notes."""
    import unittest.mock

    kept = []
    with tripwires([reference], []) as hits:
        key = next(n for n in reference.plain.__code__.co_names if n.startswith("__ag_tripwire"))
        kept.append(vars(reference)[key])
        assert unittest.mock.Mock(side_effect=kept[0])(1) == 2
    assert names(hits) == ["plain"], hits
    with tripwires([reference], []) as later:
        assert kept[0](1) == 2
    assert names(later) == ["plain"], later


def test_a_block_ended_by_an_exception_leaves_the_next_block_as_it_was(reference):
    with pytest.raises(TypeError):
        with tripwires([reference], []):
            reference.plain("x")
    with tripwires([reference], []) as hits:
        assert reference.plain(1) == 2
    assert names(hits) == ["plain"], hits


def test_a_generator_left_unfinished_after_the_block_is_noted_once(reference):
    """Its frame holds the copy it runs until it finishes (a harness may consume it later)."""
    with tripwires([reference], []) as hits:
        unfinished = reference.gen(3)
        assert next(unfinished) == 0
    assert names(hits) == ["gen"], hits
    assert list(unfinished) == [1, 2]


def test_a_function_given_the_code_by_assignment_trips_a_wire(reference):
    """`own.__code__ = course_lib_function.__code__` made before the block (the eighth red team)."""
    def own(x):
        return 0

    own.__code__ = reference.plain.__code__
    with tripwires([reference], []) as hits:
        assert own(1) == 2
    assert names(hits) == ["plain"], hits


def _swap_nested(code, nested):
    """`code` with its nested code objects (a placeholder `def`) swapped for `nested`."""
    import types

    return code.replace(co_consts=tuple(nested if isinstance(c, types.CodeType) else c for c in code.co_consts))


def test_a_function_that_holds_the_code_among_its_constants_trips_a_wire(reference):
    """A function of one's own whose constants are swapped for course_lib's code objects
    (`code.replace(co_consts=...)`): each call makes a function of that code, as a nested `def` does, with
    no audit event and no wire (the ninth red team); also with the nested code relabelled to the host's
    own file, which leaves its bytecode and names."""
    import types

    with tripwires([reference], []):  # (the audit hook is installed by the first block)
        pass

    def host(x):
        def placeholder():
            pass

        return placeholder(x)

    held = types.FunctionType(_swap_nested(host.__code__, reference.plain.__code__), {})
    relabelled_code = reference.plain.__code__.replace(co_filename=host.__code__.co_filename)
    held_relabelled = types.FunctionType(_swap_nested(host.__code__, relabelled_code), {})
    with tripwires([reference], []) as hits:
        assert held(1) == 2 and held_relabelled(1) == 2
    assert names(hits) == ["host", "host"] and {m for m, _ in hits} == {"reference_mod"}, hits


def test_a_function_with_the_same_bytecode_and_other_names_is_not_a_copy(reference):
    """Once a copy was made, later blocks search the heap for functions of the watched bytecode: a
    function of the same shape that uses other names (`return self.m` beside `Pool.size`'s `return
    self.n`, as the standard library's `Queue._qsize` beside course_lib's) is not one, and is not wired."""
    import types

    class Other:
        def __init__(self):
            self.m = 5

        @property
        def size(self):
            return self.m

    assert Other.size.fget.__code__.co_code == reference.Pool.size.fget.__code__.co_code  # (the same shape)
    with tripwires([reference], []):  # (the audit hook is installed by the first block)
        pass
    copy, pool, other = types.FunctionType(reference.Pool.size.fget.__code__, {}), reference.Pool(3), Other()
    with tripwires([reference], []) as hits:
        assert other.size == 5
        assert copy(pool) == 3
    assert names(hits) == ["size"], hits
