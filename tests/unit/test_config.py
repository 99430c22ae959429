import os

import pytest

from nameserver import config

GOOD = """
[node]
raft_addr = "127.0.0.1:9201"
grpc_addr = "127.0.0.1:9101"
data_dir = "data/n1"
[[cluster.members]]
raft_addr = "127.0.0.1:9201"
grpc_addr = "127.0.0.1:9101"
[[cluster.members]]
raft_addr = "127.0.0.1:9202"
grpc_addr = "127.0.0.1:9102"
[liveness]
default_timeout_ms = 3000
"""


def test_load_resolves_paths_and_partners(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    cfg = config.load(str(p))
    assert cfg.data_dir == str(tmp_path / "data" / "n1")
    assert cfg.partners == ["127.0.0.1:9202"]
    assert cfg.grpc_of("127.0.0.1:9202") == "127.0.0.1:9102"
    assert cfg.default_timeout_ms == 3000


def test_flags_override_file(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p), {"scan_interval_ms": 700}).scan_interval_ms == 700


def test_node_must_be_a_member(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('raft_addr = "127.0.0.1:9201"\ngrpc', 'raft_addr = "127.0.0.1:9999"\ngrpc', 1))
    with pytest.raises(config.ConfigError, match="not in cluster.members"):
        config.load(str(p))


def test_password_comes_from_env_not_text(tmp_path, monkeypatch) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD + '\n[raft]\npassword_env = "NS_TEST_PW"\n')
    with pytest.raises(config.ConfigError, match="NS_TEST_PW"):
        config.load(str(p))
    monkeypatch.setenv("NS_TEST_PW", "s3cret")
    assert config.load(str(p)).password == "s3cret"
    assert "s3cret" not in repr(config.load(str(p)))


def test_journal_fsync_is_on_by_default_and_can_be_turned_off(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).fsync is True
    p.write_text(GOOD + "[raft]\nfsync = false\n")
    assert config.load(str(p)).fsync is False
    p.write_text(GOOD + '[raft]\nfsync = "no"\n')
    with pytest.raises(config.ConfigError, match="fsync"):
        config.load(str(p))


def test_raft_frames_are_sent_uncompressed_unless_a_zlib_level_is_set(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).wire_compress_level == 0
    p.write_text(GOOD + "[raft]\nwire_compress_level = 1\n")
    assert config.load(str(p)).wire_compress_level == 1
    p.write_text(GOOD + "[raft]\nwire_compress_level = 10\n")
    with pytest.raises(config.ConfigError, match="raft.wire_compress_level must be a zlib level"):
        config.load(str(p))


def test_a_setting_of_the_wrong_type_is_refused_by_name(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace("default_timeout_ms = 3000", 'default_timeout_ms = "3s"'))
    with pytest.raises(config.ConfigError, match="liveness.default_timeout_ms must be int"):
        config.load(str(p))


def test_remoting_tls_mode_defaults_with_the_certificate_and_is_checked(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).remoting_tls_mode == "off"
    (tmp_path / "n.crt").write_text("x")
    (tmp_path / "n.key").write_text("x")
    tls = '[tls]\ncert_file = "n.crt"\nkey_file = "n.key"\n'
    p.write_text(GOOD + tls)
    assert config.load(str(p)).remoting_tls_mode == "permissive"  # RocketMQ's default tls.server.mode
    p.write_text(GOOD + tls + '[remoting]\ntls = "enforcing"\n')
    assert config.load(str(p)).remoting_tls_mode == "enforcing"
    p.write_text(GOOD + tls + '[remoting]\ntls = "strict"\n')
    with pytest.raises(config.ConfigError, match="remoting.tls must be one of off, permissive, enforcing"):
        config.load(str(p))
    p.write_text(GOOD + '[remoting]\ntls = "permissive"\n')
    with pytest.raises(config.ConfigError, match="remoting.tls.*tls.cert_file"):
        config.load(str(p))


