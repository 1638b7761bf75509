"""Signed-in people, kept on the server: the browser holds only a random
session id in an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over
TLS), never the token itself.

Each session carries its own CSRF token, which every form posts back.
Sessions live in the console's memory: restarting the console signs
everyone out, which is the safe direction.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jwt

COOKIE = "warden_console"
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Person:
    """Who a token names, as the plane accepted it."""

    id: str
    roles: tuple[str, ...]
    tenant: str

    @property
    def is_auditor(self) -> bool:
        return bool({"auditor", "auditor:all"} & set(self.roles))

    @property
    def reads_policy(self) -> bool:
        return bool({"policy-author", "auditor", "auditor:all"} & set(self.roles))


@dataclass(slots=True)
class Session:
    id: str
    csrf: str
    expires_at: float
    token: str | None = None
    person: Person | None = None
    notice: str | None = field(default=None)
    """A message to show once on the next page (what a form post did)."""

    def take_notice(self) -> str | None:
        notice, self.notice = self.notice, None
        return notice


def person_of(token: str) -> Person:
    """The claims of a token the plane has just accepted, for display and
    navigation only: every decision is the plane's, made on the token itself."""
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    roles = claims.get("roles") or []
    return Person(
        id=str(claims.get("sub", "")),
        roles=tuple(str(r) for r in roles) if isinstance(roles, list) else (),
        tenant=str(claims.get("tenant") or ""),
    )


def token_expiry(token: str) -> float | None:
    exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    return float(exp) if isinstance(exp, int | float) else None


class Sessions:
    """Sessions by id, each expiring after ``ttl_s`` (or its token's expiry)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires_at <= self._clock():
                del self._sessions[session_id]
                return None
            return session

    def start(self) -> Session:
        """A new session, signed out, with its CSRF token (for the sign-in form)."""
        now = self._clock()
        session = Session(
            id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32), expires_at=now + 3600
        )
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions = {k: s for k, s in self._sessions.items() if s.expires_at > now}
                if len(self._sessions) >= MAX_SESSIONS:
                    oldest = min(self._sessions.values(), key=lambda s: s.expires_at)
                    del self._sessions[oldest.id]
            self._sessions[session.id] = session
        return session

    def sign_in(self, old: Session | None, token: str) -> Session:
        """A fresh session for an accepted token (a new id, so a session id
        planted before sign-in is worthless after it)."""
        if old is not None:
            self.end(old)
        session = self.start()
        session.token = token
        session.person = person_of(token)
        expiry = token_expiry(token)
        limit = self._clock() + self._ttl_s
        session.expires_at = min(limit, expiry) if expiry else limit
        return session

    def end(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)

    @staticmethod
    def csrf_ok(session: Session | None, sent: object) -> bool:
        return (
            session is not None
            and isinstance(sent, str)
            and bool(sent)
            and hmac.compare_digest(session.csrf, sent)
        )
