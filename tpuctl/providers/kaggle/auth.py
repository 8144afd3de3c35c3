"""Which Kaggle credentials to use, in the order of the official client (`kaggle` 2.2.5,
kaggle_api_extended.py `KaggleApi.authenticate`: an API token, then the legacy API key, then `kaggle auth login`'s
OAuth credentials):

1. an API token (the settings page's "Generate New Token"), found as kagglesdk finds it
   (kagglesdk/kaggle_env.py `get_access_token_from_env`): KAGGLE_API_TOKEN (the token, or the path of a file
   holding it), else ~/.kaggle/access_token (or access_token.txt). Sent as `Authorization: Bearer`
   (kaggle_http_client.py `BearerAuth`); the username is not in it, so it is asked of Kaggle (`IntrospectToken`,
   as kaggle_api_extended `_introspect_token` does).
2. the legacy API key ("Create Legacy API Key"): KAGGLE_USERNAME and KAGGLE_KEY, else `kaggle.json` in
   KAGGLE_CONFIG_DIR or ~/.kaggle; sent as HTTP basic auth. A kaggle.json readable by group or others is refused
   (the kaggle client warns: "Your Kaggle API key is readable by other users on this system!").
3. `kaggle auth login`'s ~/.kaggle/credentials.json (kagglesdk/kaggle_creds.py `KaggleCredentials`): its access
   token, refreshed through its refresh token when expired, sent as Bearer; the username is in the file.

Unlike the kaggle client, a token Kaggle says is not active is an error, not a reason to try the next source: a user
who set KAGGLE_API_TOKEN means that token, and kagglesdk would send it anyway (`_try_fill_auth` prefers the
environment's token over a username and key it is given). Secrets go to Kaggle and nowhere else: never printed,
never uploaded.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import ErrorKind, TpuctlError

SETTINGS = "https://www.kaggle.com/settings"
HINT = (f"make an API token at {SETTINGS} (API, Generate New Token) and `export KAGGLE_API_TOKEN=...` or save it "
        "as ~/.kaggle/access_token (or run `kaggle auth login`); a legacy kaggle.json with `chmod 600` works too")


@dataclass(frozen=True)
class Credentials:
    token: str = ""          # Bearer
    user: str = ""           # known for a legacy key and OAuth; learnt with IntrospectToken for a token
    key: str = ""            # HTTP basic, with user
    source: str = ""         # where it came from, for messages


def config_file() -> Path:
    return Path(os.environ.get("KAGGLE_CONFIG_DIR") or Path.home() / ".kaggle") / "kaggle.json"


def _read_token(path: Path) -> str:
    try:
        return path.read_text().strip() if path.is_file() else ""
    except OSError:
        return ""


def _token() -> Credentials | None:
    """kagglesdk/kaggle_env.py `get_access_token_from_env`, without its in-notebook branch (tpuctl runs outside)."""
    value = os.environ.get("KAGGLE_API_TOKEN", "")
    if value:
        from_file = _read_token(Path(value)) if len(value) < 4096 and Path(value).exists() else ""
        return Credentials(token=from_file or value, source="KAGGLE_API_TOKEN")
    for name in ("access_token", "access_token.txt"):
        path = Path.home() / ".kaggle" / name
        token = _read_token(path)
        if token:
            return Credentials(token=token, source=str(path))
    return None


def _legacy() -> Credentials | None:
    user, key = os.environ.get("KAGGLE_USERNAME"), os.environ.get("KAGGLE_KEY")
    if user and key:
        return Credentials(user=user, key=key, source="KAGGLE_USERNAME/KAGGLE_KEY")
    path = config_file()
    if not path.is_file():
        return None
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TpuctlError(ErrorKind.PERMISSION, f"{path} is readable by other users of this machine",
                          f"run `chmod 600 {path}` (the Kaggle client asks the same)")
    try:
        doc = json.loads(path.read_text())
        return Credentials(user=str(doc["username"]), key=str(doc["key"]), source=str(path))
    except (ValueError, KeyError, TypeError):
        raise TpuctlError(ErrorKind.INPUT, f"{path} is not a Kaggle API key (a JSON with username and key)",
                          HINT) from None


def oauth_file() -> Path:
    return Path.home() / ".kaggle" / "credentials.json"   # kaggle_creds.py DEFAULT_CREDENTIALS_FILE


def find() -> Credentials:
    """The first source that is there (see the module's docstring); the OAuth file is only located here (reading
    it may refresh its token: a call to Kaggle, made by the client). TpuctlError(PERMISSION) when there is none."""
    found = _token() or _legacy()
    if found:
        return found
    if oauth_file().is_file():
        return Credentials(source=str(oauth_file()))
    raise TpuctlError(ErrorKind.PERMISSION, "no Kaggle credentials: KAGGLE_API_TOKEN is not set and there is no "
                      f"~/.kaggle/access_token, {config_file()} or KAGGLE_USERNAME/KAGGLE_KEY", HINT)
