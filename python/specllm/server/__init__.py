"""specllm's OpenAI-compatible HTTP server: `specllm-cli serve`, or create_app(llm) / serve(llm) from Python.

protocol.py holds the request and response bodies, worker.py the thread that owns the LLM and its bounded queue,
routes.py turns requests into worker jobs, app.py assembles the FastAPI app (errors, auth, CORS, body cap),
metrics.py the Prometheus metrics. Needs the `server` extra: pip install "specllm[server]".
"""
from .app import DEFAULT_MAX_BODY, create_app, serve

__all__ = ["create_app", "serve", "DEFAULT_MAX_BODY"]
