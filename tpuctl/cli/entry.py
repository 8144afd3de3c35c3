"""The entry point (`tpuctl = tpuctl.cli:main`, through cli/__init__.py): every command loaded (clusters.py's, which
registers the run commands after its own), the one asked for run, and whatever goes wrong answered as one line and an
exit code, never a traceback (a bad knob, a usage error, a refused request, Ctrl-C, a full disk, an internal error
with its details in the debug log)."""
from __future__ import annotations

import errno
import os
import sys
from typing import List, Optional

import typer

from .. import python_sigint, sigints, start_guard_off
from . import clusters  # noqa: F401 - registers every command on the app
from .common import command, console, forget_said, interrupt_answered
from ..core.errors import ErrorKind, ExitCode, TpuctlError


def _debug_log(exc: BaseException) -> str:
    import traceback   # here, not at module level: it brings linecache and tokenize, which help does not need
    from ..core.state import home
    path = home() / "debug.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return ""
    return str(path)


def _home_unusable(e: BaseException) -> tuple[str, str] | None:
    """An OSError on a path inside tpuctl's state folder (TPUCTL_HOME, else ~/.local/state/tpuctl): a HOME or
    TPUCTL_HOME that is a file, or not writable, is the user's setting, not tpuctl's bug (issue 63.4)."""
    from ..core.state import home
    name = str(getattr(e, "filename", "") or "") if isinstance(e, OSError) else ""
    root = str(home())
    if not name or not (name == root or name.startswith(root.rstrip("/") + "/") or root.startswith(name + "/")):
        return None
    assert isinstance(e, OSError)
    fix = "point TPUCTL_HOME at a folder you may write to (it is made if missing)"
    if not os.environ.get("TPUCTL_HOME"):
        fix = fix.replace("point", "set") + f", or fix {'XDG_STATE_HOME' if os.environ.get('XDG_STATE_HOME') else 'HOME'}"
    return f"tpuctl keeps its state in {root}, and cannot use it: {e.strerror} ({name})", fix


def _is_parser_error(e: BaseException) -> bool:
    """typer's command-line parser errors (raised from typer's own copy of click, so not click's classes: matched
    by what they offer instead of by importing click)."""
    return callable(getattr(e, "format_message", None)) and isinstance(getattr(e, "exit_code", None), int)


def _usage_error(e: BaseException) -> None:
    message = str(getattr(e, "format_message")())
    if type(e).__name__ == "NoArgsIsHelpError":   # `tpuctl` alone: the help, and success
        print(message)
        sys.exit(ExitCode.OK)
    ctx = getattr(e, "ctx", None)
    where = getattr(ctx, "command_path", "") or "tpuctl"
    from .parsing import PassOnCommand, pass_on_hint
    command = getattr(ctx, "command", None)
    hint = (pass_on_hint(command, where) if isinstance(command, PassOnCommand) else
            f"`{where} --help` lists {'its options' if ' ' in where else 'the commands'}")
    console().print_error(message.strip().splitlines()[0] if message.strip() else "bad usage", hint)
    sys.exit(int(getattr(e, "exit_code")))


def main(argv: Optional[List[str]] = None) -> None:
    try:
        _main(argv)
    finally:
        python_sigint()   # the command is over: Python's own Ctrl-C again (a process that runs main in its own)


def _main(argv: Optional[List[str]] = None) -> None:
    # State, the debug log, the local store and what the local agent unpacks may hold a job's [env] secrets:
    # everything tpuctl creates is private to its user (dirs 0700, files 0600).
    from ..core import umask
    umask.private()   # the user's own umask is kept for what is theirs (downloaded outputs)
    forget_said()
    try:
        sigints.clear()
        start_guard_off()   # loaded: a Ctrl-C is a KeyboardInterrupt again, answered by the command or below
        from ..core import knobs   # (math and os: what help may load, tests/test_help_imports.py)
        knobs.check()   # a bad TPUCTL_* knob is refused before anything waits on it
        rc = command().main(args=argv, standalone_mode=False, prog_name="tpuctl")  # a typer.Exit comes back as its code
        if not interrupt_answered() and (rc == ExitCode.INTERRUPTED or (sigints and not rc)):
            # typer's answer to Ctrl-C: Exit(130), silent; or a press raised where Python ignores it (a finalizer:
            # "Exception ignored in ..."), after which the command went on as if none came (issue 52.7)
            console().print_error("interrupted", "what the command was doing stopped part way; run it again to "
                                  "finish (tpuctl's commands converge)")
            sys.exit(ExitCode.INTERRUPTED)
        sys.exit(rc if isinstance(rc, int) else 0)
    except TpuctlError as e:
        if e.kind is not ErrorKind.INPUT:
            _debug_log(e)
        console().print_error(e.message, e.hint)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        console().print_error("interrupted", "")
        sys.exit(ExitCode.INTERRUPTED)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - the last line of defence: a message, not a traceback
        if _is_parser_error(e):
            _usage_error(e)
        path = _debug_log(e)
        home_said = _home_unusable(e)
        if home_said:
            console().print_error(*home_said)
            sys.exit(ExitCode.INPUT)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):   # a disk of this machine's
            where = f"the device that holds {e.filename}" if e.filename else "a device tpuctl was writing to"
            console().print_error(f"no space left on {where}",
                                  "make room there (or point TMPDIR elsewhere) and run the command again")
            sys.exit(ExitCode.ERROR)
        if os.environ.get("TPUCTL_DEBUG"):
            import traceback
            traceback.print_exc()
        console().print_error(f"internal error: {type(e).__name__}: {e}",
                               f"details in {path}; please report it" if path else "please report it")
        sys.exit(ExitCode.ERROR)
