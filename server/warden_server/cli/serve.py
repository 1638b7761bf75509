"""``warden serve``: run the plane until interrupted."""

from __future__ import annotations

import contextlib
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from warden_server.cli.common import CONFIG_OPTION, load
from warden_server.config import URL_SCHEME, ConfigError, check_files
from warden_server.stopping import StopRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from warden_server.app import Server
    from warden_server.config import Config


@click.command()
@CONFIG_OPTION
@click.option("--listen", help="host:port to serve on (overrides [server] listen).")
@click.option(
    "--store", help="The SQLite store file or postgresql:// URL (overrides [server] store)."
)
@click.option("--policies", help="Policy folder (overrides [server] policies).")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT|off",
    help="Where to serve Prometheus /metrics, or off (overrides [telemetry] metrics_listen).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    help="Processes serving the port together (overrides [server] processes; "
    "default: one per CPU).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    help="The lowest level of log message printed.",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text or JSON objects (overrides [telemetry] log_format).",
)
def serve(
    config_path: str,
    listen: str | None,
    store: str | None,
    policies: str | None,
    metrics_listen: str | None,
    processes: int | None,
    log_level: str,
    log_format: Literal["text", "json"] | None,
) -> None:
    """Serve the plane until interrupted."""
    # Paths given on the command line are relative to where the command runs;
    # a URL (postgresql://..., or a scheme the config then refuses) is no path.
    config = load(
        config_path,
        listen=listen,
        store=store if store is None or URL_SCHEME.match(store) else str(Path(store).resolve()),
        policies=str(Path(policies).resolve()) if policies else None,
        processes=str(processes) if processes else None,
    )
    try:  # before anything is made: one run names every missing file
        check_files(config_path, config, from_command_line=["policies"] if policies else [])
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if metrics_listen is not None:
        moved = None if metrics_listen in ("", "off") else metrics_listen
        config = config.model_copy(
            update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": moved})}
        )
    if log_format is not None:  # in the config, so that the other processes log so too
        config = config.model_copy(
            update={"telemetry": config.telemetry.model_copy(update={"log_format": log_format})}
        )
    # Counted once, here: once this process runs on one CPU of them, and its
    # joining processes on theirs, a count by CPU affinity would see one.
    counted = config.server.model_copy(update={"processes": config.process_count})
    config = config.model_copy(update={"server": counted})
    # A SIGTERM or SIGINT is recorded and said, nothing more: the main thread
    # stops the plane (``warden_server.stopping`` says why). Asked while still
    # starting (the plane imports, the policy sets load, the other processes
    # start), it stops as soon as serving has begun, rather than die half-started.
    say = _sayer(config.telemetry.log_format)
    request = StopRequest(say=say)
    signal.signal(signal.SIGTERM, request.handle)
    signal.signal(signal.SIGINT, request.handle)
    _check_addresses(config)
    if config.process_count > 1:
        # The other processes are forked from a server that imports the plane
        # first: started now, it imports while this process does.
        from warden_server.processes import start_forkserver

        start_forkserver()
    from warden_server.placement import cpus_for
    from warden_server.processes import prepare_collector
    from warden_server.telemetry.logs import configure_logging

    configure_logging(log_level, config.telemetry.log_format)
    prepare_collector()
    cpus = cpus_for(config.process_count, pin=config.server.pin_processes)
    server = _launch(config, cpus)
    try:
        count = config.process_count
        say(
            f"warden serving on {server.target} (store {config.store_url or config.store_path}, "
            f"policies {config.policies_path}, {count} process{'es' if count > 1 else ''}"
            f"{', on CPUs ' + ', '.join(map(str, cpus)) if cpus else ''})"
        )
        if server.metrics_port is not None:
            host = (config.telemetry.metrics_listen or "").rpartition(":")[0]
            say(f"metrics on http://{host}:{server.metrics_port}/metrics")
        server.wait(until=request.made)
    finally:
        # Whatever ended the wait, the other processes are told to stop: left
        # serving, they would hold this process at its exit for good.
        server.stop()


def _sayer(log_format: Literal["text", "json"]) -> Callable[[str], None]:
    """How the plane's own lines (serving, metrics, stopping) are said: as they
    read, or, with JSON logs, as log records like every other line."""
    if log_format != "json":
        return _say
    from warden_server.telemetry.logs import JsonFormatter

    formatter = JsonFormatter()

    def say(line: str) -> None:
        record = logging.LogRecord(__name__, logging.INFO, __file__, 0, line, None, None)
        _say(formatter.format(record))

    return say


def _say(line: str) -> None:
    """A line on stderr for whoever runs the plane, if anyone still reads it
    (a supervisor's log pipe may have closed): losing it must not stop a
    stop, or a start."""
    with contextlib.suppress(OSError):
        click.echo(line, err=True)


def _launch(config: Config, cpus: Sequence[int] | None) -> Server:
    """``app.launch``, its refusals worded for the command line."""
    from warden_server.addresses import MetricsUnavailable
    from warden_server.app import launch
    from warden_server.policy.loader import PolicyLoadError
    from warden_server.processes import stop_forkserver
    from warden_server.store import StoreError

    try:
        try:
            return launch(config, cpus=cpus, addresses_checked=True)
        except BaseException:
            stop_forkserver()  # the start failed: exit without waiting for its import
            raise
    except PolicyLoadError as exc:
        raise click.ClickException(f"the policy set has problems:\n{exc}") from None
    except MetricsUnavailable as exc:  # taken since it was checked
        raise _metrics_refused(exc) from None
    except (OSError, ValueError, StoreError) as exc:
        raise click.ClickException(str(exc)) from None


def _check_addresses(config: Config) -> None:
    """A taken address fails the start at once, before the plane is imported
    and before anything starts or is written."""
    from warden_server.addresses import MetricsUnavailable, check_addresses

    try:
        check_addresses(config)
    except MetricsUnavailable as exc:
        raise _metrics_refused(exc) from None
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _metrics_refused(exc: OSError) -> click.ClickException:
    return click.ClickException(
        f"{exc}; move it with --metrics-listen HOST:PORT, or turn it off with --metrics-listen off"
    )
