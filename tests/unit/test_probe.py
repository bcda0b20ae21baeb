"""The GPU probe keeps NVML's own words: a driver/library mismatch is not 'no driver'."""

import socket

import pynvml
import pytest

from entrypoint.supervise import probe


@pytest.mark.parametrize(
    "code,words",
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ],
)
def test_nvml_errors_are_named(code, words):
    assert words in probe._nvml_reason(pynvml.NVMLError(code))


# /proc/net/ipv6_route and if_inet6 as a dual-stack container shows them (Linux
# Documentation/networking/proc_net: dest, plen, src, plen, next hop, metric, refs, use,
# flags, interface); the last default is the kernel's reject route on lo.
IPV6_ROUTE = """\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
"""
REJECT_ONLY = IPV6_ROUTE.splitlines()[-1]
IF_INET6 = """\
fd000000000000000000000000000002 04 40 00 82     eth0
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
00000000000000000000000000000001 01 80 10 80       lo
"""
ROUTE = "Iface\tDestination\tGateway\nenp1s0\t00000000\t0100000A\n"


@pytest.mark.parametrize(
    ("route", "ipv6_route", "interface"),
    [
        (ROUTE, IPV6_ROUTE, "enp1s0"),  # IPv4's default first, as before
        ("Iface\tDestination\n", IPV6_ROUTE, "eth0"),  # an IPv6-only host
        ("", "", None),
        ("", REJECT_ONLY, None),
    ],
)
def test_the_default_route_is_ipv4_s_else_ipv6_s(route, ipv6_route, interface):
    assert (probe.ipv4_default(route) or probe.ipv6_default(ipv6_route)) == interface


def test_each_interface_lists_its_ipv6_addresses():
    assert probe.ipv6_addresses(IF_INET6 + "garbage line\n") == {
        "eth0": ["fd00::2", "fe80::fc:ff:fe00:1"],
        "lo": ["::1"],
    }


def test_the_master_resolves_to_ipv6_and_is_probed_over_it():
    assert probe.resolve("::1") == "::1" and probe.resolve("::ffff:127.0.0.1") == "127.0.0.1"
    assert probe.resolve("no-such-host.invalid") is None
    with socket.socket(socket.AF_INET6) as server:
        server.bind(("::1", 0))
        server.listen()
        assert probe.tcp_connect("::1", server.getsockname()[1]) == "open"
        assert probe.source_address("::1") == "::1"
