"""The server's settings, read from `python -m simpletuner serve`'s arguments: where it listens,
its workspace, how many runs train at once, and the access token a non-loopback bind needs.
The app gets this object; nothing is global."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")
DEFAULT_PORT = 8765


class SettingsError(ValueError):
    """The server cannot start as asked (exit status 2)."""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; anything but loopback needs --token or "
                        "--token-file")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument("--workspace", default="ui-workspace",
                        help="folder of the runs, the queue and workspace.json")
    slots = parser.add_mutually_exclusive_group()
    slots.add_argument("--slots", type=int, default=1,
                       help="runs that train at once (0: queue only, start nothing)")
    slots.add_argument("--devices", type=device_sets, default=(), metavar="0,1|2,3",
                       help="one slot per GPU set, '|' between sets: each run trains on its "
                       "set alone (CUDA_VISIBLE_DEVICES)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", help="access token every request must carry")
    token.add_argument("--token-file", help="file holding the access token")


def device_sets(value: str) -> tuple[str, ...]:
    """'0,1|2,3' -> ('0,1', '2,3'): GPU indices, each in one set only (argparse reports the
    message)."""
    sets = tuple(part.strip() for part in value.split("|"))
    indices = [index.strip() for part in sets for index in part.split(",")]
    if not all(index.isdigit() for index in indices):
        raise argparse.ArgumentTypeError(f"'{value}': GPU indices separated by ',' within a set "
                                         "and '|' between sets, e.g. 0,1|2,3")
    if len(set(indices)) != len(indices):
        raise argparse.ArgumentTypeError(f"'{value}': a GPU is in more than one set")
    return tuple(",".join(index.strip() for index in part.split(",")) for part in sets)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int          # the bound one (0 is resolved once the socket is bound)
    workspace: Path
    slots: int
    token: str | None
    repo: Path         # where train.sh is
    devices: tuple[str, ...] = ()  # --devices: a GPU set per slot ('0,1'); () when not given

    @classmethod
    def from_arguments(cls, args: argparse.Namespace, repo: Path) -> ServerSettings:
        token = args.token
        if args.token_file:
            try:
                token = Path(args.token_file).read_text().strip()
            except OSError as exc:
                raise SettingsError(f"cannot read --token-file {args.token_file}: "
                                    f"{exc.strerror or exc}") from exc
        if token is not None and len(token) < 16:
            raise SettingsError("the access token must be at least 16 characters")
        if not is_loopback(args.host) and token is None:
            raise SettingsError(
                f"refusing to listen on {args.host} without an access token: anyone who can "
                "reach it could start processes as you. Give --token or --token-file, or "
                "bind 127.0.0.1 and reach it through an SSH tunnel")
        if args.slots < 0:
            raise SettingsError("--slots must be 0 or more")
        slots = len(args.devices) if args.devices else args.slots
        return cls(args.host, args.port, Path(args.workspace).resolve(), slots, token, repo,
                   args.devices)

    def bound_to(self, port: int) -> ServerSettings:
        return replace(self, port=port)

    def answers_host(self, host_header: str) -> bool:
        """Whether this server answers a request naming ``host_header`` (a name another site
        points at us is DNS rebinding). Bound to every address (0.0.0.0, ::), its names are not
        known: the access token protects it then."""
        if self.host in WILDCARDS:
            return True
        names = {self._url_host(), *(LOOPBACK_NAMES if is_loopback(self.host) else ())}
        return host_header in {f"{name}:{self.port}" for name in names}

    def _url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def url(self) -> str:
        return f"http://{self._url_host()}:{self.port}"
