"""The schema registry's state machine: subjects, their versions, schema ids, compatibility
levels and modes, as Confluent's Schema Registry keeps them. Pure: no I/O, no clock; the
registry actor (``coordinator.registry_actor``) owns one and is its single caller.

Durable form: records of the compacted ``_schemas`` topic, in Confluent's shapes (JSON key and
value, so a key written twice compacts to its last value):
  key {"keytype": "SCHEMA", "subject", "version", "magic": 1}
      value {"subject", "version", "id", "schema", "schemaType", "references", "deleted"};
      a null value (tombstone) is a permanent delete of that version.
  key {"keytype": "CONFIG", "subject" (null: global), "magic": 0}  value {"compatibilityLevel"}
  key {"keytype": "MODE", "subject" (null: global), "magic": 0}    value {"mode"}
  (null values: the subject's setting removed)
``apply(key, value)`` is the one way state changes, at replay and after a write alike. A
write is planned first (``register``, ``delete_subject``, ...: checked against the state,
nothing changed) and answers the records to append; the actor appends them, then applies
them, then answers the client. The planned answer is valid only if nothing was applied in
between: the actor runs one write at a time.

Errors are ``RegistryError(http_status, error_code, message)``, Confluent's codes.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from odradek.coordinator import schema_formats as formats

LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")
MODES = ("READWRITE", "READONLY", "IMPORT")
DEFAULT_LEVEL, DEFAULT_MODE = "BACKWARD", "READWRITE"


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def subject_not_found(s: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{s}' not found.")


def version_not_found(s: str, v: Any) -> RegistryError:
    return RegistryError(404, 40402, f"Version {v} not found for subject '{s}'.")


def invalid_schema(why: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {why}")


class Version(NamedTuple):
    subject: str
    version: int
    id: int
    schema: str
    schema_type: str
    references: tuple  # of (name, subject, version)
    deleted: bool

    def body(self) -> dict:
        """The REST answer for this version (schemaType and references only when not default)."""
        out = {"subject": self.subject, "version": self.version, "id": self.id, "schema": self.schema}
        return {**out, **_type_and_refs(self.schema_type, self.references)}


class Plan(NamedTuple):
    """A write's answer once ``records`` (``[(key, value)]``, JSON bytes) are stored."""
    answer: Any
    records: list


