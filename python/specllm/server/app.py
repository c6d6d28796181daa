"""The FastAPI app: routes, OpenAI-shaped errors, bearer-key auth, CORS, a body cap, request metrics, and the
worker's lifetime; serve() runs it with uvicorn."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import logging
import signal
import socket
import threading
import time
from typing import Callable, Optional, Sequence, Union

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import ListenError
from ..llm import LLM
from . import completion, embeddings, errors, infill, jobs, messages, ollama, ollama_models, responses, routes
from .errors import APIError
from .metrics import Metrics
from .response_store import ResponseStore
from .worker import Worker

log = logging.getLogger("specllm.server")
DEFAULT_MAX_BODY = 4 * 2**20  # bytes: a long conversation is a few hundred KiB


class State:
    def __init__(self, worker: Worker, metrics: Metrics, model_id: Optional[str], max_queue: int):
        self.worker, self.metrics, self.max_queue = worker, metrics, max_queue
        self.cache_reuse = 0  # create_app's
        self._model_id = model_id
        self.created = int(time.time())
        self.lane = None  # the thread requests are prepared on (jobs.prepared), made at first use

    @property
    def llm(self) -> LLM:
        return self.worker.llm

    @property
    def model_id(self) -> str:
        return self.known_model_id or "loading"

    @property
    def known_model_id(self) -> Optional[str]:
        """The model's id: create_app's, or the loaded LLM's; None while a function loads it (create_app without a
        model_id: the CLI gives one)."""
        if self._model_id:
            return self._model_id
        llm = self.worker.llm
        return model_id_of(llm) if llm is not None else None

    def require_ready(self) -> None:
        if self.worker.load_error is not None:
            raise APIError(503, f"the model could not be loaded: {self.worker.load_error}", "server_error", None,
                           "model_load_failed")
        if not self.worker.ready:
            raise APIError(503, "the model is still loading; retry shortly (GET /health says when it is ready)",
                           "server_error", None, "model_loading", headers={"Retry-After": "5"})


def model_id_of(llm: LLM) -> str:
    """The id clients name the model by: its registry name, or the GGUF file's name without .gguf."""
    return jobs.model_id(llm._model)


class BodyLimit:
    """ASGI middleware: refuse a body over max_body bytes with a 413 (by Content-Length, or counted as it
    arrives), and count every response by endpoint and status."""

    def __init__(self, app, max_body: int, metrics: Metrics):
        self.app, self.max_body, self.metrics = app, max_body, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = json_content_type(scope)
        path = scope.get("path", "")
        endpoint = path if path in KNOWN_PATHS else "other"
        status = {}
        too_big = APIError(413, f"the request body is larger than {self.max_body} bytes", "invalid_request_error",
                           None, "request_too_large").response(errors.shape_of(path))

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                self.metrics.requests.labels(endpoint=endpoint, status=str(message["status"])).inc()
            await send(message)

        length = dict(scope.get("headers") or {}).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await too_big(scope, receive, counting_send)
        seen, over = 0, []

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    over.append(True)
                    return {"type": "http.disconnect"}  # the app stops reading; its answer is replaced below
            return message

        async def replacing_send(message):
            if not over:
                return await counting_send(message)
            if message["type"] == "http.response.start" and "code" not in status:
                await too_big(scope, receive, counting_send)

        try:
            await self.app(scope, counting_receive, replacing_send)
        except Exception:  # Starlette's error middleware, outside this one, answers it with a 500: count that
            if "code" not in status:
                self.metrics.requests.labels(endpoint=endpoint, status="500").inc()
            raise


def json_content_type(scope: dict) -> dict:
    """The scope of a POST from a client that is not a browser (no Origin header) with its body read as JSON whatever
    its Content-Type says, as llama-server and Ollama read it: `curl URL -d '{...}'` (Ollama's README) sends
    application/x-www-form-urlencoded, which FastAPI would not parse ("Input should be a valid dictionary"). A
    browser's request keeps its own type, so a page cannot make one that skips CORS's preflight (text/plain) count."""
    if scope.get("method") != "POST":
        return scope
    headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
    if any(k == b"origin" for k, _ in headers):
        return scope
    given = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    if given == b"application/json" or given.endswith(b"+json"):
        return scope
    return dict(scope, headers=headers + [(b"content-type", b"application/json")])


KNOWN_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/input_tokens",
               "/v1/messages", "/v1/messages/count_tokens", "/infill", "/completion", "/completions", "/tokenize",
               "/detokenize", "/props", "/apply-template", "/v1/models", "/health", "/metrics",
               "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version",
               "/v1/embeddings", "/embeddings", "/api/embed", "/api/embeddings"}


