"""The schema registry's formats: parsing a schema (is it valid?), its canonical text, and
whether a reader schema can read what a writer schema wrote. Pure: no I/O, no state.

One well-kept library parses each format; the compatibility rules are written here on the
parsed form, as the registry must decide them:
  AVRO      ``fastavro.parse_schema`` (names resolved to full names, references given as
            ``named_schemas``); the rules are Avro's "Schema Resolution" (the specification):
            promotions, record fields matched by name with defaults, enum symbols, unions.
  JSON      ``jsonschema`` (the schema must be valid for its draft, ``check_schema``); the
            rules are the common ones of Confluent's JSON Schema compatibility list (types
            narrowed, required properties added, properties added to an open content model
            or removed from a closed one, additionalProperties closed, bounds narrowed, enums
            narrowed), recursively through properties and items. Not every rule Confluent has.
  PROTOBUF  ``proto_schema_parser`` (a pure-Python .proto parser) for .proto text (and
            ``protobuf_descriptor``: its serialized descriptor, built from that tree), and
            ``google.protobuf``'s ``FileDescriptorProto`` for the base64 form confluent-kafka's
            ProtobufSerializer registers (a serialized descriptor, kept as given, so that
            ``?format=serialized`` answers it back); the rules: a message the
            writer has must still exist, and a field number both have keeps a wire-compatible
            type (Confluent's MESSAGE_REMOVED and FIELD_KIND_CHANGED / FIELD_SCALAR_KIND_CHANGED).

``incompatibilities(kind, reader, writer)`` answers a list of sentences (empty: compatible).
"""
from __future__ import annotations

import json
from typing import Any

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
TYPES = (AVRO, JSON, PROTOBUF)


class InvalidSchema(ValueError):
    """The schema text does not parse as its type says (the client's fault: 42201)."""


class Parsed:
    """A parsed schema: its canonical text (what the registry stores and compares) and the
    library's form (what the compatibility rules walk)."""

    __slots__ = ("kind", "text", "form", "named")

    def __init__(self, kind: str, text: str, form: Any, named: dict | None = None):
        self.kind, self.text, self.form, self.named = kind, text, form, named or {}


def parse(kind: str, text: str, references: list[str] = ()) -> Parsed:
    """Parse ``text`` as a schema of ``kind``; ``references`` are the texts of the schemas it
    references (in order: each may use the ones before it). Raises InvalidSchema."""
    if kind not in TYPES:
        raise InvalidSchema(f"schemaType {kind!r} is not one of {', '.join(TYPES)}")
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchema("the schema is empty")
    if kind == PROTOBUF:
        return _parse_protobuf(text)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidSchema(f"the schema is not JSON: {exc}") from None
    canonical = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return _parse_avro(doc, canonical, references) if kind == AVRO else _parse_json(doc, canonical)


def incompatibilities(reader: Parsed, writer: Parsed) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote (empty: it can)."""
    if reader.kind != writer.kind:
        return [f"the schema type changed from {writer.kind} to {reader.kind}"]
    if reader.kind == AVRO:
        return _AvroResolution(reader.named, writer.named).check(reader.form, writer.form, "")
    if reader.kind == JSON:
        out: list[str] = []
        _json_compat(reader.form, writer.form, "#", out)
        return out
    return _protobuf_compat(reader.form, writer.form)


# ---- Avro ---------------------------------------------------------------------------------
PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
              ("float", "double"), ("string", "bytes"), ("bytes", "string")}  # (writer, reader)


def _parse_avro(doc: Any, canonical: str, references: list[str]) -> Parsed:
    import fastavro
    _fields_present(doc)
    named: dict = {}
    try:
        for ref in references:
            fastavro.parse_schema(json.loads(ref), named_schemas=named)
        form = fastavro.parse_schema(doc, named_schemas=named)
    except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, ValueError, ...
        raise InvalidSchema(f"invalid Avro schema: {exc}") from None
    return Parsed(AVRO, canonical, _strip(form), named)


def _fields_present(doc: Any) -> None:
    """The one check fastavro leaves out: a record declares its fields (the specification
    requires the attribute; fastavro takes a record without one for an empty record)."""
    if isinstance(doc, list):
        for d in doc:
            _fields_present(d)
    elif isinstance(doc, dict):
        if doc.get("type") in ("record", "error") and not isinstance(doc.get("fields"), list):
            raise InvalidSchema(f"invalid Avro schema: record {doc.get('name')!r} has no 'fields' list")
        for f in doc["fields"] if isinstance(doc.get("fields"), list) else ():
            if isinstance(f, dict):
                _fields_present(f.get("type"))
        for key in ("items", "values"):
            _fields_present(doc.get(key))
        if isinstance(doc.get("type"), (dict, list)):
            _fields_present(doc["type"])


def _strip(form: Any) -> Any:
    """fastavro's parsed form without its bookkeeping keys (``__fastavro_parsed``...)."""
    if isinstance(form, dict):
        return {k: _strip(v) for k, v in form.items() if not k.startswith("__")}
    if isinstance(form, list):
        return [_strip(v) for v in form]
    return form


