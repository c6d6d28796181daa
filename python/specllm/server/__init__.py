"""specllm's OpenAI-compatible HTTP server: `specllm-cli serve`, or create_app(llm) / serve(llm) from Python.

protocol.py holds the request and response bodies, worker.py the thread that owns the LLM and its bounded queue,
jobs.py what every endpoint does with a request's job (queue it, follow it, cancel it, its errors), prepare.py a
request's prompt tokens and options (a chat's messages in the template), routes.py the OpenAI chat and completions
endpoints, responses.py OpenAI's Responses API (responses_request.py its requests, response_store.py the responses
it keeps), messages.py Anthropic's Messages API, ollama.py Ollama's API (ollama_request.py its requests,
ollama_models.py its model list, ollama_context.py fitting a long chat), truncate.py leaving out a long
conversation's oldest messages, infill.py llama-server's /infill, tools.py the tool calls in replies
(tool_grammar.py the grammars that keep them well formed), app.py assembles the FastAPI app (errors, auth, CORS,
body cap), metrics.py the Prometheus metrics.
Needs the `server` extra: pip install "specllm[server]".
"""
from .app import DEFAULT_MAX_BODY, create_app, serve

__all__ = ["create_app", "serve", "DEFAULT_MAX_BODY"]
