"""The ``txlog`` command: inspect and operate a log root from a shell.

It runs the same library code as every other process (there is no server to
talk to), so anything it does is exactly what a producer, consumer or
coordinator in another process would do.  Errors that txlog raises on purpose
(``TxlogError``) are reported as one line on stderr with exit status 1: an
operator needs the message, not a traceback.  Each command group lives in its
own module (topics, records, transactions, maintenance, inspection, groups);
this one builds the parser from them and runs the command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import TxlogError
from . import (groups, inspection, maintain, maintenance, metrics, records, root_config,
               tables, topics, transactions)
from .common import ROOT_ENV, CommandError

PROG = "txlog"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate a txlog root: a Kafka-style transactional log kept directly "
                    "in a directory or object store, with no broker.",
        epilog=f"The root can also be given in the {ROOT_ENV} environment variable. "
               "Errors are reported on one line and exit with status 1.")
    root_help = ("the log root: a local directory, or a URL such as s3://bucket/path "
                 f"(default: ${ROOT_ENV})")
    parser.add_argument("--root", metavar="DIR", default=os.environ.get(ROOT_ENV),
                        help=root_help)
    # Every command also takes --root after its own name (txlog topics list --root DIR).
    leaf = argparse.ArgumentParser(add_help=False)
    leaf.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS, help=root_help)

    def leaf_parser(group: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return group.add_parser(name, parents=[leaf], **kwargs)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    topics.add_topics(commands, leaf_parser)
    root_config.add_root_config(commands, leaf_parser)
    records.add_produce(commands, leaf_parser)
    records.add_consume(commands, leaf_parser)
    topics.add_offsets(commands, leaf_parser)
    transactions.add_transactions(commands, leaf_parser)
    maintenance.add_compact(commands, leaf_parser)
    maintenance.add_retention(commands, leaf_parser)
    maintenance.add_delete_records(commands, leaf_parser)
    inspection.add_dump(commands, leaf_parser)
    maintenance.add_gc(commands, leaf_parser)
    maintain.add_maintain(commands, leaf_parser)
    inspection.add_verify(commands, leaf_parser)
    transactions.add_producers(commands, leaf_parser)
    groups.add_groups(commands, leaf_parser)
    metrics.add_metrics(commands, leaf_parser)
    tables.add_tables(commands, leaf_parser)
    return parser


_COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "topics": topics.run_topics, "offsets": topics.run_offsets, "produce": records.run_produce,
    "consume": records.run_consume, "transactions": transactions.run_transactions,
    "producers": transactions.run_producers, "compact": maintenance.run_compact,
    "retention": maintenance.run_retention, "gc": maintenance.run_gc,
    "delete-records": maintenance.run_delete_records, "maintain": maintain.run_maintain,
    "dump": inspection.run_dump, "verify": inspection.run_verify, "groups": groups.run_groups,
    "metrics": metrics.run_metrics, "root-config": root_config.run_root_config,
    "tables": tables.run_tables}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _COMMANDS[args.command](args)
    except (TxlogError, CommandError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``txlog consume ... | head``): not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as exc:
        # Storage trouble (permissions, a full disk, an unreachable bucket) is
        # just as much an operator's problem to read about in one line.
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
