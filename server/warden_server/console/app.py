"""The console's web application: server-rendered pages over the plane's
gRPC APIs (``console/plane.py``), with sessions kept on the server.

Every page is sent with a strict Content-Security-Policy: scripts, styles
and everything else come from the console's own origin, and no inline
script runs. Every form carries the session's CSRF token; a post without
it is refused before anything else is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import io
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warden_server.audit.reader import AuditFilter
from warden_server.console import charts
from warden_server.console.plane import Plane, PlaneRefused
from warden_server.console.redaction import fields_of
from warden_server.console.sessions import COOKIE, Session, Sessions
from warden_server.policy.model import parse_duration
from warden_server.records.events import KINDS
from warden_server.records.query import Page

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
PAGE_SIZES = (25, 50, 100, 500)
KEEPALIVE_S = 15.0
STATS_SLICES = 6
EXPORT_COLUMNS = (
    "seq", "event_id", "ts", "kind", "invocation_id", "capability_id", "capability_version",
    "service", "actor_id", "tenant", "surface", "status", "stage", "code", "exposed",
    "retryable", "public_message", "executed_before_failure", "policy_revision", "rules",
    "approval_id", "input_digest", "input", "output", "cause_type", "cause_message", "stack",
    "duration_ms", "trace_id", "reason", "details", "call_id", "attempt", "prev_hash", "hash",
)  # fmt: skip


class SignInNeeded(Exception):
    """The request needs a signed-in person."""


class FormRefused(Exception):
    """A post without its session's CSRF token."""


@dataclass
class Console:
    """What every handler shares."""

    plane: Plane
    sessions: Sessions
    token_header: str | None = None
    secure_cookies: bool = False
    stopping: threading.Event = field(default_factory=threading.Event)


