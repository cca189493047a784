"""The ``switchyard keys ...``, ``budgets ...``, ``spend`` and ``savings`` commands (wired in by
``gateway.cli``). They work on the local state (``SWITCHYARD_HOME``: keys.db, the ledger); a
running gateway picks key limits up within seconds.

Each command's ``func`` takes the parsed ``args`` and returns an exit code: 0 done, 1 failed
(e.g. revoking an unknown key, an unreadable ledger), 2 bad input (message on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, cast

from gateway import bootstrap
from gateway.config.settings import Settings
from gateway.ledger.db import LedgerUnavailable
from gateway.ledger.query import spent_since
from gateway.ledger.report import (
    BUCKETS,
    GROUP_BY_CHOICES,
    GROUPS,
    SAVINGS_COLUMNS,
    SERIES_COLUMNS,
    GroupBy,
    format_table,
    parse_since,
    savings_by_cause,
    spend,
    spend_series,
    to_csv,
    to_json,
)
from gateway.ledger.sqlite import is_postgres_url, ledger_path
from gateway.limits.key_cache import store_errors
from gateway.limits.keys import KeyLimits, KeyRecord, KeyStoreBase

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
    _limit_args(create)
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
    sp.add_argument("--by", "--group-by", dest="by", choices=GROUPS, default="model", help="group by")
    sp.add_argument("--bucket", choices=BUCKETS, default=None, help="time buckets: hour, day, month, none")
    sp.add_argument("--csv", action="store_true", help="print CSV rows (one per bucket and group)")
    sp.add_argument(
        "--top", type=_positive, default=None, help="only the N most expensive groups (conversation: 20)"
    )
    sp.add_argument("--since", default="24h", help="window: 90s, 30m, 24h, 7d or 'all' (default 24h)")
    sp.add_argument("--ledger", default=None, help="ledger URL (default: $SWITCHYARD_LEDGER)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_spend)

    sv: argparse.ArgumentParser = subparsers.add_parser("savings", help="savings by cause from the ledger")
    sv.add_argument("--since", default="30d", help="window: 90s, 30m, 24h, 7d or 'all' (default 30d)")
    sv.add_argument("--bucket", choices=BUCKETS, default="none", help="time buckets (default none)")
    sv.add_argument("--ledger", default=None, help="ledger URL (default: $SWITCHYARD_LEDGER)")
    sv.add_argument("--json", action="store_true", help="print one JSON object")
    sv.add_argument("--csv", action="store_true", help="print CSV")
    sv.set_defaults(func=cmd_savings)

    budgets: argparse.ArgumentParser = subparsers.add_parser("budgets", help="USD budgets and key limits")
    budgets.set_defaults(func=_help_of(budgets))
    bsub = budgets.add_subparsers(title="budgets commands", metavar="{list,set}")
    blist = bsub.add_parser("list", help="every budget (policy and keys) with what its period spent")
    blist.add_argument("--policy", default=None, help="policy YAML (default: $SWITCHYARD_POLICY)")
    blist.add_argument("--ledger", default=None, help="ledger URL (default: $SWITCHYARD_LEDGER)")
    blist.add_argument("--json", action="store_true", help="print one JSON object")
    blist.add_argument("--csv", action="store_true", help="print CSV")
    blist.set_defaults(func=cmd_budgets_list)
    bset = bsub.add_parser("set", help="set a key's budgets and rate limits (omitted ones are removed)")
    bset.add_argument("key_id", metavar="KEY_ID")
    _limit_args(bset)
    bset.add_argument("--json", action="store_true", help="print one JSON object")
    bset.set_defaults(func=cmd_budgets_set)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--daily-usd", type=Decimal, default=None, help="USD budget per UTC day")
    p.add_argument("--monthly-usd", type=Decimal, default=None, help="USD budget per calendar month")
    p.add_argument("--rpm", type=int, default=None, help="requests per minute")
    p.add_argument("--tpm", type=int, default=None, help="tokens per minute")


def _limits_of(args: argparse.Namespace) -> KeyLimits:
    return KeyLimits(args.rpm, args.tpm, args.daily_usd, args.monthly_usd)


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


def _store() -> KeyStoreBase:
    return bootstrap.key_store(Settings.from_env())


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        with _store() as store:
            key, rec = store.create(args.tenant, args.name)
            if not _limits_of(args).empty:
                store.set_limits(rec.key_id, _limits_of(args), announce=False)  # not handed out yet
    except (ValueError, InvalidOperation) as exc:
        return _fail(str(exc))
    except store_errors() as exc:
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
    except store_errors() as exc:
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
    except store_errors() as exc:
        return _fail(f"key store: {exc}", EXIT_FAILED)
    if args.json:
        _print_json({"key_id": args.key_id, "revoked": revoked})
    elif revoked:
        print(f"revoked {args.key_id}")
    if not revoked:
        print(f"switchyard: no active key with id {args.key_id!r}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _window(text: str | None) -> float | None:
    return None if text in (None, "all") else parse_since(str(text))


def _url(args: argparse.Namespace) -> str:
    return str(args.ledger or Settings.from_env().ledger_url)


def _no_ledger(url: str) -> str | None:
    """Why a report cannot be read from ``url``: a SQLite ledger file that does not exist
    (a mistyped SWITCHYARD_HOME or --ledger) is said, not reported as zero spend."""
    if is_postgres_url(url):
        return None
    path = ledger_path(url)
    if path.is_file():
        return None
    where = "" if path.parent.is_dir() else f" (the folder {path.parent} does not exist either)"
    return f"no ledger at {path}{where}: check SWITCHYARD_HOME, SWITCHYARD_LEDGER or --ledger"


def _series_out(
    args: argparse.Namespace,
    name: str,
    rows: list[dict[str, Any]],
    extra: dict[str, Any],
    columns: Sequence[str] | None = None,
) -> None:
    """``columns``: the header, also of an empty report (None: the first row's keys)."""
    if args.csv:
        print(to_csv(rows, columns), end="")
    elif args.json:
        _print_json({**extra, name: rows})
    else:
        cols = list(columns) if columns is not None else list(rows[0]) if rows else []
        if not cols:
            print(f"no {name}")
            return
        table = [cols] + [[str(r[c]) for c in cols] for r in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
        for row in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_spend(args: argparse.Namespace) -> int:
    since: str | None = None if args.since in (None, "all") else str(args.since)
    series = args.bucket is not None or args.csv or args.by not in GROUP_BY_CHOICES
    try:
        since_seconds = _window(since)
        url = _url(args)
        if (missing := _no_ledger(url)) is not None:
            return _fail(missing, EXIT_FAILED)
        if series:
            bucket = args.bucket or "none"
            rows = spend_series(url, args.by, bucket, since_seconds, top=args.top)
        else:
            lines = spend(url, cast(GroupBy, args.by), since_seconds, top=args.top)
    except ValueError as exc:
        return _fail(str(exc))
    except LedgerUnavailable as exc:
        return _fail(str(exc), EXIT_FAILED)
    except sqlite3.Error as exc:
        return _fail(f"ledger: {exc}", EXIT_FAILED)
    if series:
        extra = {"group_by": args.by, "bucket": bucket, "since": since}
        _series_out(args, "spend", rows, extra, SERIES_COLUMNS)
    elif args.json:
        _print_json(to_json(lines, args.by, since))
    else:
        print(format_table(lines, args.by))
    return EXIT_OK


def cmd_savings(args: argparse.Namespace) -> int:
    try:
        url = _url(args)
        if (missing := _no_ledger(url)) is not None:
            return _fail(missing, EXIT_FAILED)
        rows = savings_by_cause(url, args.bucket, _window(args.since))
    except ValueError as exc:
        return _fail(str(exc))
    except sqlite3.Error as exc:
        return _fail(f"ledger: {exc}", EXIT_FAILED)
    _series_out(args, "savings", rows, {"bucket": args.bucket, "since": args.since}, SAVINGS_COLUMNS)
    return EXIT_OK


def cmd_budgets_set(args: argparse.Namespace) -> int:
    try:
        with _store() as store:
            found = store.set_limits(args.key_id, _limits_of(args))
    except ValueError as exc:
        return _fail(str(exc))
    except store_errors() as exc:
        return _fail(f"key store: {exc}", EXIT_FAILED)
    if not found:
        return _fail(f"no active key with id {args.key_id!r}", EXIT_FAILED)
    lim = _limits_of(args)
    out = {"key_id": args.key_id, "rpm": lim.rpm, "tpm": lim.tpm}
    out |= {"daily_usd": _money(lim.daily_usd), "monthly_usd": _money(lim.monthly_usd)}
    if args.json:
        _print_json(out)
    else:
        print(" ".join(f"{k}={v if v is not None else '-'}" for k, v in out.items()))
    return EXIT_OK


def _money(value: Decimal | None) -> str | None:
    return None if value is None else f"{value:f}"


def cmd_budgets_list(args: argparse.Namespace) -> int:
    """Budgets from the policy and the key store, with what each period spent per the ledger
    (a running gateway's reservations in flight are not included)."""
    from gateway.config.loader import PolicyError, load_policy

    settings = Settings.from_env()
    try:
        policy = load_policy(Path(args.policy) if args.policy else settings.policy_path)
    except PolicyError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    url = _url(args)
    try:
        with _store() as store:
            limits = bootstrap.offline_limits(store)

            async def run() -> list[dict[str, Any]]:
                await limits.seed(policy, lambda scope, since: spent_since(url, scope, since))
                return await limits.status(policy)

            rows = asyncio.run(run())
    except ValueError as exc:
        return _fail(str(exc))
    except store_errors() as exc:
        return _fail(f"store: {exc}", EXIT_FAILED)
    for row in rows:
        row["resets_at"] = _iso(row["resets_at"])
        for k in ("limit_usd", "spent_usd", "remaining_usd"):
            row[k] = _money(row[k])
    _series_out(args, "budgets", rows, {})
    return EXIT_OK
