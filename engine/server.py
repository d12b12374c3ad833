"""`dflash serve`: an OpenAI-compatible HTTP server (Starlette + uvicorn) on one runtime.

One engine worker thread runs requests in arrival order from a queue; handlers wait on their
own asyncio queue for its events. A client that goes away sets its job's cancel flag, which
the worker checks after every committed span, so the engine moves on to the next request at
once. Conversation-state reuse (engine/prompt_cache.py) makes a follow-up turn cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import inspect
import json
import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import DFlashError
from .events import Finished, GenerationResult, RunningStats, Span
from .server_metrics import Metrics
from .tool_calls import StopFilter, ToolCall, ToolCallFilter, ToolSyntax

log = logging.getLogger("dflash.serve")
DONE = object()  # the worker's last item on a job's queue


class APIError(Exception):
    """An error the client gets in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = {401: "authentication_error", 404: "invalid_request_error",
                503: "service_unavailable"}.get(self.status, "invalid_request_error")
        if self.status >= 500 and self.status != 503:
            kind = "server_error"
        return JSONResponse({"error": {"message": self.message, "type": kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status)


# -- the engine worker -----------------------------------------------------------------------
@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    options: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            self.cancelled.set()


class EngineWorker:
    """Loads the runtime, then serves jobs one at a time on its own thread."""

    def __init__(self, load: Callable[[], Any]):
        self.rt: Any = None
        self.load_error: str | None = None
        self.on_fail: Callable[[], None] | None = None  # called when loading fails
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self._depth = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(load,), daemon=True,
                                        name="dflash-engine")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.jobs.put(None)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def depth(self) -> int:
        """Requests waiting or running."""
        return self._depth

    def submit(self, job: Job) -> None:
        with self._lock:
            self._depth += 1
        self.jobs.put(job)

    def _run(self, load: Callable[[], Any]) -> None:
        try:
            self.rt = load()
        except Exception as exc:  # noqa: BLE001 - reported by /health and every request
            if isinstance(exc, DFlashError):  # a user mistake: one line, no traceback
                log.error("dflash serve: %s", exc)
            else:
                log.exception("loading the model pair failed")
            self.load_error = str(exc) or type(exc).__name__
            if self.on_fail is not None:
                self.on_fail()
            return
        while (job := self.jobs.get()) is not None:
            try:
                if not job.cancelled.is_set():
                    self._serve(job)
            except Exception as exc:  # noqa: BLE001 - one request's failure, not the server's
                log.exception("generation failed")
                job.put(exc)
            finally:
                with self._lock:
                    self._depth -= 1
                job.put(DONE)
        if hasattr(self.rt, "close_followers"):
            self.rt.close_followers()  # a sharded target: the other ranks may exit

    def _serve(self, job: Job) -> None:
        stream = self.rt.stream_generate(job.prompt, max_tokens=job.max_tokens, **job.options)
        try:
            for event in stream:
                if job.cancelled.is_set():
                    break
                job.put(event)
        finally:
            stream.close()


# -- request parsing -------------------------------------------------------------------------
def _typed(body: dict, name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise APIError(400, f"'{name}' must be {what}.", name, "invalid_type")
    return value


def _text(content: Any, where: str) -> str | None:
    """A message's content: a string, None or a list of text parts -> a string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise APIError(400, f"{where}: only text content parts are supported.",
                               "messages", "invalid_content")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"{where}.content must be a string or a list of text parts.",
                   "messages", "invalid_type")


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if messages is None:
        raise APIError(400, "'messages' is required: a list of {role, content} objects.",
                       "messages", "missing_field")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list.", "messages", "invalid_type")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"{where} must be an object with a string 'role'.", "messages",
                           "invalid_type")
        m = dict(m, content=_text(m.get("content"), where) or "")
        if isinstance(m.get("tool_calls"), list):
            # Chat templates read a call's arguments as an object, as mlx-lm's server gives.
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        with contextlib.suppress(json.JSONDecodeError):
            fn["arguments"] = json.loads(fn["arguments"])
    return dict(call, function=fn)


@dataclass
class Params:
    model: str
    max_tokens: int
    stop: list[str]
    stream: bool
    include_usage: bool
    sampling: dict[str, Any]


def parse_params(body: dict, default_max_tokens: int, sampling_supported: bool) -> Params:
    model = _typed(body, "model", (str,), "a string")
    max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if max_tokens < 1:
        raise APIError(400, f"max_tokens={max_tokens}: ask for at least 1 token.",
                       "max_tokens", "invalid_value")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "'stop' must be a string or a list of strings.", "stop",
                       "invalid_type")
    stream = bool(_typed(body, "stream", (bool,), "true or false"))
    options = _typed(body, "stream_options", (dict,), "an object") or {}
    n = _typed(body, "n", (int,), "an integer")
    if n not in (None, 1):
        raise APIError(400, f"n={n}: this server returns one choice per request.", "n",
                       "invalid_value")
    # top_k and min_p are not OpenAI's; mlx-lm's server takes them too.
    sampling = {name: value for name, kinds, what in (
        ("temperature", (int, float), "a number"), ("top_p", (int, float), "a number"),
        ("top_k", (int,), "an integer"), ("min_p", (int, float), "a number"),
        ("seed", (int,), "an integer"))
        if (value := _typed(body, name, kinds, what)) is not None}
    if not sampling_supported:
        if sampling.get("temperature"):
            raise APIError(400, f"temperature={sampling['temperature']}: greedy decoding only "
                           "(this engine is lossless speculative decoding of the argmax). "
                           "Fix: send temperature 0 or leave it out.", "temperature",
                           "unsupported_value")
        sampling = {}
    return Params(model or "", max_tokens, stop, stream, bool(options.get("include_usage")),
                  sampling)


def check_sampling(sampling: dict[str, Any]) -> None:
    """The engine's own checks of temperature, top_p, top_k, min_p and seed, as a 400."""
    if not sampling:
        return
    from .sampling import SamplingParams

    try:
        SamplingParams(**sampling)
    except DFlashError as exc:
        name = next((k for k in sampling if str(exc).startswith(f"{k}=")), None)
        raise APIError(400, str(exc), name, "invalid_value") from exc


# -- responses -------------------------------------------------------------------------------
def usage(stats: RunningStats | GenerationResult | None, prompt_tokens: int) -> dict:
    if stats is None:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                "total_tokens": prompt_tokens,
                "prompt_tokens_details": {"cached_tokens": 0},
                "dflash": {"acceptance_rate": 0.0, "tokens_per_cycle": 0.0, "cycles": 0,
                           "pauses": 0, "paused_tokens": 0}}
    generated = (stats.total_tokens if isinstance(stats, GenerationResult)
                 else stats.generated)
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": stats.prompt_tokens + generated,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "dflash": {"acceptance_rate": round(stats.acceptance_rate, 4),
                   "tokens_per_cycle": round(stats.tokens_per_cycle, 4),
                   "cycles": stats.cycles, "speculative": stats.speculative,
                   "ttft_s": round(stats.ttft_s, 4),
                   # speculation paused where the draft was not paying (engine/pause.py)
                   "pauses": stats.pauses, "paused_tokens": stats.paused_tokens},
    }


