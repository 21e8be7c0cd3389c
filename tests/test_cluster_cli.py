"""`goodput cluster` argument handling and the shell exports of `env`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from goodput.testbed.cluster import cli
from goodput.testbed.cluster.config import ClusterLayout, Ports, StatePaths, render_kubeconfig
from goodput.testbed.cluster.controlplane import ClusterState
from goodput.testbed.cluster.topology import PodNetwork, Topology


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_up_parses_the_topology_and_options() -> None:
    args = parse(
        "up", "--name", "demo", "--topology", "zones=1,domains=2,nodes=2,gpus=8", "--scrape-interval", "2"
    )
    assert args.topology == Topology(zones=1, domains_per_zone=2, nodes_per_domain=2, gpus_per_node=8)
    assert (args.name, args.scrape_interval, args.no_netns, args.state_dir) == ("demo", 2.0, False, None)


def test_up_rejects_a_bad_topology(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("up", "--topology", "racks=3")
    assert "--topology" in capsys.readouterr().err


def test_env_prints_exports_for_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = ClusterState(
        name="demo",
        state_dir=tmp_path / "demo",
        bin_dir=tmp_path / "bin",
        ports=Ports(1, 2, 3, 4, 5, 6, 7),
        network_octet=207,
        netns="goodput-demo",
        topology=Topology(),
        scrape_interval_seconds=5.0,
    )
    paths = StatePaths(state.state_dir)
    paths.root.mkdir()
    paths.state_file.write_text(state.to_json())
    layout = ClusterLayout("demo", state.bin_dir, paths, state.ports, PodNetwork(207))
    paths.kubeconfig.write_text(render_kubeconfig(layout))

    assert cli.run(parse("env", "--name", "demo", "--state-dir", str(paths.root))) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"export KUBECONFIG={paths.kubeconfig}",
        "export GOODPUT_PROMETHEUS_URL=http://127.0.0.1:7",
        "export GOODPUT_NETNS=goodput-demo",
    ]


def test_state_round_trips_through_its_json(tmp_path: Path) -> None:
    state = ClusterState(
        "demo", tmp_path, tmp_path / "bin", Ports(1, 2, 3, 4, 5, 6, 7), 230, None, Topology(zones=1), 2.0
    )
    assert ClusterState.from_json(state.to_json()) == state


def test_commands_on_a_missing_cluster_fail_with_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(parse("status", "--state-dir", str(tmp_path / "nothing"))) == 1
    assert "goodput cluster up" in capsys.readouterr().err
    assert cli.run(parse("down", "--state-dir", str(tmp_path / "nothing"))) == 0
