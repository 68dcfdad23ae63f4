"""Chaos soak of streamjobs: ``python -m soak [--target standalone|cluster] ...``.

A fleet of ``streamjobs worker soak.worker:SoakWorker`` processes consumes streams that
a producer writes at a steady rate, while faults are injected at random (seeded): kill
-9, SIGSTOP past the lock TTL then SIGCONT, SIGTERM of a consumer (each replaced by a
new process), kill -9 of the standalone server (restarted from its AOF) or of a cluster
primary (restarted once failed over), and ``CLIENT KILL TYPE normal`` on the data
nodes. Then production and faults stop, the fleet drains, stops gracefully, and the
whole history is checked. Usage and example output: ``soak/README.md``.

Modules: :mod:`soak.worker` (the consumer and its records), :mod:`soak.produce`
(the producer), :mod:`soak.stores` (the private server or cluster),
:mod:`soak.history` (the rules below, pure), :mod:`soak.runner` (the run and the
report), :mod:`soak.repro` (stand-alone reproductions of the defects the soak found).

Records
-------
Every ``handle()`` call pushes an *enter* record before its work and an *exit* record
(``ok``, ``error`` or ``cancel``) after it, each an awaited ``RPUSH`` to a side Redis
the chaos never touches, so they survive kill -9 of the worker. A call without an exit
record was cut off by its process's death; it is taken to last until that death (the
soak knows when it killed the process). ``on_stream_start``, ``on_stream_lost`` and
``on_stream_end`` are recorded too. Timestamps are wall-clock nanoseconds, read in the
worker processes of one machine.

An *ownership episode* is what one consumer does with one stream after one
``on_stream_start()``: each acquisition of the lock starts a new episode, even by a
consumer that owned the stream before. A call belongs to the episode its stream was in
when the call entered.

Exclusive ownership: the rule
-----------------------------
streamjobs promises that no two consumers run ``handle()`` on one stream at once,
except for the single call a disowned consumer had already started, and that a
consumer hands nothing more of a stream to ``handle()`` once it lost it. Checked as:

1. **No stale call.** A call of episode E must not enter after another episode E' of
   the same stream began (E' began after E): E' began only once E's lock was gone, so
   E's consumer had lost the stream. *Exception:* the call's process was SIGSTOPped
   when E' began and the call is the first one E entered after the SIGCONT (the call
   had passed its lease check just before the stop and read its clock only after it).
2. **No overlap within an episode.** Calls of one episode never overlap (a stream is
   handled one entry at a time).
3. **Overlaps across episodes only for the in-flight call.** Two calls of different
   episodes *overlap* if each entered before the other ended. The overlap is excused
   -- it is the disowned consumer's single in-flight call -- iff one of the two, ``x``,
   is the last call its episode ever entered and ``x`` was in flight when the other
   call's episode began: ``x`` entered before that episode's ``on_stream_start``, or the
   SIGSTOP exception of rule 1 applies to ``x``. (Without a SIGSTOP, ``x`` is always the
   call that entered first.) Any other overlap is a violation.

The soak fails on any violation and prints the count of excused overlaps.

The other checks
----------------
* **Nothing lost:** every entry produced (the producer writes each exactly once and
  knows its id; the streams are read back at the end too) is handled (a call for it
  returned), or dead-lettered itself, or belongs to a stream whose assignment was
  dead-lettered by recovery (``max_retries_exceeded``: the stream is abandoned).
* **Order:** within one episode, calls enter in id order; the same id again only
  after a call that did not return (a retry).
* **No finished stream started again:** no episode begins after another one ended the
  stream (``on_stream_end``): that would be a second job for a finished stream, which
  never gets an end marker.
* **Dead letters:** only ``poison`` entries (which always raise) are dead-lettered as
  entries. Counts by reason are printed.
* **Nothing left behind** once drained: no lock keys, no queued or pending
  assignments, no lease members, no active-assignment index entries; no pending
  entries in a data stream's group, and every finished data stream carries its
  retention TTL (except streams abandoned by recovery).
* **Processes:** every worker exits only when the soak ends it: status -9 for kill -9,
  0 after a SIGTERM, 0 at the final graceful stop; a worker that exits by itself is a
  failure (and is replaced). ``ERROR`` and ``Traceback`` lines in worker logs are counted
  and shown.
* **Drain:** after the fault phase, everything finishes within ``--drain-timeout-s``.

Duplicates (an entry handled more than once) are counted, not failed: delivery is at
least once (a crashed owner's unacked batch, a disowned consumer's in-flight call).
"""
