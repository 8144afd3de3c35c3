"""The command line: the typer app, its commands and what they print (`tpuctl = tpuctl.cli:main`)."""
from .clusters import main
from .common import app

__all__ = ["app", "main"]
