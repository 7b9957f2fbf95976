"""``etcdq completion bash|zsh``: a shell completion script, generated from the parser.

shtab (the ``completion`` extra) writes the script from the very parser the
verbs build, so a new verb or option completes with no change here.  shtab
rather than argcomplete: its script is static, so a TAB runs no Python
(argcomplete starts the interpreter and imports etcdq on every TAB) and
needs no activation hook or marker in the entry point; and it writes native
zsh completion, where argcomplete goes through bash's emulation.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import EtcdqError
from .exits import EXIT_OK
from .options import verb

SHELLS = ("bash", "zsh")


def add_verbs(verbs: Any) -> None:
    parser = verb(verbs, "completion", cmd_completion, "print a shell completion script",
                  epilog="bash: etcdq completion bash > "
                         "~/.local/share/bash-completion/completions/etcdq ; zsh: etcdq "
                         "completion zsh > \"${fpath[1]}/_etcdq\" (any directory of $fpath). "
                         "Needs the completion extra: pip install 'etcdq_v2[completion]'.")
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete for")


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the script for ``args.shell``; FILE and DIR arguments complete paths."""
    try:
        import shtab
    except ImportError:
        raise EtcdqError("shell completion needs shtab: "
                         "pip install 'etcdq_v2[completion]'") from None
    from .app import build_parser  # app imports this module: not at the top
    parser = build_parser()
    _complete_paths(parser, {"FILE": shtab.FILE, "DIR": shtab.DIRECTORY})
    print(shtab.complete(parser, shell=args.shell), end="")
    return EXIT_OK


def _complete_paths(parser: argparse.ArgumentParser, by_metavar: Any) -> None:
    """Mark the arguments whose metavar is FILE or DIR, in every verb, for shtab."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb_parser in set(action.choices.values()):
                _complete_paths(verb_parser, by_metavar)
        elif action.metavar in by_metavar:
            action.complete = by_metavar[action.metavar]  # type: ignore[attr-defined]
