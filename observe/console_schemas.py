"""The console's side of the schema registry (docs/OBSERVABILITY.md, "Schemas"): the message
browser decodes records in Confluent's wire format (a zero byte, the schema id in 4 bytes big
endian, then the payload), and a schemas page lists subjects, their versions, each
version's schema text and the compatibility levels.

Runs on the metrics actor's HTTP threads, installed into the console's bottle application
by ``install``; sends and accepts no message. It asks the broker's own registry over HTTP
(its URL from the supervisor's status, ``schema_registry``), with the signed-in user's
credentials when the console has a sign-in (the registry checks them as it checks anyone's).
A schema id's answer never changes, so it is cached (at most ``CACHE_SIZE`` ids).

Decoding: AVRO with fastavro (``schemaless_reader``, the writer's schema; references are not
resolved: such a record is shown undecoded, saying why); JSON as JSON; PROTOBUF after the
message indexes, with the message class built from the serialized descriptor the registry
answers for ``?format=serialized`` (google.protobuf's descriptor pool), else (a .proto text
importing another subject's file, answered as text) field by field from the wire (number,
wire type, value). A
value that is not in the wire format, or whose id the registry does not know, is rendered as
the browser would without this module.
"""
from __future__ import annotations

import base64
import collections
import io
import json
import threading
import urllib.error
import urllib.parse
import urllib.request

import bottle

MAGIC = 0
CACHE_SIZE = 1000  # schema ids remembered
TIMEOUT = 5.0  # seconds the console waits for its registry
MAX_VERSIONS_SHOWN = 100  # versions of one subject shown with their text
MAX_SUBJECTS_SHOWN = 200  # subjects listed (two registry requests each), the first by name


class Registry:
    """The broker's registry as the console asks it (thread-safe)."""

    def __init__(self, actor):
        self.actor = actor
        self._ids: collections.OrderedDict[int, dict | None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._url: str | None = None

    def url(self) -> str | None:
        if self._url is None:  # asked again after a failure: a restarted registry may have a new port
            self._url = self.actor.status()["supervisor"].get("schema_registry")
        return self._url

    def get(self, path: str, auth: str | None = None):
        """The registry's JSON answer to GET ``path``; raises bottle.HTTPError with its status."""
        url = self.url()
        if not url:
            raise bottle.HTTPError(404, "This broker runs no schema registry (schema.registry.listener is empty).")
        request = urllib.request.Request(url + path, headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                why = json.loads(exc.read()).get("message")
            except (ValueError, AttributeError):
                why = exc.reason
            raise bottle.HTTPError(exc.code, f"The schema registry answered {exc.code}: {why}") from None
        except (OSError, ValueError) as exc:
            self._url = None
            raise bottle.HTTPError(502, f"The schema registry does not answer: {exc}") from None

    def schema(self, schema_id: int, auth: str | None) -> dict | None:
        """``{"schemaType", "schema", "subjects": [(subject, version)]}`` of an id, None if unknown."""
        with self._lock:
            if schema_id in self._ids:
                return self._ids[schema_id]
        try:
            found = self.get(f"/schemas/ids/{schema_id}?format=serialized", auth)
            found = {"schemaType": found.get("schemaType") or "AVRO", "schema": found["schema"],
                     "subjects": [(v["subject"], v["version"]) for v in
                                  self.get(f"/schemas/ids/{schema_id}/versions", auth)]}
        except bottle.HTTPError as exc:
            if exc.status_code != 404:
                return None  # not remembered: the registry may answer next time
            found = None
        with self._lock:
            self._ids[schema_id] = found
            while len(self._ids) > CACHE_SIZE:
                self._ids.popitem(last=False)
        return found


def framed(value: bytes | None) -> tuple[int, bytes] | None:
    """``(schema id, payload)`` of a value in Confluent's wire format, else None."""
    if value is None or len(value) < 5 or value[0] != MAGIC:
        return None
    return int.from_bytes(value[1:5], "big"), bytes(value[5:])


def decode(kind: str, schema: str, payload: bytes) -> str:
    """A payload's content as text, by its writer's schema (raises ValueError if it does not decode)."""
    if kind == "JSON":
        return json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    if kind == "PROTOBUF":
        return _protobuf(schema, payload)
    import fastavro
    try:
        parsed = fastavro.parse_schema(json.loads(schema))
        record = fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)
    except Exception as exc:  # noqa: BLE001 - fastavro's errors are of many kinds: one answer
        raise ValueError(f"does not decode as its Avro schema: {exc}") from None
    return json.dumps(record, indent=2, ensure_ascii=False, default=repr)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    from google.protobuf.internal.decoder import _DecodeVarint
    value, pos = _DecodeVarint(data, pos)
    return (value >> 1) ^ -(value & 1), pos  # zigzag, as the message indexes are written


def _protobuf(schema: str, payload: bytes) -> str:
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
    from google.protobuf import empty_pb2
    from google.protobuf.message import DecodeError
    try:
        count, pos = _varint(payload, 0)
        indexes = [0] if count == 0 else []
        for _ in range(count if count > 0 else 0):
            i, pos = _varint(payload, pos)
            indexes.append(i)
        body = payload[pos:]
    except (IndexError, TypeError) as exc:
        raise ValueError(f"the message indexes do not decode: {exc}") from None
    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema, validate=True))
    except (ValueError, DecodeError):
        fdp = None
    try:
        if fdp is not None and not fdp.dependency:
            pool = descriptor_pool.DescriptorPool()
            pool.Add(fdp)
            message = pool.FindFileByName(fdp.name).message_types_by_name[fdp.message_type[indexes[0]].name]
            for i in indexes[1:]:
                message = message.nested_types[i]
            decoded = message_factory.GetMessageClass(message).FromString(body)
            return f"{message.full_name} " + json.dumps(json_format.MessageToDict(decoded), indent=2,
                                                         ensure_ascii=False)
        from google.protobuf.unknown_fields import UnknownFieldSet
        empty = empty_pb2.Empty.FromString(body)
        rows = [f"field {f.field_number} (wire type {f.wire_type}): {f.data!r}" for f in UnknownFieldSet(empty)]
        return "(fields by number: the registry has no descriptor to name them)\n" + "\n".join(rows)
    except (DecodeError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"does not decode as its Protobuf schema: {exc}") from None


