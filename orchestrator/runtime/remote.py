"""Site servers on Docker daemons reached over SSH (``compute: {servers: [...]}`` in a config).

A site may run its container on a Docker daemon that this machine reaches through SSH, with key
authentication: the Docker SDK's ``ssh://`` transport (paramiko, then ``docker system dial-stdio``
on the far side), given the key of the config and a known_hosts file. Host keys are checked
against that file and never accepted automatically (paramiko's `RejectPolicy`); an unknown or
changed host key is a `ConfigError` before anything starts. The key's path is named in errors, its
contents never; the URL may not carry a password.

What this version joins to the emulation: a container whose daemon runs on this machine (the same
daemon, reached through SSH, as the test does with an sshd bound to 127.0.0.1), by the same
technique as local containers (`orchestrator.runtime.docker_host`). A daemon on another machine is
refused with a clear error: its container would have to reach the site's switch through a tunnel
(VXLAN on Open vSwitch), which is not built yet (docs/cluster.md, "Remote compute servers").
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, config_entry, readable_file

LOG = logging.getLogger("netai.remote")

#: How long the SSH connection and a Docker request over it may take.
CONNECT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RemoteServer:
    """One entry of ``compute.servers``: `sites` whose servers run on the Docker daemon at `docker`
    (``ssh://user@host[:port]``), reached with the private key `key`, the host checked against
    `known_hosts` (default: the user's ``~/.ssh/known_hosts``)."""

    sites: tuple[str, ...]
    docker: str
    key: str
    known_hosts: str

    def to_dict(self) -> dict[str, Any]:
        return {"sites": list(self.sites), "docker": self.docker, "key": self.key, "known_hosts": self.known_hosts}


SERVER_KEYS = ("sites", "docker", "key", "known_hosts")


def parse_servers(raw: Any, *, base_dir: Path | None = None) -> tuple[RemoteServer, ...]:
    """``compute.servers`` of a config, checked (files exist, URL well formed, a site at most once).

    Raises
    ------
    ConfigError
        One line naming the entry and what is wrong with it.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"compute.servers must be a list of {{sites, docker, key}} entries, got {raw!r}")
    base = Path.cwd() if base_dir is None else base_dir
    out: list[RemoteServer] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"compute.servers[{i}]"
        entry = config_entry(where, entry, SERVER_KEYS, "sites, docker and key")
        sites = entry.get("sites")
        if not isinstance(sites, list) or not sites or not all(isinstance(s, str) and s for s in sites):
            raise ConfigError(f"{where}.sites must be a non-empty list of site names, got {sites!r}")
        for s in sites:
            if s in seen:
                raise ConfigError(f"{where}: site {s!r} is given to two servers")
            seen.add(s)
        url = entry.get("docker")
        check_ssh_url(url, where=f"{where}.docker")
        key = readable_file(entry.get("key"), base, f"{where}.key")
        known = entry.get("known_hosts", str(Path("~/.ssh/known_hosts").expanduser()))
        known_hosts = readable_file(known, base, f"{where}.known_hosts")
        out.append(RemoteServer(tuple(sites), str(url), key, known_hosts))
    return tuple(out)


def check_ssh_url(url: Any, *, where: str) -> urllib.parse.SplitResult:
    """``ssh://user@host[:port]`` (no password, no path), or a ConfigError."""
    if not isinstance(url, str) or not url.startswith("ssh://"):
        raise ConfigError(f"{where} must be an ssh:// URL like ssh://user@host, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.password is not None:
        raise ConfigError(f"{where}: the URL may not carry a password (keys only)")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{where}: the port is not a number") from None
    if not parts.hostname or not parts.username or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"{where} must be ssh://user@host[:port], got {url!r}")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range")
    return parts


def ssh_docker_client(server: RemoteServer) -> Any:
    """A Docker SDK client for `server`'s daemon over SSH: the config's key only (no agent, no
    other keys), the host key checked against `server.known_hosts` and refused when unknown or
    changed. The daemon is asked for its version once, so a failure surfaces here.

    Raises
    ------
    ConfigError
        The host key is unknown or does not match, the key is refused, the host is unreachable, or
        no Docker daemon answers there. The message names the URL and files, never a secret.
    """
    import docker
    import paramiko
    from docker.transport import SSHHTTPAdapter

    parts = check_ssh_url(server.docker, where="docker")

    class KeyedSSHAdapter(SSHHTTPAdapter):
        """The SDK's SSH adapter with this server's key and known_hosts (the SDK reads ~/.ssh)."""

        def _create_paramiko_client(self, base_url: str) -> None:
            logging.getLogger("paramiko").setLevel(logging.WARNING)
            self.ssh_client = paramiko.SSHClient()
            self.ssh_params = {"hostname": parts.hostname, "port": parts.port or 22, "username": parts.username,
                               "key_filename": server.key, "allow_agent": False, "look_for_keys": False,
                               "timeout": CONNECT_TIMEOUT_S, "banner_timeout": CONNECT_TIMEOUT_S,
                               "auth_timeout": CONNECT_TIMEOUT_S}
            self.ssh_client.load_host_keys(server.known_hosts)
            self.ssh_client.set_missing_host_key_policy(paramiko.RejectPolicy())

    where = f"{server.docker} (sites {', '.join(server.sites)})"
    try:
        adapter = KeyedSSHAdapter(server.docker, timeout=int(CONNECT_TIMEOUT_S))
    except paramiko.BadHostKeyException:
        raise ConfigError(f"{where}: the host key does not match {server.known_hosts}: refused") from None
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise ConfigError(f"{where}: the host is not in {server.known_hosts}: refused (host keys are "
                              "never accepted automatically; add it with ssh-keyscan after checking it)") from None
        raise ConfigError(f"{where}: SSH failed: {e}") from None
    except (OSError, EOFError) as e:
        raise ConfigError(f"{where}: cannot connect: {e}") from None
    # A client whose transport is that adapter: version pinned so that building it asks nothing.
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", version="1.41", timeout=120)
    api = client.api
    api.mount("http+docker://ssh", adapter)
    api._custom_adapter = adapter
    api.base_url = "http+docker://ssh"
    try:
        version = api.version(api_version=False)
    except Exception as e:  # noqa: BLE001 -- whatever the far side answered: one line
        adapter.close()
        raise ConfigError(f"{where}: no Docker daemon answers over SSH: {type(e).__name__}: {e}") from None
    api._version = str(version.get("ApiVersion", "1.41"))
    LOG.info("docker over ssh: %s, daemon %s", server.docker, version.get("Version", "?"))
    return client


def connect_servers(servers: Iterable[RemoteServer], *, sites: Iterable[str],
                    local_client: Any) -> dict[str, Any]:
    """{site: Docker client} for every site of `servers`, each checked: a compute site of the
    emulation, and a daemon on this machine (the same daemon as `local_client`'s).

    Raises
    ------
    ConfigError
        Before anything starts, with the site and URL.
    """
    known = set(sites)
    out: dict[str, Any] = {}
    try:
        local_id = local_client.info().get("ID")
        for server in servers:
            for s in server.sites:
                if s not in known:
                    raise ConfigError(f"compute.servers: {s!r} is not a compute site of the emulation; "
                                      f"sites: {', '.join(sorted(known))}")
            client = ssh_docker_client(server)
            remote_id = client.info().get("ID")
            if not local_id or remote_id != local_id:
                client.close()
                raise ConfigError(
                    f"{server.docker}: that Docker daemon is not this machine's; a container there would "
                    "join the emulation through a tunnel, which this version does not build "
                    "(docs/architecture.md, 'Remote compute servers')")
            out.update({s: client for s in server.sites})
    except BaseException:
        for c in {id(c): c for c in out.values()}.values():
            c.close()
        raise
    return out
