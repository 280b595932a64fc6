"""Connecting to Ray, apart from everything else in rl/ (it imports nothing from it), so that a
pre-flight check can run before a run directory is written.

    preflight(address)             # Ray installed? the cluster at HOST:PORT reachable? (no connection kept)
    owns = connect(address, workers)   # start a local Ray (address None) or join a cluster

Without an address a local Ray is started (num_cpus=max(2, workers), no dashboard, worker logs
kept out of the terminal, temp files under /tmp/bebop-ray); with an address ("auto", "HOST:PORT",
"ray://HOST:PORT") an existing cluster is joined after a TCP probe of HOST:PORT (Ray itself
retries an unreachable address for minutes). An already initialised Ray is used as is.
"""

from __future__ import annotations

import socket

from bebop.errors import BebopError

INSTALL_HINT = "--backend ray needs Ray: pip install 'bebop[ray]'"
CONNECT_TIMEOUT_S = 5.0  # TCP probe of --ray-address
LOCAL_TEMP_DIR = "/tmp/bebop-ray"


def require_ray():
    """The ray module, or a BebopError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BebopError(INSTALL_HINT) from None
    return ray


def probe_address(address: str) -> None:
    """Fail fast with the address named when HOST:PORT accepts no TCP connection."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise BebopError(f"--ray-address {address!r} is not 'auto', HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise BebopError(f"cannot reach the Ray cluster at {address} ({exc}); is `ray start --head` running "
                         f"there?") from None


def connect(address: str | None, workers: int) -> bool:
    """Start or join Ray; -> True when this call started it (and close() must shut it down)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    quiet = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address is None:
        ray.init(num_cpus=max(2, workers), _temp_dir=LOCAL_TEMP_DIR, **quiet)
        return True
    probe_address(address)
    try:
        ray.init(address=address, **quiet)
    except ConnectionError as exc:
        raise BebopError(f"cannot connect to the Ray cluster at {address}: {exc}{_root_cause(exc)}") from None
    return True


def _root_cause(exc: BaseException) -> str:
    """'; <last line of the innermost cause>' (Ray's ConnectionError hides why), or ''."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"; {lines[-1][:300]}" if lines else ""


def preflight(address: str | None) -> None:
    """Fail before anything is written when Ray is missing or the cluster address is unreachable."""
    require_ray()
    if address is not None:
        probe_address(address)

