"""The ``switchyard keys ...`` and ``switchyard spend`` commands (wired in by ``gateway.cli``).

Each command's ``func`` takes the parsed ``args`` and returns an exit code: 0 done, 1 failed
(e.g. revoking an unknown key, an unreadable ledger), 2 bad input (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from gateway.config.settings import Settings
from gateway.ledger.report import GROUP_BY_CHOICES, GroupBy, format_table, parse_since, spend, to_json
from gateway.limits.keys import KeyRecord, KeyStore

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``keys`` and ``spend`` command groups to a ``switchyard`` subparsers object
    (from ``parser.add_subparsers()``). Each command sets ``func(args) -> exit code``."""
    keys: argparse.ArgumentParser = subparsers.add_parser("keys", help="manage virtual API keys")
    keys.set_defaults(func=_help_of(keys))
    sub = keys.add_subparsers(title="keys commands", metavar="{create,list,revoke}")

    create = sub.add_parser("create", help="create a key for a tenant (the key is shown once)")
    create.add_argument("--tenant", required=True, help="tenant the key belongs to")
    create.add_argument("--name", default=None, help="a label for the key")
    create.add_argument("--json", action="store_true", help="print one JSON object")
    create.set_defaults(func=cmd_keys_create)

    lst = sub.add_parser("list", help="list keys (ids only, never the keys)")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.add_argument("--json", action="store_true", help="print one JSON object")
    lst.set_defaults(func=cmd_keys_list)

    revoke = sub.add_parser("revoke", help="revoke a key by its key id")
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.add_argument("--json", action="store_true", help="print one JSON object")
    revoke.set_defaults(func=cmd_keys_revoke)

    sp: argparse.ArgumentParser = subparsers.add_parser("spend", help="spend report from the ledger")
    sp.add_argument("--by", choices=GROUP_BY_CHOICES, default="model", help="group rows by")
    sp.add_argument("--since", default="24h", help="window: 90s, 30m, 24h, 7d or 'all' (default 24h)")
    sp.add_argument("--ledger", default=None, help="ledger URL (default: $SWITCHYARD_LEDGER)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_spend)


def _help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return show


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _record_json(rec: KeyRecord) -> dict[str, Any]:
    return {
        "key_id": rec.key_id,
        "tenant": rec.tenant,
        "name": rec.name,
        "created_at": _iso(rec.created_at),
        "revoked_at": _iso(rec.revoked_at),
    }


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"switchyard: error: {message}", file=sys.stderr)
    return code


def _store() -> KeyStore:
    return KeyStore(Settings.from_env().keys_db)


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        with _store() as store:
            key, rec = store.create(args.tenant, args.name)
    except ValueError as exc:
        return _fail(str(exc))
    except sqlite3.Error as exc:
        return _fail(f"key store: {exc}", EXIT_FAILED)
    if args.json:
        _print_json({"key": key, **{k: v for k, v in _record_json(rec).items() if k != "revoked_at"}})
    else:
        print(key)
    return EXIT_OK


def cmd_keys_list(args: argparse.Namespace) -> int:
    try:
        with _store() as store:
            records = store.list(include_revoked=args.all)
    except sqlite3.Error as exc:
        return _fail(f"key store: {exc}", EXIT_FAILED)
    if args.json:
        _print_json({"keys": [_record_json(r) for r in records]})
        return EXIT_OK
    header = ["KEY_ID", "TENANT", "NAME", "CREATED"] + (["REVOKED"] if args.all else [])
    rows = [
        [r.key_id, r.tenant, r.name or "-", _iso(r.created_at) or "-"]
        + ([_iso(r.revoked_at) or "-"] if args.all else [])
        for r in records
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    try:
        with _store() as store:
            revoked = store.revoke(args.key_id)
    except sqlite3.Error as exc:
        return _fail(f"key store: {exc}", EXIT_FAILED)
    if args.json:
        _print_json({"key_id": args.key_id, "revoked": revoked})
    elif revoked:
        print(f"revoked {args.key_id}")
    if not revoked:
        print(f"switchyard: no active key with id {args.key_id!r}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_spend(args: argparse.Namespace) -> int:
    since: str | None = None if args.since in (None, "all") else str(args.since)
    try:
        since_seconds = None if since is None else parse_since(since)
        url = args.ledger or Settings.from_env().ledger_url
        lines = spend(url, cast(GroupBy, args.by), since_seconds)
    except ValueError as exc:
        return _fail(str(exc))
    except sqlite3.Error as exc:
        return _fail(f"ledger: {exc}", EXIT_FAILED)
    if args.json:
        _print_json(to_json(lines, args.by, since))
    else:
        print(format_table(lines, args.by))
    return EXIT_OK
