"""Choosing a free pod range and the plan for the cluster's network namespace."""

from __future__ import annotations

import pytest

from goodput.testbed.cluster.netns import FIRST_OCTET, NetnsError, NetnsPlan, choose_octet, netns_name
from goodput.testbed.cluster.topology import PodNetwork

HOST_ROUTES = ["127.0.0.0/8", "127.0.0.1/32", "192.0.2.0/24", "192.0.2.2/32"]
OCTET_CASES = {
    "nothing in the way": (HOST_ROUTES, (), FIRST_OCTET),
    "first range routed already": ([*HOST_ROUTES, "10.200.0.0/16"], (), 201),
    "a host address inside the first range": ([*HOST_ROUTES, "10.200.7.9/32"], (), 201),
    "a narrower route inside the first range": ([*HOST_ROUTES, "10.200.3.0/24"], (), 201),
    "first octet held by another cluster": (HOST_ROUTES, (200, 201), 202),
    "zeroconf link-local route is fine": ([*HOST_ROUTES, "169.254.0.0/16"], (), FIRST_OCTET),
    "link address already in use": ([*HOST_ROUTES, "169.254.200.1/32"], (), 201),
    "ipv6 routes are ignored": ([*HOST_ROUTES, "fd00::/8"], (), FIRST_OCTET),
}


@pytest.mark.parametrize(("routes", "taken", "expected"), OCTET_CASES.values(), ids=OCTET_CASES.keys())
def test_choose_octet_avoids_routes_addresses_and_other_clusters(
    routes: list[str], taken: tuple[int, ...], expected: int
) -> None:
    assert choose_octet(routes, taken) == expected


def test_choose_octet_gives_up_when_a_vpn_covers_all_of_10_slash_8() -> None:
    with pytest.raises(NetnsError, match="no free"):
        choose_octet([*HOST_ROUTES, "10.0.0.0/8"])


def test_plan_routes_the_pod_range_into_the_namespace_where_every_pod_ip_is_local() -> None:
    plan = NetnsPlan(netns_name("dev"), PodNetwork(213))
    commands = [" ".join(argv) for argv in plan.setup_commands()]

    assert plan.name == "goodput-dev"
    assert len(plan.host_veth) <= 15 and len(plan.namespace_veth) <= 15  # Linux interface name limit
    assert commands[0] == "ip netns add goodput-dev"
    assert "ip -n goodput-dev link set lo up" in commands
    assert "ip -n goodput-dev route add local 10.213.0.0/16 dev lo" in commands
    assert "ip route add 10.213.0.0/16 via 169.254.213.2 dev gp213h" in commands
    # The host route needs the namespace end of the link up and addressed first.
    assert commands.index("ip route add 10.213.0.0/16 via 169.254.213.2 dev gp213h") == len(commands) - 1
    assert commands.index("ip -n goodput-dev addr add 169.254.213.2/30 dev gp213n") < len(commands) - 1


def test_exec_runs_the_command_inside_the_namespace() -> None:
    plan = NetnsPlan("goodput-x", PodNetwork(220))
    assert plan.exec_argv(["python3", "-m", "http.server"]) == [
        "ip", "netns", "exec", "goodput-x", "python3", "-m", "http.server",
    ]  # fmt: skip
