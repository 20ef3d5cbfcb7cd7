"""The page's sign-in callback limit counts per client network (webchat/oauth.py `client_network`)."""

from __future__ import annotations

from webchat.oauth import client_network


def test_an_ipv6_subscriber_counts_once_for_its_whole_64() -> None:
    assert client_network("2001:db8:1:2::1") == client_network("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_network("2001:db8:1:3::1") != client_network("2001:db8:1:2::1")


def test_ipv4_and_ipv4_mapped_addresses_count_alike_and_anything_else_as_written() -> None:
    assert client_network("203.0.113.7") == client_network("::ffff:203.0.113.7") == "203.0.113.7"
    assert client_network("203.0.113.8") != client_network("203.0.113.7")
    assert client_network("unknown") == "unknown" and len(client_network("x" * 500)) == 128