def build_app(console: Console) -> Starlette:
    """The console's ASGI application."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["when"] = _when
    templates.env.filters["time_left"] = _time_left
    templates.env.globals["KINDS"] = KINDS
    templates.env.globals["PAGE_SIZES"] = PAGE_SIZES
    pages = _Pages(console, templates)
    routes = [
        Route("/", pages.home),
        Route("/sign-in", pages.sign_in_form, methods=["GET"]),
        Route("/sign-in", pages.sign_in, methods=["POST"]),
        Route("/sign-out", pages.sign_out, methods=["POST"]),
        Route("/approvals", pages.approvals),
        Route("/approvals/inbox", pages.inbox),
        Route("/approvals/events", pages.approval_events),
        Route("/approvals/{approval_id}", pages.approval),
        Route("/approvals/{approval_id}/decide", pages.decide, methods=["POST"]),
        Route("/audit", pages.audit),
        Route("/audit/records/{seq:int}", pages.record),
        Route("/audit/stats", pages.stats),
        Route("/audit/verify", pages.verify),
        Route("/audit/export.{fmt:str}", pages.export),
        Route("/policy", pages.policy),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            SignInNeeded: pages.to_sign_in,
            FormRefused: pages.form_refused,
            HTTPException: pages.http_error,
            Exception: pages.server_error,
        },
    )
    app.state.console = console
    return SecurityHeaders(app)  # type: ignore[return-value]


class SecurityHeaders:
    """Adds the CSP and its companions to every response, static files included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class _Pages:
    def __init__(self, console: Console, templates: Jinja2Templates) -> None:
        self.console = console
        self.plane = console.plane
        self.sessions = console.sessions
        self.templates = templates

    # Rendering.

    def render(
        self,
        request: Request,
        template: str,
        session: Session | None,
        status_code: int = 200,
        *,
        fragment: bool = False,
        **context: Any,
    ) -> HTMLResponse:
        # A notice is shown once, on the next whole page: a fragment fetched
        # in the background (the live inbox) must not take it.
        notice = session.take_notice() if session and not fragment else None
        response = self.templates.TemplateResponse(
            request,
            template,
            {
                "person": session.person if session else None,
                "csrf": session.csrf if session else "",
                "notice": notice,
                **context,
            },
            status_code=status_code,
        )
        response.headers["cache-control"] = "no-store"
        self._keep(request, response, session)
        return response

    def redirect(self, request: Request, url: str, session: Session | None) -> RedirectResponse:
        response = RedirectResponse(url, status_code=303)
        self._keep(request, response, session)
        return response

    def _keep(self, request: Request, response: Response, session: Session | None) -> None:
        """Set the cookie of a session the request did not come with."""
        if session is not None and request.cookies.get(COOKIE) != session.id:
            response.set_cookie(
                COOKIE,
                session.id,
                httponly=True,
                samesite="strict",
                secure=self.console.secure_cookies or request.url.scheme == "https",
                path="/",
            )

    # Who is asking.

    async def current(self, request: Request) -> Session | None:
        """The signed-in session, signing in from the proxy's header when one is configured."""
        session = self.sessions.get(request.cookies.get(COOKIE))
        header = self.console.token_header
        sent = _bearer(request.headers.get(header, "")) if header else ""
        if sent and (session is None or session.token != sent):
            try:
                await run_in_threadpool(self.plane.check_token, sent)
            except PlaneRefused:
                return None
            session = self.sessions.sign_in(session, sent)
        return session if session is not None and session.token else None

    async def signed_in(self, request: Request) -> Session:
        session = await self.current(request)
        if session is None:
            raise SignInNeeded
        return session

    async def posted(self, request: Request, session: Session | None) -> FormData:
        form = await request.form()
        if not Sessions.csrf_ok(session, form.get("csrf")):
            raise FormRefused
        return form

    async def ask(self, call: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(call, *args)

    # Errors.

    async def to_sign_in(self, request: Request, exc: Exception) -> Response:
        if request.url.path in ("/approvals/inbox", "/approvals/events"):
            return Response("sign in again", status_code=401)
        return RedirectResponse("/sign-in", status_code=303)

    async def form_refused(self, request: Request, exc: Exception) -> Response:
        session = self.sessions.get(request.cookies.get(COOKIE))
        return self.render(
            request,
            "error.html",
            session if session and session.token else None,
            status_code=403,
            title="Form refused",
            message="This form was not accepted: it did not carry this session's security "
            "token (it may be stale, or sent from another site). Reload the page and try again.",
        )

    async def http_error(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else ""
        return self.render(
            request, "error.html", None, status_code=status, title="Not here", message=detail
        )

    async def server_error(self, request: Request, exc: Exception) -> Response:
        return self.render(
            request,
            "error.html",
            None,
            status_code=500,
            title="Something went wrong",
            message="The console could not answer this request. Try again; the console's "
            "log says more.",
        )

    # Signing in and out.

    async def home(self, request: Request) -> Response:
        session = await self.current(request)
        if session is None:
            return RedirectResponse("/sign-in", status_code=303)
        person = session.person
        target = "/audit" if person and person.is_auditor else "/approvals"
        return self.redirect(request, target, session)

    async def sign_in_form(self, request: Request) -> Response:
        session = await self.current(request)
        if session is not None:
            return self.redirect(request, "/approvals", session)
        anonymous = self.sessions.get(request.cookies.get(COOKIE)) or self.sessions.start()
        return self.render(request, "sign_in.html", anonymous, header=self.console.token_header)

    async def sign_in(self, request: Request) -> Response:
        anonymous = self.sessions.get(request.cookies.get(COOKIE))
        form = await self.posted(request, anonymous)
        token = _bearer(str(form.get("token", "")))
        problem = "Paste an actor token (a JWT) to sign in." if not token else None
        if token:
            try:
                await self.ask(self.plane.check_token, token)
                jwt.decode(token, options={"verify_signature": False})
            except PlaneRefused as exc:
                problem = f"{exc.headline}: {exc}"
            except jwt.PyJWTError:
                problem = "The plane accepted this token but it is not a JWT the console can read."
        if problem:
            return self.render(
                request,
                "sign_in.html",
                anonymous,
                status_code=401,
                problem=problem,
                header=self.console.token_header,
            )
        session = self.sessions.sign_in(anonymous, token)
        person = session.person
        return self.redirect(
            request, "/audit" if person and person.is_auditor else "/approvals", session
        )

    async def sign_out(self, request: Request) -> Response:
        session = self.sessions.get(request.cookies.get(COOKIE))
        await self.posted(request, session)
        if session is not None:
            self.sessions.end(session)
        response = RedirectResponse("/sign-in", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    # Approvals.

    async def approvals(self, request: Request) -> Response:
        session = await self.signed_in(request)
        inbox = await self._inbox(session)
        return self.render(request, "approvals.html", session, **inbox)

    async def inbox(self, request: Request) -> Response:
        session = await self.signed_in(request)
        inbox = await self._inbox(session)
        return self.render(request, "_inbox.html", session, fragment=True, **inbox)

    async def _inbox(self, session: Session) -> dict[str, Any]:
        token = session.token or ""
        try:
            pending = await self.ask(self.plane.pending, token)
            recent = await self.ask(self.plane.recent, token)
        except PlaneRefused as exc:
            return {"pending": [], "recent": [], "refused": exc}
        return {
            "pending": pending,
            "recent": recent,
            "refused": None,
            "fields_of": fields_of,
            "now": datetime.now(UTC),
        }

    async def approval_events(self, request: Request) -> Response:
        """Server-sent events fed by the plane's Watch stream: one ``approval``
        event per change the person's tenant sees."""
        session = await self.signed_in(request)
        token = session.token or ""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        stop = threading.Event()

        def put(item: tuple[str, str] | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            try:
                # include_pending: what was already waiting comes first, so no
                # request falls between the page and the watch.
                for event in self.plane.watch(token, stop, include_pending=True):
                    data = {"type": event.type, "id": event.approval.id}
                    put(("approval", json.dumps(data)))
            except PlaneRefused as exc:
                put(("refused", json.dumps({"message": f"{exc.headline}: {exc}"})))
            finally:
                put(None)

        threading.Thread(target=pump, name="console-watch", daemon=True).start()

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 3000\n: watching\n\n"
                while not self.console.stopping.is_set():
                    try:
                        item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if item is None:
                        break
                    yield f"event: {item[0]}\ndata: {item[1]}\n\n"
            finally:
                stop.set()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def approval(self, request: Request) -> Response:
        session = await self.signed_in(request)
        approval_id = request.path_params["approval_id"]
        try:
            found = await self.ask(self.plane.approval, session.token or "", approval_id)
        except PlaneRefused as exc:
            return self.render(
                request,
                "error.html",
                session,
                status_code=404 if exc.status == "NOT_FOUND" else 403,
                title=exc.headline,
                message=str(exc),
            )
        return self.render(
            request,
            "approval.html",
            session,
            approval=found,
            fields=fields_of(found.input),
            now=datetime.now(UTC),
        )

    async def decide(self, request: Request) -> Response:
        session = await self.signed_in(request)
        form = await self.posted(request, session)
        approval_id = request.path_params["approval_id"]
        verdict = str(form.get("verdict", ""))
        reason = str(form.get("reason", "")).strip()
        decide = {"approve": self.plane.approve, "deny": self.plane.deny}.get(verdict)
        if decide is None:
            raise HTTPException(400, "Choose approve or deny.")
        try:
            decided = await self.ask(decide, session.token or "", approval_id, reason)
            session.notice = f"ok:{decided.id} is {decided.state} by {decided.decided_by}."
        except PlaneRefused as exc:
            session.notice = f"error:{exc.headline}: {exc}"
        back = str(form.get("back", "/approvals"))
        return self.redirect(
            request, back if back.startswith("/approvals") else "/approvals", session
        )

    # The audit explorer.

    async def audit(self, request: Request) -> Response:
        session = await self.signed_in(request)
        params = request.query_params
        f, problem = _filter_of(params)
        limit = _int(params.get("limit"), 50)
        limit = limit if limit in PAGE_SIZES else 50
        before = _int(params.get("before"), None)
        page: Page | None = None
        refused = None
        if problem is None:
            try:
                page = await self.ask(
                    lambda: self.plane.query(session.token or "", f, limit=limit, before=before)
                )
            except PlaneRefused as exc:
                refused = exc
        query = _query_string(params, drop=("before",))
        return self.render(
            request,
            "audit.html",
            session,
            params=params,
            page=page,
            refused=refused,
            problem=problem,
            limit=limit,
            query=query,
            export_query=_query_string(params, drop=("before", "limit")),
        )

    async def record(self, request: Request) -> Response:
        session = await self.signed_in(request)
        seq = int(request.path_params["seq"])
        token = session.token or ""
        try:
            page = await self.ask(
                lambda: self.plane.query(token, AuditFilter(seq=seq), limit=1, before=None)
            )
            if not page.rows:
                raise PlaneRefused("NOT_FOUND", f"no record {seq} that you may read")
            row = page.rows[0]
            related: list[dict[str, Any]] = []
            if row.get("invocation_id"):
                joined = await self.ask(
                    lambda: self.plane.query(
                        token, AuditFilter(invocation=row["invocation_id"]), limit=100, before=None
                    )
                )
                related = sorted(joined.rows, key=lambda r: r["seq"])
        except PlaneRefused as exc:
            return self.render(
                request,
                "error.html",
                session,
                status_code=404 if exc.status == "NOT_FOUND" else 403,
                title=exc.headline,
                message=str(exc),
            )
        decision = next((r for r in related if r["kind"] == "decision"), None)
        outcome = next((r for r in related if r["kind"] == "outcome"), None)
        return self.render(
            request,
            "record.html",
            session,
            row=row,
            columns=[(c, row.get(c)) for c in EXPORT_COLUMNS],
            related=related,
            decision=decision,
            outcome=outcome,
        )

    async def stats(self, request: Request) -> Response:
        session = await self.signed_in(request)
        params = request.query_params
        since = params.get("since") or "24h"
        f, problem = _filter_of({**params, "since": since})
        token = session.token or ""
        context: dict[str, Any] = {"params": params, "since": since, "problem": problem}
        if problem is None:
            try:
                by_stage = await self.ask(self.plane.stats, token, "stage", f)
                by_code = await self.ask(self.plane.stats, token, "code", f)
                slices = await self.ask(self._over_time, token, f, since)
            except PlaneRefused as exc:
                context["refused"] = exc
            else:
                context.update(
                    by_stage=by_stage,
                    by_code=by_code,
                    stage_chart=charts.bars(
                        "Records by stage",
                        [(r.key or "(none)", r.count) for r in by_stage.rows],
                    ),
                    code_chart=charts.bars(
                        "Records by code",
                        [(r.key or "(none)", r.count) for r in by_code.rows],
                    ),
                    time_chart=charts.stacked_columns("Records by stage over time", slices)
                    if slices
                    else None,
                )
        return self.render(request, "stats.html", session, **context)

    def _over_time(self, token: str, f: AuditFilter, since: str) -> list[charts.Bucket]:
        """``audit stats --by stage`` over equal slices of the window (a duration only)."""
        try:
            seconds = parse_duration(since)
        except ValueError:
            return []
        end = datetime.now(UTC)
        step = timedelta(seconds=seconds / STATS_SLICES)
        if step < timedelta(milliseconds=1):  # records' times are in milliseconds
            return []
        buckets = []
        for i in range(STATS_SLICES):
            start = end - step * (STATS_SLICES - i)
            sliced = dataclasses.replace(f, since=_iso(start), until=_iso(start + step))
            stats = self.plane.stats(token, "stage", sliced)
            label = (start + step).strftime("%H:%M" if seconds <= 2 * 86400 else "%m-%d")
            buckets.append(charts.Bucket(label, {(r.key or "(none)"): r.count for r in stats.rows}))
        return buckets

    async def verify(self, request: Request) -> Response:
        session = await self.signed_in(request)
        result = refused = None
        if request.query_params.get("run"):
            try:
                result = await self.ask(self.plane.verify, session.token or "")
            except PlaneRefused as exc:
                refused = exc
        return self.render(request, "verify.html", session, result=result, refused=refused)

    async def export(self, request: Request) -> Response:
        session = await self.signed_in(request)
        fmt = request.path_params["fmt"]
        if fmt not in ("csv", "jsonl"):
            raise HTTPException(404, "Export as export.csv or export.jsonl.")
        f, problem = _filter_of(request.query_params)
        if problem:
            raise HTTPException(400, problem)
        rows = self.plane.export(session.token or "", f)
        try:
            first = await run_in_threadpool(next, rows, None)
        except PlaneRefused as exc:
            return self.render(
                request,
                "error.html",
                session,
                status_code=403,
                title=exc.headline,
                message=str(exc),
            )
        lines = _csv_lines(first, rows) if fmt == "csv" else _jsonl_lines(first, rows)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return StreamingResponse(
            iterate_in_threadpool(lines),
            media_type="text/csv" if fmt == "csv" else "application/x-ndjson",
            headers={
                "content-disposition": f'attachment; filename="warden-audit-{stamp}.{fmt}"',
                "cache-control": "no-store",
            },
        )

    # Policy status.

    async def policy(self, request: Request) -> Response:
        session = await self.signed_in(request)
        try:
            status = await self.ask(self.plane.policy_status, session.token or "")
        except PlaneRefused as exc:
            return self.render(request, "policy.html", session, status=None, refused=exc)
        return self.render(request, "policy.html", session, status=status, refused=None)


def _bearer(value: str) -> str:
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else value


def _filter_of(params: Mapping[str, str]) -> tuple[AuditFilter, str | None]:
    """The audit filter of a form's fields (the filters of ``warden audit query``)."""

    def text(name: str) -> str | None:
        value = str(params.get(name) or "").strip()
        return value or None

    kind = text("kind")
    if kind is not None and kind not in KINDS:
        return AuditFilter(), f"Unknown kind {kind!r}: one of {', '.join(KINDS)}."
    capabilities = tuple(c for c in (text("capability") or "").replace(",", " ").split() if c)
    return (
        AuditFilter(
            since=text("since"),
            until=text("until"),
            capabilities=capabilities,
            actor=text("actor"),
            tenant=text("tenant"),
            stage=text("stage"),
            code=text("code"),
            status=text("status"),
            kind=kind,
            invocation=text("invocation"),
        ),
        None,
    )


def _query_string(params: Mapping[str, str], drop: tuple[str, ...]) -> str:
    from urllib.parse import urlencode

    return urlencode({k: v for k, v in params.items() if v and k not in drop})


def _int(value: str | None, default: Any) -> Any:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _csv_lines(first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(values: list[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(values)
        return buffer.getvalue()

    yield line(list(EXPORT_COLUMNS))
    for row in _chain(first, rest):
        yield line(["" if row.get(c) is None else row.get(c) for c in EXPORT_COLUMNS])


def _jsonl_lines(first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]) -> Iterator[str]:
    for row in _chain(first, rest):
        yield json.dumps(row, ensure_ascii=False) + "\n"


def _chain(
    first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    if first is not None:
        yield first
        yield from rest


def _when(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _time_left(moment: datetime, now: datetime | None = None) -> str:
    left = (moment - (now or datetime.now(UTC))).total_seconds()
    if left <= 0:
        return "expired"
    if left < 90:
        return f"{int(left)} s left"
    if left < 90 * 60:
        return f"{round(left / 60)} min left"
    if left < 48 * 3600:
        return f"{left / 3600:.1f} h left"
    return f"{round(left / 86400)} days left"


Handler = Callable[[Request], Awaitable[Response]]
