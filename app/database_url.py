"""The two ways a ``DATABASE_URL`` names several PostgreSQL hosts (docs/scaling.md, "High availability
with Patroni").

libpq lists the hosts in the URL's host part, ``postgresql://user@h1:5432,h2:5433/db?
target_session_attrs=read-write``: a client tries them in order and keeps the first whose session
matches ``target_session_attrs`` (``read-write``: the primary). SQLAlchemy's URL holds one host there
(``h1:5432,h2:5433`` is a bad port to it) and takes several as repeated ``host`` query parameters,
``postgresql://user@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write``, which its asyncpg
dialect hands to ``asyncpg.connect`` as lists of hosts and ports, with ``target_session_attrs``.

:func:`parse` reads either form (and a plain one-host URL) into SQLAlchemy's; :func:`to_libpq` writes it
back in libpq's form, the one ``asyncpg.connect(dsn)`` reads. Pure string handling: no connection.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

DEFAULT_PORT = 5432


def _split(url: str) -> tuple[str, str, str]:
    """``scheme://user@HOSTS/db?query`` -> (``scheme://user@``, ``HOSTS``, ``/db?query``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    userinfo, at, hosts = netloc.rpartition("@")
    return f"{scheme}://{userinfo}{at}", hosts, tail


def _host_port(entry: str) -> str:
    """One entry of a host list as ``host:port`` (the default port when it names none)."""
    if entry.startswith("["):
        raise ValueError("an IPv6 address in a list of hosts is not supported; use a host name")
    host, colon, port = entry.partition(":")
    if not host:
        raise ValueError("an empty host in the list of hosts")
    if not colon:
        return f"{host}:{DEFAULT_PORT}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} of host {host!r} is not a number in 1..65535")
    return f"{host}:{int(port)}"


def parse(url: str) -> URL:
    """``url`` as SQLAlchemy's URL; libpq's list of hosts becomes repeated ``host=host:port`` query
    parameters (each with its port; the default 5432 when it names none). Raises ValueError for a bad
    entry, or for hosts named both ways."""
    prefix, hosts, tail = _split(url)
    if "," not in hosts:
        return make_url(url)
    single = make_url(prefix + tail)
    if "host" in single.query:
        raise ValueError("hosts are listed both in the host part and as host= parameters")
    return single.update_query_pairs([("host", _host_port(h)) for h in hosts.split(",")], append=True)


def hosts(url: URL) -> list[str]:
    """The ``host:port`` entries of a URL that names several hosts (empty when it names one)."""
    listed = url.query.get("host")
    return list(listed) if isinstance(listed, tuple) and len(listed) > 1 else []


def to_libpq(url: URL, drivername: str = "postgresql") -> str:
    """``url`` written as libpq (and asyncpg) read it: several hosts back in the host part, the
    password kept; a one-host URL as SQLAlchemy renders it."""
    listed = hosts(url)
    if not listed:
        return url.set(drivername=drivername).render_as_string(hide_password=False)
    rest = {k: v for k, v in url.query.items() if k != "host"}
    bare = url.set(drivername=drivername, host=None, port=None, query=rest)
    prefix, _, tail = _split(bare.render_as_string(hide_password=False))
    return prefix + ",".join(listed) + tail
