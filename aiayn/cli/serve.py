"""``aiayn serve``: models behind an HTTP API and a web page (FastAPI + uvicorn, the serve extra:
``pip install 'aiayn[serve]'``)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import logging
import os
import socket
from pathlib import Path

from aiayn.cli.commands import summary
from aiayn.cli.decode_options import add_quantize_argument, formatter
from aiayn.errors import ConfigError

DESCRIPTION = "Serve models over HTTP: translation, generation, classification; a page shows attention."
EXAMPLES = """examples:
  aiayn serve --model runs/multi30k-de-en                       # http://127.0.0.1:5000/
  aiayn serve --model de-en=runs/de-en --model en-de=runs/en-de --model lm=runs/shakespeare
  aiayn serve --model runs/de-en --host 0.0.0.0 --port 8080 --api-keys keys.txt
  aiayn serve --model de-en=runs/de-en:runs/de-en-seed2         # two models served as one ensemble
  aiayn serve --model sst2=runs/sst2-seed1:runs/sst2-seed2       # two classifiers as one ensemble

  curl -s 127.0.0.1:5000/translate -H 'Content-Type: application/json' \\
       -d '{"q": "Ein Mann fährt Fahrrad.", "source": "de", "target": "en"}'

LibreTranslate's API (/translate, /languages, /detect; JSON, URL-encoded or multipart forms) works
with its clients unchanged; the native API is
/v1/translate, /v1/generate (server-sent events with "stream": true), /v1/classify, /v1/fill-mask;
/health, /metrics (Prometheus), /docs (OpenAPI), and / (the page). Binds to loopback unless --host
says otherwise.
"""


def add_parser(sub) -> None:
    from aiayn.serve.settings import SCHEDULINGS, Settings, flag

    d = Settings()
    p = sub.add_parser("serve", help=summary("serve"), description=DESCRIPTION,
                       epilog=EXAMPLES, formatter_class=formatter)  # fmt: skip
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR[:DIR…]",
                   help="a model directory (repeat for several); NAME: the folder's by default; translation "
                   f"(or classifier) directories joined by {os.pathsep!r} are one ensemble; a directory that "
                   f"exists is one model even if its name holds '=' or {os.pathsep!r}")  # fmt: skip
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=5000, help="default: 5000 (LibreTranslate's)")
    p.add_argument("--device", default="cpu", help="torch device for the models (default: cpu)")
    add_quantize_argument(p)
    p.add_argument("--api-keys", metavar="FILE", help="require one of these keys (one per line)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads for the model (0 = PyTorch's default)"
    )
    limits = p.add_argument_group("limits")
    p.add_argument("--allowed-hosts", metavar="NAME[,NAME…]",
                   help="Host headers answered (without port), or '*' for any; with a loopback --host, "
                   "besides localhost, 127.0.0.1 and ::1 (only those by default, against DNS rebinding); "
                   "else only these (default: any)")  # fmt: skip
    p.add_argument("--cors-origins", metavar="ORIGIN[,ORIGIN…]",
                   help="pages of other sites whose scripts may read the answers, as scheme://host[:port], "
                   "or '*' for any (LibreTranslate's default); default: none")  # fmt: skip
    for f in dataclasses.fields(Settings):
        if f.name in OWN:
            continue
        value = getattr(d, f.name)
        kind = float if isinstance(value, float) else str if isinstance(value, str) else int
        choices = SCHEDULINGS if f.name == "scheduling" else None
        limits.add_argument(f"--{flag(f.name)}", dest=f.name, type=kind, default=value, choices=choices,
                            help=f"default: {value}")  # fmt: skip
    p.set_defaults(run=run)


def parse_models(items: list[str]) -> list[tuple[str, list[Path]]]:
    """``[NAME=]DIR[:DIR…]`` items -> unique (name, directories) pairs (several: one ensemble). A
    directory that exists is one model whatever its name holds (``runs/lr=3e-4``, ``runs/12:30``)."""
    out, seen = [], set()
    for item in items:
        name, sep, paths = ("", "", item) if Path(item).is_dir() else item.partition("=")
        given = paths if sep else item
        parts = [given] if Path(given).is_dir() else given.split(os.pathsep)
        if not all(parts):
            raise ConfigError(f"--model {item!r}: an empty directory name; give [NAME=]DIR[{os.pathsep}DIR…]")
        if not sep:
            name = Path(parts[0]).resolve().name
        if not name or name in seen:
            raise ConfigError(f"--model {item!r}: the name {name!r} is empty or already used; give NAME=DIR")
        seen.add(name)
        out.append((name, [Path(p) for p in parts]))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from aiayn.serve.app import create_app
        from aiayn.serve.connections import ConnectionGuard
    except ImportError as e:
        raise ConfigError(
            f"aiayn serve needs the serve extra ({e.name} is missing): pip install 'aiayn[serve]'"
        ) from None
    from aiayn.device import in_passing_thread, max_threads
    from aiayn.serve.services import load_service
    from aiayn.serve.settings import Settings, read_api_keys

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is not a TCP port (1..65535)")
    if not 0 <= args.threads <= max_threads():
        raise ConfigError(f"--threads {args.threads} must be in 0..{max_threads()} (0 = PyTorch's default; "
                          "at most four per CPU)")  # fmt: skip
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if f.name not in OWN}
    keys = read_api_keys(args.api_keys) if args.api_keys else frozenset()
    settings = Settings(**fields, api_keys=keys, allowed_hosts=allowed_hosts(args.allowed_hosts, args.host),
                        cors_origins=cors_origins(args.cors_origins))  # fmt: skip
    models = parse_models(args.model)
    backlog = min(ACCEPT_BURST, settings.max_connections)
    reserve_descriptors(settings.max_connections, 2 * backlog)
    guard = ConnectionGuard(settings.max_connections, settings.header_timeout_s, settings.body_timeout_s,
                            settings.send_timeout_s)  # fmt: skip
    sock = guard.listener(bind(args.host, args.port))  # before the models load and "on http://…" prints
    # the main thread runs no parallel operation: the models load on a thread that then ends (why:
    # aiayn.device.in_passing_thread), and each worker thread sets its own threads
    services = in_passing_thread(lambda: [load_service(name, dirs, args.device, args.quantize, args.gemm)
                                          for name, dirs in models], args.threads)  # fmt: skip
    app = create_app(services, settings, args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = uvicorn.Config(
        app,
        log_level="warning",
        http=guard.protocol,
        timeout_keep_alive=settings.keep_alive_s,
        backlog=backlog,
        h11_max_incomplete_event_size=H11_MAX_HEADERS,
        # the guard counts connections in Python's accept() and its protocol's connection_lost: uvloop
        # accepts in libuv, and a WebSocket upgrade hands the connection to another protocol, so each
        # would escape --max-connections (and leak its count) where those extras are installed
        loop="asyncio",
        ws="none",
    )
    names = ", ".join(f"{s.name} ({s.kind})" for s in services)
    print(f"aiayn serve: {names} on {url(args.host, args.port)}", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:  # after a graceful stop the workers are gone already; after a forced one (a second
        # Ctrl-C) they stop at their next decoding step, so that none is inside the model at exit
        app.state.server.batcher.close(finish=False)
    return 0


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
OWN = ("api_keys", "allowed_hosts", "cors_origins")  # Settings fields with an option of their own


def url(host: str, port: int) -> str:
    """The server's address as a URL: an IPv6 address in brackets (``http://[::1]:5000/``)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def cors_origins(given: str | None) -> frozenset[str]:
    """``--cors-origins``: the origins named (lowercase, without a trailing slash), ``{"*"}``, or none."""
    names = frozenset(n.strip().lower().rstrip("/") for n in (given or "").split(",") if n.strip())
    if given is not None and not names:
        raise ConfigError("--cors-origins is empty; give origins (--cors-origins https://example.org) or '*'")
    return frozenset({"*"}) if "*" in names else names


