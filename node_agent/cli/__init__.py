"""``python -m node_agent [global options] <command> ...``: the node agent's command line, its one CLI layer.

This package is the only code that parses arguments (``argparse``): the parser and the global options
here, the command registry (``commands``), the context built once from the global options
(``context``), the exit codes (``exitcodes``), and one module per command group (``check``,
``runtime``, ``sysctl``, ``vfio``, ``labels``, ``setup``, ``sim``, ``mig``, ``dra``,
``device_plugin``), each holding its commands' ``register``/``run``: parse, build typed values, call
the domain package, map its errors to an exit code. The domain packages below take typed values only.

Global options (before or after the command)::

    --host-root PATH        host filesystem root (default /; /host in the DaemonSet)
    --driver-root PATH      NVIDIA driver root as this process sees it (default $NVIDIA_DRIVER_ROOT, else /;
                            /driver-root in the DaemonSets): --nvml real loads libnvidia-ml.so.1 from it
    --host-exec MODE        run host commands directly or via chroot (default: direct for /, chroot otherwise)
    --nvml SPEC             real | simulated:<machine> (default real)
    --nvml-state PATH       simulated machine state file (default under the host root's /run)
    --node-name NAME        this node (default $NODE_NAME)
    --kubeconfig PATH       kubeconfig (default: in-cluster config, then ~/.kube/config)
    --json                  print one JSON document instead of text
    --log-level LEVEL       warning by default; logs go to stderr as key=value

Exit codes: the one table in ``node_agent.cli.exitcodes``.

Commands come from ``node_agent.cli.commands``; only the chosen command's module is imported.
``--nvml simulated:<machine>`` registers the simulated machines (``simulation``: the package ``nvml_sim``
beside the agent, where installed) before the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import io
import logging
import os
import signal
import sys
from collections.abc import Sequence

from node_agent.cli import exitcodes, simulation
from node_agent.cli.commands import COMMANDS
from node_agent.cli.context import UsageError
from node_agent.host.driverroot import default_driver_root, set_driver_root
from nvgpu.version import VERSION

#: ``--help``'s description.
_DESCRIPTION = "``python -m node_agent [global options] <command> ...``: the node agent's command line."


def _globals(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """The global options. ``after_command``: the same options on a command's own parser, so they may also
    follow the command (``node_agent check --json``, as users type it); there they have no default of
    their own (a value given before the command stays), and a command's own option of the same name
    (``mig apply --json``) is left as it is."""

    def add(*names: str, **kwargs: object) -> None:
        if after_command:
            if any(n in parser._option_string_actions for n in names):
                return
            kwargs["default"] = argparse.SUPPRESS
        parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]

    add("--host-root", default="/", metavar="PATH", help="the host's filesystem root (/host in the DaemonSets)")
    # Not relative to --host-root: a path in this process's filesystem (the DaemonSets mount the
    # driver root at /driver-root and the host's / at /host).
    add("--driver-root", default=default_driver_root(), metavar="PATH",
        help="the NVIDIA driver root as this process sees it (/driver-root in the DaemonSets): --nvml real loads "
             "libnvidia-ml.so.1 from it")
    add("--host-exec", choices=("direct", "chroot"), default=None,
        help="run host commands directly or through chroot (default: direct for /, chroot otherwise)")
    add("--nvml", default="real", metavar="SPEC", help="real | simulated:<machine>")
    add("--nvml-state", default=None, metavar="PATH",
        help="the simulated machine's state file (default: under the host root's /run)")
    add("--node-name", default=None, help="this node (default: $NODE_NAME)")
    add("--kubeconfig", default=None, metavar="PATH", help="default: the in-cluster config, then ~/.kube/config")
    add("--json", action="store_true", help="print one JSON document instead of text")
    add("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
        help="logs go to stderr as key=value")


def _command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser a command line can end in: the commands' and their subcommands' (``mig apply``)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += [child, *_command_parsers(child)]
    return out


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m node_agent", description=_DESCRIPTION, epilog=exitcodes.SUMMARY)
    # The release the image was built from: the components that render this agent's command lines carry the same.
    parser.add_argument("--version", action="version", version=f"nvidia-gpu node agent {VERSION}")
    _globals(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    chosen_module = next((c.module for c in COMMANDS if c.name == selected), None)
    for command in COMMANDS:
        if command.module == chosen_module:
            continue
        sub.add_parser(command.name, help=command.help)
    if chosen_module is not None:
        try:
            module = importlib.import_module(chosen_module)
        except ModuleNotFoundError as e:  # ``sim`` where the simulator is not installed (the agent image)
            if not simulation.is_missing(e):
                raise
            placeholder = sub.add_parser(str(selected), help="not available: the simulated machines are not installed")
            placeholder.add_argument("rest", nargs=argparse.REMAINDER)  # main() then says it is not available
        else:
            module.register(sub)
    for command_parser in _command_parsers(parser):
        _globals(command_parser, after_command=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    _globals(pre)
    pre.add_argument("command", nargs="?")
    known, _ = pre.parse_known_args(args_list)
    parser = build_parser(known.command)
    args = parser.parse_args(args_list)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    set_driver_root(args.driver_root)  # what open_nvml("real") and driver_binary() use in this process
    simulation.enable(getattr(args, "nvml", None))  # --nvml simulated:<machine>: the simulator, where installed
    # `kill -USR1 <pid>` writes every thread's stack to the log: what a hung agent is waiting on, without
    # a debugger in a distroless-like image (the long-running commands are exactly the ones that can hang).
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):  # stderr without a descriptor
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    run = getattr(args, "run", None)
    if run is None:
        parser.error(f"command {args.command!r} is not available")
    try:
        code: int = run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.USAGE
    except BrokenPipeError:
        # The reader of stdout went away (`labels | head`): the command did its work; say nothing more, and
        # point stdout at /dev/null so the interpreter's final flush does not print a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exitcodes.OK
    return code