def test_initial_state_is_new_by_default_existing_on_request_and_checked_by_name(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).initial_state == "new"
    p.write_text(GOOD + '[cluster]\ninitial_state = "existing"\n')
    assert config.load(str(p)).initial_state == "existing"
    p.write_text(GOOD + '[cluster]\ninitial_state = "join"\n')
    with pytest.raises(config.ConfigError, match="cluster.initial_state must be one of new, existing"):
        config.load(str(p))
    p.write_text(GOOD + '[cluster]\ninitial_sate = "existing"\n')
    with pytest.raises(config.ConfigError, match="cluster.initial_sate is not a setting"):
        config.load(str(p))


def test_worker_processes_is_auto_by_default_and_checked_by_name(tmp_path) -> None:
    """Without the key a node runs "auto" workers (a node uses its cores); 0 keeps one process."""
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).worker_processes == config.auto_worker_processes(config.load(str(p)).max_followers)
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = 0'))
    assert config.load(str(p)).worker_processes == 0
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = 2'))
    assert config.load(str(p)).worker_processes == 2
    for bad, says in (("-1", "node.worker_processes must be 0..64"), ("1000", "node.worker_processes must be 0..64"),
                      ('"two"', 'node.worker_processes must be int or "auto", not \'two\''),
                      ("2.5", "node.worker_processes must be int")):
        p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "data/n1"\nworker_processes = {bad}'))
        with pytest.raises(config.ConfigError, match=says):
            config.load(str(p))


