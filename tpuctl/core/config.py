"""Settings precedence: flag > environment > config file > default; and where the Google Cloud project comes from.

Config file: $TPUCTL_CONFIG, else $XDG_CONFIG_HOME/tpuctl/config.toml (keys: provider, project, zone, cluster,
autostop, max_duration, notify, budget, api); each key also works as TPUCTL_<KEY> in the environment (README).
"""
from __future__ import annotations

import configparser
import os
import sys
from pathlib import Path
from typing import Any

from .errors import bad_input
from .models import ProviderName

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

# Every key the docs name (tests/test_config_keys.py reads them from README and docs/ and tries each, in the file
# and as TPUCTL_<KEY>).
KEYS = ("provider", "project", "zone", "cluster", "autostop", "max_duration", "notify", "budget", "api")
_KEYS = set(KEYS)


def config_path() -> Path:
    if os.environ.get("TPUCTL_CONFIG"):
        return Path(os.environ["TPUCTL_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "tpuctl" / "config.toml"


def file_settings() -> dict[str, Any]:
    p = config_path()
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise bad_input(f"{p}: {e}", "fix or remove the config file")
    unknown = set(data) - _KEYS
    if unknown:
        raise bad_input(f"{p}: unknown key {sorted(unknown)[0]!r}", "known keys: " + ", ".join(sorted(_KEYS)))
    return data


def setting(key: str, flag_value: Any, default: Any = None) -> Any:
    if flag_value not in (None, "", []):
        return flag_value
    env = os.environ.get(f"TPUCTL_{key.upper()}")
    if env:
        return env
    return file_settings().get(key, default)


def provider(flag_value: str | None) -> ProviderName:
    p = setting("provider", flag_value, ProviderName.GCP.value)
    try:
        return ProviderName(p)
    except ValueError:
        raise bad_input(f"unknown provider {p!r}", "use " + " or ".join(f"--provider {n.value}" for n in ProviderName))


def _gcloud_project() -> str:
    cfg_dir = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    name = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (cfg_dir / "active_config").read_text().strip() or "default"
        except OSError:
            name = "default"
    ini = configparser.ConfigParser()
    try:
        ini.read(cfg_dir / "configurations" / f"config_{name}")
    except configparser.Error:
        return ""
    return ini.get("core", "project", fallback="")


def project(flag_value: str | None) -> str:
    """--project, TPUCTL_PROJECT (as every key: README), GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, config file,
    gcloud's active config; "" if none. (Application Default Credentials come last, in providers/google/project.py:
    only it imports google.auth.)"""
    return (flag_value or os.environ.get("TPUCTL_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or os.environ.get("CLOUDSDK_CORE_PROJECT") or str(file_settings().get("project") or "")
            or _gcloud_project())
