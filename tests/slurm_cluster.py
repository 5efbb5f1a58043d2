"""A one-host SLURM cluster for tests: munged, slurmctld and slurmd (Debian's munge and
slurm-wlm) on loopback with a slurm.conf, key, state and logs in a temporary folder, each
daemon in the foreground through launching.Launch, so closing the cluster kills them and every
job process by pid. CPU nodes: one node named after this host with this host's CPUs.

    with SlurmCluster(tmp) as cluster:      # raises ClusterUnavailable with the reason
        job = cluster.submit(["examples/slurm/train.sbatch", config], env=env)
        cluster.job(job)["JobState"]        # scontrol show job, as a dict
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from launching import MARKER, Launch, run_bounded

DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT = 30
COMMAND_TIMEOUT = 30


class ClusterUnavailable(RuntimeError):
    """The daemons are not installed or did not start here: the message says why."""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def slurm_conf(folder: Path, host: str, cpus: int, ports: Sequence[int]) -> str:
    return "\n".join([
        "ClusterName=simpletuner-test", f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root", f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}", "AuthType=auth/munge",
        f"AuthInfo=socket={folder / 'munge.socket'}", f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}", f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}", f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/builtin", "KillWait=30", "MinJobAge=600",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


class SlurmCluster:
    """The cluster's daemons, started on entry (ClusterUnavailable when they cannot be) and
    killed on exit. ``env`` is what a SLURM command needs (SLURM_CONF)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.daemons: list[Launch] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.folder / "slurm.conf"))

    def __enter__(self) -> "SlurmCluster":
        missing = [name for name in (*DAEMONS, "sbatch") if _program(name) is None]
        if missing:
            raise ClusterUnavailable(f"{', '.join(missing)} not installed (Debian: apt-get "
                                     "install slurm-wlm munge)")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self) -> None:
        f = self.folder
        for sub in ("state", "spool", "tmp"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        key = f / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        (f / "slurm.conf").write_text(slurm_conf(f, host, os.cpu_count() or 1, free_ports(2)))
        tmp = f / "tmp"
        self._daemon(["munged", "-F", "--force", f"--socket={f / 'munge.socket'}",
                      f"--key-file={key}", f"--pid-file={f / 'munged.pid'}",
                      f"--seed-file={f / 'munged.seed'}", f"--log-file={f / 'munged.log'}"], tmp)
        self._wait_for(lambda: (f / "munge.socket").exists(), "munged")
        self._daemon(["slurmctld", "-D", "-i"], tmp)
        self._daemon(["slurmd", "-D", "-N", host], tmp)
        self._wait_for(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"]).stdout,
                       "slurmctld and slurmd (node idle)")

    def _daemon(self, command: list[str], tmp: Path) -> None:
        command = [_program(command[0]), *command[1:]]  # /usr/sbin may not be on PATH
        self.daemons.append(Launch(command, tmpdir=tmp, env=self.env, cwd=self.folder))

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            ended = [d for d in self.daemons if d.process.poll() is not None]
            if ended or time.monotonic() > deadline:
                raise ClusterUnavailable(f"{what} did not start: {self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        parts = []
        for daemon in self.daemons:
            parts.append(f"{daemon.command[0]} (status {daemon.process.poll()}): "
                         f"{daemon.stderr()[-800:]}")
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.folder / name
            if path.is_file():
                parts.append(f"{name}: {path.read_text(errors='replace')[-800:]}")
        return "\n".join(parts)

    def run(self, command: Sequence[str]) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster (its status and output)."""
        return run_bounded(command, tmpdir=self.folder / "tmp", env=self.env,
                           timeout=COMMAND_TIMEOUT, cwd=self.folder)

    def submit(self, sbatch_args: Sequence[str], env: Mapping[str, str], cwd: Path) -> str:
        """``sbatch --parsable`` with ``env``: the job id. The job's processes carry slurmd's
        launch marker (not sbatch's), so closing the cluster kills them too."""
        job_env = dict(env, SLURM_CONF=self.env["SLURM_CONF"])
        result = run_bounded(["sbatch", "--parsable",
                              f"--export=ALL,{MARKER}={self.daemons[-1].launch_id}",
                              *sbatch_args], tmpdir=job_env["TMPDIR"], env=job_env,
                             timeout=COMMAND_TIMEOUT, cwd=cwd)
        if result.returncode != 0:
            raise AssertionError(f"sbatch failed: {result.stderr}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as key -> value (values without spaces)."""
        result = self.run(["scontrol", "-o", "show", "job", job_id])
        fields = {}
        for word in result.stdout.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def close(self) -> None:
        errors = []
        for daemon in reversed(self.daemons):
            try:
                daemon.close()
            except RuntimeError as exc:
                errors.append(str(exc))
        self.daemons.clear()
        if errors:
            raise RuntimeError("; ".join(errors))


def _program(name: str) -> str | None:
    """The path of ``name``: on PATH, else in /usr/sbin (where Debian puts the daemons)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin")