@dataclass
class Outcome:
    """What a generation produced after the server's filters."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    finish: str = "length"
    stats: RunningStats | GenerationResult | None = None


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Server:
    def __init__(self, worker: EngineWorker, api_key: str | None = None,
                 default_max_tokens: int = 512, speculative: bool = True):
        self.worker = worker
        self.api_key = api_key
        self.default_max_tokens = default_max_tokens
        self.speculative = speculative
        self.created = int(time.time())
        self.metrics = Metrics()

    # -- plumbing ----------------------------------------------------------------------
    def runtime(self) -> Any:
        if self.worker.load_error:
            raise APIError(503, f"the model pair failed to load: {self.worker.load_error}",
                           code="load_failed")
        if self.worker.rt is None:
            raise APIError(503, "the model pair is still loading; retry shortly.",
                           code="loading")
        return self.worker.rt

    def model_ids(self, rt: Any) -> list[str]:
        return [rt.target_id]

    def check_model(self, rt: Any, name: str) -> None:
        if not name:
            return
        wanted = name.lower()
        for known in self.model_ids(rt):
            if wanted in (known.lower(), known.lower().rsplit("/", 1)[-1]):
                return
        raise APIError(404, f"model {name!r} is not served here; this server runs "
                       f"{rt.target_id!r} (see GET /v1/models).", "model", "model_not_found")

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer "
                           "<key>' with the server's --api-key.", code="invalid_api_key")

    async def body(self, request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc}).",
                           code="invalid_json") from exc
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object.", code="invalid_json")
        return body

    def sampling_supported(self, rt: Any) -> bool:
        return "temperature" in inspect.signature(rt.stream_generate).parameters

    # -- endpoints ---------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        if self.worker.load_error:
            return JSONResponse({"status": "error", "error": self.worker.load_error}, 503)
        if self.worker.rt is None:
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ok", "queue_depth": self.worker.depth})

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        rt = self.runtime()
        info = rt.describe()
        return JSONResponse({"object": "list", "data": [
            {"id": rt.target_id, "object": "model", "created": self.created,
             "owned_by": "dflash", "draft": rt.draft_id, "max_ctx": info.get("max_ctx"),
             "backend": info.get("backend")}]})

    async def metrics_page(self, request: Request) -> Response:
        self.authorize(request)
        self.metrics.set("dflash_queue_depth", self.worker.depth)
        return Response(self.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def chat(self, request: Request) -> Response:
        self.authorize(request)
        rt = self.runtime()
        body = await self.body(request)
        messages = parse_messages(body)
        params = parse_params(body, self.default_max_tokens, self.sampling_supported(rt))
        check_sampling(params.sampling)
        self.check_model(rt, params.model)
        tools = _typed(body, "tools", (list,), "a list")
        # over the server's --chat-template-args (the runtime merges them)
        template_args = dict(_typed(body, "chat_template_kwargs", (dict,), "an object") or {})
        if tools:
            template_args["tools"] = tools
            if body.get("tool_choice") is not None:
                template_args["tool_choice"] = body["tool_choice"]
        syntax = ToolSyntax.of(rt.tokenizer) if tools else None
        prompt = await self.encode(rt, messages, template_args)
        return await self.run(request, rt, prompt, params, "chat", syntax, tools)

    async def completions(self, request: Request) -> Response:
        self.authorize(request)
        rt = self.runtime()
        body = await self.body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if prompt is None:
            raise APIError(400, "'prompt' is required: a string.", "prompt", "missing_field")
        if not (isinstance(prompt, str) and prompt) and not (
                isinstance(prompt, list) and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            raise APIError(400, "'prompt' must be a non-empty string or a list of token ids.",
                           "prompt", "invalid_type")
        params = parse_params(body, self.default_max_tokens, self.sampling_supported(rt))
        check_sampling(params.sampling)
        self.check_model(rt, params.model)
        ids = await self.encode(rt, prompt, None)
        return await self.run(request, rt, ids, params, "completions", None, None)

    async def encode(self, rt: Any, prompt: Any, template_args: dict | None) -> list[int]:
        try:
            ids = await asyncio.to_thread(rt.encode, prompt, template_args or None)
        except DFlashError as exc:
            raise APIError(400, str(exc), "messages", "invalid_prompt") from exc
        except Exception as exc:  # noqa: BLE001 - a chat template that rejects the messages
            raise APIError(400, f"the chat template rejected the messages: {exc}",
                           "messages", "invalid_prompt") from exc
        max_ctx = rt.config.max_ctx
        if len(ids) >= max_ctx:
            raise APIError(400, f"the prompt is {len(ids)} tokens but this server's context "
                           f"is {max_ctx} tokens (max_ctx). Fix: shorten the conversation or "
                           "start the server with a larger --max-ctx.", "messages",
                           "context_length_exceeded")
        return ids

    # -- generation --------------------------------------------------------------------
    async def run(self, request: Request, rt: Any, prompt: list[int], params: Params,
                  kind: str, syntax: ToolSyntax | None, tools: Any) -> Response:
        options = {"speculative": self.speculative, **params.sampling}
        # The reply ends at the context's end (clients often ask for more than is left); within
        # max_ctx the draft stays on.
        max_tokens = min(params.max_tokens, rt.config.max_ctx - len(prompt))
        job = Job(prompt, max_tokens, options, asyncio.get_running_loop())
        self.worker.submit(job)
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        base = {"id": rid, "created": int(time.time()), "model": rt.target_id}
        if params.stream:
            return StreamingResponse(self.stream(job, params, kind, syntax, tools, base, prompt),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            outcome = Outcome()
            async for piece in self.pieces(job, params, syntax, tools, outcome, request):
                if isinstance(piece, ToolCall):
                    outcome.calls.append(piece)
                else:
                    outcome.content += piece
        finally:
            job.cancelled.set()  # a no-op when finished; frees the engine on a disconnect
        self.metrics.request(kind, 200, outcome.stats)
        return JSONResponse(self.final(kind, base, outcome, len(prompt)))

    async def pieces(self, job: Job, params: Params, syntax: ToolSyntax | None, tools: Any,
                     outcome: Outcome, request: Request | None = None
                     ) -> AsyncIterator[str | ToolCall]:
        """Text and tool calls from the job's events, stop strings applied. Fills `outcome`'s
        finish reason and stats."""
        stops = StopFilter(params.stop)
        calls = ToolCallFilter(syntax, tools)
        while True:
            try:
                item = await asyncio.wait_for(job.events.get(), timeout=0.5)
            except TimeoutError:
                if request is not None and await request.is_disconnected():
                    job.cancelled.set()
                    return
                continue
            if item is DONE:
                break
            if isinstance(item, Exception):
                raise APIError(500, "generation failed inside the engine; see the server log.",
                               code="engine_error")
            if isinstance(item, Finished):
                outcome.stats = item.result
                outcome.finish = "stop" if item.result.finish_reason == "stop" else "length"
                continue
            assert isinstance(item, Span)
            outcome.stats = item.stats
            for piece in calls.feed(stops.feed(item.text)):
                yield piece
            if stops.stopped:
                outcome.finish = "stop"
                job.cancelled.set()
                break
        for piece in calls.feed(stops.flush()) + calls.flush():
            yield piece
        if calls.calls:
            outcome.finish = "tool_calls"

    def final(self, kind: str, base: dict, outcome: Outcome, prompt_tokens: int) -> dict:
        use = usage(outcome.stats, prompt_tokens)
        if kind == "completions":
            return {**base, "object": "text_completion", "usage": use, "choices": [
                {"index": 0, "text": outcome.content, "logprobs": None,
                 "finish_reason": outcome.finish}]}
        message: dict[str, Any] = {"role": "assistant", "content": outcome.content or None}
        if outcome.calls:
            message["tool_calls"] = [_call_json(c) for c in outcome.calls]
        elif message["content"] is None:
            message["content"] = ""
        return {**base, "object": "chat.completion", "usage": use, "choices": [
            {"index": 0, "message": message, "logprobs": None,
             "finish_reason": outcome.finish}]}

    async def stream(self, job: Job, params: Params, kind: str, syntax: ToolSyntax | None,
                     tools: Any, base: dict, prompt: list[int]) -> AsyncIterator[str]:
        chat = kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict | None = None, finish: str | None = None, text: str = "",
                  **more: Any) -> str:
            if chat:
                choice = {"index": 0, "delta": delta or {}, "logprobs": None,
                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return sse({**base, "object": obj, "choices": [choice], **more})

        outcome, n_calls, status = Outcome(), 0, 200
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            async for piece in self.pieces(job, params, syntax, tools, outcome):
                if isinstance(piece, ToolCall):
                    yield chunk({"tool_calls": [dict(_call_json(piece), index=n_calls)]})
                    n_calls += 1
                elif piece:
                    yield chunk({"content": piece}) if chat else chunk(text=piece)
            # usage rides on the last chunk always; include_usage adds OpenAI's own usage-only
            # chunk after it
            use = usage(outcome.stats, len(prompt))
            yield chunk({}, outcome.finish, usage=use)
            if params.include_usage:
                yield sse({**base, "object": obj, "choices": [], "usage": use})
            yield "data: [DONE]\n\n"
        except APIError as exc:
            status = exc.status
            yield sse({"error": {"message": exc.message, "type": "server_error",
                                 "param": None, "code": exc.code}})
        finally:
            # Reached on a client disconnect too (the response task is cancelled): stop the
            # engine on this request at its next span.
            job.cancelled.set()
            self.metrics.request(kind, status, outcome.stats)


def _call_json(call: ToolCall) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def create_app(load: Callable[[], Any], **server_options: Any) -> Starlette:
    """The ASGI app. `load` builds the runtime on the engine thread (503 until it returns)."""
    worker = EngineWorker(load)
    server = Server(worker, **server_options)

    def guarded(handler: Callable) -> Callable:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                server.metrics.request(request.url.path.rsplit("/", 1)[-1], exc.status, None)
                return exc.response()
            except Exception:  # noqa: BLE001 - never a traceback to the client
                log.exception("request failed")
                return APIError(500, "internal server error; see the server log.",
                                code="internal_error").response()
        return endpoint

    routes = [
        Route("/health", guarded(server.health), methods=["GET"]),
        Route("/metrics", guarded(server.metrics_page), methods=["GET"]),
        Route("/v1/models", guarded(server.models), methods=["GET"]),
        Route("/v1/chat/completions", guarded(server.chat), methods=["POST"]),
        Route("/v1/completions", guarded(server.completions), methods=["POST"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = (f"{request.method} {request.url.path} is not an endpoint here"
                   if status == 404 else f"{request.method} is not allowed on "
                   f"{request.url.path}")
        return APIError(status, message, code="not_found" if status == 404
                        else "method_not_allowed").response()

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        worker.start()
        yield
        worker.stop()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: not_found})
    app.state.server = server
    return app


# -- command line ----------------------------------------------------------------------------
def serve_parser() -> argparse.ArgumentParser:
    from .config import add_distributed_arg, add_engine_args

    p = argparse.ArgumentParser(prog="dflash serve",
                                description="OpenAI-compatible server on a DFlash pair")
    p.add_argument("--model", default=None,
                   help="target id or folder (default: the offline SmolLM2-135M-Instruct pair)")
    p.add_argument("--draft", default=None, help="draft id or folder (default: the registry's)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="reply length when a request sets no max_tokens")
    p.add_argument("--prompt-cache", type=_cache_arg, default="auto", metavar="auto|off|MB",
                   help="memory for reused conversation states (default: an eighth of RAM, "
                        "at most 8 GiB)")
    add_engine_args(p)
    p.add_argument("--no-speculative", action="store_true", help="plain greedy decoding")
    add_distributed_arg(p)
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def _cache_arg(text: str) -> int | str:
    if text in ("auto", "off"):
        return 0 if text == "off" else text
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if mb < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give megabytes, 'auto' or 'off'")
    return int(mb * (1 << 20))


def serve_main(argv: list[str]) -> int:
    import uvicorn

    from .config import config_from_args

    args = serve_parser().parse_args(argv)
    if args.max_tokens < 1:
        print(f"dflash serve: --max-tokens {args.max_tokens}: use at least 1", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args, prompt_cache_bytes=args.prompt_cache)
    except DFlashError as exc:
        print(f"dflash serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")

    def load() -> Any:
        from .runtime import DFlashRuntime

        log.info("loading the model pair (requests get 503 until it is ready)")
        rt = DFlashRuntime.from_pretrained(model=args.model, draft=args.draft, config=config,
                                           distributed=args.distributed or False)
        log.info("ready: %s + %s on %s", rt.target_id, rt.draft_id, rt.describe()["backend"])
        return rt

    if args.distributed:  # ranks > 0 serve no HTTP: they follow rank 0's requests
        from .distributed import follow, init_group

        try:
            if init_group(args.distributed).rank() != 0:
                follow(load())
                return 0
        except DFlashError as exc:
            print(f"dflash serve: {exc}", file=sys.stderr)
            return 2
    app = create_app(load, api_key=args.api_key, default_max_tokens=args.max_tokens,
                     speculative=not args.no_speculative)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning("listening on %s without --api-key: anyone who can reach it can use it",
                    args.host)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level))
    worker = app.state.server.worker
    # A pair that cannot load ends the server (exit 2) rather than answering 503 forever.
    worker.on_fail = lambda: setattr(server, "should_exit", True)
    try:
        server.run()
    finally:
        worker.join(timeout=30)  # a sharded target's followers are released on this thread
    return 2 if worker.load_error else 0
