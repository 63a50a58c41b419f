"""``txlog maintain``: compaction, retention and gc in a loop (admin/maintenance.py).

On a terminal it shows what the pass is doing and a line per pass; anywhere
else (a service manager's journal, a pipe) it prints one JSON object per
pass, so that its output can be collected and graphed without parsing prose.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..admin.maintenance import (DEFAULT_COMPACT_INTERVAL_S, DEFAULT_GC_INTERVAL_S,
                                 DEFAULT_JITTER, DEFAULT_RETENTION_INTERVAL_S,
                                 MaintenanceSettings, Maintainer, PassReport)
from ..partition.compaction import DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES
from .common import (CommandError, LeafParser, Progress, non_negative_int, open_log,
                     positive_int, positive_seconds)
from .maintenance import add_gc_ages


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 0 and below 1")
    return value


def add_maintain(commands: Any, leaf_parser: LeafParser) -> None:
    maintain = leaf_parser(
        commands, "maintain", help="run compaction, retention and gc in a loop",
        description="Run compaction, retention and gc, each on its own interval with random "
                    "jitter, until stopped (or for --passes / --once). Several maintainers "
                    "may run at once on one root, without any lock (docs/protocol.md, "
                    "section 7.2). A pass runs the steps that are due; the first runs all "
                    "three. On a terminal it shows progress and a line per pass; otherwise "
                    "it prints one JSON object per pass (--json forces that). A step that "
                    "fails on one partition is reported and the others go on; --once and "
                    "--passes exit with status 1 if any pass reported an error. Before "
                    "retention, the Iceberg table of each topic whose txlog.table.sync is "
                    "true is synced (as 'txlog tables sync'), then compacted and expired "
                    "by its properties (as 'txlog tables compact' and 'expire'); a topic "
                    "whose sync fails keeps its segments until a later pass.")
    maintain.add_argument("--topic", metavar="TOPIC", action="append",
                          help="only this topic (repeatable; default: every topic, listed "
                               "again on each pass)")
    maintain.add_argument("--compact-interval", metavar="SECONDS", type=positive_seconds,
                          default=DEFAULT_COMPACT_INTERVAL_S,
                          help=f"between compactions (default {DEFAULT_COMPACT_INTERVAL_S:g})")
    maintain.add_argument("--retention-interval", metavar="SECONDS", type=positive_seconds,
                          default=DEFAULT_RETENTION_INTERVAL_S,
                          help="between retention runs "
                               f"(default {DEFAULT_RETENTION_INTERVAL_S:g})")
    maintain.add_argument("--gc-interval", metavar="SECONDS", type=positive_seconds,
                          default=DEFAULT_GC_INTERVAL_S,
                          help=f"between gc runs (default {DEFAULT_GC_INTERVAL_S:g})")
    maintain.add_argument("--jitter", metavar="FRACTION", type=_fraction, default=DEFAULT_JITTER,
                          help="each interval is drawn between (1 - FRACTION) and "
                               f"(1 + FRACTION) times itself (default {DEFAULT_JITTER:g})")
    runs = maintain.add_mutually_exclusive_group()
    runs.add_argument("--once", action="store_true", help="one pass of all three steps, then exit")
    runs.add_argument("--passes", metavar="N", type=positive_int,
                      help="stop after N passes (default: run until stopped)")
    maintain.add_argument("--lag", metavar="N", type=non_negative_int, default=0,
                          help="compaction leaves the newest N offsets of each partition as "
                               "batch objects (default 0)")
    maintain.add_argument("--min-batches", metavar="N", type=positive_int,
                          default=DEFAULT_MIN_BATCHES,
                          help=f"compaction's --min-batches (default {DEFAULT_MIN_BATCHES})")
    maintain.add_argument("--compaction-buffer-bytes", metavar="BYTES", type=positive_int,
                          default=DEFAULT_BUFFER_BYTES,
                          help="compaction's --buffer-bytes (default "
                               f"{DEFAULT_BUFFER_BYTES})")
    add_gc_ages(maintain)  # gc's own options, for the gc step
    maintain.add_argument("--json", action="store_true",
                          help="one JSON object per pass even on a terminal")


def _line(report: PassReport) -> str:
    """A pass as a person reads it on a terminal."""
    parts = [f"pass {report.number}: {'+'.join(report.steps) or 'nothing due'}"]
    if "compact" in report.steps:
        parts.append(f"{report.segments_made} segments made of {report.batches_merged} batches")
        if report.segments_merged:
            parts.append(f"{report.segments_merged} merged")
    if "retention" in report.steps:
        if report.records_synced or report.offsets_lost:
            parts.append(f"{report.records_synced} records synced to tables"
                         + (f" ({report.offsets_lost} offsets gone before a sync)"
                            if report.offsets_lost else ""))
        if report.table_files_compacted or report.table_files_expired:
            parts.append(f"{report.table_files_compacted} table files compacted, "
                         f"{report.table_files_expired} expired")
        parts.append(f"{report.segments_deleted} segments deleted")
    if "gc" in report.steps:
        parts.append(f"{report.gc_removed} objects collected")
    parts.append(f"{sum(report.objects.values())} objects in {len(report.objects)} partitions")
    parts.append(f"{report.duration_ms} ms")
    line = ", ".join(parts)
    for error in report.errors:
        line += f"\n  error: {error}"
    return line


def run_maintain(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    settings = MaintenanceSettings(
        topics=tuple(args.topic) if args.topic else None,
        compact_interval_s=args.compact_interval, retention_interval_s=args.retention_interval,
        gc_interval_s=args.gc_interval, jitter=args.jitter, lag=args.lag,
        min_batches=args.min_batches, compaction_buffer_bytes=args.compaction_buffer_bytes,
        chain_age_s=args.chain_age, decision_age_s=args.decision_age, temp_age_s=args.temp_age,
        data_age_s=args.data_age,
        txn_id_expiration_ms=args.transactional_id_expiration_ms)
    for topic in settings.topics or ():
        log.describe_topic(topic)  # a mistyped topic fails now, not silently on every pass
    as_json = args.json or not sys.stdout.isatty()
    failed = False
    with Progress("", "partitions") as progress:
        def show(step: str, done: int, total: int) -> None:
            progress.verb = f"pass {maintainer.passes}: {step}"
            progress.update(done, total)

        maintainer = Maintainer(log.services, settings, progress=show)

        def on_pass(report: PassReport) -> None:
            nonlocal failed
            failed = failed or bool(report.errors)
            if progress.shown and progress.last:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            print(json.dumps(report.as_dict()) if as_json else _line(report), flush=True)

        maintainer.run(1 if args.once else args.passes, on_pass)
    if failed:
        raise CommandError("a maintenance pass reported errors (see above)")