def test_worker_processes_auto_is_a_worker_per_cpu_within_half_the_followers(tmp_path, monkeypatch) -> None:
    """"auto": one per CPU the node may run on (its affinity, as the nodes inherit it), at most half of
    limits.max_followers (the rest for read replicas)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(config, "cgroup_cpu_quota", lambda: None)
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = "auto"'))
    assert config.load(str(p)).worker_processes == 4
    p.write_text(p.read_text() + "\n[limits]\nmax_followers = 2\n")
    assert config.load(str(p)).worker_processes == 1
    assert config.auto_worker_processes(100) == 4


def test_worker_processes_auto_is_resolved_after_the_overrides(tmp_path) -> None:
    """load()'s overrides (the command line's) apply before "auto" is worked out: it depends on
    limits.max_followers, which an override may set, and an override may say "auto" itself."""
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = "auto"'))
    cfg = config.load(str(p), {"max_followers": 2})
    assert cfg.worker_processes == config.auto_worker_processes(2) == 1
    p.write_text(GOOD)
    assert config.load(str(p), {"worker_processes": "auto"}).worker_processes == config.auto_worker_processes(16)
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = "auto"'))
    assert config.load(str(p), {"worker_processes": 0}).worker_processes == 0  # the override wins


def test_more_workers_than_followers_allowed_is_refused_naming_both(tmp_path) -> None:
    """Each worker's replica is one of the core's followers (limits.max_followers): a worker past the bound
    would never become ready, and its node would serve with fewer processes than configured."""
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = 20'))
    with pytest.raises(config.ConfigError, match=r"limits.max_followers \(16\) must be at least "
                                                 r"node.worker_processes \(20\)"):
        config.load(str(p))
    p.write_text(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\nworker_processes = 20')
                 + "\n[limits]\nmax_followers = 24\n")
    assert config.load(str(p)).worker_processes == 20


def test_a_data_dir_too_long_for_the_channel_sockets_is_refused_at_load(tmp_path) -> None:
    """With workers the core binds Unix sockets under data_dir/channel/: a path past the kernel's 107 bytes
    failed at bind with grpcio's traceback; the config names the key instead. The longest data_dir it
    accepts fits every channel socket the node binds."""
    from nameserver.api import corelink, writechannel
    from nameserver.remoting import corechannel

    p = tmp_path / "n1.toml"
    room = config.UNIX_PATH_MAX - len(str(tmp_path)) - len("/" + config.CHANNEL_SOCKET_LONGEST) - 1
    fits = "d" * room
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "{fits}"\nworker_processes = 1'))
    cfg = config.load(str(p))
    for path in (corelink.socket_path(cfg), writechannel.socket_path(cfg.data_dir), corechannel.socket_path(cfg)):
        assert len(path.encode()) <= config.UNIX_PATH_MAX, path
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "{fits}d"\nworker_processes = 1'))
    with pytest.raises(config.ConfigError, match="node.data_dir is too long for node.worker_processes"):
        config.load(str(p))
    # the default ("auto") on such a data_dir: no workers, no sockets, and why (said at start)
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "{fits}d"'))
    assert config.load(str(p)).worker_processes == 0
    assert "data_dir too long for the channel sockets" in config.load(str(p)).workers_off_reason
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "{fits}"'))
    assert not config.load(str(p)).workers_off_reason  # fits: the default runs its workers


REPLICA = """
[node]
grpc_addr = "127.0.0.1:9111"
[replica]
"""


def test_grpc_front_is_auto_by_default_and_go_needs_workers_and_a_node(tmp_path) -> None:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD)
    assert config.load(str(p)).grpc_front == "auto"  # settled at the node's start (the next tests)
    for front in ("go", "grpcio", "auto"):
        p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "data/n1"\nworker_processes = 2\n'
                                  f'grpc_front = "{front}"'))
        assert config.load(str(p)).grpc_front == front
    p.write_text(GOOD.replace('data_dir = "data/n1"',
                              'data_dir = "data/n1"\nworker_processes = 0\ngrpc_front = "auto"'))
    assert config.load(str(p)).grpc_front == "auto"  # grpcio then, without workers: no refusal
    for node, says in (('worker_processes = 0\ngrpc_front = "go"',
                        'node.grpc_front = "go" needs node.worker_processes >= 1'),
                       ('grpc_front = "rust"', 'node.grpc_front must be "auto", "grpcio" or "go", not \'rust\''),
                       ("grpc_front = 1", "node.grpc_front must be str")):
        p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "data/n1"\n{node}'))
        with pytest.raises(config.ConfigError, match=says):
            config.load(str(p))
    replica = tmp_path / "replica.toml"
    replica.write_text(REPLICA.replace("[replica]", 'grpc_front = "go"\n[replica]') + 'follow = ["a:1"]\n')
    with pytest.raises(config.ConfigError, match='node.grpc_front = "go" is a node\'s'):
        config.load(str(replica))
    replica.write_text(REPLICA + 'follow = ["a:1"]\n')
    assert config.load(str(replica)).grpc_front == "auto"  # a replica serves with grpcio: the default is no error


def _node_with(tmp_path, front: str, workers: int = 2) -> config.NodeConfig:
    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "data/n1"\nworker_processes = {workers}\n'
                              f'grpc_front = "{front}"'))
    return config.load(str(p))


def test_auto_is_the_go_front_end_when_it_is_built_and_grpcio_saying_why_when_not(tmp_path, monkeypatch) -> None:
    from nameserver.ops import gobuild, gofront

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where `make setup` puts it: empty here
    settled = gofront.settle(_node_with(tmp_path, "auto"))
    assert (settled.cfg.grpc_front, settled.binary) == ("grpcio", "")
    assert "not built" in settled.note and "`make setup`" in settled.note and 'grpc_front = "grpcio"' in settled.note
    for front, workers in (("auto", 0), ("grpcio", 2)):  # nothing to say: grpcio is what the node would run
        assert gofront.settle(_node_with(tmp_path, front, workers)) == (_node_with(tmp_path, "grpcio", workers),
                                                                        "", "")
    binary = gobuild.binary_path(gobuild.FRONT_SOURCE)  # as `make setup` builds it for this checkout's front/
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    binary.chmod(0o755)
    for front in ("auto", "go"):
        assert gofront.settle(_node_with(tmp_path, front)) == (_node_with(tmp_path, "go"), str(binary), "")
    for front, workers in (("auto", 0), ("grpcio", 2)):  # built, but not chosen
        assert gofront.settle(_node_with(tmp_path, front, workers)).cfg.grpc_front == "grpcio"


def test_an_explicit_go_whose_front_end_cannot_be_built_stops_the_start_naming_the_setting(
        tmp_path, monkeypatch) -> None:
    from nameserver.ops import gobuild, gofront

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "front"  # a front end that does not compile, not built yet
    broken.mkdir()
    (broken / "go.mod").write_text("module example.com/front\n\ngo 1.21\n")
    (broken / "main.go").write_text("package main\n\nfunc main() { undefined() }\n")
    monkeypatch.setattr(gobuild, "FRONT_SOURCE", broken)
    with pytest.raises(OSError, match=r'\[node\] grpc_front = "go": the Go front end .* is not built and could not '
                                      r'be built now: .*Run `make setup`'):
        gofront.settle(_node_with(tmp_path, "go"))
    settled = gofront.settle(_node_with(tmp_path, "auto"))  # the default never builds: grpcio, saying so
    assert settled.cfg.grpc_front == "grpcio" and "`make setup`" in settled.note
    assert not gobuild.binary_path(broken).exists()


def test_the_go_front_ends_cache_is_32_mib_by_default_and_bounded(tmp_path) -> None:
    from nameserver.ops import gofront

    p = tmp_path / "n1.toml"
    go = 'data_dir = "data/n1"\nworker_processes = 2\ngrpc_front = "go"'
    p.write_text(GOOD.replace('data_dir = "data/n1"', go))
    cfg = config.load(str(p))
    assert cfg.grpc_front_cache_mb == 32
    cmd = gofront.command(cfg, "front", 10)
    assert cmd[cmd.index("-cache-bytes") + 1] == str(32 << 20)
    p.write_text(GOOD.replace('data_dir = "data/n1"', go + "\ngrpc_front_cache_mb = 0"))
    cmd = gofront.command(config.load(str(p)), "front", 10)
    assert cmd[cmd.index("-cache-bytes") + 1] == "0"  # no cache
    for value, says in (("-1", "node.grpc_front_cache_mb must be 0 \\(no cache\\) or more, not -1"),
                        ("2000000", "node.grpc_front_cache_mb must be at most 1048576"),
                        ('"big"', "node.grpc_front_cache_mb must be int")):
        p.write_text(GOOD.replace('data_dir = "data/n1"', f"{go}\ngrpc_front_cache_mb = {value}"))
        with pytest.raises(config.ConfigError, match=says):
            config.load(str(p))


def test_the_go_front_ends_counts_are_read_from_its_file(tmp_path) -> None:
    from nameserver.ops import gofront

    p = tmp_path / "n1.toml"
    p.write_text(GOOD.replace('data_dir = "data/n1"', f'data_dir = "{tmp_path}/d"\nworker_processes = 2\n'
                              'grpc_front = "go"'))
    front = gofront.FrontProcess(config.load(str(p)), 10)
    assert front.calls() == {} and front.cache() == gofront.CacheCounts({}, 0, 0, 0)  # not written yet
    os.makedirs(tmp_path / "d" / "channel")
    with open(gofront.counters_path(str(tmp_path / "d")), "w") as f:  # as front/counters.go and cache.go write it
        f.write("0 12\n16 1\nhit /rip18.nameserver.v1.NameServer/GetRoute 9\nmiss 3\nentries 2\nbytes 3000\n")
    assert front.calls() == {0: 12, 16: 1}
    assert front.cache() == gofront.CacheCounts({"/rip18.nameserver.v1.NameServer/GetRoute": 9}, 3, 2, 3000)


def test_a_read_replica_config_names_its_voters_and_bounds(tmp_path) -> None:
    p = tmp_path / "replica.toml"
    p.write_text(REPLICA + 'follow = ["10.0.0.1:9101", "10.0.0.2:9101", "10.0.0.1:9101"]\nmax_silence_ms = 2000\n')
    cfg = config.load(str(p))
    assert cfg.replica_follow == ["10.0.0.1:9101", "10.0.0.2:9101"]  # duplicates dropped, order kept
    assert (cfg.replica_max_silence_ms, cfg.replica_max_lag_entries) == (2000, 1000)
    assert cfg.raft_addr == "127.0.0.1:9111"  # named by its gRPC address: it has no Raft port
    assert config.load(None, {"raft_addr": "a:1", "grpc_addr": "a:2", "data_dir": "d"}).replica_follow == []


@pytest.mark.parametrize(("body", "named"), [
    ("", "replica.follow is required"),
    ('follow = "10.0.0.1:9101"\n', "replica.follow must be a non-empty list"),
    ("follow = []\n", "replica.follow must be a non-empty list"),
    ('follow = ["a:1"]\nmax_lag_entries = 0\n', "replica.max_lag_entries must be positive"),
    ('follow = ["a:1"]\nmax_silence_ms = "5s"\n', "replica.max_silence_ms must be int"),
    ('follow = ["a:1"]\nfollows = ["a:1"]\n', "replica.follows is not a setting"),
])
def test_a_bad_replica_setting_is_refused_by_name(tmp_path, body: str, named: str) -> None:
    p = tmp_path / "replica.toml"
    p.write_text(REPLICA + body)
    with pytest.raises(config.ConfigError, match=named):
        config.load(str(p))


@pytest.fixture
def root_logging():
    """The commands install their log handler on the root logger, writing to the captured stderr: put the
    root logger back, or later tests' log lines go to a closed stream ("--- Logging error ---")."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_serve_refuses_a_replica_config_and_replica_a_node_config(tmp_path, capsys, root_logging) -> None:
    from nameserver.cli import serve

    replica, node = tmp_path / "replica.toml", tmp_path / "n1.toml"
    replica.write_text(REPLICA + 'follow = ["10.0.0.1:9101"]\n')
    node.write_text(GOOD)
    assert serve.main(["serve", "--config", str(replica)]) == 2
    assert "nameserver replica" in capsys.readouterr().err
    assert serve.main(["replica", "--config", str(node)]) == 2
    assert "replica.follow is required" in capsys.readouterr().err


