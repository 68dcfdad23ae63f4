"""Chaos soak of streamjobs: ``python -m tests.soak [--target standalone|cluster] ...``.

A fleet of ``streamjobs worker tests.soak.worker:SoakWorker`` processes, half of them with
``Liveness.LOCK`` and half with ``Liveness.SESSION``, consumes jobs that a producer
writes at a steady rate, while faults are injected at random (seeded): kill -9, SIGSTOP
past the lock TTL then SIGCONT, SIGTERM of a consumer (each replaced by a new process),
kill -9 of the standalone server (restarted from its AOF) or of a cluster primary
(restarted once failed over), and ``CLIENT KILL TYPE normal`` on the data nodes.

The producer's mix (``--mix``) adds the cases where features meet: stream names come
from a bounded pool, so each name carries one job after another (``reuse``); some jobs
are cancelled (``cancel``), some are ended early by their handler calling
``finish()`` (``finish``), and a job that ended early may still get a few entries
afterwards, which belong to it and must never reach a later job of the name; some
entries are rejected by the handler (``DeadLetter``) and replayed from the
dead-letter stream every few seconds and during the drain (``reject``). Every job has
a soak-wide number ``n``: ``info={"job": n, ...}``, and each of its entries carries
``job=n``. Then production and faults stop, the fleet drains, stops gracefully, and
the whole history is checked. Usage and example output: ``tests/soak/README.md``.

Modules: :mod:`tests.soak.worker` (the consumer and its records), :mod:`tests.soak.produce`
(the producer), :mod:`tests.soak.stores` (the private server or cluster),
:mod:`tests.soak.history` (the rules below, pure), :mod:`tests.soak.runner` (the run, the replays
and the report), :mod:`tests.soak.repro` (stand-alone reproductions of the defects the soak
found).

Records
-------
Every ``handle()`` call pushes an *enter* record before its work and an *exit* record
(``ok``, ``error``, ``reject`` or ``cancel``) after it, each an awaited ``RPUSH`` to a
side Redis the chaos never touches, so they survive kill -9 of the worker. A call
without an exit record was cut off by its process's death; it is taken to last until
that death (the soak knows when it killed the process). The enter record carries the
entry's ``job`` field, ``message.info["job"]`` and ``message.replayed_from``.
``on_stream_start`` (with the job of its ``info``), ``on_stream_lost``,
``on_stream_end`` and ``on_stream_cancelled`` are recorded too. Timestamps are
wall-clock nanoseconds, read in the worker processes of one machine.

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

Jobs
----
A *job* is what one ``add_stream()`` of a name started: the entries appended to the
name from then until the job's end (its end marker, a cancel, or ``finish()`` after its
``finish=1`` entry). The producer numbers the jobs and knows, for every entry, its job
and its kind (plain, ``poison``, ``flaky``, ``reject``, ``finish``, or *tail*: appended
after its job's end point, i.e. after the cancel returned or after the finish entry).
Every check attributes entries to their job, never to a name: entry ids are unique
within a stream, and each produced entry belongs to one job. A replayed copy (a new
entry with ``_replayed_from``) counts for the entry it copies.

The other checks
----------------
* **No foreign entry:** every ``handle()`` call's entry has ``job`` equal to
  ``message.info["job"]``; a call where they differ handed an entry to a job it did
  not belong to (the leftovers of an ended job read by the next job of the name, a
  replayed copy run under another job's info). Must be 0.
* **Nothing lost:** every entry produced (the producer writes each exactly once and
  knows its id; the streams are read back at the end too) is handled (a call for it,
  or for a replayed copy of it, returned), or excused:

  - it is in the dead-letter stream (``handler_failed``: only poison entries);
  - its job's assignment was dead-lettered by recovery (``max_retries_exceeded``:
    the job is abandoned);
  - its job was cancelled (the rest of a cancelled job may be skipped, acked unhandled);
  - it lies after its job's finish entry, or it is a ``reject`` entry of a job
    finished early whose replayed copy went after the finish entry (skipped with the
    rest of the job).

  A ``reject`` entry is accounted for only once a replayed copy of it was handled:
  its dead letter does not excuse it. Tail entries are never lost.
* **Nothing handled past a job's end:** no tail entry is ever handled.
* **Replays:** the handler rejects only ``reject`` entries (the replayer selects them
  with ``DeadLetterFilter(reason="soak reject")``, the handler's text); after the drain
  no ``rejected`` dead letter is left.
* **Order:** within one episode, calls enter in id order; the same id again only
  after a call that did not return (a retry).
* **No finished job started again:** no episode of a job begins after another one
  ended that job (``on_stream_end`` or ``on_stream_cancelled``): that would be a second
  run of a finished job, which never gets an end marker. Episodes are grouped by stream
  and by the job in their ``info`` (a later job of a reused name is another job). A
  replay that queued a new assignment for the job (its dead entries' job info) starts
  a second run on purpose and excuses the episode that follows it.
* **Dead letters:** only ``poison`` entries are dead-lettered as ``handler_failed``,
  only ``reject`` entries as ``rejected``. Counts by reason are printed.
* **Nothing left behind** once drained: no lock keys, no queued or pending
  assignments, no lease members, no active-assignment index entries; no pending
  entries in a data stream's group, and every data stream carries its retention TTL
  (except streams of jobs abandoned by recovery).
* **Processes:** every worker exits only when the soak ends it: status -9 for kill -9,
  0 after a SIGTERM, 0 at the final graceful stop; a worker that exits by itself is a
  failure (and is replaced). ``ERROR`` and ``Traceback`` lines in worker logs are counted
  and shown.
* **Drain:** after the fault phase, everything finishes within ``--drain-timeout-s``.

Failures that come from a dead-letter replay are named apart in the summary (they
fail the run all the same): a foreign entry that is a replayed copy, or a tail entry of
a job a replay ran again after its early end (``foreign_replay``); such a tail entry
handled (``past_end_replay``); a ``reject`` entry whose replayed copy was never handled
(``lost_replay``); and, once such a tail reached a job, the foreign, lost and past-end
entries of that job and of the later jobs of its name (a tail that ends in an end
marker ends the job that reads it, which leaves its own entries to the next job). So
is a lease member left for an assignment that no longer exists (``stale_lease``).
Defects of streamjobs caused them, now fixed (``tests/soak/README.md``, "Defects it found",
items 4-7); the names stay so that a regression is recognised at once.

Duplicates (an entry handled more than once) are counted, not failed: delivery is at
least once (a crashed owner's unacked batch, a disowned consumer's in-flight call).
Entries skipped after a cancel or a finish are counted too.

The shared group's rules (``GroupConsumer`` workers on a few streams, beside the fleet
above) are in the docstring of ``tests/soak/groups.py``: ``group_lost``,
``group_dead_letters``, ``group_overlap`` and ``group_left_behind``.
"""
