"""URL fetching: only public addresses, checked at every hop. The refusals of private addresses are
tested on the policy and with injected resolvers, never by connecting to those addresses; the
only connections go to local test servers on loopback."""

import pytest

from knowledge.fetching import AddressPolicy, BlockedAddress, FetchError, fetch_url
from tests.local_server import LocalServer

PUBLIC = AddressPolicy()


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "::1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "169.254.169.254",
    "169.254.1.1", "100.64.0.1", "100.100.100.200", "0.0.0.0", "::", "fe80::1", "fc00::1",  # noqa: S104
    "fd00:ec2::254",
    "224.0.0.1", "240.0.0.1", "255.255.255.255", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a00:1",
    "2002:7f00:1::", "192.0.0.192", "198.18.0.1", "not-an-ip",
])
def test_non_public_addresses_are_refused(address):
    assert not PUBLIC.allows(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "1.1.1.1"])
def test_public_addresses_are_allowed(address):
    assert PUBLIC.allows(address)


def test_an_operator_can_open_a_private_network():
    policy = AddressPolicy(allowed_networks=("10.20.0.0/16",))
    assert policy.allows("10.20.3.4")
    assert not policy.allows("10.21.0.1")


def test_dns_answer_pointing_inside_is_refused_before_connecting():
    connected = []

    def resolver(host, port):
        connected.append(host)
        return ["93.184.215.14", "10.0.0.7"]  # a public answer mixed with a private one: rebinding

    with pytest.raises(BlockedAddress, match=r"10\.0\.0\.7, which is not a public address"):
        fetch_url("http://intranet.example.com/", resolver=resolver)
    assert connected == ["intranet.example.com"]  # resolved, never connected


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "http://[::1]:8080/", "http://169.254.169.254/latest/meta-data"])
def test_literal_private_addresses_are_refused(url):
    with pytest.raises(BlockedAddress):
        fetch_url(url, resolver=lambda h, p: pytest.fail("a literal address is not resolved"))


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://example.com/file.txt", "only http and https"),
    ("file:///etc/passwd", "only http and https"),
    ("http://user:pw@example.com/", "credentials"),
    ("http:///nohost", "no host name"),
    ("http://example.com:99999/", "not a valid URL"),
])
def test_malformed_urls_are_refused(url, message):
    with pytest.raises(FetchError, match=message):
        fetch_url(url, resolver=lambda h, p: ["93.184.215.14"])


@pytest.fixture
def page_server():
    # a loopback address of its own, so the policy can open exactly this one for the test
    with LocalServer("127.0.0.2") as server:
        yield server


ALLOW_TEST_SERVER = AddressPolicy(allowed_networks=("127.0.0.2/32",))


def test_fetch_from_an_allowed_local_server(page_server):
    page_server.routes["/doc"] = (200, {"Content-Type": "text/html; charset=utf-8"}, "<p>Hello</p>")
    page = fetch_url(page_server.url("/doc"), policy=ALLOW_TEST_SERVER)
    assert page.body == b"<p>Hello</p>" and page.content_type.startswith("text/html")
    assert page_server.requests[0]["headers"]["host"] == f"127.0.0.2:{page_server.port}"


def test_a_redirect_to_127_0_0_1_is_blocked(page_server):
    page_server.routes["/start"] = (302, {"Location": "http://127.0.0.1:9/admin"}, "")
    with pytest.raises(BlockedAddress, match=r"127\.0\.0\.1, which is not a public address"):
        fetch_url(page_server.url("/start"), policy=ALLOW_TEST_SERVER)
    assert [r["path"] for r in page_server.requests] == ["/start"]


def test_a_redirect_to_a_name_resolving_inside_is_blocked(page_server):
    page_server.routes["/start"] = (301, {"Location": "http://metadata.example.com/"}, "")
    resolver = {"metadata.example.com": ["169.254.169.254"]}
    with pytest.raises(BlockedAddress, match=r"169\.254\.169\.254"):
        fetch_url(page_server.url("/start"), policy=ALLOW_TEST_SERVER, resolver=lambda h, p: resolver[h])


def test_relative_redirects_are_followed_and_bounded(page_server):
    page_server.routes["/a"] = (302, {"Location": "/b"}, "")
    page_server.routes["/b"] = (200, {"Content-Type": "text/plain"}, "arrived")
    page_server.routes["/loop"] = (302, {"Location": "/loop"}, "")
    assert fetch_url(page_server.url("/a"), policy=ALLOW_TEST_SERVER).body == b"arrived"
    with pytest.raises(FetchError, match="redirected more than 5 times"):
        fetch_url(page_server.url("/loop"), policy=ALLOW_TEST_SERVER)


def test_size_cap_type_and_status_are_enforced(page_server):
    page_server.routes["/big"] = (200, {"Content-Type": "text/plain"}, "x" * 5000)
    page_server.routes["/image"] = (200, {"Content-Type": "image/png"}, "\x89PNG")
    page_server.routes["/gone"] = (404, {"Content-Type": "text/plain"}, "no")
    page_server.routes["/down"] = (503, {"Content-Type": "text/plain"}, "later")
    with pytest.raises(FetchError, match="limit"):
        fetch_url(page_server.url("/big"), policy=ALLOW_TEST_SERVER, max_bytes=1000)
    with pytest.raises(FetchError, match="image/png"):
        fetch_url(page_server.url("/image"), policy=ALLOW_TEST_SERVER)
    with pytest.raises(FetchError, match="HTTP 404") as gone:
        fetch_url(page_server.url("/gone"), policy=ALLOW_TEST_SERVER)
    assert not gone.value.transient
    with pytest.raises(FetchError, match="HTTP 503") as down:
        fetch_url(page_server.url("/down"), policy=ALLOW_TEST_SERVER)
    assert down.value.transient


def test_a_slow_server_hits_the_deadline(page_server):
    import time

    def slow(handler, body):
        time.sleep(1.5)
        return 200, {"Content-Type": "text/plain"}, "late"

    page_server.routes["/slow"] = slow
    with pytest.raises(FetchError, match=r"in time|longer than allowed") as caught:
        fetch_url(page_server.url("/slow"), policy=ALLOW_TEST_SERVER, timeout=0.3)
    assert caught.value.transient