def test_replica_on_a_port_in_use_says_so_in_one_line(tmp_path, capfd, root_logging) -> None:
    """A newcomer's first mistake (a port another process holds): one line naming the setting, exit 1, no
    traceback (grpcio raises RuntimeError where it once returned 0)."""
    import socket

    from nameserver.cli import serve

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    p = tmp_path / "replica.toml"
    p.write_text(REPLICA.replace("127.0.0.1:9111", f"127.0.0.1:{port}") + 'follow = ["127.0.0.1:1"]\n')
    try:
        assert serve.main(["replica", "--config", str(p)]) == 1
    finally:
        held.close()
    err = capfd.readouterr().err
    assert f"cannot listen on [node] grpc_addr 127.0.0.1:{port}" in err and "Traceback" not in err


def test_auto_worker_processes_follow_the_cgroup_cpu_quota(tmp_path, monkeypatch) -> None:
    """A container limited to 1.5 CPUs on a bigger host: "auto" counts 2, not the host's CPUs (affinity
    shows the host's); v2 (cpu.max) and v1 (cfs quota / period) both read; no quota: the affinity."""
    own = tmp_path / "cgroup"
    (tmp_path / "v2" / "pod").mkdir(parents=True)
    own.write_text("0::/pod\n")
    (tmp_path / "v2" / "pod" / "cpu.max").write_text("150000 100000\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v2"), str(own)) == 1.5
    (tmp_path / "v2" / "pod" / "cpu.max").write_text("max 100000\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v2"), str(own)) is None
    (tmp_path / "v1" / "cpu" / "pod").mkdir(parents=True)
    own.write_text("4:cpu,cpuacct:/pod\n0::/\n")
    (tmp_path / "v1" / "cpu" / "pod" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "v1" / "cpu" / "pod" / "cpu.cfs_period_us").write_text("100000\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v1"), str(own)) == 3.0
    (tmp_path / "v1" / "cpu" / "pod" / "cpu.cfs_quota_us").write_text("-1\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v1"), str(own)) is None
    # v1 without a cgroup namespace: /proc/self/cgroup names the host's path, the mount is the container's
    own.write_text("4:cpu,cpuacct:/kubepods/burstable/pod1/abc\n")
    (tmp_path / "v1" / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "v1" / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v1"), str(own)) == 2.0
    own.write_text("0::/kubepods/pod1/abc\n")  # v2 the same
    (tmp_path / "v2" / "cpu.max").write_text("250000 100000\n")
    assert config.cgroup_cpu_quota(str(tmp_path / "v2"), str(own)) == 2.5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(config, "cgroup_cpu_quota", lambda: 1.5)
    assert config.auto_worker_processes(100) == 2
    monkeypatch.setattr(config, "cgroup_cpu_quota", lambda: None)
    assert config.auto_worker_processes(100) == 50
    monkeypatch.setattr(config, "cgroup_cpu_quota", lambda: 0.5)  # one CPU: no worker beside the core
    assert config.auto_worker_processes(100) == 0
