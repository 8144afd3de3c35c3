"""The bytes of a dataset's files and a session's outputs: one upload to the URL StartBlobUpload gave, resumed where a
cut left it (kaggle_api_extended `_upload_blob`, `_resume_upload`), and a signed output URL's download."""
from __future__ import annotations

import os
import time
from pathlib import Path

from ...core.errors import ErrorKind, TpuctlError
from .retries import ATTEMPTS, backoff

def fetch(url: str, dest: Path) -> None:
    """A signed output URL's file to `dest` (written whole, then renamed)."""
    import requests
    with requests.get(url, timeout=600, stream=True) as r:
        if r.status_code != 200:
            raise TpuctlError(ErrorKind.ERROR, f"download of {dest.name} failed: HTTP {r.status_code}", "try again")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        with open(tmp, "wb") as f:
            for chunk in r.iter_content(1 << 20):
                f.write(chunk)
        os.replace(tmp, dest)


def put(name: str, url: str, data: bytes) -> None:
    """One input file's upload to the URL StartBlobUpload gave. A cut one (a 5xx or 429, a connection cut) asks what
    arrived (arrived()) and sends the rest, up to ATTEMPTS times with the client's backoff: that file alone, never the
    whole dataset again."""
    import requests
    start = 0
    for attempt in range(1, ATTEMPTS + 1):
        # the rest of the file from `start` (all of it at first): a cut upload resumes where it stopped, as
        # kaggle_api_extended `upload_complete` does with `Content-Range: bytes A-B/N`
        headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
        try:
            put = requests.put(url, data=data[start:], headers=headers, timeout=600)
            if put.status_code in (200, 201):
                return
            if put.status_code not in (429, 500, 502, 503, 504):
                raise TpuctlError(ErrorKind.ERROR, f"upload of {name} failed: HTTP {put.status_code}", "submit again")
        except requests.RequestException:
            pass   # a connection cut: ask what arrived, below
        if attempt == ATTEMPTS:
            raise TpuctlError(ErrorKind.ERROR, f"upload of {name} failed {ATTEMPTS} times", "submit again")
        time.sleep(backoff(attempt))
        got = arrived(url, len(data))
        if got is None:
            return
        start = got


def arrived(url: str, size: int) -> int | None:
    """How much of an upload of `size` bytes reached `url` (kaggle_api_extended `_resume_upload`, Google's resumable
    upload protocol): None when all of it (200/201); else the offset to resume from (308 with `Range: bytes=0-K`:
    K+1; no Range, an expired upload (404) or any other answer: 0, from the start)."""
    import requests
    try:
        r = requests.put(url, headers={"Content-Length": "0", "Content-Range": f"bytes */{size}"}, timeout=60)
    except requests.RequestException:
        return 0
    if r.status_code in (200, 201):
        return None
    rng = r.headers.get("Range", "") if r.status_code == 308 else ""
    try:
        return int(rng.rsplit("-", 1)[1]) + 1 if rng.startswith("bytes=0-") else 0
    except ValueError:
        return 0
