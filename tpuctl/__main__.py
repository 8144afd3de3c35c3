from . import _guard_start

_guard_start(force=True)   # `python -m tpuctl`: the package was imported as `-m`, before its name was known
from .cli import main  # noqa: E402 - after the guard

main()
