"""[sharding] groups and raft_port_step, and group_config: group k's core's configuration."""

import os

import pytest

from nameserver import config
from tests.unit.test_config import GOOD


def _doc(node: str, sharding: str) -> str:
    """test_config's two-member node with `node` in [node], /metrics on, and `sharding`."""
    return (GOOD.replace('data_dir = "data/n1"\n', f'data_dir = "data/n1"\n{node}\n', 1)
            + '[metrics]\nlisten = "127.0.0.1:9301"\n' + sharding)


def _load(tmp_path, node: str = "worker_processes = 1", sharding: str = "") -> config.NodeConfig:
    p = tmp_path / "n1.toml"
    p.write_text(_doc(node, sharding))
    return config.load(str(p))


def test_one_group_by_default_and_its_config_is_the_node_s(tmp_path) -> None:
    cfg = _load(tmp_path, node="")
    assert (cfg.groups, cfg.raft_port_step, cfg.group, cfg.leader_balance_s) == (1, 100, 0, 30.0)
    assert config.group_config(cfg, 0) is cfg


def test_group_k_shifts_every_member_s_raft_port_and_keeps_grpc(tmp_path) -> None:
    cfg = _load(tmp_path, sharding="[sharding]\ngroups = 3\nraft_port_step = 50")
    g2 = config.group_config(cfg, 2)
    assert g2.group == 2
    assert g2.raft_addr == "127.0.0.1:9301"
    assert [m.raft_addr for m in g2.members] == ["127.0.0.1:9301", "127.0.0.1:9302"]
    assert g2.partners == ["127.0.0.1:9302"]
    # a leader of group 2 is reached at its node's public gRPC address (its workers pass it to group 2)
    assert g2.grpc_of("127.0.0.1:9302") == "127.0.0.1:9102"
    assert g2.data_dir == os.path.join(cfg.data_dir, "g2")
    assert (g2.metrics_addr, g2.controller_addr, g2.archive_dir) == ("", "", "")
    assert g2.worker_processes == cfg.worker_processes  # sizes its private sockets; it starts none
    assert config.group_config(cfg, 0).data_dir == cfg.data_dir


def test_leader_balance_s_takes_seconds_and_0_turns_it_off(tmp_path) -> None:
    assert _load(tmp_path, sharding="[sharding]\ngroups = 2\nleader_balance_s = 1.5").leader_balance_s == 1.5
    assert _load(tmp_path, sharding="[sharding]\ngroups = 2\nleader_balance_s = 0").leader_balance_s == 0.0


def test_group_out_of_range_is_refused(tmp_path) -> None:
    cfg = _load(tmp_path, sharding="[sharding]\ngroups = 2")
    with pytest.raises(config.ConfigError, match="group 2 is not a group"):
        config.group_config(cfg, 2)


@pytest.mark.parametrize(("node", "sharding", "field"), [
    ("worker_processes = 0", "[sharding]\ngroups = 2", "node.worker_processes"),
    ("worker_processes = 1", "[sharding]\ngroups = 0", "sharding.groups"),
    ("worker_processes = 1", "[sharding]\ngroups = 2\nraft_port_step = 0", "sharding.raft_port_step"),
    ("worker_processes = 1", "[sharding]\ngroups = 2\nraft_port_step = 60000", "sharding.raft_port_step"),
    ("worker_processes = 1", '[sharding]\ngroups = "2"', "sharding.groups"),
    ("worker_processes = 2", "[sharding]\ngroups = 16", "limits.max_followers"),
    ("worker_processes = 1", "[sharding]\ngroups = 2\nleader_balance_s = -1", "sharding.leader_balance_s"),
    ("worker_processes = 1", "[sharding]\ngroups = 2\nleader_balance_s = nan", "sharding.leader_balance_s"),
    ("worker_processes = 1", "[sharding]\ngroups = 2\nleader_balance_s = inf", "sharding.leader_balance_s"),
    ("worker_processes = 1", '[sharding]\ngroups = 2\nleader_balance_s = "30s"', "sharding.leader_balance_s"),
])
def test_bad_sharding_is_refused_naming_the_field(tmp_path, node: str, sharding: str, field: str) -> None:
    with pytest.raises(config.ConfigError, match=field):
        _load(tmp_path, node=node, sharding=sharding)


def test_controller_mode_with_groups_is_served_by_group_0_s_core_alone(tmp_path) -> None:
    """[controller] listen with groups > 1 loads (every ctrl/ record is group 0's: docs/scaling.md,
    "Controller mode with groups"); group k's core has no controller port."""
    cfg = _load(tmp_path, sharding='[sharding]\ngroups = 2\n[controller]\nlisten = "127.0.0.1:9878"')
    assert (cfg.groups, cfg.controller_addr) == (2, "127.0.0.1:9878")
    assert config.group_config(cfg, 0).controller_addr == "127.0.0.1:9878"
    assert config.group_config(cfg, 1).controller_addr == ""


def test_long_data_dir_counts_the_group_directory(tmp_path) -> None:
    deep = tmp_path / ("d" * (config.UNIX_PATH_MAX - len(str(tmp_path)) - 24))  # 106 bytes, 109 with g1/
    node = f'worker_processes = 1\ndata_dir = "{deep}"'
    p = tmp_path / "n1.toml"
    p.write_text(_doc("", "").replace('data_dir = "data/n1"', node))
    config.load(str(p))  # fits with one group
    p.write_text(_doc("", "[sharding]\ngroups = 2").replace('data_dir = "data/n1"', node))
    with pytest.raises(config.ConfigError, match="node.data_dir is too long"):
        config.load(str(p))