def _streams_end_by_the_worker() -> None:
    """sse-starlette (3.x) cancels every open stream itself when uvicorn is told to exit, racing the shutdown that
    stops the worker, which ends each stream with its 503 event and [DONE]: cut off first, streams lost both (a
    reviewer: a running and a queued stream, both cut in 3 of 4 SIGTERMs). Its own drain is turned off."""
    from sse_starlette.sse import AppStatus

    off = getattr(AppStatus, "disable_automatic_graceful_drain", None)  # sse-starlette 2.x has no such watcher
    if off is not None:
        off()


def create_app(llm: Union[LLM, Callable[[], LLM]], *, model_id: Optional[str] = None, api_key: Optional[str] = None,
               cors_origins: Sequence[str] = (), max_queue: int = 16, max_body: int = DEFAULT_MAX_BODY,
               cache_reuse: int = 0, remeasure_after: float = 10.0) -> FastAPI:
    """An ASGI app serving llm over the OpenAI API. llm: a loaded LLM, or a function that loads one (called on
    the worker thread at startup; /health answers 503 until it returns). The app owns a worker thread while it
    runs (its lifespan): run it under uvicorn or another ASGI server, or drive it with starlette's TestClient.
    cache_reuse: every request's cache_reuse unless it gives n_cache_reuse (llama-server's --cache-reuse).
    remeasure_after: idle seconds before a cost profile the steps judged stale is measured again (worker.py); 0:
    never (until the next start)."""
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"max_queue must be an int >= 1, got {max_queue!r}")
    if isinstance(cache_reuse, bool) or not isinstance(cache_reuse, int) or cache_reuse < 0:
        raise ValueError(f"cache_reuse must be an int >= 0, got {cache_reuse!r}")
    if isinstance(remeasure_after, bool) or not isinstance(remeasure_after, (int, float)) or not \
            0 <= remeasure_after < float("inf"):
        raise ValueError(f"remeasure_after must be a number of seconds >= 0 (0: never), got {remeasure_after!r}")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError(f"api_key must be a non-empty string (None: no key), got {api_key!r}")
    api_key = api_key.strip() if api_key is not None else None  # as the token sent is read
    origins = [] if cors_origins is None else [cors_origins] if isinstance(cors_origins, str) else list(cors_origins)
    if isinstance(cors_origins, str) or not all(isinstance(o, str) and o.strip() for o in origins):
        raise ValueError(f"cors_origins must be a list of origins such as ['http://localhost:3000'], got "
                         f"{cors_origins!r}")
    _streams_end_by_the_worker()
    metrics = Metrics()
    worker = Worker(llm, max_queue, metrics, remeasure_after=float(remeasure_after))
    state = State(worker, metrics, model_id, max_queue)
    state.cache_reuse = cache_reuse

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()
            if state.lane is not None:
                state.lane.shutdown(wait=False, cancel_futures=True)
                state.lane = None

    async def check_key(request: Request):
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
            token = request.headers.get("x-api-key", "") if not given else ""
        if not token or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                           "invalid_request_error", None, "invalid_api_key")

    app = FastAPI(title="specllm", lifespan=lifespan, docs_url=None, redoc_url=None,
                  default_response_class=errors.SafeJSONResponse)
    app.state.specllm = state
    app.state.responses = ResponseStore()  # what /v1/responses keeps for previous_response_id
    errors.install(app)
    app.include_router(routes.router, dependencies=[Depends(check_key)])
    app.include_router(infill.router, dependencies=[Depends(check_key)])
    app.include_router(completion.router, dependencies=[Depends(check_key)])
    app.include_router(responses.router, dependencies=[Depends(check_key)])
    app.include_router(messages.router, dependencies=[Depends(check_key)])
    app.include_router(ollama.router, dependencies=[Depends(check_key)])
    app.include_router(embeddings.router, dependencies=[Depends(check_key)])
    app.include_router(routes.public)
    app.include_router(ollama_models.public)

    @app.get("/metrics", dependencies=[Depends(check_key)])
    async def metrics_endpoint():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if origins:
        # any request header, as llama-server allows: the origins are the gate, and the official JS clients send
        # headers of their own (x-stainless-os, -retry-count, -timeout...) that a list refused in the preflight
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimit, max_body=max_body, metrics=metrics)
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but Ctrl-C and SIGTERM end serve() normally (uvicorn re-raises the signal after
        its graceful shutdown, which would turn a requested stop into exit status 130 or a kill by SIGTERM)."""

        worker = None  # the app's Worker: serve() sets it

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

        async def shutdown(self, sockets=None):
            # the requests are cancelled first (they end with "the server is shutting down"), so that their
            # responses end and uvicorn's wait for open connections is short
            if self.worker is not None:
                await asyncio.to_thread(self.worker.stop)
            await super().shutdown(sockets)
            if not self.force_exit:
                return
            # a second Ctrl-C sets force_exit: uvicorn then neither waits for the responses that are ending nor runs
            # the app's shutdown, and both are cancelled later and logged as errors with tracebacks. Give the
            # responses a moment (bounded) and run the app's shutdown anyway.
            tasks = [t for t in self.server_state.tasks if not t.done()]
            if tasks:
                await asyncio.wait(tasks, timeout=2)
            done = getattr(self.lifespan, "shutdown_event", None)
            if done is not None and not done.is_set():
                await self.lifespan.shutdown()

    return Server


def serve(llm: Union[LLM, Callable[[], LLM]], host: str = "127.0.0.1", port: int = 8000, *,
          api_key: Optional[str] = None, log_level: str = "info", access_log: bool = True, **app_options) -> None:
    """Serve llm on host:port until Ctrl-C or SIGTERM (running requests are cancelled, then it returns).
    llm may be a function that loads the LLM: the server answers /health with 503 until it is loaded, and if
    loading fails it stops and serve() raises that error. ListenError, before anything is loaded, when host:port
    cannot be listened on."""
    sockets = listen(host, port)  # before the load: a taken port is said at once, not after a minute's measuring
    try:
        _run(llm, host, port, sockets, api_key, log_level, access_log, app_options)
    finally:
        for sock in sockets:
            sock.close()


def _run(llm, host, port, sockets, api_key, log_level, access_log, app_options) -> None:
    import uvicorn

    _Server = _uvicorn_server()
    if not is_loopback(host) and api_key is None:  # said at any log level: a quiet log must not hide an open port
        log.log(min(max(logging.WARNING, log.getEffectiveLevel()), logging.CRITICAL),
                "serving on %s without an API key: anyone who can reach this port can use the model "
                "(pass api_key / --api-key)", host)
    app = create_app(llm, api_key=api_key, **app_options)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                    timeout_graceful_shutdown=5))
    worker = server.worker = app.state.specllm.worker
    worker.on_load_error = lambda e: setattr(server, "should_exit", True)

    def ready(loaded: LLM) -> None:
        log.info("ready: serving '%s' (draft: %s); endpoints: /v1 (OpenAI: chat, completions, responses, embeddings), "
                 "/v1/messages (Anthropic), /api (Ollama), /completion and /infill (llama-server), /health, /metrics",
                 app.state.specllm.model_id, loaded.draft or "none")
    if worker.llm is not None:
        ready(worker.llm)
    else:
        worker.on_ready = ready
    # uvicorn, handed its sockets, does not say where it listens ("Uvicorn running on ..."): this does
    log.info("listening on %s (Ctrl-C to stop)", ", ".join(url(sock) for sock in sockets))
    server.run(sockets=sockets)
    if worker.load_error is not None:
        raise worker.load_error


def listen(host: str, port: int) -> list:
    """Listening sockets for host:port, one per address the host names (IPv4 and IPv6 for "localhost"; a family the
    kernel lacks is skipped), as asyncio's create_server makes them for uvicorn; ListenError says what stands in the
    way."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ListenError(f"port must be an int from 0 to 65535 (0: a free one), got {port!r}")
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ListenError(f"cannot listen on host {host!r}: {getattr(e, 'strerror', None) or e} (give an address "
                          f"of this machine: 127.0.0.1 for this machine only, 0.0.0.0 for every network)") from None
    sockets = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # no IPv6 in this kernel, say: as asyncio, the other family serves
                continue
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)  # now, not in uvicorn: a second server bound beside it would fail only there
        if not sockets:
            raise OSError(errno.EAFNOSUPPORT, "no address family of it can be used here")
    except OSError as e:
        for sock in sockets:
            sock.close()
        hint = {errno.EADDRINUSE: "; another program (another server?) listens there: stop it or pick another "
                                  "--port", errno.EACCES: "; ports below 1024 need privileges: pick a higher port",
                errno.EADDRNOTAVAIL: "; it is not an address of this machine"}.get(e.errno, "")
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    return sockets


def url(sock) -> str:
    """http://host:port of a listening socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
