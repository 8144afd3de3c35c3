"""`tpuctl ui --token-file PATH`: the token written where a Prometheus reads it (`authorization.credentials_file`,
which sends it as `Authorization: Bearer <token>`, the file's trailing newline stripped: RUN_HEALTH_FACTS.md §6),
readable by its owner alone."""
from __future__ import annotations

import os

from ..core.errors import ErrorKind, TpuctlError


def write(path: str, token: str) -> None:
    """Mode 0600, also when the file was there with a looser mode (O_CREAT's mode applies only to a new file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, f"{token}\n".encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise TpuctlError(ErrorKind.INPUT, f"--token-file {path} cannot be written: {e.strerror}",
                          "give a path in a directory you can write") from None