class _AvroResolution:
    """Avro's schema resolution, reader against writer, on fastavro's parsed form (named types
    by full name; a name seen again is a string looked up in ``named``)."""

    def __init__(self, reader_named: dict, writer_named: dict):
        self.rn, self.wn = reader_named, writer_named
        self.assumed: set[tuple[str, str]] = set()  # named pairs under check: recursion assumes success

    def _resolve(self, s: Any, named: dict) -> Any:
        if isinstance(s, str) and s not in PRIMITIVES:
            return _strip(named.get(s, s))
        if isinstance(s, dict) and s.get("type") in PRIMITIVES:
            return s["type"]  # {"type": "int", "logicalType": ...}: its underlying type
        return s

    @staticmethod
    def _kind(s: Any) -> str:
        if isinstance(s, list):
            return "union"
        return s if isinstance(s, str) else s.get("type")

    def check(self, r: Any, w: Any, path: str) -> list[str]:
        r, w = self._resolve(r, self.rn), self._resolve(w, self.wn)
        rk, wk = self._kind(r), self._kind(w)
        where = path or "/"
        if wk == "union":
            out = []
            for i, branch in enumerate(w):
                out += self.check(r, branch, f"{path}/{i}")
            return out
        if rk == "union":
            if any(not self.check(branch, w, path) for branch in r):
                return []
            return [f"{where}: the reader's union has no branch for the writer's {wk}"]
        if rk != wk:
            if (wk, rk) in PROMOTIONS:
                return []
            return [f"{where}: the reader's type {rk} cannot read the writer's {wk}"]
        if rk in PRIMITIVES:
            return []
        if rk in ("record", "enum", "fixed") and r["name"] != w["name"] and w["name"] not in r.get("aliases", ()):
            return [f"{where}: the reader's {rk} is named {r['name']}, the writer's {w['name']}"]
        if rk == "array":
            return self.check(r["items"], w["items"], f"{path}/items")
        if rk == "map":
            return self.check(r["values"], w["values"], f"{path}/values")
        if rk == "fixed":
            return [] if r["size"] == w["size"] else [f"{where}: fixed size {w['size']} read as {r['size']}"]
        if rk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return [f"{where}: the reader's enum {r['name']} lacks the writer's symbols {missing} "
                        f"and has no default"]
            return []
        return self._record(r, w, path)

    def _record(self, r: dict, w: dict, path: str) -> list[str]:
        pair = (r["name"], w["name"])
        if pair in self.assumed:
            return []
        self.assumed.add(pair)
        written = {f["name"]: f for f in w["fields"]}
        out = []
        for f in r["fields"]:
            wf = written.get(f["name"]) or next((written[a] for a in f.get("aliases", ()) if a in written), None)
            if wf is not None:
                out += self.check(f["type"], wf["type"], f"{path}/{f['name']}")
            elif "default" not in f:
                out.append(f"{path or '/'}: the reader's field '{f['name']}' of {r['name']} is not in the "
                           f"writer's schema and has no default")
        return out


