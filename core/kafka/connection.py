"""One Kafka connection's protocol state, held by the processor (network/processor.py). Pure.

``next()`` turns the bytes fed in into ``codec.Frame``s carrying the same internal request a
native client sends (``{api, v, corr, client, body}`` + payload frames), plus ``kafka``: what is
needed to answer (registry entry, version, decoded request). A request answered without a
handler (ApiVersions, an unsupported version) comes out as a Frame whose header holds
``answer``, the response's buffers. ``answer()`` encodes the internal reply as the Kafka
response for that request's key, version and correlation id.
"""
from __future__ import annotations

import logging

from odradek.core import codec
from odradek.core.kafka import framing, schema
from odradek.core.kafka.apis import REGISTRY, Api, api_versions, top_level_error
from odradek.core.protocol import ApiKey, ErrorCode

log = logging.getLogger("odradek.kafka")


class KafkaConnection:
    def __init__(self, max_size: int, peer: str = "?"):
        self.decoder = framing.Decoder(max_size)
        self.peer = peer
        self.client: str | None = None
        # Set by the processor on a connection that must authenticate (network/processor.py):
        # (Request) -> a Frame it answered itself (SaslHandshake, SaslAuthenticate), or None
        # to go on; it raises FrameError for a request not allowed before authentication.
        self.intercept = None

    def feed(self, data: bytes) -> None:
        self.decoder.feed(data)

    @property
    def buffered(self) -> int:
        return self.decoder.buffered

    def head_size(self) -> int | None:
        return self.decoder.head_size()

    def next(self) -> codec.Frame | None:
        req = self.decoder.next()
        if req is None:
            return None
        if req.api == framing.RAW_SASL:  # only the processor's SASL gate may answer it
            if self.intercept is None:
                raise framing.FrameError("a raw SASL token on a connection without SASL")
            return self.intercept(req)
        if self.client is None:
            self.client = req.client
            log.info("Kafka client '%s' connected from %s", req.client, self.peer)
        if self.intercept is not None:
            frame = self.intercept(req)
            if frame is not None:
                return frame
        try:
            return self._translate(req)
        except framing.FrameError:
            raise
        except Exception as exc:  # a bug in a decoder: this connection is refused, the processor serves on
            log.exception("cannot read %s v%d from client '%s'", _name(req.api), req.version, req.client)
            raise framing.FrameError(f"{_name(req.api)} v{req.version} could not be read: "
                                     f"{type(exc).__name__}: {exc}") from None

    def _translate(self, req: framing.Request) -> codec.Frame:
        api = REGISTRY.get(req.api)
        if api is None or not api.min_version <= req.version <= api.max_version:
            return self._unsupported(req, api)
        request = api.decode(req.version, req.rest) if api.decode else schema.decode_request(req.api, req.version,
                                                                                             req.rest)
        if api.local is not None:
            return _answered(req.corr, framing.response(req.corr, False, [
                schema.encode_response(req.api, req.version, api.local(req.version, request))]))
        try:
            body, frames = api.to_internal(req.version, request)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise framing.FrameError(f"{_name(req.api)} v{req.version} from client '{req.client}' "
                                     f"has a field of the wrong shape: {type(exc).__name__}: {exc}") from None
        header = {"api": api.internal if api.internal is not None else api.key, "v": 0, "corr": req.corr,
                  "client": req.client, "body": body}
        if api.answers is None or api.answers(req.version, request):
            header["kafka"] = (api, req.version, request)
        return codec.Frame(header, [memoryview(f) for f in frames])

    def _unsupported(self, req: framing.Request, api: Api | None) -> codec.Frame:
        code = int(ErrorCode.UNSUPPORTED_VERSION)
        if req.api == ApiKey.API_VERSIONS:  # answered at v0 with the list, as Kafka does (KIP-511)
            body = api_versions(0, {})
            body["error_code"] = code
            return _answered(req.corr, framing.response(req.corr, False, [schema.encode_response(18, 0, body)]))
        rng = f"versions {api.min_version} to {api.max_version}" if api else "no version (unknown API key)"
        message = f"{_name(req.api)} (key {req.api}) v{req.version} is not supported: this broker serves {rng}"
        if not schema.known(req.api, req.version):
            raise framing.FrameError(message, ErrorCode.UNSUPPORTED_VERSION)
        request = schema.decode_request(req.api, req.version, req.rest)
        body = (api.error if api and api.error else top_level_error)(req.version, request, code, message)
        return _answered(req.corr, self._frame(req.api, req.version, req.corr, body))

    def answer(self, ctx: tuple, corr: int, kind: str, fields, payload: list) -> list:
        """The response buffers for the internal reply: ``kind`` "_reply" (``fields`` a
        ``Response``) or "_error" (an ``ErrorReply``)."""
        api, version, request = ctx
        try:
            if kind == "_error":
                body = (api.error or top_level_error)(version, request, fields.code, fields.message)
            else:
                body = api.from_internal(version, request, fields, payload)
            return self._frame(api.key, version, corr, body)
        except Exception:  # a bug in a translation: the client gets an error, the processor lives
            log.exception("cannot encode %s v%d for client '%s'", _name(api.key), version, self.client)
            body = (api.error or top_level_error)(version, request, int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                                  "the broker could not encode its answer (see its log)")
            return self._frame(api.key, version, corr, body)

    @staticmethod
    def _frame(key: int, version: int, corr: int, body) -> list:
        bufs = body if isinstance(body, list) else [schema.encode_response(key, version, body)]
        return framing.response(corr, schema.response_header_flexible(key, version), bufs)


def _answered(corr: int, bufs: list) -> codec.Frame:
    return codec.Frame({"corr": corr, "answer": bufs}, [])


def _name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"API {key}"
