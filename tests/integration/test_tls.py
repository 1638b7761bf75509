"""TLS to the plane, and mutual TLS: a client that does not speak it, or trusts
another authority, or lacks the certificate the plane asks for, fails closed."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import EchoIn, EchoOut, write_lab_policies
from warden_server.config import ConfigError, config_from_dict

Key = ec.EllipticCurvePrivateKey


def _write(folder: Path, name: str, key: Key, cert: x509.Certificate) -> tuple[Path, Path]:
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def _certificate(
    subject: str, key: Key, issuer: tuple[str, Key] | None, *, ca: bool = False
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


class Authority:
    """A certificate authority made for one test."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = _certificate(name, self.key, None, ca=True)
        _, self.cert_file = _write(folder, name, self.key, self.cert)

    def issue(self, subject: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        return _write(self.folder, subject, key, _certificate(subject, key, (self.name, self.key)))


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority(tmp_path, "warden-test-ca")


def _runtime(plant: Plant, tls: warden.TLS | None) -> warden.Runtime:
    rt = warden.Runtime(
        plant.target, service="orders", token=ORDERS_TOKEN, tls=tls, governance_timeout_ms=2000
    )

    @rt.capability("orders.echo", input=EchoIn, output=EchoOut, side_effect="read")
    def echo(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        return EchoOut(n=inp.n)

    return rt


def _echo(plant: Plant, tls: warden.TLS | None) -> warden.Envelope:
    rt = _runtime(plant, tls)
    try:
        return rt.invoke("orders.echo", {"n": 7}, actor=plant.token())
    finally:
        rt.close()


@pytest.fixture
def tls_plant(start_plane: Callable[..., Plant], tmp_path: Path, authority: Authority) -> Plant:
    key, cert = authority.issue("plane")
    return start_plane(
        write_lab_policies(tmp_path / "policies"), tls_cert_file=str(cert), tls_key_file=str(key)
    )


def test_a_client_that_trusts_the_plane_s_authority_is_served(
    tls_plant: Plant, authority: Authority
) -> None:
    env = _echo(tls_plant, warden.TLS(ca_file=str(authority.cert_file)))
    assert env.status == "succeeded"


def test_a_plaintext_client_fails_closed(tls_plant: Plant) -> None:
    env = _echo(tls_plant, None)
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"
    assert "TLS on one side only" in str(env.error.cause), env.error.cause


def test_a_client_that_trusts_another_authority_fails_closed(
    tls_plant: Plant, tmp_path: Path
) -> None:
    stranger = Authority(tmp_path, "another-ca")
    env = _echo(tls_plant, warden.TLS(ca_file=str(stranger.cert_file)))
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"


def test_mutual_tls_serves_only_clients_with_a_certificate_it_trusts(
    start_plane: Callable[..., Plant], tmp_path: Path, authority: Authority
) -> None:
    key, cert = authority.issue("plane")
    clients = Authority(tmp_path, "service-ca")
    plant = start_plane(
        write_lab_policies(tmp_path / "policies"),
        tls_cert_file=str(cert),
        tls_key_file=str(key),
        tls_client_ca_file=str(clients.cert_file),
    )
    ca = str(authority.cert_file)
    client_key, client_cert = clients.issue("orders-service")
    with_cert = warden.TLS(ca_file=ca, cert_file=str(client_cert), key_file=str(client_key))
    assert _echo(plant, with_cert).status == "succeeded"
    without = _echo(plant, warden.TLS(ca_file=ca))
    assert without.error is not None and without.error.code == "GOVERNANCE_UNAVAILABLE"
    assert "WARDEN_TLS_CERT_FILE" in str(without.error.cause), without.error.cause
    foreign_key, foreign_cert = authority.issue("not-a-service")
    foreign = warden.TLS(ca_file=ca, cert_file=str(foreign_cert), key_file=str(foreign_key))
    assert _echo(plant, foreign).error is not None


@pytest.mark.fixed_processes
def test_half_a_client_certificate_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="together"):
        warden.TLS(ca_file="ca.pem", cert_file="client.pem")


@pytest.mark.fixed_processes
def test_an_unreadable_ca_file_is_a_developer_error(tmp_path: Path) -> None:
    with pytest.raises(warden.WardenError, match="cannot read"):
        warden.Runtime(
            "127.0.0.1:1", service="orders", token="t", tls=warden.TLS(ca_file=str(tmp_path / "x"))
        )


@pytest.mark.fixed_processes
def test_the_config_wants_certificate_and_key_together() -> None:
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file together"):
        config_from_dict(
            {"server": {"tls_cert_file": "plane.pem"}, "actors": {"hs256_secret": "s" * 40}}
        )


@pytest.mark.fixed_processes
def test_tls_settings_come_from_the_environment_for_the_cli() -> None:
    assert warden.TLS.from_environ({}) is None
    tls = warden.TLS.from_environ({"WARDEN_TLS_CA_FILE": "ca.pem"})
    assert tls == warden.TLS(ca_file="ca.pem")