# ---- JSON Schema --------------------------------------------------------------------------
def _parse_json(doc: Any, canonical: str) -> Parsed:
    import jsonschema
    if not isinstance(doc, (dict, bool)):
        raise InvalidSchema("a JSON schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(doc).check_schema(doc)
    except jsonschema.SchemaError as exc:
        raise InvalidSchema(f"invalid JSON schema: {exc.message}") from None
    return Parsed(JSON, canonical, doc)


def _types(s: dict) -> set[str] | None:
    t = s.get("type")
    if t is None:
        return None  # any
    return {t} if isinstance(t, str) else set(t)


def _json_compat(r: Any, w: Any, path: str, out: list[str]) -> None:
    """What ``w`` allows that ``r`` refuses, for the common rules (appends sentences to ``out``)."""
    if r is True or r == {}:
        return
    if w is True or w == {} or r is False or not isinstance(r, dict) or not isinstance(w, dict):
        if r != w:
            out.append(f"{path}: the reader's schema is narrower than the writer's")
        return
    rt, wt = _types(r), _types(w)
    if rt is not None:
        widened = rt | ({"integer"} if "number" in rt else set())
        lost = (wt or {"any type"}) - widened
        if lost:
            out.append(f"{path}: type narrowed: the writer allows {sorted(lost)}")
    for key, wider in (("maxLength", max), ("maximum", max), ("maxItems", max), ("maxProperties", max),
                       ("minLength", min), ("minimum", min), ("minItems", min), ("minProperties", min)):
        if key in r and (key not in w or wider(r[key], w[key]) != r[key]):
            out.append(f"{path}: {key} narrowed to {r[key]}")
    if "enum" in r and ("enum" not in w or any(v not in r["enum"] for v in w["enum"])):
        out.append(f"{path}: enum narrowed")
    added = set(r.get("required", ())) - set(w.get("required", ()))
    if added:
        out.append(f"{path}: required properties added: {sorted(added)}")
    rp, wp = r.get("properties") or {}, w.get("properties") or {}
    w_open = w.get("additionalProperties", True) is not False
    if r.get("additionalProperties", True) is False and w_open:
        out.append(f"{path}: additionalProperties closed")
    for name, sub in rp.items():
        if name in wp:
            _json_compat(sub, wp[name], f"{path}/properties/{name}", out)
        elif w_open and sub not in (True, {}):
            out.append(f"{path}: property '{name}' added to an open content model")
    if r.get("additionalProperties", True) is False:
        for name in set(wp) - set(rp):
            out.append(f"{path}: property '{name}' removed from a closed content model")
    if isinstance(r.get("items"), dict) and isinstance(w.get("items"), dict):
        _json_compat(r["items"], w["items"], f"{path}/items", out)


# ---- Protobuf -----------------------------------------------------------------------------
# Scalar types that share a wire encoding (a field may move within a group: Confluent's rule).
WIRE_GROUPS = [{"int32", "uint32", "int64", "uint64", "bool"}, {"sint32", "sint64"}, {"fixed32", "sfixed32"},
               {"fixed64", "sfixed64"}, {"string", "bytes"}]


def _parse_protobuf(text: str) -> Parsed:
    descriptor = _descriptor(text.strip())
    if descriptor is not None:
        messages: dict[str, dict[int, str]] = {}
        _descriptor_messages(descriptor.message_type, "", messages)
        return Parsed(PROTOBUF, text.strip(), messages)
    from antlr4.error.ErrorListener import ErrorListener
    from proto_schema_parser.parser import Parser

    class Refuse(ErrorListener):  # ANTLR's default prints a syntax error and goes on: refuse instead
        def syntaxError(self, recognizer, offending, line, column, msg, e):
            raise InvalidSchema(f"invalid Protobuf schema: line {line}:{column}: {msg}")

    def quiet(recognizer) -> None:
        recognizer.removeErrorListeners()
        recognizer.addErrorListener(Refuse())

    try:
        ast = Parser(setup_lexer=quiet, setup_parser=quiet).parse(text)
    except InvalidSchema:
        raise
    except Exception as exc:  # anything else the parser or its visitor raises on odd input
        raise InvalidSchema(f"invalid Protobuf schema: {exc}") from None
    messages: dict[str, dict[int, str]] = {}
    _proto_messages(ast.file_elements, "", messages)
    return Parsed(PROTOBUF, text.strip(), messages)


def _proto_messages(elements, prefix: str, out: dict) -> None:
    from proto_schema_parser import ast as pa
    for el in elements:
        if isinstance(el, pa.Message):
            name = f"{prefix}{el.name}"
            out[name] = {f.number: f.type for f in el.elements if isinstance(f, pa.Field)}
            _proto_messages(el.elements, name + ".", out)


def _descriptor(text: str):
    """The ``FileDescriptorProto`` of a base64 serialized descriptor, or None if ``text`` is not
    one (.proto text has spaces, which base64 has not)."""
    import base64
    import binascii

    if not text or any(c.isspace() for c in text):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError
    try:
        descriptor = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidSchema(f"invalid Protobuf schema: base64 but not a serialized FileDescriptorProto ({exc})") from None
    if not descriptor.message_type and not descriptor.enum_type and not descriptor.name:
        raise InvalidSchema("invalid Protobuf schema: a serialized FileDescriptorProto with neither name nor types")
    return descriptor


def _descriptor_messages(messages, prefix: str, out: dict) -> None:
    """As ``_proto_messages``, from descriptors: a scalar's type by its .proto name, a message
    or enum field by its type's last name (as .proto text usually spells it)."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto
    for m in messages:
        name = f"{prefix}{m.name}"
        out[name] = {f.number: (f.type_name.rpartition(".")[2] if f.type_name else
                                FieldDescriptorProto.Type.Name(f.type)[len("TYPE_"):].lower()) for f in m.field}
        _descriptor_messages(m.nested_type, name + ".", out)


SCALARS = {"double", "float", "int64", "uint64", "int32", "fixed64", "fixed32", "bool", "string", "bytes",
           "uint32", "sfixed32", "sfixed64", "sint32", "sint64"}


def protobuf_descriptor(text: str) -> str | None:
    """The base64 serialized ``FileDescriptorProto`` of a .proto text (what confluent-kafka's
    Protobuf deserializer asks for with ``?format=serialized``), built from
    proto-schema-parser's tree: messages (nested), fields, maps, oneofs, enums, the package,
    the imports. None if the text is already a serialized descriptor, or if a type it names
    is neither declared in it nor in one of the well-known ``google/protobuf/*.proto`` it
    imports (a reference to another subject's file is not resolved here)."""
    import base64
    import importlib
    import re

    from google.protobuf import descriptor_pb2, descriptor_pool
    from proto_schema_parser import ast as pa
    from proto_schema_parser.parser import Parser

    if _descriptor(text.strip()) is not None:
        return None
    tree = Parser().parse(text)
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="default.proto", syntax=tree.syntax or "proto2")
    package = next((e.name for e in tree.file_elements if isinstance(e, pa.Package)), "")
    fdp.package = package
    fdp.dependency.extend(e.name for e in tree.file_elements if isinstance(e, pa.Import))
    declared: dict[str, int] = {}  # full name (".pkg.Outer.Inner") -> TYPE_MESSAGE / TYPE_ENUM

    def names(elements, scope: str) -> None:
        for e in elements:
            if isinstance(e, (pa.Message, pa.Enum)):
                declared[f"{scope}.{e.name}"] = F.TYPE_MESSAGE if isinstance(e, pa.Message) else F.TYPE_ENUM
                if isinstance(e, pa.Message):
                    names(e.elements, f"{scope}.{e.name}")
    root = f".{package}" if package else ""
    names(tree.file_elements, root)
    known = descriptor_pool.Default()
    for dependency in fdp.dependency:  # the well-known types' modules put them in the default pool
        well_known = re.fullmatch(r"google/protobuf/(\w+)\.proto", dependency)
        if well_known:
            try:
                importlib.import_module(f"google.protobuf.{well_known.group(1)}_pb2")
            except ImportError:
                pass

    def resolve(name: str, scope: str) -> tuple[int, str]:
        """Protobuf's scoping: the innermost scope first, then each enclosing one."""
        if name.startswith("."):
            candidates = [name]
        else:
            parts = scope.split(".")
            candidates = [".".join(parts[:i] + [name]) for i in range(len(parts), 0, -1)] + [f".{name}"]
        for c in candidates:
            if c in declared:
                return declared[c], c
        for c in candidates:
            for find, kind in ((known.FindMessageTypeByName, F.TYPE_MESSAGE), (known.FindEnumTypeByName, F.TYPE_ENUM)):
                try:
                    find(c[1:])
                    return kind, c
                except KeyError:
                    pass
        raise KeyError(name)

    def field(out, name: str, number: int, kind: str, label: int, scope: str):
        f = out.field.add(name=name, number=number, label=label, json_name=_json_name(name))
        if kind in SCALARS:
            f.type = F.Type.Value(f"TYPE_{kind.upper()}")
        else:
            f.type, f.type_name = resolve(kind, scope)
        return f

    def message(out, m, scope: str) -> None:
        here = f"{scope}.{m.name}"
        for e in m.elements:
            if isinstance(e, pa.Field):
                label = {pa.FieldCardinality.REPEATED: F.LABEL_REPEATED,
                         pa.FieldCardinality.REQUIRED: F.LABEL_REQUIRED}.get(e.cardinality, F.LABEL_OPTIONAL)
                field(out, e.name, e.number, e.type, label, here)
            elif isinstance(e, pa.MapField):
                entry = out.nested_type.add(name="".join(p[:1].upper() + p[1:] for p in e.name.split("_")) + "Entry")
                entry.options.map_entry = True
                field(entry, "key", 1, e.key_type, F.LABEL_OPTIONAL, here)
                field(entry, "value", 2, e.value_type, F.LABEL_OPTIONAL, here)
                out.field.add(name=e.name, number=e.number, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                              type_name=f"{here}.{entry.name}", json_name=_json_name(e.name))
            elif isinstance(e, pa.OneOf):
                index = len(out.oneof_decl)
                out.oneof_decl.add(name=e.name)
                for o in e.elements:
                    if isinstance(o, pa.Field):
                        field(out, o.name, o.number, o.type, F.LABEL_OPTIONAL, here).oneof_index = index
            elif isinstance(e, pa.Message):
                message(out.nested_type.add(name=e.name), e, here)
            elif isinstance(e, pa.Enum):
                enum(out.enum_type.add(name=e.name), e)

    def enum(out, e) -> None:
        for v in e.elements:
            if isinstance(v, pa.EnumValue):
                out.value.add(name=v.name, number=v.number)

    try:
        for e in tree.file_elements:
            if isinstance(e, pa.Message):
                message(fdp.message_type.add(name=e.name), e, root)
            elif isinstance(e, pa.Enum):
                enum(fdp.enum_type.add(name=e.name), e)
    except KeyError:
        return None
    return base64.standard_b64encode(fdp.SerializeToString()).decode("ascii")


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _same_wire(a: str, b: str) -> bool:
    return a == b or any(a in g and b in g for g in WIRE_GROUPS)


def _protobuf_compat(reader: dict, writer: dict) -> list[str]:
    out = []
    for name, fields in writer.items():
        if name not in reader:
            out.append(f"message {name} removed")
            continue
        for number, kind in fields.items():
            theirs = reader[name].get(number)
            if theirs is not None and not _same_wire(theirs, kind):
                out.append(f"message {name}: field {number} changed from {kind} to {theirs}")
    return out
