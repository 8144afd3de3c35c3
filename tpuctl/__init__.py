"""tpuctl: a TensorFlow training job onto a Cloud TPU (or this machine), its logs back, nothing left billing.

The `tpuctl` command's first instruction is here: its console script (`tpuctl-python = "tpuctl.cli:main"`, which
pip writes as `from tpuctl.cli import main`) imports this package before anything of the command line. Until the
command line has loaded, a Ctrl-C prints one line and exits 130 at once (`_guard_start`); tpuctl.cli.main hands
SIGINT back to Python's own KeyboardInterrupt once its commands are imported (`start_guard_off`). The `tpuctl`
command itself is launcher/tpuctl, which starts that script with SIGINT blocked, so a press while Python itself
starts waits, pending, for the guard (issue 58.5)."""
import os as _os
import sys as _sys

__version__ = "0.1.0"

# Ctrl-C presses the command line has seen; a KeyboardInterrupt raised inside a finalizer or a callback is printed
# as "Exception ignored" and lost, so the CLI reads this when its command returns (cli/entry.py main).
sigints: list[int] = []


def _interrupted_at_start(signum: int, frame: object) -> None:
    # Nothing has been done yet: say so and leave. Raising KeyboardInterrupt here would not do: inside an import it
    # printed a traceback, inside a finalizer it was ignored and the command went on to exit 0 (issue 52.7).
    _os.write(2, b"\nerror: interrupted while tpuctl was starting; nothing was done\n")
    _os._exit(130)   # ExitCode.INTERRUPTED, written out: nothing of tpuctl is loaded yet


def _interrupt(signum: int, frame: object) -> None:
    """Python's own behaviour (KeyboardInterrupt), and the press noted in `sigints`."""
    sigints.append(signum)
    raise KeyboardInterrupt


# The names the command runs under: launcher/tpuctl's console script, and pip's script named tpuctl (an install
# from before the launcher, or one whose installer left the launcher out)
_COMMANDS = ("tpuctl", "tpuctl-python", "tpuctl.exe", "tpuctl-python.exe", "tpuctl-script.py", "tpuctl-python-script.py")


def _guard_start(force: bool = False) -> None:
    """Installed only for the `tpuctl` console script (or `force`: `python -m tpuctl`), only where Python installed
    its own SIGINT handler (not when the shell started it with SIGINT ignored, as `tpuctl ... &` in a script is),
    and only on the main thread: an agent, a job, a test or a web server importing tpuctl keeps Python's handler.

    Started by launcher/tpuctl (TPUCTL_LAUNCHER=sigint-blocked), SIGINT is blocked since before Python started:
    unblocked here, after the guard is in place, so a press made meanwhile is answered by the guard now (a pending
    signal is delivered as it is unblocked: sigprocmask(2)), and one to an ignoring process is dropped as it would
    have been. The variable is taken out of the environment: nothing tpuctl starts inherits it."""
    import _signal   # builtin, loaded with the interpreter: nothing imported before the guard
    launched = _os.environ.pop("TPUCTL_LAUNCHER", "") == "sigint-blocked"
    name = _os.path.basename(_sys.argv[0] if _sys.argv else "")
    try:
        if (force or launched or name in _COMMANDS) and \
                _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, _interrupted_at_start)
    except ValueError:   # not the main thread
        pass
    if launched:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])


_unraisable: list[object] = []   # the hook start_guard_off replaced (python_sigint puts it back)


def _quiet_unraisable(u: object) -> None:
    """A KeyboardInterrupt raised where Python cannot raise it (a finalizer, a weakref callback: importlib's module
    locks have one) is printed as "Exception ignored in ..." with its traceback, and lost: the press is noted in
    `sigints` already and the command answers it when it returns (cli/entry.py), so it is not printed (issue 58.5:
    tracebacks in early Ctrl-Cs). Anything else is printed as Python prints it."""
    if not isinstance(getattr(u, "exc_value", None), KeyboardInterrupt):
        (_unraisable[0] if _unraisable else _sys.__unraisablehook__)(u)  # type: ignore[operator]  # kept as object


def start_guard_off() -> None:
    """The command line is loaded: a Ctrl-C is a KeyboardInterrupt again, which each command answers (and noted in
    `sigints`). Called wherever the guard was installed (the console script, `python -m tpuctl`)."""
    import signal
    try:
        if signal.getsignal(signal.SIGINT) in (_interrupted_at_start, signal.default_int_handler):
            signal.signal(signal.SIGINT, _interrupt)
            if _sys.unraisablehook is not _quiet_unraisable:
                _unraisable[:] = [_sys.unraisablehook]
                _sys.unraisablehook = _quiet_unraisable
    except ValueError:
        pass


def python_sigint() -> None:
    """The command has returned: Python's own handler again, where `start_guard_off` put `_interrupt`."""
    import signal
    try:
        if signal.getsignal(signal.SIGINT) is _interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if _sys.unraisablehook is _quiet_unraisable and _unraisable:
                _sys.unraisablehook = _unraisable.pop()  # type: ignore[assignment]  # the hook kept as object
    except ValueError:
        pass


_guard_start()