def authorization() -> str | None:
    """HTTP Basic of the signed-in user (kept by its session, whether or not the broker has a
    SASL listener for the console's own clients), None when nobody signed in."""
    session = bottle.request.environ.get("odradek.session")
    return getattr(session, "basic", None)


def renderer(registry: Registry, render):
    """The browser's ``render(value, fmt)``, decoding registry-encoded values first (not in
    the hex format, which shows the bytes as they are)."""
    def render_value(value: bytes | None, fmt: str) -> str:
        found = framed(value) if fmt != "hex" else None
        if found is None:
            return render(value, fmt)
        schema_id, payload = found
        schema = registry.schema(schema_id, authorization())
        if schema is None:
            return render(value, fmt)
        where = ", ".join(f"{s} v{v}" for s, v in schema["subjects"]) or "no live subject"
        head = f"[schema id {schema_id}, {schema['schemaType']}, {where}]"
        try:
            return f"{head}\n{decode(schema['schemaType'], schema['schema'], payload)}"
        except ValueError as exc:
            return f"{head} {exc}\n{render(value, 'hex')}"
    return render_value


def install(app: bottle.Bottle, actor, view) -> Registry:
    """The schemas pages: ``/schemas`` (subjects, latest versions, levels) and
    ``/schemas/<subject>`` (every version with its text)."""
    registry = Registry(actor)

    @app.get("/schemas")
    def schemas():
        auth = authorization()
        q = urllib.parse.quote
        subjects = sorted(registry.get("/subjects", auth))
        rows = []
        for subject in subjects[:MAX_SUBJECTS_SHOWN]:
            latest = registry.get(f"/subjects/{q(subject, safe='')}/versions/latest", auth)
            level = registry.get(f"/config/{q(subject, safe='')}?defaultToGlobal=true", auth)
            rows.append({"subject": subject, "version": latest.get("version"), "id": latest.get("id"),
                         "type": latest.get("schemaType") or "AVRO", "level": level.get("compatibilityLevel")})
        return view("schemas", title="Schemas", rows=rows, url=registry.url(), total=len(subjects),
                    level=registry.get("/config", auth).get("compatibilityLevel"),
                    mode=registry.get("/mode", auth).get("mode"))

    @app.get("/schemas/<subject>")
    def subject_page(subject):
        auth = authorization()
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}"
        versions = registry.get(f"{path}/versions", auth)[-MAX_VERSIONS_SHOWN:]
        shown = []
        for v in reversed(versions):
            got = registry.get(f"{path}/versions/{v}", auth)
            text = got.get("schema") or ""
            try:
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                pass  # .proto text (or a serialized descriptor) as stored
            shown.append({"version": got.get("version"), "id": got.get("id"), "text": text,
                          "type": got.get("schemaType") or "AVRO",
                          "references": got.get("references") or []})
        level = registry.get(f"/config/{urllib.parse.quote(subject, safe='')}?defaultToGlobal=true", auth)
        return view("schema", title=f"Schema {subject}", subject=subject, versions=shown,
                    level=level.get("compatibilityLevel"))

    return registry
