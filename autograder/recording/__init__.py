"""The recording: the boundary between a check and the student's code, kept as plain data and replayed.

A check talks to student code through objects: it calls the adapter, calls methods on what that
returns, reads attributes, plugs it into an engine that calls it in turn; and student code calls
back into the grader's objects (an engine, a model, a request, a kv manager). A membrane
(`machine.Membrane`) stands between the two worlds:

- every student object the grader's side sees is a proxy (an *S-handle*), every grader object
  the student's side sees is a proxy too (a *G-handle*), each numbered in order of appearance
  (`proxy`);
- values that are data (None, bool, int, float, str, bytes, tuples, lists, dicts, sets, tensors,
  numpy arrays, course_lib enums and course_lib dataclasses) cross as copies, never as live objects
  (`codec`), with one exception: a list, dict or set the student's side *reaches inside* a grader
  object (an attribute, an item, the next element, what a container's own method hands out: a
  request's `output_token_ids`, a kv manager's `tables`) is grader state, and crosses live as a
  G-handle, so that the student's `output.append(token)` changes the grader's own list (an `O`
  event, re-done in replay) instead of a copy that nobody reads; iterating a grader container whose
  elements are not containers themselves takes one snapshot (one event) rather than one event per
  element (`operations.crossing`). A grader object's own state (a course_lib `Request`) is never
  copied to the student's side: it is a G-handle, so every change the student's code (or course_lib
  code it inherits, running on the student's side) makes to it is an event;
- in RECORD mode (inside the sandbox, in the student's kernel) each crossing is an event: the
  grader's side asks (`S`: handle, operation, a digest of the arguments) and the student's side
  answers (`Sr` with the result, or `Sx` with the exception, `exceptions_as_data`), and in between
  the student's code may ask the grader's side (`O`: handle, operation, the arguments in full) and
  get answers (`Or` / `Ox`). An operation without arguments (most are: an attribute, `len`, `next`)
  carries no `a` at all, and an answer whose arguments nobody changed no `m`: an event of plain
  values is smaller to write and read, and no work for the garbage collector;
- in REPLAY mode (in the grader's own process) the same check runs on the same seed against a
  stub: each question the check asks must be the next `S` event (same handle, operation and
  argument digest), the student's calls back into the grader's objects are re-done on the
  grader's real objects (so an engine's state, a model's forward passes, a pool's pages evolve
  exactly as they did), and the answer is the recorded one. The verdict is the replay's.

A record that does not match what the check asks raises `Divergence` (`errors`), a BaseException so
that a check's `except Exception` cannot mistake it for the student's error; once diverged, the
membrane stays poisoned and the verdict is a failure. Nothing read from a record is ever unpickled:
tensors travel as raw little-endian bytes (base64) with dtype and shape.

The modules, lowest first: `errors` (what stops a recording), `active` (the membrane of the check
call in progress, a context variable), `class_names` (the classes a record may name), `operations`
(what one side can ask of an object on the other side), `proxy` (proxies and their handles),
`codec` (values as JSON-able data), `exceptions_as_data`, `machine` (the event machine).
`autograder.membrane` re-exports the public names. This package imports nothing of the checks:
what it needs of them (failing a check, describing an exception) is handed to it.
"""
