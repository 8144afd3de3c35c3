"""What every HTTP fake answers with: a JSON body, and Google's REST error shape
(cloud.google.com/apis/design/errors: {"error": {"code", "message", "status"}})."""
from __future__ import annotations

import json


def send_json(handler, code: int, doc) -> None:
    data = json.dumps(doc).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_error(handler, code: int, status: str, message: str) -> None:
    send_json(handler, code, {"error": {"code": code, "message": message, "status": status}})
