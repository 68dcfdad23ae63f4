"""The operator commands of the CLI: ``status``, ``dlq``, ``cancel`` and ``consumers``
(docs/operations.md#status, #dead-letters, #cancelling-a-stream, #consumer-names).

Each one connects like ``streamjobs worker`` (same URL options and precedence), does
its work through :class:`~streamjobs.Inspector`, :class:`~streamjobs.DeadLetters` or
the :class:`~streamjobs.Producer`, prints a table (or ``--json``) and exits: 0 done,
1 an error Redis or the service reported (an unknown service, say), 2 bad input. Every
error is one line, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

import anyio
import anyio.abc

from ._cli_errors import UsageError
from ._deadletter import DeadLetterRecord
from ._keys import DEFAULT_PREFIX, Keys
from ._redis._gateway import Gateway
from ._redis._operator import owner_of
from .dlq import DeadLetterFilter, DeadLetters, ReplayReport
from .exceptions import StreamJobsError
from .inspector import Inspector, Overview
from .producer import CancelOutcome, Producer

PROGRESS_FROM = 200
"""Replays and purges of more dead letters than this show a progress bar."""
TABLE_ROWS = 50
"""Rows per table in the human ``status`` output (``--json`` has them all)."""


def add_connection_args(p: argparse.ArgumentParser, env_var: str, default_url: str) -> None:
    p.add_argument("--service", required=True)
    p.add_argument(
        "--redis-url", default=None, help=f"Redis URL (else ${env_var}, else {default_url})"
    )
    p.add_argument(
        "--redis-url-file", default=None, metavar="PATH", help="read the URL from a file"
    )
    p.add_argument("--cluster", action="store_true", help="connect to an OSS Redis Cluster")
    p.add_argument("--key-prefix", default=DEFAULT_PREFIX, help="the consumers' key_prefix")
    p.add_argument("--dlq-stream", default=None, help="the consumers' dlq_stream, if set")


def add_commands(sub: Any, env_var: str, default_url: str) -> None:
    """Register ``status``, ``dlq``, ``cancel`` and ``consumers``."""
    p = sub.add_parser("status", help="who owns what, what waits, what died")
    add_connection_args(p, env_var, default_url)
    p.add_argument("--json", action="store_true", help="print the stable JSON form")
    p.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C",
    )

    dlq = sub.add_parser("dlq", help="inspect, replay or purge dead letters")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    for name, text in (
        ("list", "list dead letters (oldest first)"),
        ("show", "show dead letters in full"),
        ("replay", "put dead letters back and remove them"),
        ("purge", "delete dead letters for good"),
    ):
        q = dsub.add_parser(name, help=text)
        add_connection_args(q, env_var, default_url)
        q.add_argument("ids", nargs="*", metavar="ID", help="dead-letter ids (else: the filters)")
        q.add_argument(
            "--reason",
            default=None,
            help="only this _dlq_reason, or dead letters a handler rejected with this text",
        )
        q.add_argument("--source-stream", default=None, help="only from this stream")
        q.add_argument("--older-than", type=float, default=None, metavar="SECONDS")
        q.add_argument("--newer-than", type=float, default=None, metavar="SECONDS")
        q.add_argument("--limit", type=int, default=None)
        q.add_argument("--json", action="store_true")
        if name in ("replay", "purge"):
            q.add_argument("--dry-run", action="store_true", help="say what would be done")
            q.add_argument(
                "--all",
                action="store_true",
                help="every dead letter, when no ID or filter is given",
            )
        if name == "purge":
            q.add_argument(
                "--yes",
                action="store_true",
                help="purge --all without asking (it asks on a terminal, and refuses elsewhere)",
            )

    c = sub.add_parser("cancel", help="cancel a data stream's job")
    add_connection_args(c, env_var, default_url)
    c.add_argument("stream", metavar="STREAM")
    c.add_argument("--reason", default="", help="handed to on_stream_cancelled")

    cons = sub.add_parser("consumers", help="manage consumer names")
    csub = cons.add_subparsers(dest="consumers_command", required=True)
    prune = csub.add_parser("prune", help="remove dead consumer names with nothing pending")
    add_connection_args(prune, env_var, default_url)
    prune.add_argument("--dry-run", action="store_true")
    prune.add_argument("--json", action="store_true")


def _filter(ns: argparse.Namespace) -> DeadLetterFilter | None:
    given = any(
        v is not None for v in (ns.reason, ns.source_stream, ns.older_than, ns.newer_than, ns.limit)
    )
    if not given:
        return None
    return DeadLetterFilter(
        reason=ns.reason,
        source_stream=ns.source_stream,
        older_than_s=ns.older_than,
        newer_than_s=ns.newer_than,
        limit=ns.limit,
    )


def _record_json(record: DeadLetterRecord) -> dict[str, Any]:
    out = dataclasses.asdict(record)
    out["reason"] = None if record.reason is None else record.reason.value
    out["kind"] = "assignment" if record.is_assignment else "entry"
    out["fields"] = dict(record.fields)
    return out


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _cut(value: str, width: int) -> str:
    return value if len(value) <= width else value[: width - 1] + "…"


def table(
    rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO, indent: str = "  "
) -> None:
    """A plain left-aligned table."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
        out.write(f"{indent}{line}".rstrip() + "\n")


