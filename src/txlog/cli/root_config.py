"""``txlog root-config``: the root's own settings, as a broker's (topic auto-creation)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..root.root_config import AUTO_CREATE, NUM_PARTITIONS, ROOT_DEFAULTS
from ..root.topics import MAX_PARTITIONS
from .common import CommandError, LeafParser, config_item, open_log


def add_root_config(commands: Any, leaf_parser: LeafParser) -> None:
    root_config = commands.add_parser(
        "root-config", help="show or change the root's settings (topic auto-creation)",
        description="The root's own settings, as a Kafka broker's: whether a producer or "
                    "consumer that uses a missing topic creates it, and with how many "
                    "partitions.")
    actions = root_config.add_subparsers(dest="action", metavar="ACTION", required=True)
    describe = leaf_parser(
        actions, "describe", help="show the root's settings",
        description="Show every root setting, Kafka's default marked where the root sets "
                    "none.")
    describe.add_argument("--json", action="store_true", help="one JSON object")
    alter = leaf_parser(
        actions, "alter", help="set or remove root settings",
        description="Set or remove root settings (kafka-configs --entity-type brokers "
                    "--alter). Clients read them whenever they meet a missing topic.")
    alter.add_argument("--config", metavar="KEY=VALUE", type=config_item, action="append",
                       default=[],
                       help=f"set a setting, repeatable: {AUTO_CREATE}=true|false, "
                            f"{NUM_PARTITIONS}=N (1 to {MAX_PARTITIONS})")
    alter.add_argument("--delete-config", metavar="KEY", action="append", default=[],
                       help="remove a setting, back to Kafka's default (repeatable)")


def run_root_config(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    if args.action == "alter":
        if not args.config and not args.delete_config:
            raise CommandError("give --config or --delete-config")
        config = log.alter_root_config(dict(args.config), args.delete_config)
    else:
        config = log.describe_root_config()
    values = {key: config.setting(key) for key in ROOT_DEFAULTS}
    defaults = sorted(k for k in values if k not in config.config)
    if args.action == "describe" and args.json:
        print(json.dumps({"config": values, "default_config_keys": defaults}))
        return
    for key, value in values.items():
        shown = str(value).lower() if isinstance(value, bool) else value
        print(f"{key}={shown}" + (" (default)" if key in defaults else ""))