def allowed_hosts(given: str | None, host: str) -> frozenset[str]:
    """The Host headers to answer: on a loopback ``--host`` (an address that resolves to one) its
    own names and ``--allowed-hosts``; elsewhere ``--allowed-hosts``, or any when none are given;
    ``*``: any (the empty set)."""
    names = frozenset(n.strip().lower().strip("[]") for n in (given or "").split(",") if n.strip())
    if given is not None and not names:
        raise ConfigError("--allowed-hosts is empty; give names (--allowed-hosts example.org) or '*'")
    if "*" in names:
        return frozenset()
    try:  # the address it binds: 127.1 and localhost are loopback too
        address = socket.getaddrinfo(host.strip("[]"), None)[0][4][0]
        loopback = ipaddress.ip_address(address.split("%")[0]).is_loopback
    except (OSError, ValueError):
        loopback = False
    return names | LOOPBACK_NAMES | {host.lower().strip("[]")} if loopback else names


H11_MAX_HEADERS = 16 * 1024  # bytes of a request line and headers at most (h11's own default, stated)
# connections waiting to be accepted, which is also how many asyncio accepts in one turn of its loop:
# the connections closed to make room for them close at the end of that turn
ACCEPT_BURST = 128


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (uvicorn listens on it), or one line saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart at once
        sock.bind((host, port))
    except OSError as e:
        hint = (
            "; another server is using it: stop it, or give another --port"
            if e.errno == errno.EADDRINUSE
            else ""
        )
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    return sock


def reserve_descriptors(connections: int, waiting: int) -> None:
    """Raise the process's soft limit of open files to hold ``connections`` sockets, ``waiting``
    more (accepted while older ones are closed) and the files a server keeps open; ``ConfigError``
    when the hard limit does not allow it."""
    try:
        import resource
    except ImportError:  # not on this platform: the operating system's limit applies
        return
    need = connections + waiting + 128  # and the models' files, the listening socket, the interpreter's own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(f"--max-connections {connections} needs {need} open files ({waiting} more for "
                              f"connections being accepted, 128 for the server's own); this process may open "
                              f"{hard} (ulimit -n): give at most {max(hard - waiting - 128, 0)}")  # fmt: skip
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
