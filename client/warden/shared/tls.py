"""TLS for connections to the plane (and mutual TLS when the plane asks): the
SDK, the approvals client and the CLI open their channels here."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

ChannelOptions = Sequence[tuple[str, int | str]]


class TLSConfigError(ValueError):
    """TLS settings that cannot work: half a client certificate, an unreadable file."""


@dataclass(frozen=True, slots=True)
class TLS:
    """How to reach a plane that serves TLS.

    Attributes:
        ca_file: PEM certificates to trust for the plane; the system's roots when None.
        cert_file: This client's PEM certificate chain, for a plane that asks
            for client certificates (mutual TLS).
        key_file: The private key of ``cert_file``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TLSConfigError("TLS: give cert_file and key_file together, or neither")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TLS | None:
        """``WARDEN_TLS_CA_FILE``, ``WARDEN_TLS_CERT_FILE`` and ``WARDEN_TLS_KEY_FILE``;
        None when none is set (a plaintext connection)."""
        env = os.environ if environ is None else environ
        names = ("WARDEN_TLS_CA_FILE", "WARDEN_TLS_CERT_FILE", "WARDEN_TLS_KEY_FILE")
        ca, cert, key = (env.get(name) or None for name in names)
        if ca is None and cert is None and key is None:
            return None
        return cls(ca_file=ca, cert_file=cert, key_file=key)

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials; the files are read now.

        Raises:
            TLSConfigError: a file cannot be read.
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )


def credentials_of(tls: TLS | None) -> grpc.ChannelCredentials | None:
    """The channel credentials of ``tls`` (None: plaintext), read once, up front."""
    return tls.credentials() if tls is not None else None


def sync_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: ChannelOptions = ()
) -> grpc.Channel:
    """A blocking channel to the plane: TLS with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def aio_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """An asyncio channel to the plane: TLS with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"TLS: cannot read {path}: {exc.strerror}") from None