def _more(total: int, shown: int, out: TextIO) -> None:
    if total > shown:
        out.write(f"  ... {total - shown} more (--json lists them all)\n")


def print_overview(view: Overview, out: TextIO) -> None:
    if view.groups and not (view.consumers or view.streams or view.pending or view.queued):
        # Only GroupConsumers ran: the assignment tables would all be empty.
        pending = sum(g.pending for g in view.groups)
        out.write(
            f"service {view.service}: shared groups on {_plural(len(view.groups), 'stream')}, "
            f"{pending} pending; {view.dlq.length} dead letter(s)\n"
        )
        _print_groups(view, out)
        _print_dead_letters(view, out)
        return
    oldest = ""
    if view.streams or view.pending:  # else nothing is pending: no age to give
        oldest = f"; oldest pending {view.oldest_pending_age_s:.1f}s"
    out.write(
        f"service {view.service}: {len(view.streams)} owned, {len(view.pending)} pending "
        f"without an owner, {view.queued} queued{oldest}; {view.dlq.length} dead "
        "letter(s)\n\n"
    )
    out.write(f"consumers ({len(view.consumers)})\n")
    rows: list[tuple[Any, ...]] = [
        (c.name, c.state, f"{c.idle_s:.1f}s", c.owned_streams, c.pending)
        for c in view.consumers[:TABLE_ROWS]
    ]
    table(rows, ("name", "state", "idle", "owned", "pending"), out)
    _more(len(view.consumers), TABLE_ROWS, out)
    out.write(f"\nowned streams ({len(view.streams)})\n")
    rows = [
        (
            _cut(s.stream, 40), s.owner, f"{s.lock_ttl_s:.1f}s", _or_dash(s.pending),
            _or_dash(s.lag), s.retry_count, f"{s.owned_for_s:.0f}s",
        )
        for s in view.streams[:TABLE_ROWS]
    ]  # fmt: skip
    table(rows, ("stream", "owner", "lock ttl", "pending", "lag", "retries", "owned for"), out)
    _more(len(view.streams), TABLE_ROWS, out)
    out.write(f"\npending without an owner ({len(view.pending)})\n")
    rows = [
        (p.assignment_id, _cut(p.stream, 40), p.consumer, f"{p.idle_s:.1f}s", p.retry_count)
        for p in view.pending[:TABLE_ROWS]
    ]
    table(rows, ("assignment", "stream", "delivered to", "idle", "retries"), out)
    _more(len(view.pending), TABLE_ROWS, out)
    if view.groups:
        _print_groups(view, out)
    _print_dead_letters(view, out)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _print_groups(view: Overview, out: TextIO) -> None:
    out.write(f"\nshared groups ({_plural(len(view.groups), 'stream')})\n")
    rows: list[tuple[Any, ...]] = [
        (
            _cut(g.stream, 40), g.count("alive"), g.count("stopped"), g.count("dead"),
            g.pending, _or_dash(g.lag),
            f"{g.oldest_pending_age_s:.1f}s" if g.pending else "-",
        )
        for g in view.groups[:TABLE_ROWS]
    ]  # fmt: skip
    table(rows, ("stream", "alive", "stopped", "dead", "pending", "lag", "oldest"), out)
    _more(len(view.groups), TABLE_ROWS, out)
    members = [(g.stream, m) for g in view.groups for m in g.members]
    out.write(f"\ngroup members ({len(members)})\n")
    rows = [
        (_cut(stream, 40), m.member, m.state, m.pending,
         "-" if m.idle_s is None else f"{m.idle_s:.1f}s")
        for stream, m in members[:TABLE_ROWS]
    ]  # fmt: skip
    table(rows, ("stream", "member", "state", "pending", "idle"), out)
    _more(len(members), TABLE_ROWS, out)


