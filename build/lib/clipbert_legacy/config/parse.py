"""Command line + JSON file -> validated :class:`~clipbert_legacy.config.schema.Config`.

Precedence is CLI > JSON > default, where "CLI" means what argparse parsed (so an abbreviated flag
like ``--learning`` still beats the JSON file); ``$CLIPBERT_OVERRIDES`` is appended to the command line.
"""
import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

from clipbert_legacy.config.json_file import load_json_object
from clipbert_legacy.config.path_roots import map_paths, parse_prefix, prefix_spec
from clipbert_legacy.config.schema import Config, ConfigError, Option, coerce, suggest
from clipbert_legacy.config.tasks import post_parse_chain, task_options
from clipbert_legacy.utils.errors import clip, line_of, shown

logger = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"command line: {clip(message, 300)}")


def build_parser(task: str) -> argparse.ArgumentParser:
    """argparse parser generated from the schema. Every default is SUPPRESS: only given flags appear."""
    opts = task_options(task)
    p = _Parser(description=f"clipbert-legacy {task} options (see the README's config reference)",
                argument_default=argparse.SUPPRESS, allow_abbrev=True)
    p.add_argument("--config", default=None, help="JSON config file; CLI flags override its values")
    for o in opts.values():
        if o.json_only:
            continue
        hlp = o.help or o.unused or ""
        p.add_argument(f"--{o.name}", dest=o.name, nargs=o.nargs, metavar=o.type_name().upper(),
                       help=f"{hlp} (default: {o.default!r})".replace("%", "%%"))
    return p


OVERRIDES_ENV = "CLIPBERT_OVERRIDES"


def env_overrides() -> list[str]:
    """Extra CLI flags from ``$CLIPBERT_OVERRIDES``, appended after the command line (so they win).

    For wrappers that must change a setting of every run without editing commands, e.g. cluster
    scripts, or the README test that runs the documented commands in a reduced mode.
    """
    text = os.environ.get(OVERRIDES_ENV, "").strip()
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"${OVERRIDES_ENV}={shown(text)}: {e}") from None


def parse_args(task: str, argv: Optional[Sequence[str]] = None) -> Config:
    """Parse ``argv`` (default ``sys.argv[1:]``) for ``task`` into a validated :class:`Config`.

    Raises :class:`ConfigError` (one line) on any bad key or value.
    """
    opts = task_options(task)
    parser = build_parser(task)
    argv = (sys.argv[1:] if argv is None else list(argv)) + env_overrides()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise _unknown_argument(unknown[0], opts)
    cli = vars(ns)
    cfg_path = cli.pop("config", None)
    values = {n: o.default for n, o in opts.items()}
    given = set()
    notices = []
    json_values = load_json_object(cfg_path) if cfg_path else {}
    spec = prefix_spec(cli, json_values)
    roots = parse_prefix(spec)  # /txt, /img, /pretrain, /storage -> the user's folders
    if spec and "path_prefix" in opts:
        values["path_prefix"] = spec
    for k, v in json_values.items():
        if k not in opts:
            if k == "config":
                continue
            raise ConfigError(f"unknown option {shown(k)} in {clip(cfg_path)}{suggest(k, opts)}")
        values[k] = coerce(opts[k], map_paths(v, roots, k), os.path.basename(cfg_path))
        given.add(k)
    for k, v in cli.items():
        values[k] = coerce(opts[k], map_paths(v, roots, k), "command line", from_cli=True)
        given.add(k)
    for k in sorted(given):
        if opts[k].unused:
            notices.append(f"option {k!r} is {opts[k].unused}")
    cfg = Config({k: (list(v) if isinstance(v, list) else v) for k, v in values.items()})
    cfg._given = sorted(given)  # popped below; lets post-parse rules know what the user set
    for fn in post_parse_chain(task):
        fn(cfg, notices)
    for o in opts.values():
        if o.derived and o.name in given:
            user = coerce(o, _raw(cfg_path, cli, o.name), "given", from_cli=o.name in cli)
            if user != cfg[o.name]:
                notices.append(f"option {o.name!r} is derived ({o.help}); the given {user!r} is "
                               f"replaced by {cfg[o.name]!r}")
    del cfg["_given"]
    for n in notices:
        logger.warning("config: %s", n)
    return cfg


def _unknown_argument(tok: str, opts: dict[str, Option]) -> ConfigError:
    flag = tok.split("=", 1)[0]
    if flag.startswith("--"):
        flags = [n for n, o in opts.items() if not o.json_only]
        hint = suggest(flag[2:], flags)
        if flag[2:] in opts and opts[flag[2:]].json_only:
            hint = f"; {flag[2:]} can only be set in the --config JSON file"
        return ConfigError(f"command line: unknown option {shown(flag)}{hint}")
    return ConfigError(f"command line: unexpected argument {shown(tok)}")


def _raw(cfg_path: Optional[str], cli: dict, name: str) -> Any:
    if name in cli:
        return cli[name]
    return load_json_object(cfg_path)[name]


def parse_args_or_exit(task: str, argv: Optional[Sequence[str]] = None) -> Config:
    """CLI entry: like :func:`parse_args`, but a ConfigError prints one line and exits with 2."""
    try:
        return parse_args(task, argv)
    except ConfigError as e:
        print(f"config error: {line_of(e)}", file=sys.stderr)
        sys.exit(2)
