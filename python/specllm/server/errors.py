"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}, never a traceback."""
from __future__ import annotations

import json
import logging
import re
from typing import Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("specllm.server")


UNION_TAG = re.compile(r"^(int|str|float|bool|none|list\[.*\]|dict\[.*\]|literal\[.*\]|function-.*|[A-Z]\w*)$")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """The error in the shape of Anthropic's API (/v1/messages), whose clients read error.type by status."""
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(self.status, "api_error"),
                                           "message": self.message, "param": self.param}}

    def response(self, shape: str = "openai") -> JSONResponse:
        """shape: "openai", "anthropic" (/v1/messages) or "ollama" (/api/...: {"error": message})."""
        body = {"anthropic": self.anthropic_body, "ollama": lambda: {"error": self.message}}.get(shape, self.body)()
        return SafeJSONResponse(body, status_code=self.status, headers=self.headers)


class SafeJSONResponse(JSONResponse):
    """JSON as UTF-8; a string with a lone surrogate (JSON's "\\ud800", which a request may carry and an answer
    echo) has no UTF-8 form, so then the whole body is written with \\u escapes (still JSON) instead of a 500."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def json_text(value) -> str:
    """JSON text for a stream's event or line, non-ASCII as itself; with \\u escapes where a string holds a lone
    surrogate (as SafeJSONResponse), which has no UTF-8 form and cut the stream off mid-answer."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def shape_of(path: str) -> str:
    """The error shape of the API a path belongs to."""
    return "anthropic" if path.startswith("/v1/messages") else "ollama" if path.startswith("/api/") else "openai"


def _shape(request: Request) -> str:
    return shape_of(request.url.path)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "the request body is not valid")
    e = errors[0]
    # without "body" and the union members pydantic names (stop.str, content.list[ContentPart], ...)
    loc = [str(x) for x in e.get("loc", ()) if x != "body" and not UNION_TAG.match(str(x))]
    if e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",):
        return APIError(400, "the request has no body: send its fields as a JSON object (Content-Type: "
                             "application/json)", param=None, code="invalid_json")
    if e.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {e.get('msg', '')}", param=None,
                        code="invalid_json")
    param = ".".join(loc) or None
    got = e.get("input")
    shown = repr(got) if len(repr(got)) <= 80 else repr(got)[:77] + "..."
    what = f"{param}: {e.get('msg', 'invalid value')}" if param else e.get("msg", "invalid body")
    if e.get("type") != "missing" and param:
        what += f" (got {shown})"
    return APIError(400, what, param=param, code="invalid_value")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the OpenAI error shape (Anthropic's on /v1/messages,
    Ollama's on /api/)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return exc.response(_shape(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = _validation_error(exc)
        return err.response(_shape(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kinds = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}
        type_, code = kinds.get(exc.status_code, ("invalid_request_error", None))
        message = exc.detail if isinstance(exc.detail, str) else "invalid request"
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's words
            message, code = ("the request body cannot be read as JSON: it must be UTF-8, nested at most ~1000 levels "
                             "deep, with integers of at most 4300 digits", "invalid_json")
        return APIError(exc.status_code, message, type_, None, code,
                        getattr(exc, "headers", None)).response(_shape(request))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return APIError(500, f"internal error ({type(exc).__name__}); the server goes on serving", "server_error",
                        None, "internal_error").response(_shape(request))