def _print_dead_letters(view: Overview, out: TextIO) -> None:
    out.write(f"\ndead letters ({view.dlq.length} in {view.dlq.stream})\n")
    table(list(view.dlq.by_reason.items()), ("reason", "count"), out)
    if view.dlq.counted < view.dlq.length:
        out.write(f"  (counted over the newest {view.dlq.counted})\n")


def _inspector(client: Any, ns: argparse.Namespace) -> Inspector:
    return Inspector(client, service=ns.service, key_prefix=ns.key_prefix, dlq_stream=ns.dlq_stream)


async def run_status(client: Any, ns: argparse.Namespace, out: TextIO) -> int:
    inspector = _inspector(client, ns)
    if ns.watch is not None and ns.watch <= 0:
        raise UsageError(f"--watch: must be a number of seconds above 0, got {ns.watch}")
    if ns.watch is None:
        await _show_status(inspector, ns, out)
        return 0
    # SIGINT and SIGTERM end --watch with status 0, handled here rather than left to
    # Python's KeyboardInterrupt: a process started in the background of a script
    # inherits SIGINT ignored, and would then never stop on it.
    async with anyio.create_task_group() as tg:
        await tg.start(_stop_on_signal, tg.cancel_scope)
        while True:
            await _show_status(inspector, ns, out)
            await anyio.sleep(ns.watch)
    return 0


async def _stop_on_signal(
    scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return


async def _show_status(inspector: Inspector, ns: argparse.Namespace, out: TextIO) -> None:
    view = await inspector.overview()
    if ns.watch is not None and out.isatty():
        out.write("\x1b[H\x1b[2J")  # home and clear: refresh in place
    if ns.json and ns.watch is not None:
        # JSON Lines: one document per refresh, on one line, flushed at once, so that
        # a reader (jq, a log shipper) sees each as it comes.
        out.write(json.dumps(view.to_json(), separators=(",", ":")) + "\n")
    elif ns.json:
        out.write(json.dumps(view.to_json(), indent=2) + "\n")
    else:
        print_overview(view, out)
    out.flush()
    out.flush()


@contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int], None]]:
    """A callback for ``progress=``, drawing a tqdm bar (on stderr) once the work is
    larger than :data:`PROGRESS_FROM`."""
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if total <= PROGRESS_FROM:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=what, unit="letter", file=sys.stderr)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


