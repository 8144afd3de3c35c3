"""The umask the user's shell gave tpuctl, kept when the CLI sets its own 0077 (cli/entry.py): what tpuctl keeps
(state, logs, a job's secrets) stays private to its user, while the files it writes for the user to use (downloaded
outputs, issue 63.6) get the modes any of the user's own programs would give them."""
from __future__ import annotations

import os

_user = [0o022]


def private() -> None:
    """From now on everything tpuctl creates is private (dirs 0700, files 0600); the user's umask is kept."""
    _user[0] = os.umask(0o077)


def user_file_mode(executable: bool = False) -> int:
    """A new file's (or, `executable`, a program's or a directory's) mode under the user's own umask."""
    return (0o777 if executable else 0o666) & ~_user[0]
