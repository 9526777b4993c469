"""Fetching one web page for a URL source, safely.

Only public addresses are reached. The host name is resolved once, every address it resolves
to must pass the policy, and the connection goes to that checked address (the Host header and
TLS server name keep the name), so a DNS answer cannot change between the check and the
connection. Each redirect is checked the same way. The whole fetch has one deadline and a
size cap; the answer must be a format the extractor reads.

    page = fetch_url("https://example.org/handbook")          # page.body, page.content_type, page.url

Tests and operators can widen the policy: ``AddressPolicy(allowed_networks=["10.1.0.0/16"])``
(the ``KNOWLEDGE_URL_ALLOWED_NETWORKS`` setting), and inject a resolver.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from knowledge.extraction import CSV, DOCX, HTML, MARKDOWN, PDF, TEXT

USER_AGENT = "LineageKnowledgeBot/0.1 (one page per request)"
MAX_REDIRECTS = 5
ACCEPTED_TYPES = (TEXT, MARKDOWN, HTML, CSV, PDF, DOCX, "application/xhtml+xml", "text/x-markdown")

Resolver = Callable[[str, int], list[str]]

# Addresses that are never reached, even when marked global by the ipaddress module, or where
# the ipaddress flags are not enough on their own (cloud metadata services).
_ALWAYS_REFUSED = tuple(ipaddress.ip_network(net) for net in (
    "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack metadata (also link-local)
    "100.100.100.200/32",  # Alibaba Cloud metadata (in the shared 100.64/10 range)
    "fd00:ec2::254/128",  # AWS metadata over IPv6
    "192.0.0.192/32",  # Oracle Cloud metadata
))


class FetchError(ValueError):
    """The URL cannot be fetched; the message is meant for the user. `transient` errors (a timeout,
    a lost connection, a 5xx answer) are worth retrying, the others are not."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class BlockedAddress(FetchError):
    pass


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address hidden in an IPv4-mapped, NAT64 or 6to4 IPv6 address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in ipaddress.ip_network("64:ff9b::/96"):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return None


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses a fetch may connect to: public (globally routable) ones, plus the
    `allowed_networks` an operator opened. Loopback, private, link-local, shared, reserved,
    multicast and metadata addresses are refused."""

    allowed_networks: tuple[str, ...] = ()
    _networks: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self):
        object.__setattr__(self, "_networks", tuple(ipaddress.ip_network(n, strict=False)
                                                    for n in self.allowed_networks))

    def allows(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if any(ip.version == net.version and ip in net for net in self._networks):
            return True
        if any(ip.version == net.version and ip in net for net in _ALWAYS_REFUSED):
            return False
        if isinstance(ip, ipaddress.IPv6Address):
            inner = _embedded_ipv4(ip)
            if inner is not None:
                return self.allows(str(inner))
        return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local
                                     or ip.is_private or ip.is_unspecified)

    def check(self, host: str, addresses: Iterable[str]) -> list[str]:
        """The addresses to connect to; refuses the host when any of them is not allowed (a
        name that also resolves inside the network is a rebinding attempt, not a public site)."""
        addresses = list(dict.fromkeys(addresses))
        if not addresses:
            raise FetchError(f"{host} does not resolve to any address")
        refused = [a for a in addresses if not self.allows(a)]
        if refused:
            raise BlockedAddress(
                f"{host} resolves to {refused[0]}, which is not a public address: only public web pages "
                "can be fetched"
            )
        return addresses


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FetchError(f"{host} could not be resolved: {exc.strerror or exc}", transient=True) from None
    return [info[4][0] for info in infos]


@dataclass(frozen=True)
class Page:
    url: str  # after redirects
    body: bytes
    content_type: str  # the declared type, charset included
    status: int


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float, context: ssl.SSLContext):
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def fetch_url(url: str, *, timeout: float = 15.0, max_bytes: int = 10 * 1024 * 1024,
              policy: AddressPolicy | None = None, resolver: Resolver = system_resolver,
              ssl_context: ssl.SSLContext | None = None) -> Page:
    """GET one page, following at most 5 redirects, each hop's addresses checked by `policy`."""
    policy = policy or AddressPolicy()
    deadline = time.monotonic() + timeout
    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        parts = _validate_url(current)
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = policy.check(host, _resolve(host, port, resolver))
        response, connection, sock = _request(parts, host, addresses[0], port, deadline, ssl_context)
        try:
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                if not location:
                    raise FetchError(f"{current} redirected without a Location header")
                current = urljoin(current, location)
                continue
            if response.status >= 400:
                raise FetchError(f"{current} answered HTTP {response.status} {response.reason}",
                                 transient=response.status >= 500 or response.status == 429)
            content_type = response.getheader("Content-Type", "") or ""
            base_type = content_type.split(";")[0].strip().lower()
            if base_type and base_type not in ACCEPTED_TYPES:
                raise FetchError(f"{current} is {base_type}, not a page or document that can be indexed")
            declared = response.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise FetchError(f"{current} is {int(declared):,} bytes, over the {max_bytes:,}-byte limit")
            body = _read(response, sock, max_bytes, deadline, current)
            return Page(url=current, body=body, content_type=content_type, status=response.status)
        finally:
            connection.close()
    raise FetchError(f"{url} redirected more than {MAX_REDIRECTS} times")


def _validate_url(url: str):
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise FetchError(f"{url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise FetchError(f"only http and https URLs can be fetched, not {parts.scheme or 'a relative URL'!r}")
    if not parts.hostname:
        raise FetchError(f"{url!r} has no host name")
    if parts.username or parts.password:
        raise FetchError("URLs with credentials are not fetched")
    return parts


def _resolve(host: str, port: int, resolver: Resolver) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]  # a literal address
    except ValueError:
        return resolver(host, port)


def _request(parts, host, address, port, deadline, ssl_context):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise FetchError(f"fetching {parts.geturl()} took longer than allowed", transient=True)
    if parts.scheme == "https":
        connection = _PinnedHTTPSConnection(host, address, port, remaining,
                                            ssl_context or ssl.create_default_context())
    else:
        connection = _PinnedHTTPConnection(host, address, port, remaining)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        connection.request("GET", path, headers={
            "Host": parts.netloc.rsplit("@", 1)[-1], "User-Agent": USER_AGENT,
            "Accept": "text/html,application/xhtml+xml,text/plain,text/markdown,application/pdf,*/*;q=0.5",
            "Accept-Encoding": "identity",
        })
        sock = connection.sock  # kept: the connection lets go of it when the answer closes the connection
        return connection.getresponse(), connection, sock
    except TimeoutError:
        connection.close()
        raise FetchError(f"{parts.geturl()} did not answer in time", transient=True) from None
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise FetchError(f"{parts.geturl()} could not be fetched: {exc}", transient=True) from None


def _read(response, sock, max_bytes: int, deadline: float, url: str) -> bytes:
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"{url} took longer than allowed to send its content", transient=True)
        if sock is not None and not response.isclosed():
            with contextlib.suppress(OSError):  # the answer may have just been read to its end
                sock.settimeout(remaining)  # each read waits at most until the deadline
        try:
            chunk = response.read(65536)
        except TimeoutError:
            raise FetchError(f"{url} took longer than allowed to send its content", transient=True) from None
        except (OSError, http.client.HTTPException) as exc:
            raise FetchError(f"{url} broke off while sending its content: {exc}", transient=True) from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(f"{url} is larger than the {max_bytes:,}-byte limit")
        chunks.append(chunk)
