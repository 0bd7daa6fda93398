"""Raw HTTP to the registry for the tests (urllib: what a person with curl sees)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def http(url: str, method: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, object, str]:
    """``(status, decoded JSON answer, content type)``."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("Content-Type")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            answer = json.loads(text)
        except ValueError:
            answer = text.decode(errors="replace")
        return exc.code, answer, exc.headers.get("Content-Type")
