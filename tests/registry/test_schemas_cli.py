"""``odradek schemas`` against a running broker's registry (one broker)."""
from __future__ import annotations

import json
import subprocess
import sys

V1 = {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"}]}
BAD = {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"}, {"name": "m", "type": "int"}]}


def schemas(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "odradek", "schemas", "--registry", url, *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_register_list_get_check_and_set_compatibility(broker, tmp_path):
    url = broker.schema_registry_url
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    (tmp_path / "bad.avsc").write_text(json.dumps(BAD))
    out = schemas(url, "register", "pings-value", "--schema", str(tmp_path / "v1.avsc"))
    assert out.returncode == 0, out.stderr
    schema_id = json.loads(out.stdout)["id"]
    assert schemas(url, "list").stdout.split() == ["pings-value"]
    got = json.loads(schemas(url, "get", "pings-value").stdout)
    assert (got["id"], got["version"], json.loads(got["schema"])) == (schema_id, 1, V1)
    assert json.loads(schemas(url, "get", "--id", str(schema_id)).stdout)["schema"] == got["schema"]
    check = schemas(url, "check", "pings-value", "--schema", "-", stdin=json.dumps(BAD))
    assert check.returncode == 2 and json.loads(check.stdout)["is_compatible"] is False
    refused = schemas(url, "register", "pings-value", "--schema", str(tmp_path / "bad.avsc"))
    assert refused.returncode == 1 and "error_code 409" in refused.stderr
    assert json.loads(schemas(url, "compatibility", "pings-value", "--set", "NONE").stdout) == {"compatibility": "NONE"}
    assert json.loads(schemas(url, "compatibility", "pings-value").stdout) == {"compatibilityLevel": "NONE"}
    assert schemas(url, "register", "pings-value", "--schema", str(tmp_path / "bad.avsc")).returncode == 0
    missing = schemas(url, "get", "nope")
    assert missing.returncode == 1 and "error_code 40401" in missing.stderr
    assert json.loads(schemas(url, "delete", "pings-value").stdout) == [1, 2]