async def run_dlq(client: Any, ns: argparse.Namespace, out: TextIO) -> int:
    letters = DeadLetters(
        client, service=ns.service, key_prefix=ns.key_prefix, dlq_stream=ns.dlq_stream
    )
    await _inspector(client, ns).check_service(queued_only=True)
    selection = _filter(ns)
    if ns.ids and selection is not None:
        raise UsageError("give dead-letter IDs or filters, not both")
    command = ns.dlq_command
    if command in ("list", "show"):
        if ns.ids:
            records = [r for r in [await letters.get(i) for i in ns.ids] if r is not None]
            missing = [i for i in ns.ids if i not in {r.id for r in records}]
            if missing:
                raise UsageError(f"no such dead letter: {', '.join(missing)}")
        else:
            records = await letters.select(selection or DeadLetterFilter())
        if ns.json or command == "show":
            out.write(json.dumps([_record_json(r) for r in records], indent=2) + "\n")
        else:
            rows = [
                (
                    r.id, r.reason.value if r.reason else "?",
                    "assignment" if r.is_assignment else "entry",
                    _cut(r.source_stream, 40), _when(r.dead_at_ms), _cut(r.error, 60),
                )
                for r in records
            ]  # fmt: skip
            table(rows, ("id", "reason", "kind", "source", "dead at", "error"), out, indent="")
            out.write(f"{len(records)} dead letter(s)\n")
        return 0
    if not ns.ids and selection is None and not ns.all:
        raise UsageError(f"dlq {command}: give dead-letter IDs, a filter, or --all")
    target: Sequence[str] | DeadLetterFilter = ns.ids or selection or DeadLetterFilter()
    if command == "replay":
        with progress_bar("replaying") as update:
            report: ReplayReport = await letters.replay(target, dry_run=ns.dry_run, progress=update)
        if ns.json:
            out.write(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
        else:
            for r in report.replayed:
                where = r.target + (" (re-assigned)" if r.reassigned else "")
                out.write(f"{r.dead_letter_id} -> {where} {r.new_id}".rstrip() + "\n")
            for dead_letter_id, why in report.skipped:
                out.write(f"{dead_letter_id} skipped: {why}\n")
            done = "would replay" if ns.dry_run else "replayed"
            out.write(f"{done}: {len(report.replayed)}, skipped: {len(report.skipped)}\n")
        return 0
    if ns.all and not (ns.ids or selection) and not ns.dry_run and not ns.yes:
        await _confirm_purge_all(letters, ns)
    with progress_bar("purging") as update:
        ids = await letters.purge(target, dry_run=ns.dry_run, progress=update)
    if ns.json:
        out.write(json.dumps({"purged": ids, "dry_run": ns.dry_run}, indent=2) + "\n")
    else:
        out.write(f"{'would purge' if ns.dry_run else 'purged'}: {len(ids)}\n")
    return 0


async def _confirm_purge_all(letters: DeadLetters, ns: argparse.Namespace) -> None:
    """``dlq purge --all`` deletes what cannot be recovered: ask on a terminal; refuse
    without one (a script must say ``--yes``).

    Raises:
        UsageError: not confirmed.
    """
    count = len(await letters.purge(DeadLetterFilter(), dry_run=True))
    what = f"all {count} dead letter(s) of service {ns.service!r}"
    if not sys.stdin.isatty():
        raise UsageError(f"dlq purge --all would delete {what}: add --yes to confirm")
    answer = await anyio.to_thread.run_sync(input, f"delete {what} for good? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("dlq purge --all: not confirmed; nothing deleted")


async def run_cancel(client: Any, ns: argparse.Namespace, out: TextIO) -> int:
    producer = Producer(client, service=ns.service, key_prefix=ns.key_prefix)
    await _inspector(client, ns).check_service(queued_only=True)
    outcome = await producer.cancel_stream(ns.stream, ns.reason)
    if outcome is CancelOutcome.NOT_FOUND:
        raise StreamJobsError(
            f"{ns.stream}: not found: no unfinished assignment and no lock in service "
            f"{ns.service!r}; nothing done"
        )
    messages = {
        CancelOutcome.REMOVED: "removed its queued assignment",
        CancelOutcome.SIGNALLED: "its owner ends it within one read batch",
    }
    out.write(f"{ns.stream}: {outcome.value}: {messages[outcome]}\n")
    return 0


async def prune_consumer_names(client: Any, keys: Keys, *, dry_run: bool) -> dict[str, list[str]]:
    """Dead consumer names (no live session, no lock, nothing pending) removed from the
    assignment group and from the groups of the streams the active index names:
    {stream: [names]} (with ``dry_run``, what would be)."""
    gw = Gateway(client, keys)
    consumers = await gw.operator.consumers()
    alive = set()
    for c, live in zip(
        consumers, await gw.operator.sessions([c.name for c in consumers]), strict=True
    ):
        if live:
            alive.add(c.name)
    pending = await gw.operator.pending_all(100_000)
    fields = await gw.operator.assignment_fields([p.id for p in pending])
    from ._wire import stream_name_of

    streams = sorted({stream_name_of(f) for f in fields if f} - {""})
    streams += [s for s in await gw.operator.indexed_streams() if s not in set(streams)]
    for row in await gw.operator.stream_rows(streams):
        if row.holder:
            alive.add(owner_of(row.holder))
    out: dict[str, list[str]] = {}
    lbs = [c.name for c in consumers if c.name not in alive and c.pending == 0]
    out[keys.assignments] = lbs if dry_run else await gw.operator.prune_names(keys.assignments, lbs)
    for stream, names in zip(streams, await gw.operator.group_consumers(streams), strict=True):
        dead = [n for n, p in names if n not in alive and p == 0]
        if dead:
            out[stream] = dead if dry_run else await gw.operator.prune_names(stream, dead)
    return {k: v for k, v in out.items() if v}


async def run_consumers(client: Any, ns: argparse.Namespace, out: TextIO) -> int:
    keys = Keys(ns.service, ns.key_prefix)
    inspector = Inspector(client, service=ns.service, key_prefix=ns.key_prefix)
    await inspector.check_service()
    pruned = await prune_consumer_names(client, keys, dry_run=ns.dry_run)
    if ns.json:
        out.write(json.dumps({"pruned": pruned, "dry_run": ns.dry_run}, indent=2) + "\n")
        return 0
    total = sum(len(v) for v in pruned.values())
    for stream, names in pruned.items():
        out.write(f"{stream}: {', '.join(names)}\n")
    out.write(f"{'would remove' if ns.dry_run else 'removed'} {total} consumer name(s)\n")
    return 0
