"""Settings precedence: flag > environment > config file > default; and where the Google Cloud project comes from.

Config file: $TPUCTL_CONFIG, else $XDG_CONFIG_HOME/tpuctl/config.toml (keys: provider, project, zone, cluster).
"""
from __future__ import annotations

import configparser
import os
from pathlib import Path

from .errors import TpuctlError, bad_input

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

_KEYS = {"provider", "project", "zone", "cluster"}
PROVIDERS = ("gcp", "local")


def config_path() -> Path:
    if os.environ.get("TPUCTL_CONFIG"):
        return Path(os.environ["TPUCTL_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "tpuctl" / "config.toml"


def file_settings() -> dict:
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


def setting(key: str, flag_value, default=None):
    if flag_value not in (None, "", []):
        return flag_value
    env = os.environ.get(f"TPUCTL_{key.upper()}")
    if env:
        return env
    return file_settings().get(key, default)


def provider(flag_value: str | None) -> str:
    p = setting("provider", flag_value, "gcp")
    if p not in PROVIDERS:
        raise bad_input(f"unknown provider {p!r}", "use --provider gcp or --provider local")
    return p


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


def project(flag_value: str | None, allow_adc: bool = True) -> str:
    """--project, GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, config file, gcloud's active config, then ADC."""
    p = (flag_value or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
         or file_settings().get("project") or _gcloud_project())
    if not p and allow_adc:
        try:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
            try:
                _, p = google.auth.default()
            except DefaultCredentialsError:
                p = None
        except ImportError:
            p = None
    if not p:
        raise TpuctlError("input", "no Google Cloud project given",
                          "pass --project PROJECT_ID, or run `gcloud config set project PROJECT_ID`")
    return p
