"""Which Google Cloud project: --project, TPUCTL_PROJECT, GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, the config file, gcloud's
active configuration, then Application Default Credentials (the only step that imports google.auth)."""
from __future__ import annotations

from ...core import config
from ...core.errors import ErrorKind, TpuctlError


def adc_project() -> str:
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return ""
    try:
        _, p = google.auth.default()
    except DefaultCredentialsError:
        return ""
    return p or ""


def resolve(flag_value: str | None) -> str:
    p = config.project(flag_value) or adc_project()
    if not p:
        raise TpuctlError(ErrorKind.INPUT, "no Google Cloud project given",
                          "pass --project PROJECT_ID (or set TPUCTL_PROJECT or GOOGLE_CLOUD_PROJECT, or "
                          "`project = \"PROJECT_ID\"` in the config file), or run `gcloud config set project "
                          "PROJECT_ID`")
    return p