def _type_and_refs(kind: str, refs: tuple) -> dict:
    out: dict = {} if kind == formats.AVRO else {"schemaType": kind}
    if refs:
        out["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in refs]
    return out


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> bytes:
    return _dump({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})


def setting_key(keytype: str, subject: str | None) -> bytes:
    return _dump({"keytype": keytype, "subject": subject, "magic": 0})


class SchemaRegistry:
    """Not thread-safe: one caller (the registry actor's loop)."""

    def __init__(self) -> None:
        self.subjects: dict[str, dict[int, Version]] = {}
        self.by_id: dict[int, tuple[str, str, tuple]] = {}  # id -> (schemaType, schema, references)
        self.ids: dict[tuple[str, str, tuple], int] = {}  # the reverse: one id per distinct schema
        self.levels: dict[str | None, str] = {}  # None: the global level
        self.modes: dict[str | None, str] = {}

    # ---- the one way state changes ------------------------------------------------------
    def apply(self, key: bytes | None, value: bytes | None) -> str | None:
        """Apply one ``_schemas`` record; returns why it was not usable (None: applied)."""
        try:
            k = json.loads(key) if key else None
            v = json.loads(value) if value is not None else None
            kind = k["keytype"]
            if kind == "SCHEMA":
                self._apply_schema(k["subject"], int(k["version"]), v)
            elif kind in ("CONFIG", "MODE"):
                table, field, allowed = ((self.levels, "compatibilityLevel", LEVELS) if kind == "CONFIG"
                                         else (self.modes, "mode", MODES))
                if v is None:
                    table.pop(k["subject"], None)
                elif v[field] in allowed:
                    table[k["subject"]] = v[field]
                else:
                    return f"{kind} value {v[field]!r} is not one of {allowed}"
            elif kind in ("NOOP", "DELETE_SUBJECT", "CLEAR_SUBJECT"):
                pass  # Confluent's markers; the SCHEMA records carry the state here
            else:
                return f"unknown keytype {kind!r}"
        except (ValueError, KeyError, TypeError) as exc:
            return f"not a registry record ({type(exc).__name__}: {exc})"
        return None

    def _apply_schema(self, subject: str, version: int, v: dict | None) -> None:
        if v is None:
            versions = self.subjects.get(subject, {})
            versions.pop(version, None)
            if not versions:
                self.subjects.pop(subject, None)
            return
        refs = tuple((r["name"], r["subject"], int(r["version"])) for r in v.get("references") or ())
        kind = v.get("schemaType") or formats.AVRO
        if kind not in formats.TYPES or not isinstance(v["schema"], str) or not isinstance(subject, str):
            raise ValueError(f"schemaType {kind!r}, schema and subject must be a type and strings")
        row = Version(subject, version, int(v["id"]), v["schema"], kind, refs, bool(v.get("deleted")))
        self.subjects.setdefault(subject, {})[version] = row
        self.by_id[row.id] = (kind, row.schema, refs)
        self.ids.setdefault((kind, row.schema, refs), row.id)

    # ---- reads ------------------------------------------------------------------------
    def subject_names(self, deleted: bool = False) -> list[str]:
        return sorted(s for s, vs in self.subjects.items() if deleted or any(not v.deleted for v in vs.values()))

    def live(self, subject: str, deleted: bool = False) -> list[Version]:
        """The subject's versions, oldest first (soft-deleted ones too with ``deleted``)."""
        return [v for _, v in sorted(self.subjects.get(subject, {}).items()) if deleted or not v.deleted]

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        rows = self.live(subject, deleted)
        if not rows:
            raise subject_not_found(subject)
        return [v.version for v in rows]

    def get(self, subject: str, version: str | int, deleted: bool = False) -> Version:
        rows = self.live(subject, deleted)
        if not rows:
            raise subject_not_found(subject)
        if version in ("latest", -1, "-1"):
            return rows[-1]
        n = _version_number(version)
        for v in rows:
            if v.version == n:
                return v
        raise version_not_found(subject, n)

    def schema(self, schema_id: Any) -> dict:
        try:
            kind, text, refs = self.by_id[int(schema_id)]
        except (KeyError, ValueError, TypeError):
            raise RegistryError(404, 40403, f"Schema {schema_id} not found") from None
        return {"schema": text, **_type_and_refs(kind, refs)}

    def id_versions(self, schema_id: Any) -> list[dict]:
        self.schema(schema_id)
        return [{"subject": v.subject, "version": v.version} for vs in self.subjects.values()
                for v in vs.values() if v.id == int(schema_id) and not v.deleted]

    def level(self, subject: str | None = None) -> str:
        return self.levels.get(subject) or self.levels.get(None) or DEFAULT_LEVEL

    def mode(self, subject: str | None = None) -> str:
        return self.modes.get(subject) or self.modes.get(None) or DEFAULT_MODE

    def lookup(self, subject: str, request: Any, deleted: bool = False) -> dict:
        """POST /subjects/{s}: the version of ``subject`` holding this schema."""
        kind, parsed, refs = self._parse_request(request)
        rows = self.live(subject, deleted)
        if not rows:
            raise subject_not_found(subject)
        for v in rows:
            if (v.schema_type, v.schema, v.references) == (kind, parsed.text, refs):
                return v.body()
        raise RegistryError(404, 40403, f"Schema not found under subject '{subject}'")

    def check(self, subject: str, request: Any, version: str | int | None = None) -> list[str]:
        """POST /compatibility/...: why the schema is not compatible (empty: it is) with the
        given version, or (``None``) with what the subject's level says."""
        kind, parsed, _refs = self._parse_request(request)
        if version is None:
            return self._incompatibilities(subject, parsed, self._against(subject))
        return self._incompatibilities(subject, parsed, [self.get(subject, version)])

    # ---- planned writes -------------------------------------------------------------------
    def register(self, subject: str, request: Any) -> Plan:
        """POST /subjects/{s}/versions: ``{"id"}``, the schema's id, new or not."""
        mode = self.mode(subject)
        if mode == "READONLY":
            raise RegistryError(422, 42205, f"Subject '{subject}' is in read-only mode")
        kind, parsed, refs = self._parse_request(request)
        rows = self.live(subject)
        for v in rows:
            if (v.schema_type, v.schema, v.references) == (kind, parsed.text, refs):
                return Plan({"id": v.id}, [])
        wanted_id, wanted_version = request.get("id"), request.get("version")
        if mode == "IMPORT":
            if not isinstance(wanted_id, int) or wanted_id < 1:
                raise RegistryError(422, 42205, "in IMPORT mode a registration names its schema id ('id')")
            taken = self.by_id.get(wanted_id)
            if taken is not None and taken != (kind, parsed.text, refs):
                raise RegistryError(422, 42205, f"schema id {wanted_id} is already another schema's")
        elif wanted_id is not None:
            raise RegistryError(422, 42205, "a schema id ('id') may be given in IMPORT mode only")
        else:
            why = self._incompatibilities(subject, parsed, self._against(subject))
            if why:
                raise RegistryError(409, 409, f"Schema being registered is incompatible with an earlier "
                                              f"schema for subject '{subject}', details: {why}")
        schema_id = wanted_id or self.ids.get((kind, parsed.text, refs)) or max(self.by_id, default=0) + 1
        every = self.subjects.get(subject, {})
        version = max(every, default=0) + 1
        if mode == "IMPORT" and wanted_version is not None:
            version = _version_number(wanted_version)
            if version in every:
                raise RegistryError(422, 42202, f"version {version} of subject '{subject}' exists")
        value = {"subject": subject, "version": version, "id": schema_id, "schema": parsed.text,
                 **_type_and_refs(kind, refs), "deleted": False}
        return Plan({"id": schema_id}, [(schema_key(subject, version), _dump(value))])

    def delete_subject(self, subject: str, permanent: bool = False) -> Plan:
        """DELETE /subjects/{s}: the versions deleted. Soft marks them deleted; permanent
        (only after a soft delete) removes them (tombstones)."""
        self._writable(subject)
        every = self.live(subject, deleted=True)
        if not every:
            raise subject_not_found(subject)
        live = [v for v in every if not v.deleted]
        self._unreferenced(every)
        if permanent:
            if live:
                raise RegistryError(404, 40405, f"Subject '{subject}' was not deleted first before being "
                                                f"permanently deleted")
            return Plan([v.version for v in every], [(schema_key(subject, v.version), None) for v in every]
                        + [(setting_key("CONFIG", subject), None), (setting_key("MODE", subject), None)])
        if not live:
            raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted. Set permanent=true to delete "
                                            f"permanently")
        return Plan([v.version for v in live], [self._soft(v) for v in live])

    def delete_version(self, subject: str, version: str | int, permanent: bool = False) -> Plan:
        """DELETE /subjects/{s}/versions/{v}: the version deleted."""
        self._writable(subject)
        v = self.get(subject, version, deleted=True) if version != "latest" else self.get(subject, "latest")
        self._unreferenced([v])
        if permanent:
            if not v.deleted:
                raise RegistryError(404, 40407, f"Subject '{subject}' Version {v.version} was not deleted first "
                                                f"before being permanently deleted")
            return Plan(v.version, [(schema_key(subject, v.version), None)])
        if v.deleted:
            raise RegistryError(404, 40406, f"Subject '{subject}' Version {v.version} was soft deleted. Set "
                                            f"permanent=true to delete permanently")
        return Plan(v.version, [self._soft(v)])

    def set_level(self, subject: str | None, request: Any) -> Plan:
        level = request.get("compatibility") if isinstance(request, dict) else None
        if level not in LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}: one of {', '.join(LEVELS)}")
        return Plan({"compatibility": level}, [(setting_key("CONFIG", subject), _dump({"compatibilityLevel": level}))])

    def delete_level(self, subject: str) -> Plan:
        if subject not in self.levels:
            raise RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility "
                                            f"configured")
        return Plan({"compatibilityLevel": self.levels[subject]}, [(setting_key("CONFIG", subject), None)])

    def set_mode(self, subject: str | None, request: Any) -> Plan:
        mode = request.get("mode") if isinstance(request, dict) else None
        if mode not in MODES:
            raise RegistryError(422, 42204, f"Invalid mode {mode!r}: one of {', '.join(MODES)}")
        if mode == "IMPORT" and subject is None and self.subjects and not request.get("force"):
            raise RegistryError(422, 42205, "Cannot import since found existing subjects (force=true to go on)")
        return Plan({"mode": mode}, [(setting_key("MODE", subject), _dump({"mode": mode}))])

    # ---- helpers --------------------------------------------------------------------------
    def _unreferenced(self, rows: list[Version]) -> None:
        """Refuse to delete a version another live version references (Confluent's 42206)."""
        doomed = {(v.subject, v.version) for v in rows}
        for vs in self.subjects.values():
            for v in vs.values():
                if not v.deleted and (v.subject, v.version) not in doomed:
                    used = [(s, n) for _, s, n in v.references if (s, n) in doomed]
                    if used:
                        raise RegistryError(422, 42206, f"One or more references exist to the schema "
                                                        f"{{subject={used[0][0]}, version={used[0][1]}}}: "
                                                        f"version {v.version} of '{v.subject}'")

    def _writable(self, subject: str) -> None:
        if self.mode(subject) == "READONLY":
            raise RegistryError(422, 42205, f"Subject '{subject}' is in read-only mode")

    @staticmethod
    def _soft(v: Version) -> tuple[bytes, bytes]:
        value = {"subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema,
                 **_type_and_refs(v.schema_type, v.references), "deleted": True}
        return schema_key(v.subject, v.version), _dump(value)

    def _parse_request(self, request: Any) -> tuple[str, formats.Parsed, tuple]:
        if not isinstance(request, dict) or not isinstance(request.get("schema"), str):
            raise invalid_schema("the request must be a JSON object with a 'schema' string")
        kind = request.get("schemaType") or formats.AVRO
        refs, texts = [], []
        for r in request.get("references") or ():
            if not isinstance(r, dict) or not all(isinstance(r.get(f), str) for f in ("name", "subject")):
                raise invalid_schema(f"a reference has a 'name', a 'subject' and a 'version': {r!r}")
            try:
                target = self.get(r["subject"], r.get("version", "latest"))
            except RegistryError:
                raise invalid_schema(f"reference {r['name']!r}: subject '{r['subject']}' version "
                                     f"{r.get('version')} not found") from None
            refs.append((r["name"], r["subject"], target.version))
            texts.append(target.schema)
        try:
            parsed = formats.parse(kind, request["schema"], texts)
        except formats.InvalidSchema as exc:
            raise invalid_schema(str(exc)) from None
        return kind, parsed, tuple(refs)

    def _against(self, subject: str) -> list[Version]:
        """The versions a new schema is checked against: every live one (``_TRANSITIVE``
        levels) or the latest."""
        rows = self.live(subject)
        return rows if self.level(subject).endswith("_TRANSITIVE") else rows[-1:]

    def _incompatibilities(self, subject: str, new: formats.Parsed, rows: list[Version]) -> list[str]:
        """Why ``new`` cannot stand beside ``rows`` at the subject's level (empty: it can)."""
        level = self.level(subject)
        if level == "NONE":
            return []
        out = []
        for v in rows:
            old = formats.parse(v.schema_type, v.schema, [self.get(s, n, deleted=True).schema
                                                          for _, s, n in v.references])
            if level.startswith(("BACKWARD", "FULL")):
                out += [f"version {v.version} (backward): {w}" for w in formats.incompatibilities(new, old)]
            if level.startswith(("FORWARD", "FULL")):
                out += [f"version {v.version} (forward): {w}" for w in formats.incompatibilities(old, new)]
        return out


def _version_number(version: Any) -> int:
    try:
        n = int(version)
    except (ValueError, TypeError):
        n = 0
    if n < 1 or n > 2**31 - 1:
        raise RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id. Allowed "
                                        f"values are between [1, 2^31-1] and the string \"latest\"")
    return n
