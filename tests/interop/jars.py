"""Apache RocketMQ's jars for the interop tests: fetched by Maven (tests/interop/pom.xml), cached per version.

    python -m tests.interop.jars            # fetch both lines (what `make interop-setup` runs)
    python -m tests.interop.jars 5.5.0      # one version

The cache is tests/interop/.jars/<version>/ (git-ignored; RMQ_JARS_DIR moves it). A version whose folder
holds the `.complete` stamp is not fetched again. Maven runs non-interactively (`mvn -B -q`), so a fresh
machine with Maven Central reachable fetches everything itself.

The two lines (checked on Maven Central: 4.9.8's broker and 5.5.1's namesrv/client/tools are not served,
so these are the newest versions whose broker, namesrv, client, tools and proxy all resolve):
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
POM = os.path.join(HERE, "pom.xml")

LINE_4 = "4.9.7"  # newest 4.9.x whose artifacts resolve
LINE_5 = "5.5.0"  # newest 5.x whose artifacts resolve; runs on Java 17
LINES = (LINE_4, LINE_5)

STAMP = ".complete"


def cache_root() -> str:
    return os.environ.get("RMQ_JARS_DIR") or os.path.join(HERE, ".jars")


def jars_dir(version: str) -> str:
    return os.path.join(cache_root(), version)


def is_5x(version: str) -> bool:
    return int(version.split(".")[0]) >= 5


def ensure(version: str, quiet: bool = True) -> str:
    """Fetch `version`'s jars unless already cached; return the folder. Raises RuntimeError on failure."""
    out = jars_dir(version)
    if os.path.exists(os.path.join(out, STAMP)):
        return out
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn not found: install Maven (Debian: apt-get install maven)")
    tmp = out + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-B", "-f", POM, f"-Drocketmq.version={version}", f"-Djars.dir={tmp}"]
    if quiet:
        cmd.append("-q")
    if is_5x(version):
        cmd.append("-Pproxy")
    cmd.append("dependency:copy-dependencies")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"fetching RocketMQ {version} failed ({' '.join(cmd)}):\n"
                           f"{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    if not glob.glob(os.path.join(tmp, f"rocketmq-broker-{version}.jar")):
        raise RuntimeError(f"fetching RocketMQ {version}: no rocketmq-broker jar in {tmp}")
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(version + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def classpath(version: str) -> str:
    """The Java classpath of every cached jar of `version` (fetching them first if needed)."""
    d = ensure(version)
    return os.path.join(d, "*")


def main(argv: list[str]) -> int:
    versions = argv or list(LINES)
    for v in versions:
        cached = os.path.exists(os.path.join(jars_dir(v), STAMP))
        d = ensure(v)
        n = len(glob.glob(os.path.join(d, "*.jar")))
        print(f"RocketMQ {v}: {n} jars in {d}" + (" (cached)" if cached else " (fetched)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
