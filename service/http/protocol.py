"""The HTTP server's own 400 answers (a request its parser refuses, before the app sees it: a malformed request line,
a URL or headers past the parser's limits, e.g. a 100,000-character path) in the service's JSON error envelope,
``{"error": {"message", "type", "param", "code"}}`` (:class:`service.http.errors.APIError`), instead of uvicorn's plain
text ``Invalid HTTP request received.``.

uvicorn writes that answer itself (``send_400_response`` of its protocol classes; the ASGI app is never called), so
the protocol is subclassed here and passed as ``uvicorn.Config(http=...)``: httptools' protocol when httptools is
installed (uvicorn's own choice, ``http="auto"``), else h11's. The path is not known when the parser fails, so the
answer is always OpenAI's envelope (also under ``/qdrant``). Follows uvicorn 0.30+'s ``send_400_response(msg)``.
"""

from __future__ import annotations

import json

from service.http.errors import APIError


def envelope_400(msg: str) -> bytes:
    """The JSON body of a 400 for a request the HTTP parser refused (``msg``: the server's reason)."""
    e = APIError(400, f"malformed HTTP request: {msg.rstrip('.')}", code="invalid_http_request")
    return json.dumps(e.body()).encode()


def protocol_class() -> type:
    """The uvicorn HTTP protocol class to serve with: uvicorn's (httptools', else h11's) answering its 400s in the
    JSON envelope."""
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's h11 protocol
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class EnvelopeH11Protocol(H11Protocol):
            def send_400_response(self, msg: str) -> None:
                body = envelope_400(msg)
                headers = [
                    (b"content-type", b"application/json"),
                    (b"connection", b"close"),
                    (b"content-length", str(len(body)).encode()),
                ]
                for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
                self.transport.close()

        return EnvelopeH11Protocol

    class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            body = envelope_400(msg)
            content = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:
                content.extend([name, b": ", value, b"\r\n"])
            content += [
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
            self.transport.write(b"".join(content))
            self.transport.close()

    return EnvelopeHttpToolsProtocol
